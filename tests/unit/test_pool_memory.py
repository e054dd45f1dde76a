"""The pool's memory budget (app/model/catalog/memory.py): a model's estimate is what the
single-model memory check computes for its own settings from its real (tiny) GGUF; a model
whose file is not here yet counts the bytes of its files, or nothing; the room is host memory
free less MEMORY_MARGIN_GB, capped by MEMORY_BUDGET_GB; MEMORY_CHECK=off and an unmeasurable
GPU turn it off."""

from __future__ import annotations

from pathlib import Path

import pytest

from app import engine_config
from app.engine import memory_budget
from app.engine import memory_check as mc
from app.engine.memory_budget import GIB, Free
from app.model.catalog import ModelSpec, memory
from app.model.gguf_header import read_model
from app.settings import Settings
from tests.support.tiny_bert import build_tiny_bert
from tests.support.tiny_shapes import Shape, build_shape


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pool-memory")
    vocab = build_tiny_bert(d / "bert.gguf")
    return build_shape(d / "model.gguf", vocab, Shape(n_layer=3))


def spec(source: str, size: int | None = None, **settings) -> ModelSpec:
    s = Settings(model=source, served_model_name="m", **settings)
    return ModelSpec(name="m", source=source, origin="MODELS", settings=s, files=(source,),
                     size=size)


@pytest.mark.parametrize("settings", [
    {},
    {"ctx_size": 2048, "parallel": 4},
    {"ctx_size": 1024, "parallel": 1, "kv_cache_type_k": "q8_0", "kv_cache_type_v": "q8_0",
     "flash_attn": "on"},
])
def test_the_estimate_is_the_memory_check_s_for_the_model_s_own_settings(tiny, settings):
    sp = spec(str(tiny), size=123, **settings)
    got = memory.estimate(sp, engine_config)
    fp = mc.footprint(engine_config(sp.settings), mc.Files(read_model(tiny)))
    assert got == {dev: fp.need(dev) for dev in fp.devices}
    assert set(got) == {"CPU"} and got["CPU"] > read_model(tiny).tensor_bytes  # + KV, compute


def test_a_bigger_context_is_a_bigger_estimate(tiny):
    small = memory.estimate(spec(str(tiny), ctx_size=512, parallel=1), engine_config)
    big = memory.estimate(spec(str(tiny), ctx_size=8192, parallel=4), engine_config)
    assert big["CPU"] > small["CPU"]


def test_a_model_not_here_counts_its_files_bytes_or_nothing(tmp_path):
    assert memory.estimate(spec("gs://bucket/m.gguf", size=5000), engine_config) == 5000
    assert memory.estimate(spec("gs://bucket/m.gguf"), engine_config) is None
    assert memory.estimate(spec(str(tmp_path / "gone.gguf"), size=7), engine_config) == 7


def test_a_gs_model_in_the_download_cache_is_read_from_there(tiny, tmp_path):
    cached = tmp_path / "gcs" / "bucket" / "dir" / "m.gguf"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(tiny.read_bytes())
    sp = spec("gs://bucket/dir/m.gguf", size=5, model_cache_dir=str(tmp_path))
    fp = mc.footprint(engine_config(sp.settings), mc.Files(read_model(tiny)))
    assert memory.estimate(sp, engine_config) == {dev: fp.need(dev) for dev in fp.devices}
    gone = spec("gs://bucket/dir/other.gguf", size=5, model_cache_dir=str(tmp_path))
    assert memory.estimate(gone, engine_config) == 5


def test_a_file_that_is_no_gguf_counts_its_bytes(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    assert memory.estimate(spec(str(bad), size=17), engine_config) == 17


def test_a_draft_model_not_here_falls_back(tiny):
    sp = spec(str(tiny), size=9, draft_model="gs://bucket/draft.gguf")
    assert memory.estimate(sp, engine_config) == 9


def test_memory_check_off_estimates_nothing(tiny):
    assert memory.estimate(spec(str(tiny), memory_check="off"), engine_config) is None


def _host(monkeypatch, free_gib: float, total_gib: float = 64) -> None:
    monkeypatch.setattr(memory_budget, "host", lambda root="/": Free(
        "CPU", int(free_gib * GIB), int(total_gib * GIB), "test"))


def room(settings: Settings, specs=(), **kw):
    return memory.measure(settings, specs, **kw).budget


def test_the_room_is_free_host_memory_less_the_margin(monkeypatch):
    _host(monkeypatch, 10)
    assert room(Settings(memory_margin_gb=1.5), gpu=lambda: False) == {"CPU": int(8.5 * GIB)}


def test_memory_budget_gb_caps_the_room(monkeypatch):
    _host(monkeypatch, 10)
    assert room(Settings(memory_budget_gb="CPU=2"), gpu=lambda: False) == {"CPU": 2 * GIB}


def test_memory_check_off_is_no_budget(monkeypatch):
    _host(monkeypatch, 10)
    assert room(Settings(memory_check="off"), gpu=lambda: False) is None


def test_a_gpu_is_read_by_a_probe_and_counted_per_device(monkeypatch, tiny):
    _host(monkeypatch, 10)
    gpus = [Free("CUDA0", 20 * GIB, 24 * GIB, "test")]
    offloads = [spec(str(tiny))]
    got = memory.measure(Settings(memory_budget_gb="CUDA0=8"), offloads, gpu=lambda: True,
                         probe=lambda: gpus)
    assert got.budget == {"CPU": int(9.5 * GIB), "CUDA0": 8 * GIB}
    assert got.gpus == tuple(gpus)
    # the estimate splits the layers over the GPUs seen, as the memory check does
    sp = offloads[0]
    need = memory.estimate(sp, engine_config, got.gpus)
    files = mc.Files(read_model(tiny), gpus=("CUDA0",), gpu_free=(float(20 * GIB),))
    fp = mc.footprint(engine_config(sp.settings), files)
    assert need == {dev: fp.need(dev) for dev in fp.devices} and need["CUDA0"] > 0


def test_a_gpu_that_cannot_be_read_is_no_budget(monkeypatch, tiny, caplog):
    _host(monkeypatch, 10)
    offloads = [spec(str(tiny))]
    assert room(Settings(), offloads, gpu=lambda: True, probe=lambda: None) is None
    assert "could not be read" in caplog.text and "MODELS_MAX alone" in caplog.text
    # every model on the CPU (GPU_LAYERS=0): no probe, the host's room is all that counts
    cpu_only = [spec(str(tiny), gpu_layers=0)]
    assert room(Settings(), cpu_only, gpu=lambda: True,
                probe=lambda: pytest.fail("probed")) == {"CPU": int(9.5 * GIB)}


def test_unknown_host_memory_is_no_budget(monkeypatch):
    monkeypatch.setattr(memory_budget, "host", lambda root="/": Free("CPU", 0, 0, "unknown"))
    assert room(Settings(), gpu=lambda: False) is None


def test_the_probe_process_reads_the_gpus_this_build_sees():
    """A CPU build (this machine's) sees none; the probe imports llama.cpp in its own process."""
    assert memory.probe_gpus() == []


def test_the_real_host_is_read_without_llama_cpp():
    """The web process measures the room and reads the headers with no llama.cpp loaded."""
    import subprocess
    import sys

    code = ("import sys; from app.settings import Settings; from app.model.catalog import memory; "
            "r = memory.measure(Settings(), gpu=lambda: False).budget; "
            "assert r is None or r['CPU'] >= 0; assert 'llama_cpp' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
