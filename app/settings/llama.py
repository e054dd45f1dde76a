"""llama.cpp and its scheduler: the context and its slots, devices and placement, batching, the KV
cache, threads, the queue, idle sleep, and the reasoning and tool-call formats. One part of
app.settings.Settings.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from app import formats
from app.settings.fields import (
    UNQUANTIZED_KV,
    KvCacheType,
    ReasoningFormatName,
    ToolFormatName,
    env,
)


class LlamaSettings(BaseModel):
    """llama.cpp and its scheduler."""

    # --- llama.cpp ---------------------------------------------------------------------------
    ctx_size: int = Field(
        4096,
        description="Context size in tokens per slot (0: the model's training context).",
        ge=0,
        le=1 << 20,
        **env("CTX_SIZE"),
    )
    gpu_layers: int = Field(
        -1,
        description="Layers offloaded to the GPU (-1: all of them when a GPU is present; "
        "0: CPU only).",
        ge=-1,
        le=100_000,
        **env("GPU_LAYERS"),
    )
    split_mode: Literal["none", "layer", "row"] = Field(
        "layer",
        description="How a model is spread over several GPUs: layer (whole layers and their KV "
        "cache per GPU, llama.cpp's default), row (each layer's rows across GPUs: tensor "
        "parallelism where supported), none (all on MAIN_GPU).",
        **env("SPLIT_MODE"),
    )
    tensor_split: str | None = Field(
        None,
        description="Share of the model per GPU, comma-separated proportions in device order "
        "(e.g. 3,1 puts three quarters on GPU 0); none: by free memory.",
        max_length=256,
        pattern=r"^\s*\d+(\.\d+)?(\s*,\s*\d+(\.\d+)?)*\s*$",
        **env("TENSOR_SPLIT"),
    )
    main_gpu: int = Field(
        0,
        description="The GPU that holds the whole model with SPLIT_MODE=none (and small "
        "tensors with row).",
        ge=0,
        le=63,
        **env("MAIN_GPU"),
    )
    threads: int = Field(
        0,
        description="CPU threads for generation (0: the CPUs this process may use).",
        ge=0,
        le=1024,
        **env("THREADS"),
    )
    threads_batch: int = Field(
        0,
        description="CPU threads for prompt processing (0: same as threads).",
        ge=0,
        le=1024,
        **env("THREADS_BATCH"),
    )
    batch_size: int = Field(
        512,
        description="Most prompt tokens decoded in one llama_decode call.",
        ge=8,
        le=65536,
        **env("BATCH_SIZE"),
    )
    flash_attn: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Flash attention: auto, on or off.",
        **env("FLASH_ATTN"),
    )
    kv_cache_type_k: KvCacheType = Field(
        "f16",
        description="Data type of the KV cache's keys: f16 (llama.cpp's default), bf16, f32, "
        "or a quantized type (q8_0 halves the cache at a small cost in quality; q4_0, q4_1, "
        "q5_0, q5_1 and iq4_nl shrink it further).",
        **env("KV_CACHE_TYPE_K"),
    )
    kv_cache_type_v: KvCacheType = Field(
        "f16",
        description="Data type of the KV cache's values, as KV_CACHE_TYPE_K; a quantized type "
        "needs flash attention (FLASH_ATTN auto turns it on, off is refused at start).",
        **env("KV_CACHE_TYPE_V"),
    )
    n_ubatch: int = Field(
        0,
        description="Physical micro-batch: the most tokens llama.cpp computes in one pass of a "
        "decode (0: the logical batch, at most 512). Larger speeds prompt processing on a GPU "
        "at the cost of compute-buffer memory; it never exceeds the logical batch.",
        ge=0,
        le=65536,
        **env("N_UBATCH"),
    )
    cpu_moe: bool = Field(
        False,
        description="Keep every mixture-of-experts expert tensor in host memory (llama-server's "
        "--cpu-moe): the attention and shared weights go to the GPU, the experts stay on the "
        "CPU. Fits a large MoE on a small GPU.",
        **env("CPU_MOE"),
    )
    n_cpu_moe: int = Field(
        0,
        description="Keep the expert tensors of the first N layers in host memory (llama-server's "
        "--n-cpu-moe): lower it until the GPU is full.",
        ge=0,
        le=100_000,
        **env("N_CPU_MOE"),
    )
    override_tensor: str | None = Field(
        None,
        description="Where tensors go, as llama-server's -ot: comma-separated pattern=buffer-type "
        "pairs, the pattern a regular expression searched in each tensor's name, the buffer "
        "type a device's (CPU, CUDA0, ...). The first matching pair wins; these come before "
        "CPU_MOE and N_CPU_MOE.",
        max_length=4096,
        **env("OVERRIDE_TENSOR"),
    )
    memory_check: Literal["warn", "error", "off"] = Field(
        "warn",
        description="Before loading, estimate what the model takes per device (weights, KV "
        "cache, compute and output buffers, from its GGUF) and compare it with what is free: "
        "warn (one log line; a model that cannot fit is named in a warning and loaded anyway), "
        "error (a model that cannot fit fails its load, naming what it needs, what is free and "
        "the settings that would make it fit), off.",
        **env("MEMORY_CHECK"),
    )
    memory_margin_gb: float = Field(
        0.5,
        description="GiB kept free on each device beyond the estimate (the CUDA runtime's "
        "pools, requests' buffers): a device's budget is what is free at load less this.",
        ge=0,
        le=1024,
        **env("MEMORY_MARGIN_GB"),
    )
    memory_budget_gb: str | None = Field(
        None,
        description="The most the model may take per device in GiB, as device=GiB pairs "
        "(CPU=6,CUDA0=20): a device's budget is this when it is below what is free less the "
        "margin (room left for another process). Unnamed devices: what is free.",
        max_length=512,
        **env("MEMORY_BUDGET_GB"),
    )
    cpu_extra_buffers: Literal["auto", "on", "off"] = Field(
        "auto",
        description="llama.cpp's extra CPU buffer types for the weights (repacked layouts, "
        "AMX): on, off (plain CPU buffers, as llama-server's --no-repack), or auto: on, "
        "unless this llama.cpp was built with its AMX kernels (they crash: llama.cpp#20824) or "
        "the last worker crashed while loading (the safe fallback).",
        **env("CPU_EXTRA_BUFFERS"),
    )
    parallel: int = Field(
        8,
        description="Slots: sequences decoded together in one batch (continuous batching). "
        "Each slot has ctx_size tokens of context; the KV cache holds parallel x ctx_size.",
        ge=1,
        le=256,
        **env("PARALLEL"),
    )
    prefill_chunk: int = Field(
        256,
        description="Most prompt tokens decoded per engine step, so a long new prompt does not "
        "stall the streams already running; prompts being decoded share it (a short one beside "
        "a long one is decoded whole in the next step).",
        ge=16,
        le=65536,
        **env("PREFILL_CHUNK"),
    )
    prompt_cache_ram_mb: int = Field(
        1024,
        description="Host RAM (MiB) for prompts kept when their slot is taken: before a slot's "
        "KV is overwritten by another conversation, it is copied to host RAM, and a later "
        "prompt that extends it (within the same API key's scope) has it copied back instead "
        "of decoding it again; least recently used out first. Per model. 0: off.",
        ge=0,
        le=1 << 20,
        **env("PROMPT_CACHE_RAM_MB"),
    )
    prompt_cache_min_tokens: int = Field(
        256,
        description="Fewest tokens a slot must lose for its KV to be kept in the prompt "
        "cache: a shorter prompt decodes again in about the time its copy takes.",
        ge=16,
        le=1 << 20,
        **env("PROMPT_CACHE_MIN_TOKENS"),
    )
    prompt_cache_dir: str | None = Field(
        None,
        description="Where prompts are kept across restarts: a local folder or a gs://bucket/"
        "prefix. Prompts that leave the RAM cache, the slots' conversations when the model "
        "sleeps, and at SIGTERM every slot's and RAM entry's are written there (files named "
        "by the model's identity, the API key's scope and the tokens' hash); a prompt that "
        "extends one has it read back instead of decoding it again. A file of another model, "
        "build or key, or a damaged one, is never used. Unset: off.",
        max_length=1024,
        **env("PROMPT_CACHE_DIR"),
    )
    prompt_cache_disk_mb: int = Field(
        10240,
        description="Most MiB of prompt files in PROMPT_CACHE_DIR for this model: past it the "
        "oldest files are deleted.",
        ge=1,
        le=1 << 24,
        **env("PROMPT_CACHE_DISK_MB"),
    )
    warm_up: Literal["auto", "full", "light"] = Field(
        "auto",
        description="What a load runs before the model is ready. full: a whole PREFILL_CHUNK "
        "prompt and every slot generating, so the first burst of requests pays no first-use "
        "cost (buffers sized, pages mapped; on a CPU the prompt alone costs a fraction of a "
        "second), then the chat template's opening decoded and left cached; light: a "
        "two-token prompt and one token on one compute thread (as llama-server's warm-up), "
        "which proves the model generates and keeps short the wait of the request that "
        "asked for the model (it decodes the opening with its own prompt), without "
        "llama.cpp's compute threads spinning against those of the models serving beside "
        "it. auto: full for a model loaded before the server is ready "
        "(MODEL, MODELS_PRELOAD), light for one loaded on demand by a request.",
        **env("WARM_UP"),
    )
    load_priority: Literal["normal", "low"] = Field(
        "normal",
        description="The CPU priority of a load and its warm-up. low: the lowest (nice 19, on "
        "a thread of their own: the model serves at normal priority after), for a model "
        "loaded beside models whose streams matter more than its load time: on a CPU they "
        "keep the processor, and a load beside models that use every core waits until they "
        "leave it some (minutes, or for as long as they stay busy); normal: as any thread.",
        **env("LOAD_PRIORITY"),
    )
    max_queue: int = Field(
        64,
        description="Requests that may wait while every slot is busy; past it, 429.",
        ge=0,
        le=100_000,
        **env("MAX_QUEUE"),
    )
    max_queue_per_key: int = Field(
        0,
        description="Requests one API key may have waiting beyond the slots (its requests in "
        "the engine: at most PARALLEL plus this); past it, 429 for that key while others still "
        "queue, and a freed slot goes to the key holding the fewest. 0: half of MAX_QUEUE. "
        "Without API keys every caller is one key: only MAX_QUEUE applies, first come first "
        "served.",
        ge=0,
        le=100_000,
        **env("MAX_QUEUE_PER_KEY"),
    )
    sleep_idle_seconds: float = Field(
        0,
        description="After this many seconds without a request, free the model, contexts and "
        "KV cache (a shared GPU's memory given back); the next request reloads it from the "
        "local file and waits. Health stays 200 and says sleeping. 0: never sleep.",
        ge=0,
        le=7 * 86400,
        **env("SLEEP_IDLE_SECONDS"),
    )
    engine_process: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Where the engine runs. on: in a process of its own, started with a fresh "
        "interpreter that loads only the engine (a native crash ends that process alone: its "
        "requests get an error, health says loading while another process loads the model, "
        "under the CRASH_* rules). off: in the web process. auto: in the web process while "
        "one model is served.",
        **env("ENGINE_PROCESS"),
    )

    reasoning_format: ReasoningFormatName = Field(
        "auto",
        description="Thoughts: parsed into their own field, left inline in the content, or auto "
        "(parsed when the chat template teaches a thought syntax, which it names). A syntax's "
        f"name ({', '.join(formats.REASONING)}) parses thoughts written that way whatever the "
        "template says; otherwise the template's own syntax is used, else <think>...</think>.",
        **env("REASONING_FORMAT"),
    )
    reasoning_field: Literal["reasoning_content", "reasoning"] = Field(
        "reasoning_content",
        description="Field that carries parsed thoughts: reasoning_content (llama.cpp, older "
        "vLLM) or reasoning (newer vLLM).",
        **env("REASONING_FIELD"),
    )
    tool_format: ToolFormatName = Field(
        "auto",
        description="How the model writes tool calls: auto (read from the chat template), "
        f"{formats.describe()}.",
        **env("TOOL_FORMAT"),
    )

    @field_validator("tensor_split")
    @classmethod
    def _some_share(cls, value: str | None) -> str | None:
        if value is not None and not any(float(p) > 0 for p in value.split(",")):
            raise ValueError("at least one GPU must get a share above 0")
        return value

    @field_validator("override_tensor")
    @classmethod
    def _override_pairs(cls, value: str | None) -> str | None:
        """pattern=buffer-type pairs, each pattern a regular expression (checked here: an
        invalid one would be an exception inside llama.cpp's loader)."""
        if value is None:
            return None
        import re

        for pair in value.split(","):
            pattern, eq, buft = pair.strip().partition("=")
            if not eq or not pattern or not buft.strip():
                raise ValueError(f"{pair!r}: OVERRIDE_TENSOR takes pattern=buffer-type pairs")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a valid regular expression: {exc}") from None
        return value

    @field_validator("memory_budget_gb")
    @classmethod
    def _budget_pairs(cls, value: str | None) -> str | None:
        """device=GiB pairs: a device name (CPU, CUDA0, ...) and a number of GiB."""
        if value is None:
            return None
        import re

        for pair in value.split(","):
            if not re.fullmatch(r"\s*[A-Za-z][A-Za-z0-9_]*\s*=\s*\d+(\.\d+)?\s*", pair):
                raise ValueError(f"{pair!r}: MEMORY_BUDGET_GB takes device=GiB pairs, as "
                                 "CPU=6,CUDA0=20")
        return value

    @model_validator(mode="after")
    def _quantized_v_needs_flash(self) -> LlamaSettings:
        if self.kv_cache_type_v not in UNQUANTIZED_KV and self.flash_attn == "off":
            raise ValueError(
                f"KV_CACHE_TYPE_V={self.kv_cache_type_v} needs flash attention: set FLASH_ATTN "
                "to auto or on, or keep the V cache at f16")
        return self
