"""The pool's memory budget (issue 50, docs/models.md): what each model will take, estimated
from its GGUF header as the single-model memory check does (app.engine.memory_check), and the
room there is for models, measured once at start.

``estimate(spec, config_of)`` reads the model's own settings (its CTX_SIZE, PARALLEL, KV cache
types, GPU_LAYERS, EMBEDDINGS, draft model, projector, LoRA adapters) and its files' headers,
never the weights. A ``gs://`` model's files are read from the download cache (MODEL_CACHE_DIR)
once there; a model whose files are not here yet counts the bytes of its files as listed
(``spec.size``), or nothing when that is unknown. The pool estimates again after each load, so
a model downloaded by its first load is counted by its header from then on.

``measure(settings, specs)`` is what is free at start less MEMORY_MARGIN_GB, capped by
MEMORY_BUDGET_GB: the web process's own memory is used already when it is measured, and a model
loaded later is counted by its estimate, never measured again. Host RAM needs no llama.cpp (the
cgroup's room, MemAvailable). A GPU's free memory is ggml's, and the web process never loads
llama.cpp (the engines run in processes of their own): where a GPU is present and a model may
offload to it, a short-lived process reads it (``probe_gpus``); when that fails the budget is
off (MODELS_MAX alone bounds the pool) and a log line says so.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.engine import memory_budget, memory_check
from app.engine.config import EngineConfig
from app.engine.memory_budget import GIB, Free
from app.model import gcs, gcs_cache
from app.model.catalog.spec import ModelSpec
from app.model.gguf_header import GgufError, read_header, read_model
from app.settings import Settings, lora_entries

log = logging.getLogger(__name__)

ConfigOf = Callable[[Settings], EngineConfig]

# where a GPU shows itself without a driver library: NVIDIA's driver, AMD's ROCm
GPU_MARKERS = ("/proc/driver/nvidia/gpus", "/dev/nvidiactl", "/dev/kfd")


def _local(source: str | None, base: str | None = None, cache: Path | None = None) -> str | None:
    """The local file ``source`` names (a path or file:// URI; relative: under ``base``; a
    gs:// object: its copy in the cache ``cache``, once downloaded), or None: not here."""
    if not source:
        return None
    if source.startswith("gs://") and cache is not None:
        try:
            bucket, name = gcs.parse_uri(source)
            path = gcs_cache.cache_path(cache, gcs.GcsObject(bucket, name, 0, 0, ""))
        except gcs.GcsError:
            return None
        return str(path) if path.is_file() else None  # renamed in only once verified
    if "://" in source and not source.startswith("file://"):
        return None
    path = Path(source[len("file://"):] if source.startswith("file://") else source)
    if not path.is_absolute() and base is not None:
        root = Path(base[len("file://"):] if base.startswith("file://") else base)
        path = (root if root.is_dir() else root.parent) / path
    return str(path) if path.is_file() else None


def files_of(spec: ModelSpec) -> memory_check.Files | None:
    """The headers a load of ``spec`` reads, or None when one of its files is not here."""
    s = spec.settings
    cache = Path(s.model_cache_dir)
    model = _local(spec.files[0] if spec.files else spec.source, spec.source, cache)
    if model is None:
        return None
    projector = None
    if spec.projector and s.mmproj != "none":
        projector = _local(spec.projector, spec.source, cache)
        if projector is None:
            return None
    draft = _local(s.draft_model, cache=cache) if s.draft_model else None
    if s.draft_model and draft is None:
        return None
    adapters = [_local(src, cache=cache) for _, src, _ in lora_entries(s.lora_adapters)]
    if any(a is None for a in adapters):
        return None
    return memory_check.Files(read_model(model), draft=read_model(draft) if draft else None,
                              projector=read_header(projector) if projector else None,
                              adapters=[read_header(a) for a in adapters if a])


def estimate(spec: ModelSpec, config_of: ConfigOf,
             gpus: Sequence[Free] = ()) -> dict[str, int] | int | None:
    """Bytes per device the model will take (the memory check's footprint of its own settings,
    its layers split over ``gpus`` as llama.cpp would: ``Room.gpus``), else the bytes of its
    files, else None."""
    s = spec.settings
    if s.memory_check == "off":
        return None
    try:
        files = files_of(spec)
    except (GgufError, OSError, ValueError) as exc:
        log.info("model %s: no memory estimate from its header (%s)", spec.name, exc)
        files = None
    if files is None:
        return spec.size
    files.gpus = tuple(g.device for g in gpus)
    files.gpu_free = tuple(float(g.free) for g in gpus)
    fp = memory_check.footprint(config_of(s), files)
    return {dev: fp.need(dev) for dev in fp.devices}


def gpu_present(markers: Iterable[str] = GPU_MARKERS) -> bool:
    return any(os.path.exists(m) for m in markers)


# run in a process of its own: llama.cpp's ggml lists the GPUs and reads their free memory, the
# very reading (and device names) an engine's MEMORY_CHECK uses; the web process imports none
PROBE = ("import json; from llama_cpp import llama_cpp as ll; from app.engine import memory_budget;"
         " ll.llama_backend_init(); gpus = memory_budget.gpus(ll) "
         "if ll.llama_supports_gpu_offload() else []; "
         "print(json.dumps([[g.device, g.free, g.total] for g in gpus]))")


def probe_gpus(timeout: float = 120.0) -> list[Free] | None:
    """Each GPU's free memory as ggml reads it, from a short-lived process (its CUDA context is
    in use while it reads: the reading errs low by that); None: it could not tell."""
    try:
        done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                              timeout=timeout, check=True)
        rows = json.loads(done.stdout.strip().splitlines()[-1])
        return [Free(str(dev), int(free), int(total), "ggml_backend_dev_memory, read at start")
                for dev, free, total in rows]
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, TypeError) as exc:
        detail = getattr(exc, "stderr", None) or ""
        log.warning("memory budget: the GPUs could not be read (%s) %s", exc,
                    detail.strip().splitlines()[-1] if detail.strip() else "")
        return None


@dataclass(frozen=True)
class Room:
    """The room for models, measured at start: bytes per device (None: no budget), and the GPUs
    seen (their free memory splits a model's layers, as llama.cpp's default split does)."""

    budget: dict[str, int] | None
    gpus: tuple[Free, ...] = ()


def measure(settings: Settings, specs: Iterable[ModelSpec] = (),
            gpu: Callable[[], bool] | None = None,
            probe: Callable[[], list[Free] | None] | None = None) -> Room:
    """What every loaded model may take together, per device, measured now (at start): host
    memory free (the cgroup's room, MemAvailable) and, where a GPU is present and a model may
    offload to it, each GPU's free memory read by a probe process; less MEMORY_MARGIN_GB,
    capped by MEMORY_BUDGET_GB. No budget with MEMORY_CHECK=off, or GPUs that cannot be read."""
    if settings.memory_check == "off":
        log.info("memory budget: off (MEMORY_CHECK=off): MODELS_MAX alone bounds the models")
        return Room(None)
    gpus: list[Free] = []
    if (gpu or gpu_present)() and any(spec.settings.gpu_layers != 0 for spec in specs):
        read = (probe or probe_gpus)()
        if read is None:
            log.warning("memory budget: off: a GPU is present and its free memory could not be "
                        "read; MODELS_MAX alone bounds the models (each engine's own "
                        "MEMORY_CHECK still runs at its load)")
            return Room(None)
        gpus = read
    host = memory_budget.host()
    budget = memory_budget.budget([host, *gpus], settings.memory_margin_gb,
                                  settings.memory_budget_gb)
    if budget.of("CPU") is None:
        log.warning("memory budget: off: host memory is unknown (%s)", host.source)
        return Room(None)
    out = {dev: n for dev in budget.free if (n := budget.of(dev)) is not None}
    said = "; ".join(
        f"{dev} {out[dev] / GIB:.2f} GiB ({f.free / GIB:.2f} GiB free by {f.source}, less the "
        f"{settings.memory_margin_gb:.2f} GiB margin"
        f"{', capped by MEMORY_BUDGET_GB' if dev in budget.caps else ''})"
        for dev, f in budget.free.items())
    log.info("memory budget for models: %s%s", said,
             "" if gpus else "; no GPU counted")
    return Room(out, tuple(gpus))
