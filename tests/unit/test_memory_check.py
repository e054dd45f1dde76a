"""app.engine.memory_check: what the server would open (the contexts from the settings), the
verdict against a budget, the message of a model that cannot fit and the settings it names,
each of which does make the model fit, and MEMORY_CHECK's three modes."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from app import engine_config
from app.base.errors import ModelLoadError
from app.engine import memory_check as mc
from app.engine.memory_budget import GIB, Free, budget
from app.settings import Settings
from tests.support.fake_header import model

MIB = 1 << 20


def cfg(**kw):
    return engine_config(Settings(**kw))


def apply(config, hint: str):
    """A hint ("CTX_SIZE=1024", "KV_CACHE_TYPE_K=q8_0 and KV_CACHE_TYPE_V=q8_0") applied."""
    changes = {}
    for part in hint.split(" and "):
        name, _, value = part.partition("=")
        field = name.lower()
        current = getattr(config, field)
        changes[field] = type(current)(value) if not isinstance(current, str) else value
    return dataclasses.replace(config, **changes)


def big_model():
    # 8 layers, 4 KV heads of 128: 2 KiB of f16 K and V per cell and layer
    return model(n_layer=8, n_embd=1024, n_head=8, n_head_kv=4, head=128, n_ff=4096)


def test_the_contexts_the_server_opens():
    files = mc.Files(big_model())
    gen, = mc._contexts(cfg(ctx_size=4096, parallel=4, n_ubatch=256), files)
    assert (gen.role, gen.n_ctx, gen.n_seq, gen.n_ubatch) == ("generation", 16384, 4, 256)
    assert (gen.type_k, gen.flash_attn, gen.kv_unified, gen.swa_full) == ("f16", True, False,
                                                                          True)
    # rows: 4 slots x (1 + 16 drafted) ... or the rows a scored prompt takes, the larger
    assert gen.n_outputs == max(4 * 17, min(256, (1 << 22) // 1000))
    both = mc._contexts(cfg(ctx_size=0, embeddings="on", flash_attn="off"), files)
    assert both[0].n_ctx == 8192 * 8  # CTX_SIZE=0: the training context per slot
    emb = both[1]
    assert (emb.role, emb.n_ctx, emb.n_ubatch, emb.kv_unified, emb.flash_attn) == \
        ("embeddings", 2048, 2048, True, False)
    bert = mc.Files(model("bert", n_layer=2, tied=True, attention__causal=False))
    only, = mc._contexts(cfg(), bert)
    assert only.role == "embeddings" and only.n_ctx == 8192


def test_a_model_that_fits():
    files = mc.Files(big_model())
    b = budget([Free("CPU", 8 * GIB, 16 * GIB, "test")], 0.5, None)
    v = mc.judge(cfg(ctx_size=4096, parallel=4), files, b)
    assert v.fits and v.over == [] and v.hints == []
    assert v.line().startswith("memory estimate: CPU needs ") and v.line().endswith(": fits")
    d = v.as_dict()
    assert d["fits"] and d["estimate"]["CPU"]["kv_cache"] == 8 * 16384 * 2048
    assert d["budget"]["CPU"]["budget"] == int(7.5 * GIB)


def test_a_model_that_does_not_fit_says_what_would():
    config = cfg(ctx_size=8192, parallel=8)
    files = mc.Files(big_model())
    # the KV cache: 8 layers x 65536 cells x 2 KiB = 1 GiB
    b = budget([Free("CPU", int(1.3 * GIB), 16 * GIB, "test")], 0.5, None)
    v = mc.judge(config, files, b)
    assert not v.fits and v.over == ["CPU"]
    msg = v.message("/models/m.gguf")
    assert msg.startswith("model /models/m.gguf: not enough memory to load it: CPU needs 1.")
    assert "KV cache 1.00" in msg and "0.80 GiB free (1.30 GiB less the 0.50 GiB margin" in msg
    assert "MEMORY_CHECK=warn loads it anyway" in msg
    names = [h.split("=")[0] for h in v.hints]
    assert names == ["CTX_SIZE", "PARALLEL", "KV_CACHE_TYPE_K"]
    for hint in v.hints:  # each one alone makes it fit, and is the largest that does
        assert mc.judge(apply(config, hint), files, b).fits, hint
    ctx = int(v.hints[0].split("=")[1])
    assert not mc.judge(dataclasses.replace(config, ctx_size=ctx + 256), files, b).fits


def test_a_gpu_that_is_too_small_names_the_layers_that_fit():
    config = cfg(ctx_size=4096, parallel=2, gpu_layers=-1)
    files = mc.Files(big_model(), gpus=("CUDA0",), gpu_free=(1.0,))
    fp = mc.footprint(config, files)
    room = fp.need("CUDA0") // 2
    b = budget([Free("CPU", 64 * GIB, 64 * GIB, "t"), Free("CUDA0", room, 80 * GIB, "t")], 0,
               None)
    v = mc.judge(config, files, b)
    assert v.over == ["CUDA0"]
    layers = next(h for h in v.hints if h.startswith("GPU_LAYERS="))
    n = int(layers.split("=")[1])
    assert 0 < n < 8
    assert mc.judge(apply(config, layers), files, b).fits
    assert not mc.judge(dataclasses.replace(config, gpu_layers=n + 1), files, b).fits


def test_a_mixture_of_experts_on_a_small_gpu_names_n_cpu_moe():
    config = cfg(ctx_size=1024, parallel=1, gpu_layers=-1)
    h = model(n_layer=8, n_embd=512, n_ff=2048, experts=16)
    files = mc.Files(h, gpus=("CUDA0",), gpu_free=(1.0,))
    gpu = mc.footprint(config, files).need("CUDA0")
    b = budget([Free("CPU", 64 * GIB, 64 * GIB, "t"), Free("CUDA0", gpu * 2 // 3, 80 * GIB,
                                                                 "t")], 0, None)
    v = mc.judge(config, files, b)
    hint = next(h for h in v.hints if h.startswith("N_CPU_MOE="))
    k = int(hint.split("=")[1])
    assert mc.judge(apply(config, hint), files, b).fits
    assert not mc.judge(dataclasses.replace(config, n_cpu_moe=k - 1), files, b).fits


def test_nothing_fits_says_so():
    b = budget([Free("CPU", GIB // 100, GIB, "t")], 0, None)
    v = mc.judge(cfg(ctx_size=512, parallel=1), mc.Files(big_model()), b)
    assert v.hints == []
    assert "No one setting makes it fit" in v.message("m.gguf")


def test_a_cap_is_named_as_the_budget():
    b = budget([Free("CPU", 30 * GIB, 32 * GIB, "t")], 0.5, "CPU=1")
    v = mc.judge(cfg(ctx_size=8192, parallel=8), mc.Files(big_model()), b)
    assert "budget 1.00 GiB (MEMORY_BUDGET_GB; 30.00 GiB free)" in v.message("m.gguf")


def test_modes(caplog, default_model, tmp_path):
    path = str(default_model)
    small = dict(ctx_size=1024, parallel=2)
    assert mc.run(None, cfg(memory_check="off", **small), path, None, None, [], False) is None
    with caplog.at_level(logging.INFO, logger="app.engine.memory_check"):
        v = mc.run(None, cfg(**small), path, None, None, [], False)
    assert v is not None and v.fits
    assert "memory estimate: CPU needs 0." in caplog.text
    tight = cfg(memory_budget_gb="CPU=0.05", **small)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="app.engine.memory_check"):
        v = mc.run(None, tight, path, None, None, [], False)  # warn: loads anyway
    assert v is not None and not v.fits and "Loading it anyway (MEMORY_CHECK=warn)" in caplog.text
    with pytest.raises(ModelLoadError, match=r"not enough memory to load it: CPU needs 0\.\d\d GiB"):
        mc.run(None, dataclasses.replace(tight, memory_check="error"), path, None, None, [],
               False)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 60)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="app.engine.memory_check"):
        assert mc.run(None, dataclasses.replace(tight, memory_check="error"), str(bad), None,
                      None, [], False) is None  # llama.cpp judges a file this reader refuses
    assert "memory check skipped" in caplog.text


def test_llama_cpp_s_buffer_lines_are_read():
    """What /props "memory" "reported" holds: llama.cpp's own figures, by buffer type and kind
    (two caches of a sliding-window model summed; the teardown's lines ignored)."""
    from app.engine.llama_log import Seen

    seen = Seen()
    for line in ["load_tensors:   CPU_Mapped model buffer size =    92.10 MiB",
                 "load_tensors:        CUDA0 model buffer size =  4403.49 MiB",
                 "llama_context:  CUDA_Host  output buffer size =     0.38 MiB",
                 "llama_kv_cache:      CUDA0 KV buffer size =    10.00 MiB",
                 "llama_kv_cache:      CUDA0 KV buffer size =     2.50 MiB",
                 "llama_memory_recurrent:        CPU RS buffer size =     1.25 MiB",
                 "sched_reserve:      CUDA0 compute buffer size =   258.50 MiB",
                 "~llama_context:      CUDA0 compute buffer size =   258.50 MiB"]:
        seen.read(line)
    assert seen.buffers == {
        "CPU_Mapped": {"weights": round(92.10 * MIB)},
        "CUDA0": {"weights": round(4403.49 * MIB), "kv_cache": round(12.5 * MIB),
                  "compute": round(258.5 * MIB)},
        "CUDA_Host": {"output": round(0.38 * MIB)},
        "CPU": {"kv_cache": round(1.25 * MIB)}}
