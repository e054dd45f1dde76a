"""Where the model file comes from: a local path, file:// URI, or the cached default model."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path

from app.base.errors import ModelLoadError
from app.base.state import LoadState
from app.engine.lora import AdapterFile
from app.model import gcs
from app.model.default import SHA256, default_model_path, sha256_of
from app.model.gcs_download import DownloadOptions, Progress, fetch_model
from app.settings import Settings, lora_entries


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
        if sha256_of(path) != SHA256:  # the cache is a plain directory: check what is served
            raise ModelLoadError(
                f"the default model at {path} does not match its sha256: delete it and run "
                "`vertex-gguf fetch-default-model` again"
            )
        return str(path)
    if source.startswith("gs://"):
        state.begin_download(source)
        path = fetch_model(source, DownloadOptions.from_settings(settings),
                           on_progress=partial(_on_progress, state, source))
        return str(path)
    if source.startswith("file://"):
        source = source[len("file://"):]
    path = Path(source)
    if path.is_dir():
        return str(_local_dir_model(path, settings.model_file, source))
    return str(path)


def resolve_projector(settings: Settings, state: LoadState) -> str | None:
    """A local path to the vision projector: MMPROJ (a path, file:// or gs:// URI), else the
    one ``mmproj*.gguf`` beside the model in its directory (local or gs://); None without."""
    source = settings.mmproj
    if source == "none":  # a directory's projector left unpaired
        return None
    opts = DownloadOptions.from_settings(settings)
    if source is None:
        model = settings.model
        if model is None:
            return None
        if model.startswith("gs://"):
            try:
                source = gcs.find_projector(model, opts.emulator_host)
            except gcs.GcsError as exc:
                raise ModelLoadError(str(exc)) from None
            if source is None:
                return None
        else:
            folder = Path(model[len("file://"):] if model.startswith("file://") else model)
            if not folder.is_dir():
                return None
            found = [gcs.GcsObject("local", p.name, p.stat().st_size, 0, "")
                     for p in sorted(folder.glob("*.gguf"))]
            try:
                chosen = gcs.pick_projector(found, model)
            except gcs.GcsError as exc:
                raise ModelLoadError(str(exc)) from None
            return str(folder / chosen.name) if chosen else None
    return _one_file(source, "MMPROJ", opts, state)


def resolve_draft(settings: Settings, state: LoadState) -> str | None:
    """A local path to DRAFT_MODEL (a path, file:// or gs:// URI: downloaded, verified and
    cached as the model is); None without one."""
    if settings.draft_model is None:
        return None
    return _one_file(settings.draft_model, "DRAFT_MODEL", DownloadOptions.from_settings(
        settings), state)


def resolve_adapters(settings: Settings, state: LoadState) -> list[AdapterFile]:
    """LORA_ADAPTERS, each a local file (fetched and verified as the model is)."""
    opts = DownloadOptions.from_settings(settings)
    return [AdapterFile(name, _one_file(source, f"LORA_ADAPTERS {name}", opts, state), scale)
            for name, source, scale in lora_entries(settings.lora_adapters)]


def _one_file(source: str, setting: str, opts: DownloadOptions, state: LoadState) -> str:
    """A second GGUF beside the model, named by ``setting``: fetched from Cloud Storage into
    the cache, or a local file that must exist."""
    if source.startswith("gs://"):
        state.begin_download(source)
        try:
            return str(fetch_model(source, replace(opts, model_file=None),
                                   on_progress=partial(_on_progress, state, source)))
        except gcs.GcsError as exc:
            raise ModelLoadError(str(exc).replace("model ", f"{setting} ", 1)) from None
    path = Path(source[len("file://"):] if source.startswith("file://") else source)
    if not path.is_file():
        raise ModelLoadError(f"{setting} {source}: file not found")
    return str(path)


def _local_dir_model(path: Path, model_file: str | None, source: str) -> Path:
    """The same choice rules as a gs:// directory (a Cloud Run volume mount looks like this)."""
    found = [
        gcs.GcsObject("local", p.name, p.stat().st_size, 0, "")
        for p in sorted(path.glob("*.gguf"))
    ]
    try:
        chosen = gcs.pick_model(found, model_file, source)
    except gcs.GcsError as exc:
        raise ModelLoadError(str(exc)) from None
    return path / chosen[0].name


def _on_progress(state: LoadState, source: str, progress: Progress) -> None:
    """A download's figures to /health and /models/sse (summed with the others under way: the
    projector, draft model and adapters download beside the model); while it waits for another
    download of the same object (another model naming it), the detail says so."""
    detail = f"{source}: {progress.waiting}" if progress.waiting else source
    state.set_download(progress.done, progress.total, progress.rate, progress.eta, detail,
                       source=source)
