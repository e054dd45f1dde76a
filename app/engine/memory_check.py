"""The pre-load memory check (MEMORY_CHECK): before llama.cpp loads a model, estimate what the
model and every context the server opens on it will take per device (app.engine.footprint),
compare it with the budget (app.engine.memory_budget), and say so in one log line. With
MEMORY_CHECK=error a model that cannot fit fails its load with a message naming what it needs
per device, what is free, and the settings that would make it fit, instead of an out-of-memory
abort (or the kernel's OOM killer) in the middle of loading.

What the server opens, as app.engine.llama_model does: the generation context (PARALLEL slots of
CTX_SIZE cells, one stream per slot, the micro-batch N_UBATCH), the embedding context when
EMBEDDINGS asks for one, the draft model and its context (DRAFT_MODEL), the projector (MMPROJ)
and the LoRA adapters (LORA_ADAPTERS).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.base.errors import ModelLoadError
from app.engine import memory_budget, placement
from app.engine.config import EngineConfig
from app.engine.footprint import Context, Footprint, Layout, estimate, projector, tensor_device
from app.engine.logprobs import rows_per_step
from app.engine.lora import AdapterFile
from app.engine.memory_budget import GIB, Budget
from app.engine.model_shape import ModelShape, shape_of
from app.model.gguf_header import GgufError, GgufHeader, read_header, read_model

log = logging.getLogger(__name__)

CAUSAL_RANK_UBATCH = 512  # app.engine.llama_embed's: a decoder reranker's micro-batch
EMBED_MAX_CTX, GENERATIVE_EMBED_MAX_CTX = 8192, 2048  # app.engine.llama_embed's caps


@dataclass
class Files:
    """The GGUF headers a load reads, each once: the model, and what opens beside it."""

    model: GgufHeader
    draft: GgufHeader | None = None
    projector: GgufHeader | None = None
    adapters: list[GgufHeader] = field(default_factory=list)
    gpus: tuple[str, ...] = ()  # the GPUs llama.cpp sees, in its order
    gpu_free: tuple[float, ...] = ()  # their free memory: llama.cpp's default split
    shape: ModelShape | None = None

    def __post_init__(self) -> None:
        self.shape = self.shape or shape_of(self.model)


def _gib(n: int) -> str:
    return f"{n / GIB:.2f}"


def embedding_mode(cfg: EngineConfig, h: GgufHeader) -> str:
    """EMBEDDINGS resolved as app.engine.llama_model does, from the header."""
    embedding_model = h.arch("attention.causal") is False or h.arch("pooling_type") is not None
    mode = cfg.embeddings
    if mode == "auto":
        mode = "only" if embedding_model else "off"
    return mode


def _contexts(cfg: EngineConfig, files: Files) -> list[Context]:
    h, shape = files.model, files.shape
    assert shape is not None
    flash = cfg.flash_attn != "off"
    n_ctx_train = int(h.arch("context_length", 0) or 0)
    mode = embedding_mode(cfg, h)
    out = []
    if mode != "only":
        n_slot = cfg.ctx_size or n_ctx_train or 4096
        n_batch = max(cfg.batch_size, cfg.prefill_chunk + cfg.parallel)
        drafts = 0 if any(shape.recurrent) else cfg.spec_draft_max
        rows = max(min(n_batch, cfg.parallel * (1 + drafts)),
                   rows_per_step(shape.n_vocab, cfg.prefill_chunk))
        out.append(Context("generation", n_slot * cfg.parallel, cfg.parallel,
                           min(n_batch, cfg.n_ubatch or 512), rows, cfg.kv_cache_type_k,
                           cfg.kv_cache_type_v, flash))
    if mode in ("on", "only"):
        cap = EMBED_MAX_CTX if mode == "only" else GENERATIVE_EMBED_MAX_CTX
        n_ctx = cfg.embedding_ctx or min(n_ctx_train or cap, cap)
        pooling = cfg.embedding_pooling
        if pooling == "auto":
            pooling = "rank" if h.arch("pooling_type") == 4 else "mean"
        ubatch = min(n_ctx, CAUSAL_RANK_UBATCH) if pooling == "rank" and shape.causal else n_ctx
        n_seq = min(cfg.embedding_batch, n_ctx)
        out.append(Context("embeddings", n_ctx, n_seq, ubatch, n_seq, flash_attn=flash,
                           kv_unified=True, embeddings=True))
    return out


def layout(cfg: EngineConfig, files: Files, gpu_layers: int | None = None) -> Layout:
    shares: tuple[float, ...] = files.gpu_free
    if cfg.tensor_split:
        shares = tuple(float(p) for p in cfg.tensor_split.split(","))
    return Layout(gpus=files.gpus, gpu_layers=cfg.gpu_layers if gpu_layers is None else gpu_layers,
                  split_mode=cfg.split_mode, main_gpu=cfg.main_gpu, split=shares,
                  overrides=tuple(placement.rules(cfg.override_tensor, cfg.cpu_moe,
                                                  cfg.n_cpu_moe)))


def footprint(cfg: EngineConfig, files: Files) -> Footprint:
    """Everything the load opens, per device."""
    lay = layout(cfg, files)
    contexts = _contexts(cfg, files)
    fp = estimate(files.model, lay, contexts, files.shape)
    gen = next((c for c in contexts if c.role == "generation"), None)
    if files.draft is not None and gen is not None:
        dshape = shape_of(files.draft)
        if not any(files.shape.recurrent):  # type: ignore[union-attr]
            dlay = dataclasses.replace(lay, overrides=())
            fp.merge(estimate(files.draft, dlay, [Context(
                "draft", gen.n_ctx, gen.n_seq, min(gen.n_ubatch, 512), gen.n_seq,
                flash_attn=gen.flash_attn)], dshape))
    if files.projector is not None and gen is not None:
        gpus = lay.used_gpus()
        on_gpu = cfg.mmproj_offload and bool(gpus)
        fp.merge(projector(files.projector, gpus[0] if on_gpu else "CPU"))
    devices = lay.devices(files.shape.n_layer)  # type: ignore[union-attr]
    for adapter in files.adapters:
        for t in adapter.tensors:
            base = t.name.rsplit(".lora_", 1)[0]
            fp.at(tensor_device(base, devices, lay.overrides)).weights += t.nbytes
    return fp


@dataclass
class Verdict:
    footprint: Footprint
    budget: Budget
    over: list[str]  # the devices whose need exceeds their budget
    hints: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.over

    def _device(self, dev: str) -> str:
        n = self.footprint.devices[dev]
        parts = f"weights {_gib(n.weights)}, KV cache {_gib(n.kv)}, compute {_gib(n.compute)}"
        if n.output:
            parts += f", output {_gib(n.output)}"
        return f"{dev} needs {_gib(n.total)} GiB ({parts}), {self._room(dev)}"

    def _room(self, dev: str) -> str:
        room, f = self.budget.of(dev), self.budget.free.get(dev)
        if room is None:
            return "free memory unknown"
        free = f.free if f is not None and f.total > 0 else None
        if free is not None and room < free - self.budget.margin:
            return f"budget {_gib(room)} GiB (MEMORY_BUDGET_GB; {_gib(free)} GiB free)"
        if free is None:
            return f"budget {_gib(room)} GiB (MEMORY_BUDGET_GB)"
        return (f"{_gib(room)} GiB free ({_gib(free)} GiB less the "
                f"{_gib(self.budget.margin)} GiB margin, MEMORY_MARGIN_GB)")

    def line(self) -> str:
        """The start-up log line."""
        devs = "; ".join(self._device(d) for d in _sorted(self.footprint.devices))
        return f"memory estimate: {devs}: {'fits' if self.fits else 'does NOT fit'}"

    def message(self, path: str) -> str:
        over = "; ".join(self._device(d) for d in self.over)
        hint = (" It would fit with " + ", or ".join(self.hints) + ".") if self.hints else (
            " No one setting makes it fit (GPU_LAYERS, CTX_SIZE, PARALLEL, N_UBATCH, a q8_0 KV "
            "cache were tried): use a smaller quantization, or a machine with more memory.")
        return (f"model {path}: not enough memory to load it: {over}.{hint} MEMORY_CHECK=warn "
                "loads it anyway.")

    def as_dict(self) -> dict:
        return {"estimate": self.footprint.as_dict(), "budget": self.budget.as_dict(),
                "margin": self.budget.margin, "fits": self.fits, "over": list(self.over),
                "notes": list(self.footprint.notes)}


def _sorted(devices: Sequence[str]) -> list[str]:
    return sorted(devices, key=lambda d: (d != "CPU", d))


def _over(fp: Footprint, budget: Budget) -> list[str]:
    out = []
    for dev in _sorted(list(fp.devices)):
        room = budget.of(dev)
        if room is not None and fp.need(dev) > room:
            out.append(dev)
    return out


def judge(cfg: EngineConfig, files: Files, budget: Budget) -> Verdict:
    fp = footprint(cfg, files)
    verdict = Verdict(fp, budget, _over(fp, budget))
    if not verdict.fits:
        verdict.hints = hints(cfg, files, budget)
    return verdict


def _fits(cfg: EngineConfig, files: Files, budget: Budget) -> bool:
    return not _over(footprint(cfg, files), budget)


def _largest(lo: int, hi: int, ok) -> int | None:
    """The largest n in [lo, hi] with ok(n), ok being monotone (true up to some n)."""
    if hi < lo or not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def _smallest(lo: int, hi: int, ok) -> int | None:
    """The smallest n in [lo, hi] with ok(n), ok being monotone (false up to some n)."""
    if hi < lo or not ok(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid + 1, hi)
    return lo


def hints(cfg: EngineConfig, files: Files, budget: Budget) -> list[str]:
    """The settings that would make the model fit, each changed alone."""
    shape = files.shape
    assert shape is not None
    out = []

    def fits(**changes: object) -> bool:
        return _fits(dataclasses.replace(cfg, **changes), files, budget)

    if files.gpus and cfg.gpu_layers != 0:
        n = _largest(0, shape.n_layer, lambda k: fits(gpu_layers=k))
        if n is not None:
            out.append(f"GPU_LAYERS={n}")
        if shape.n_expert and not cfg.cpu_moe:
            k = _smallest(1, shape.n_layer, lambda k: fits(n_cpu_moe=k))
            if k is not None:
                out.append(f"N_CPU_MOE={k}")
    n_train = int(files.model.arch("context_length", 0) or 0)
    slot = cfg.ctx_size or n_train or 4096
    if embedding_mode(cfg, files.model) != "only":
        ctx = _largest(1, max(slot // 256 - 1, 0), lambda k: fits(ctx_size=k * 256))
        if ctx is not None:
            out.append(f"CTX_SIZE={ctx * 256}")
        if cfg.parallel > 1:
            par = _largest(1, cfg.parallel - 1, lambda k: fits(parallel=k))
            if par is not None:
                out.append(f"PARALLEL={par}")
        ubatch = cfg.n_ubatch or 512
        small = [u for u in (256, 128, 64) if u < ubatch]
        if small and (u := next((u for u in small if fits(n_ubatch=u)), None)) is not None:
            out.append(f"N_UBATCH={u}")
        if cfg.kv_cache_type_k in ("f32", "f16", "bf16") and cfg.flash_attn != "off" \
                and fits(kv_cache_type_k="q8_0", kv_cache_type_v="q8_0"):
            out.append("KV_CACHE_TYPE_K=q8_0 and KV_CACHE_TYPE_V=q8_0")
    if cfg.embeddings == "on" and fits(embeddings="off"):
        out.append("EMBEDDINGS=off")
    return out


def check(cfg: EngineConfig, files: Files, budget: Budget, path: str) -> Verdict:
    """Judge, log, and under MEMORY_CHECK=error refuse: ModelLoadError with the message."""
    verdict = judge(cfg, files, budget)
    for note in verdict.footprint.notes:
        log.info("memory estimate: %s", note)
    if verdict.fits:
        log.info("%s", verdict.line())
        return verdict
    log.warning("%s", verdict.line())
    if cfg.memory_check == "error":
        raise ModelLoadError(verdict.message(path))
    log.warning("%s", verdict.message(path).replace(" MEMORY_CHECK=warn loads it anyway.",
                                                    " Loading it anyway (MEMORY_CHECK=warn)."))
    return verdict


def run(ll, cfg: EngineConfig, path: str, mmproj: str | None, draft: str | None,
        adapters: Sequence[AdapterFile], gpu_offload: bool) -> Verdict | None:
    """The check before a load (None: MEMORY_CHECK=off, or a header this reader cannot read:
    llama.cpp then judges the file itself)."""
    if cfg.memory_check == "off":
        return None
    try:
        files = Files(read_model(path), draft=read_model(draft) if draft else None,
                      projector=read_header(mmproj) if mmproj else None,
                      adapters=[read_header(a.path) for a in adapters])
    except (GgufError, OSError, ValueError) as exc:
        log.warning("memory check skipped: %s", exc)
        return None
    try:
        gpus = memory_budget.gpus(ll) if gpu_offload else []
    except (ModelLoadError, OSError, AttributeError) as exc:  # no ggml to ask
        log.warning("memory check skipped: the GPUs could not be listed (%s)", exc)
        return None
    files.gpus = tuple(g.device for g in gpus)
    files.gpu_free = tuple(float(g.free) for g in gpus)
    budget = memory_budget.budget([memory_budget.host(), *gpus], cfg.memory_margin_gb,
                                  cfg.memory_budget_gb)
    unknown = sorted(set(budget.caps) - set(budget.free))
    if unknown:
        log.warning("MEMORY_BUDGET_GB names %s, which this machine does not have; it has %s",
                    ", ".join(unknown), ", ".join(budget.free))
    return check(cfg, files, budget, path)
