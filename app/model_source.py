"""Where the model file comes from: a local path, file:// URI, or the cached default model."""

from __future__ import annotations

from pathlib import Path

from app.default_model import default_model_path
from app.engine.llama_engine import ModelLoadError
from app.settings import Settings
from app.state import LoadState


def resolve(settings: Settings, state: LoadState) -> str:
    """Return a local path to the GGUF to load (downloading it first when it is remote)."""
    source = settings.model
    if source is None:
        path = default_model_path(settings.model_cache_dir)
        if not path.is_file():
            raise ModelLoadError(
                f"no model configured (MODEL, --model or AIP_STORAGE_URI) and the default model "
                f"is not cached at {path}: run `vertex-gguf fetch-default-model` first"
            )
        return str(path)
    if source.startswith("gs://"):
        raise ModelLoadError(f"model {source}: gs:// models are not supported yet")
    if source.startswith("file://"):
        source = source[len("file://"):]
    path = Path(source)
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) != 1:
            names = ", ".join(p.name for p in ggufs) or "none"
            raise ModelLoadError(
                f"model {source}: a directory must hold exactly one .gguf file (found: {names})"
            )
        path = ggufs[0]
    return str(path)
