"""Where the vision projector comes from (app.model.source.resolve_projector): MMPROJ, or the
one mmproj*.gguf beside the model in its directory; never taken for the model itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.base.errors import ModelLoadError
from app.base.state import LoadState
from app.model import gcs, source
from app.settings import Settings


def settings(**kw) -> Settings:
    return Settings(**kw)


def touch(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"GGUF" + name.encode())
    return folder


def resolve(**kw) -> str | None:
    return source.resolve_projector(settings(**kw), LoadState())


def test_a_directory_pairs_its_one_projector(tmp_path):
    d = touch(tmp_path / "m", "model-Q4_K_M.gguf", "mmproj-model-f16.gguf")
    assert resolve(model=str(d)) == str(d / "mmproj-model-f16.gguf")
    assert resolve(model=f"file://{d}") == str(d / "mmproj-model-f16.gguf")
    # and the model chosen from it is the model
    assert source.resolve(settings(model=str(d)), LoadState()) == str(d / "model-Q4_K_M.gguf")


def test_no_projector_or_a_model_file_pairs_nothing(tmp_path):
    d = touch(tmp_path / "m", "model.gguf")
    assert resolve(model=str(d)) is None
    assert resolve(model=str(d / "model.gguf")) is None
    assert resolve() is None  # the default model


def test_two_projectors_need_mmproj(tmp_path):
    d = touch(tmp_path / "m", "model.gguf", "mmproj-a.gguf", "mmproj-b.gguf")
    with pytest.raises(ModelLoadError, match="2 projectors.*set MMPROJ"):
        resolve(model=str(d))
    assert resolve(model=str(d), mmproj=str(d / "mmproj-b.gguf")) == str(d / "mmproj-b.gguf")


def test_mmproj_none_leaves_a_directory_unpaired(tmp_path):
    d = touch(tmp_path / "m", "model.gguf", "mmproj-model.gguf")
    assert resolve(model=str(d), mmproj="none") is None


def test_a_missing_mmproj_file_is_a_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="MMPROJ .*file not found"):
        resolve(mmproj=str(tmp_path / "nope.gguf"))


def test_a_projector_is_never_picked_as_the_model():
    objs = [gcs.GcsObject("b", n, 1, 0, "") for n in ("m/mmproj-x.gguf", "m/x.gguf")]
    assert [o.name for o in gcs.pick_model(objs, None, "gs://b/m/")] == ["m/x.gguf"]
    assert gcs.pick_projector(objs, "gs://b/m/").name == "m/mmproj-x.gguf"
