"""What the llama.cpp engine needs of the settings, in one frozen record.

Its own module because both the engine and the model loader (app.engine.llama_model) read it,
and the composition root builds it (app.engine_config) without importing llama.cpp.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from app.engine.types import ModelInfo

# at exit, the most seconds the prompts' writes to PROMPT_CACHE_DIR may add (Cloud Run sends
# SIGKILL 10 s after SIGTERM); a file not finished by then is absent, never half written
PERSIST_EXIT_SECONDS = 8.0


@dataclass(frozen=True)
class EngineConfig:
    """What the engine needs of the settings. Each field named like a setting is that setting
    (``app.settings.from_settings`` fills them by name); the rest are derived from settings by
    the caller. No defaults, so none can drift from the settings' (the engine knows nothing of
    where its configuration comes from)."""

    ctx_size: int
    gpu_layers: int
    threads: int
    threads_batch: int
    batch_size: int
    flash_attn: Literal["auto", "on", "off"]
    cpu_extra_buffers: Literal["auto", "on", "off"]
    max_queue: int
    max_queue_per_key: int  # 0: half of max_queue
    sleep_idle_seconds: float
    parallel: int
    prefill_chunk: int
    prompt_cache_ram_mb: int  # 0: off
    prompt_cache_min_tokens: int
    prompt_cache_dir: str | None  # a folder or gs:// prefix; None: prompts die with the process
    prompt_cache_disk_mb: int
    storage_emulator_host: str | None  # for a gs:// PROMPT_CACHE_DIR (tests, benchmarks)
    warm_up: Literal["auto", "full", "light"]  # auto, in the engine: full
    load_priority: Literal["normal", "low"]
    served_model_name: str | None
    model_tags: str | None
    max_prompt_bytes: int  # 0: context x longest token
    prompt_logprobs_max_tokens: int  # longest prompt a request may score
    grammar_max_step_ms: float
    split_mode: str
    tensor_split: str | None
    main_gpu: int
    embeddings: Literal["auto", "on", "off", "only"]
    embedding_pooling: str
    embedding_ctx: int
    embedding_batch: int
    mmproj_offload: bool
    kv_cache_type_k: str
    kv_cache_type_v: str
    n_ubatch: int
    cpu_moe: bool
    n_cpu_moe: int
    override_tensor: str | None
    memory_check: Literal["warn", "error", "off"]
    memory_margin_gb: float
    memory_budget_gb: str | None
    spec_mtp: Literal["auto", "on", "off"]
    spec_mtp_draft_max: int
    spec_ngram: bool
    spec_adaptive: bool
    spec_draft_max: int
    spec_draft_min: int
    spec_p_min: float
    deterministic: bool
    image_cache_mb: int
    # derived
    chat_template: str | None  # the template's text (None: the GGUF's own)
    verbose: bool  # llama.cpp's own logging
    # markers the reply parsers read (app.formats.preserved_tokens): some models make them
    # control tokens, which llama.cpp leaves out of the text unless asked
    preserved_tokens: tuple[str, ...]
    # the text every chat starts with, for the model's card (app.core.plan.opening): decoded
    # at load and left in the KV cache, so the first requests reuse it as later ones do
    opening: Callable[[ModelInfo], str | None] | None


def n_threads(cfg: EngineConfig) -> int:
    """THREADS, resolved (0: every core this process may run on)."""
    return cfg.threads or len(os.sched_getaffinity(0))
