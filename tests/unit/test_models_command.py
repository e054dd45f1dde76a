"""``vertex-gguf models``: the catalog as the server would serve it, or the error and exit 1;
loading and downloading nothing. Local folders here, gs:// folders through the storage
emulator (started by this module on a loopback port, with tiny fake objects)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.model.catalog import CatalogError, build
from app.process.cli import main
from app.settings import Settings
from tests.support.gcs_emulator import Emulator

ROOT = Path(__file__).resolve().parents[2]


def touch(root: Path, *names: str, data: bytes = b"GGUF") -> Path:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def run_models(monkeypatch, capsys, **env: str) -> tuple[int, str, str]:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    rc = main(["models"])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_models_prints_each_model_and_what_differs(tmp_path, monkeypatch, capsys):
    touch(tmp_path, "dir/a.gguf", "dir/v/m.gguf", "dir/v/mmproj-f16.gguf",
          "dir/s/s-00001-of-00002.gguf", "dir/s/s-00002-of-00002.gguf")
    (tmp_path / "p.ini").write_text("[*]\nctx_size = 8192\n[v]\naliases = eyes\npin = true\n"
                                    "parallel = 2\nkeep_alive = 1h\n")
    rc, out, err = run_models(monkeypatch, capsys, MODELS_DIR=str(tmp_path / "dir"),
                              MODELS_PRESET=str(tmp_path / "p.ini"), MODELS_PRELOAD="a,v",
                              API_KEY="sk-never-shown")
    assert rc == 0 and err == ""
    assert out.startswith("3 models: default a; at most 4 loaded at once (MODELS_MAX); "
                          "KEEP_ALIVE 5m0s; download cache no bound (MODEL_CACHE_MAX_GB)\n")
    blocks = {b.splitlines()[0]: b for b in out.split("\n\n")[1:]}
    assert set(blocks) == {"a  [default, preload]", "s", "v  [preload, pin]"}
    v = blocks["v  [preload, pin]"]
    assert f"  projector:  {tmp_path / 'dir/v/mmproj-f16.gguf'}" in v
    assert "  aliases:    eyes" in v and "  keep_alive: 1h0m0s" in v
    assert "  setting:    CTX_SIZE=8192 (base: 4096)" in v
    assert "  setting:    PARALLEL=2 (base: 8)" in v
    assert "  preset:     ctx_size, aliases, pin, parallel, keep_alive" in v
    assert "  shards:     2 (8 bytes)" in blocks["s"]
    assert "PARALLEL" not in blocks["s"] and "  setting:    CTX_SIZE=8192" in blocks["s"]
    assert "sk-never-shown" not in out


def test_models_with_model_alone_says_it_is_served_as_ever(tmp_path, monkeypatch, capsys):
    touch(tmp_path, "q.gguf")
    rc, out, _ = run_models(monkeypatch, capsys, MODEL=str(tmp_path / "q.gguf"))
    assert rc == 0 and out.startswith("1 model: MODEL alone, served as ever")
    assert "q  [default]" in out and "being built" not in out


def test_a_bad_configuration_exits_1_with_the_error(tmp_path, monkeypatch, capsys):
    rc, out, err = run_models(monkeypatch, capsys, MODELS=f"a={tmp_path / 'a.gguf'}",
                              MODELS_DEFAULT="b")
    assert rc == 1 and out == ""
    assert err.startswith("vertex-gguf models: model a (MODELS): ")


def test_the_command_in_its_own_process(tmp_path):
    touch(tmp_path, "a.gguf")
    env = {"PATH": "/usr/bin:/bin", "MODELS_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    ok = subprocess.run([sys.executable, "-m", "app", "models"], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "\na  [default, preload]\n" in ok.stdout, ok.stderr
    bad = subprocess.run([sys.executable, "-m", "app", "models", "--models-max", "-1"], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "--models-max / MODELS_MAX" in bad.stderr


# ---- gs:// folders, listed through the storage emulator ------------------------------------


@pytest.fixture(scope="module")
def zoo():
    emu = Emulator()
    try:
        for name in ("models/a.gguf", "models/README.md", "models/.tmp.gguf", "models/vis/m.gguf",
                     "models/vis/mmproj-f16.gguf", "models/big/x-00001-of-00002.gguf",
                     "models/big/x-00002-of-00002.gguf", "models/deep/er/z.gguf",
                     "models/top-00001-of-00002.gguf", "models/top-00002-of-00002.gguf",
                     "bad/mmproj-f16.gguf", "bad/m.gguf"):
            emu.upload("zoo", name, data=b"GGUF" * 100)
        yield emu
    finally:
        emu.stop()


def gs(zoo: Emulator, tmp_path: Path, **kw) -> Settings:
    return Settings(storage_emulator_host=zoo.url, model_cache_dir=tmp_path / "cache", **kw)


def test_a_gs_models_dir_follows_the_same_rules(zoo, tmp_path):
    cat = build(gs(zoo, tmp_path, models_dir="gs://zoo/models"))
    assert cat.names == ("a", "big", "top", "vis")
    assert cat.get("a").source == "gs://zoo/models/a.gguf"
    vis = cat.get("vis")
    assert vis.source == "gs://zoo/models/vis/" and vis.files == ("gs://zoo/models/vis/m.gguf",)
    assert vis.projector == "gs://zoo/models/vis/mmproj-f16.gguf"
    assert cat.get("big").files == tuple(f"gs://zoo/models/big/x-0000{i}-of-00002.gguf"
                                         for i in (1, 2))
    assert cat.get("big").size == 800
    assert cat.get("top").source == "gs://zoo/models/top-00001-of-00002.gguf"
    assert len(cat.get("top").files) == 2
    assert not (tmp_path / "cache").exists()  # listed, never downloaded


def test_gs_sources_in_models_and_their_errors(zoo, tmp_path):
    cat = build(gs(zoo, tmp_path, models="x=gs://zoo/models/big/x-00001-of-00002.gguf"))
    assert len(cat.get("x").files) == 2
    with pytest.raises(CatalogError, match="MODELS_DIR gs://zoo/bad: the projector "
                                           "mmproj-f16.gguf at the top pairs with no model"):
        build(gs(zoo, tmp_path, models_dir="gs://zoo/bad"))
    with pytest.raises(CatalogError, match=r"model y \(MODELS\): model gs://zoo/nope.gguf: no "
                                           "such object"):
        build(gs(zoo, tmp_path, models="y=gs://zoo/nope.gguf"))
    with pytest.raises(CatalogError, match="model big is 0.00 GB in Cloud Storage, more than "
                                           "MODEL_CACHE_MAX_GB"):
        build(gs(zoo, tmp_path, models_dir="gs://zoo/models", model_cache_max_gb=5e-7))
