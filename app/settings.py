"""The one typed configuration object.

Every setting ``foo_bar`` is the flag ``--foo-bar`` and the env var ``FOO_BAR``; the platform
variables (``AIP_*`` from Vertex AI, ``PORT`` from Cloud Run) are read under the names the
platforms give them. Flags win over env vars. Settings are read once, at start-up, into a frozen
object that is passed down; nothing else reads the environment.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app import formats

DEFAULT_CACHE_DIR = Path("/tmp/vertex-gguf")
C = TypeVar("C")
# TOOL_FORMAT's values: auto, or a format of the registry (a new format needs no edit here)
ToolFormatName = Literal[("auto", *formats.FORMATS)]  # type: ignore[valid-type]
# the KV cache types llama-server's -ctk/-ctv take
UNQUANTIZED_KV = ("f32", "f16", "bf16")
KvCacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]


def _env(*names: str) -> dict[str, Any]:
    """Field kwargs reading the env vars ``names`` (first set one wins)."""
    return {"validation_alias": AliasChoices(*names)}


class Settings(BaseSettings):
    """Server configuration: model, llama.cpp, HTTP and Vertex AI contract."""

    model_config = SettingsConfigDict(
        frozen=True,
        populate_by_name=True,
        case_sensitive=False,
        extra="ignore",
        env_ignore_empty=True,
    )

    # --- model -------------------------------------------------------------------------------
    model: str | None = Field(
        None,
        description="Model to serve: a local .gguf path, directory or file:// URI, or a gs:// "
        "object or directory. Falls back to AIP_STORAGE_URI, then to the embedded default model.",
        min_length=1,
        **_env("MODEL", "AIP_STORAGE_URI"),
    )
    model_cache_dir: Path = Field(
        DEFAULT_CACHE_DIR,
        description="Directory for downloaded models and the fetched default model.",
        **_env("MODEL_CACHE_DIR"),
    )
    model_file: str | None = Field(
        None,
        description="Which GGUF to serve when the model directory holds several: a file name "
        "or glob (a split model is named by any of its shards).",
        min_length=1,
        **_env("MODEL_FILE"),
    )
    download_workers: int = Field(
        8,
        description="Concurrent ranged downloads per object from gs://.",
        ge=1,
        le=64,
        **_env("DOWNLOAD_WORKERS"),
    )
    download_slice_mb: int = Field(
        32,
        description="Size of each ranged slice in MiB; objects under two slices download in "
        "one stream.",
        ge=1,
        le=4096,
        **_env("DOWNLOAD_SLICE_MB"),
    )
    storage_emulator_host: str | None = Field(
        None,
        description="Cloud Storage emulator address (tests): anonymous credentials are used "
        "only when this is set; otherwise Application Default Credentials.",
        min_length=1,
        **_env("STORAGE_EMULATOR_HOST"),
    )
    served_model_name: str | None = Field(
        None,
        description="The model's names, comma-separated: the first is its id (in /v1/models), "
        "every one is an alias a request may name and have echoed in its answer's `model` "
        "(default: the file name without .gguf). Duplicates are dropped; an empty name is an "
        "error.",
        min_length=1,
        max_length=4096,
        **_env("SERVED_MODEL_NAME"),
    )
    model_tags: str | None = Field(
        None,
        description="Informational tags for /v1/models and /props, comma-separated (not used "
        "to pick a model).",
        min_length=1,
        max_length=4096,
        **_env("MODEL_TAGS"),
    )
    strict_model_name: bool = Field(
        False,
        description="Answer a request whose `model` is none of the aliases with a 404 "
        "model_not_found (default: serve it, answering with the id; many clients send a fixed "
        "name). A request that names no model is always served.",
        **_env("STRICT_MODEL_NAME"),
    )
    slots_endpoint: Literal["auto", "on", "off"] = Field(
        "auto",
        description="GET /slots (each slot's state, prompt lengths included): on, off (a 501 "
        "as llama-server's --no-slots), or auto: on unless an API key is configured.",
        **_env("SLOTS_ENDPOINT"),
    )
    chat_template: str | None = Field(
        None,
        description="Jinja chat template overriding the GGUF's own: a file path or the "
        "template text.",
        min_length=1,
        **_env("CHAT_TEMPLATE"),
    )

    # --- speculative decoding ------------------------------------------------------------------
    draft_model: str | None = Field(
        None,
        description="A smaller model that drafts tokens for the model to check (speculative "
        "decoding): a path, file:// or gs:// URI, fetched and verified like MODEL. It must "
        "share the model's vocabulary (checked at load).",
        max_length=2048,
        **_env("DRAFT_MODEL"),
    )
    spec_ngram: bool = Field(
        False,
        description="Speculative decoding with no second model: draft from the sequence "
        "itself, the tokens that followed the latest earlier occurrence of its last 4, 3 or 2 "
        "tokens (prompt lookup). Strong where replies copy their prompt (code edits, RAG); "
        "with DRAFT_MODEL it drafts for the requests the draft model cannot (images).",
        **_env("SPEC_NGRAM"),
    )
    spec_adaptive: bool = Field(
        True,
        description="Draft only where it pays: the engine measures, per batch width, the "
        "tokens a step emits per second with drafting and without, and drafts where that is "
        "higher (trying the other choice every 16th step). Off: draft on every step.",
        **_env("SPEC_ADAPTIVE"),
    )
    spec_draft_max: int = Field(
        8,
        description="Most tokens drafted per sequence per step (a request's speculative.n_max "
        "may lower it, or set 0 to turn speculation off for itself).",
        ge=1,
        le=128,
        **_env("SPEC_DRAFT_MAX"),
    )
    spec_draft_min: int = Field(
        0,
        description="A draft shorter than this is not checked (speculative.n_min per request).",
        ge=0,
        le=128,
        **_env("SPEC_DRAFT_MIN"),
    )
    spec_p_min: float = Field(
        0.5,
        description="The draft model stops drafting where its own probability of its next "
        "token falls below this (speculative.p_min per request).",
        ge=0.0,
        le=1.0,
        **_env("SPEC_P_MIN"),
    )

    # --- LoRA adapters -------------------------------------------------------------------------
    lora_adapters: str | None = Field(
        None,
        description="LoRA adapters loaded over the model at start: comma-separated "
        "name=path-or-gs://[:scale] (the scale when a request chooses the adapter; default 1). "
        "/v1/models lists each as a model whose parent is the base; a request picks one by "
        "naming it as its model, or with llama-server's lora field.",
        max_length=8192,
        **_env("LORA_ADAPTERS"),
    )
    admin_api_key: str | None = Field(
        None,
        description="The operator key: the only key POST /lora-adapters answers to (it sets "
        "the adapter scales of every request that names none). Unset: that route is off.",
        min_length=16,
        max_length=512,
        **_env("ADMIN_API_KEY"),
    )

    # --- llama.cpp ---------------------------------------------------------------------------
    ctx_size: int = Field(
        4096,
        description="Context size in tokens per slot (0: the model's training context).",
        ge=0,
        le=1 << 20,
        **_env("CTX_SIZE"),
    )
    gpu_layers: int = Field(
        -1,
        description="Layers offloaded to the GPU (-1: all of them when a GPU is present; "
        "0: CPU only).",
        ge=-1,
        le=100_000,
        **_env("GPU_LAYERS"),
    )
    split_mode: Literal["none", "layer", "row"] = Field(
        "layer",
        description="How a model is spread over several GPUs: layer (whole layers and their KV "
        "cache per GPU, llama.cpp's default), row (each layer's rows across GPUs: tensor "
        "parallelism where supported), none (all on MAIN_GPU).",
        **_env("SPLIT_MODE"),
    )
    tensor_split: str | None = Field(
        None,
        description="Share of the model per GPU, comma-separated proportions in device order "
        "(e.g. 3,1 puts three quarters on GPU 0); none: by free memory.",
        max_length=256,
        pattern=r"^\s*\d+(\.\d+)?(\s*,\s*\d+(\.\d+)?)*\s*$",
        **_env("TENSOR_SPLIT"),
    )
    main_gpu: int = Field(
        0,
        description="The GPU that holds the whole model with SPLIT_MODE=none (and small "
        "tensors with row).",
        ge=0,
        le=63,
        **_env("MAIN_GPU"),
    )
    threads: int = Field(
        0,
        description="CPU threads for generation (0: the CPUs this process may use).",
        ge=0,
        le=1024,
        **_env("THREADS"),
    )
    threads_batch: int = Field(
        0,
        description="CPU threads for prompt processing (0: same as threads).",
        ge=0,
        le=1024,
        **_env("THREADS_BATCH"),
    )
    batch_size: int = Field(
        512,
        description="Most prompt tokens decoded in one llama_decode call.",
        ge=8,
        le=65536,
        **_env("BATCH_SIZE"),
    )
    flash_attn: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Flash attention: auto, on or off.",
        **_env("FLASH_ATTN"),
    )
    kv_cache_type_k: KvCacheType = Field(
        "f16",
        description="Data type of the KV cache's keys: f16 (llama.cpp's default), bf16, f32, "
        "or a quantized type (q8_0 halves the cache at a small cost in quality; q4_0, q4_1, "
        "q5_0, q5_1 and iq4_nl shrink it further).",
        **_env("KV_CACHE_TYPE_K"),
    )
    kv_cache_type_v: KvCacheType = Field(
        "f16",
        description="Data type of the KV cache's values, as KV_CACHE_TYPE_K; a quantized type "
        "needs flash attention (FLASH_ATTN auto turns it on, off is refused at start).",
        **_env("KV_CACHE_TYPE_V"),
    )
    n_ubatch: int = Field(
        0,
        description="Physical micro-batch: the most tokens llama.cpp computes in one pass of a "
        "decode (0: the logical batch, at most 512). Larger speeds prompt processing on a GPU "
        "at the cost of compute-buffer memory; it never exceeds the logical batch.",
        ge=0,
        le=65536,
        **_env("N_UBATCH"),
    )
    cpu_moe: bool = Field(
        False,
        description="Keep every mixture-of-experts expert tensor in host memory (llama-server's "
        "--cpu-moe): the attention and shared weights go to the GPU, the experts stay on the "
        "CPU. Fits a large MoE on a small GPU.",
        **_env("CPU_MOE"),
    )
    n_cpu_moe: int = Field(
        0,
        description="Keep the expert tensors of the first N layers in host memory (llama-server's "
        "--n-cpu-moe): lower it until the GPU is full.",
        ge=0,
        le=100_000,
        **_env("N_CPU_MOE"),
    )
    override_tensor: str | None = Field(
        None,
        description="Where tensors go, as llama-server's -ot: comma-separated pattern=buffer-type "
        "pairs, the pattern a regular expression searched in each tensor's name, the buffer "
        "type a device's (CPU, CUDA0, ...). The first matching pair wins; these come before "
        "CPU_MOE and N_CPU_MOE.",
        max_length=4096,
        **_env("OVERRIDE_TENSOR"),
    )
    cpu_extra_buffers: Literal["auto", "on", "off"] = Field(
        "auto",
        description="llama.cpp's extra CPU buffer types for the weights (repacked layouts, "
        "AMX): on, off (plain CPU buffers, as llama-server's --no-repack), or auto: on, "
        "unless this llama.cpp was built with its AMX kernels (they crash: llama.cpp#20824) or "
        "the last worker crashed while loading (the safe fallback).",
        **_env("CPU_EXTRA_BUFFERS"),
    )
    parallel: int = Field(
        8,
        description="Slots: sequences decoded together in one batch (continuous batching). "
        "Each slot has ctx_size tokens of context; the KV cache holds parallel x ctx_size.",
        ge=1,
        le=256,
        **_env("PARALLEL"),
    )
    prefill_chunk: int = Field(
        256,
        description="Most prompt tokens decoded per engine step, so a long new prompt does not "
        "stall the streams already running.",
        ge=16,
        le=65536,
        **_env("PREFILL_CHUNK"),
    )
    max_queue: int = Field(
        64,
        description="Requests that may wait while every slot is busy; past it, 429.",
        ge=0,
        le=100_000,
        **_env("MAX_QUEUE"),
    )
    sleep_idle_seconds: float = Field(
        0,
        description="After this many seconds without a request, free the model, contexts and "
        "KV cache (a shared GPU's memory given back); the next request reloads it from the "
        "local file and waits. Health stays 200 and says sleeping. 0: never sleep.",
        ge=0,
        le=7 * 86400,
        **_env("SLEEP_IDLE_SECONDS"),
    )

    reasoning_format: Literal["auto", "parsed", "inline"] = Field(
        "auto",
        description="Thoughts (<think>...</think>): parsed into their own field, left inline in "
        "the content, or auto (parsed when the chat template mentions <think>).",
        **_env("REASONING_FORMAT"),
    )
    reasoning_field: Literal["reasoning_content", "reasoning"] = Field(
        "reasoning_content",
        description="Field that carries parsed thoughts: reasoning_content (llama.cpp, older "
        "vLLM) or reasoning (newer vLLM).",
        **_env("REASONING_FIELD"),
    )
    tool_format: ToolFormatName = Field(
        "auto",
        description="How the model writes tool calls: auto (read from the chat template), "
        f"{formats.describe()}.",
        **_env("TOOL_FORMAT"),
    )

    # --- vision ------------------------------------------------------------------------------
    mmproj: str | None = Field(
        None,
        description="The model's vision projector (llama-server's --mmproj): an mmproj GGUF's "
        "path, file:// or gs:// URI. Unset: the one mmproj*.gguf in the model's directory "
        "(local or gs://), if there is one; none: no projector. With one, chat requests may "
        "carry images (docs/vision.md).",
        min_length=1,
        **_env("MMPROJ"),
    )
    mmproj_offload: bool = Field(
        True,
        description="Run the projector on the GPU when the model's layers are there "
        "(llama-server's --no-mmproj-offload is false here).",
        **_env("MMPROJ_OFFLOAD"),
    )
    image_cache_mb: int = Field(
        256,
        description="Memory for the projector's output of recent images (MiB; 0: none): an "
        "image sent again by the same API key skips the vision encoder. Its prompt KV is "
        "reused apart from this, by the prefix cache.",
        ge=0,
        le=1 << 20,
        **_env("IMAGE_CACHE_MB"),
    )
    audio_max_seconds: float = Field(
        60.0,
        description="Longest sound a request may send (input_audio, WAV), read from its "
        "header before its samples; longer is a 400. Speech encoders hear 30 s per chunk.",
        gt=0,
        le=3600,
        **_env("AUDIO_MAX_SECONDS"),
    )
    image_buckets: str | None = Field(
        None,
        description="Buckets whose objects a request may name as a gs:// image URL, "
        "comma-separated (read with the server's own credentials). Unset: gs:// image URLs "
        "are refused.",
        min_length=1,
        **_env("IMAGE_BUCKETS"),
    )
    image_url_hosts: str | None = Field(
        None,
        description="Hosts a request may name in an http(s) image URL, comma-separated "
        "(exact names; no redirects are followed). Unset: http(s) image URLs are refused.",
        min_length=1,
        **_env("IMAGE_URL_HOSTS"),
    )
    image_fetch_timeout: float = Field(
        10.0,
        description="Seconds to read one image named by URL.",
        gt=0,
        le=300,
        **_env("IMAGE_FETCH_TIMEOUT"),
    )
    images_per_request: int = Field(
        8,
        description="Most images in one request; more is a 400.",
        ge=1,
        le=256,
        **_env("IMAGES_PER_REQUEST"),
    )
    image_max_bytes: int = Field(
        8 * 1024 * 1024,
        description="Largest image in bytes (as sent, before base64); larger is a 413. A "
        "request's body is bounded by MAX_BODY_BYTES first.",
        ge=1024,
        le=1 << 30,
        **_env("IMAGE_MAX_BYTES"),
    )
    image_max_pixels: int = Field(
        50_000_000,
        description="Most pixels an image may declare (width x height, read from its header "
        "before anything is decoded); more is a 400. Bounds decoding memory: a small file can "
        "claim an enormous image.",
        ge=1,
        le=1 << 31,
        **_env("IMAGE_MAX_PIXELS"),
    )
    image_max_side: int = Field(
        2048,
        description="Images are scaled down (aspect kept) until neither side is longer, "
        "before the projector sees them: projectors work at a few hundred pixels, so a large "
        "photo costs no more than a small one.",
        ge=16,
        le=16384,
        **_env("IMAGE_MAX_SIDE"),
    )

    # --- embeddings --------------------------------------------------------------------------
    embeddings: Literal["auto", "on", "off", "only"] = Field(
        "auto",
        description="Embeddings (/v1/embeddings, Vertex embedding instances) run in a context "
        "of their own beside generation, so they never wait behind it. auto: an embedding GGUF "
        "(non-causal, or with a pooling type in its metadata) embeds only, and the chat routes "
        "answer 400; a generative one does not embed (its embedding context costs memory: see "
        "EMBEDDING_CTX). on: both. off: none. only: embeddings, no generation context.",
        **_env("EMBEDDINGS"),
    )
    embedding_pooling: Literal["auto", "mean", "cls", "last", "none"] = Field(
        "auto",
        description="How a text's token vectors become one: auto (the GGUF's pooling type, else "
        "mean), mean, cls (first token) or last (last token: decoder embedding models). none "
        "gives one vector per token, which /v1/embeddings refuses with a 400.",
        **_env("EMBEDDING_POOLING"),
    )
    embedding_ctx: int = Field(
        0,
        description="Most tokens of one embedding input, and of one embedding batch (0: the "
        "model's training context, at most 8192 for an embedding model and 2048 for a "
        "generative one, whose output layer llama.cpp also runs: its compute buffer holds this "
        "many tokens x the vocabulary in floats). Longer inputs are refused with a 400, or cut "
        "when the request asks (Vertex autoTruncate).",
        ge=0,
        le=1_048_576,
        **_env("EMBEDDING_CTX"),
    )
    embedding_batch: int = Field(
        64,
        description="Most inputs embedded together in one decode (from one request or many).",
        ge=1,
        le=256,
        **_env("EMBEDDING_BATCH"),
    )
    embedding_normalize: bool = Field(
        True,
        description="L2-normalize embeddings (after cutting them to 'dimensions'): cosine "
        "similarity is then a dot product, as OpenAI's embeddings are.",
        **_env("EMBEDDING_NORMALIZE"),
    )
    embedding_max_inputs: int = Field(
        2048,
        description="Most inputs (or Vertex instances) in one embedding request.",
        ge=1,
        le=100_000,
        **_env("EMBEDDING_MAX_INPUTS"),
    )
    embedding_task_prefixes: dict[str, str] = Field(
        default_factory=dict,
        description="Text put before a Vertex embedding instance's content for its task_type, "
        'as JSON (e.g. {"RETRIEVAL_QUERY": "query: ", "RETRIEVAL_DOCUMENT": "passage: "} for '
        "E5 models). Empty: task_type is checked, then ignored.",
        json_schema_extra={"default_label": "{}"},
        **_env("EMBEDDING_TASK_PREFIXES"),
    )

    # --- operations (docs/security.md; docs/operations.md) -----------------------------------
    api_key: str | None = Field(
        None,
        description="API keys, comma-separated: when set (or API_KEY_FILE), every route but "
        "the health routes needs `Authorization: Bearer <key>` or `x-api-key: <key>`; a "
        "missing or wrong key is a 401. Never logged nor shown.",
        min_length=1,
        max_length=65536,
        repr=False,
        **_env("API_KEY"),
    )
    api_key_file: Path | None = Field(
        None,
        description="File of API keys, one a line (blank lines and # comments ignored), read "
        "at start; adds to API_KEY. A file without a key stops the server.",
        repr=False,
        **_env("API_KEY_FILE"),
    )
    metrics_public: bool = Field(
        False,
        description="Serve /metrics without an API key when keys are configured (a scraper "
        "inside the network); off: /metrics needs a key like every other route.",
        **_env("METRICS_PUBLIC"),
    )
    apis: str = Field(
        "all",
        description="The wire APIs served: all, or a comma-separated list of openai (Chat "
        "Completions, Completions), responses, anthropic, gemini, ollama, embeddings (OpenAI's "
        "and Vertex's). An API left out has no routes (a 404), and the predict route does not "
        "dispatch to it.",
        **_env("APIS"),
    )
    webui: Literal["on", "off"] = Field(
        "on",
        description="The playground page at / (chat with streaming, thoughts, tool calls, "
        "settings; conversations kept in the browser). It needs no key to load, and asks for "
        "one when keys are set; off: / is a 404. Vertex AI never routes / to the container.",
        **_env("WEBUI"),
    )
    log_format: Literal["auto", "json", "text"] = Field(
        "auto",
        description="Log lines: json (one Cloud Logging structured entry a line: severity, "
        "trace, request id, httpRequest) or text; auto: json when K_SERVICE (Cloud Run) or "
        "AIP_MODE (Vertex AI) is set, else text.",
        **_env("LOG_FORMAT"),
    )
    google_cloud_project: str | None = Field(
        None,
        description="Project id for trace links in JSON logs (projects/<id>/traces/<trace>); "
        "unset: the trace id alone.",
        min_length=1,
        max_length=128,
        **_env("GOOGLE_CLOUD_PROJECT"),
    )
    k_service: str | None = Field(
        None,
        description="Cloud Run service name (set by Cloud Run; makes LOG_FORMAT=auto json).",
        **_env("K_SERVICE"),
    )

    # --- HTTP --------------------------------------------------------------------------------
    host: str = Field(
        "0.0.0.0",
        description="Address to bind.",
        min_length=1,
        **_env("HOST"),
    )
    port: int = Field(
        8080,
        description="Port to bind: AIP_HTTP_PORT (Vertex AI), else PORT (Cloud Run), else 8080.",
        ge=1,
        le=65535,
        **_env("AIP_HTTP_PORT", "PORT"),
    )
    health_route: str = Field(
        "/health",
        description="Health route (Vertex: AIP_HEALTH_ROUTE). /health is always served too.",
        pattern=r"^/",
        **_env("AIP_HEALTH_ROUTE", "HEALTH_ROUTE"),
    )
    predict_route: str = Field(
        "/predict",
        description="Vertex predict route (Vertex: AIP_PREDICT_ROUTE); also takes raw OpenAI "
        "bodies (rawPredict, streamRawPredict).",
        pattern=r"^/",
        **_env("AIP_PREDICT_ROUTE", "PREDICT_ROUTE"),
    )
    max_instances: int = Field(
        64,
        description="Most instances in one predict envelope; more is a 400.",
        ge=1,
        le=10_000,
        **_env("MAX_INSTANCES"),
    )
    max_body_bytes: int = Field(
        10 * 1024 * 1024,
        description="Largest request body in bytes; larger is a 413.",
        ge=1024,
        le=1 << 31,
        **_env("MAX_BODY_BYTES"),
    )
    graceful_timeout: float = Field(
        10.0,
        description="Seconds in-flight requests get to finish after SIGTERM.",
        ge=0,
        le=3600,
        **_env("GRACEFUL_TIMEOUT"),
    )
    crash_limit: int = Field(
        3,
        description="A worker that dies from a signal after the model was ready is restarted; "
        "this many such deaths within CRASH_WINDOW seconds end the process (exit code 4) "
        "instead of a restart loop. A death while loading is restarted once, in safe mode.",
        ge=1,
        le=1000,
        **_env("CRASH_LIMIT"),
    )
    crash_window: float = Field(
        600.0,
        description="Seconds over which worker deaths after ready are counted against "
        "CRASH_LIMIT.",
        gt=0,
        le=86400 * 7,
        **_env("CRASH_WINDOW"),
    )
    worker_connections: int = Field(
        1000,
        description="Most simultaneous connections the gevent worker accepts.",
        ge=1,
        le=100_000,
        **_env("WORKER_CONNECTIONS"),
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info",
        description="Log level.",
        **_env("LOG_LEVEL"),
    )

    # --- streaming (docs/streaming.md: a profile, then overrides) ----------------------------
    stream_profile: Literal["openai", "strict", "llama.cpp"] = Field(
        "openai",
        description="Stream termination profile: openai ([DONE], usage on request), strict (no "
        "[DONE]: the stream ends when the response closes), llama.cpp (what llama-server sends).",
        **_env("STREAM_PROFILE"),
    )
    stream_done: bool | None = Field(
        None,
        description="Send `data: [DONE]` at the end of a stream (default: from the profile). "
        "Per request: header X-Stream-Done: 1 or 0.",
        json_schema_extra={"default_label": "from profile"},
        **_env("STREAM_DONE"),
    )
    stream_done_after_error: bool | None = Field(
        None,
        description="Send [DONE] after a mid-stream error event (default: from the profile).",
        json_schema_extra={"default_label": "from profile"},
        **_env("STREAM_DONE_AFTER_ERROR"),
    )
    stream_role_content: Literal["empty", "null"] | None = Field(
        None,
        description='Content of the first (role) chunk: "empty" sends "", "null" sends null '
        "(default: from the profile).",
        json_schema_extra={"default_label": "from profile"},
        **_env("STREAM_ROLE_CONTENT"),
    )
    stream_always_usage: bool | None = Field(
        None,
        description="Send the usage chunk even without stream_options.include_usage (default: "
        "from the profile).",
        json_schema_extra={"default_label": "from profile"},
        **_env("STREAM_ALWAYS_USAGE"),
    )
    stream_heartbeat_seconds: float | None = Field(
        None,
        description="Send an SSE comment `: ping` when nothing was sent for this long; 0 = off "
        "(default: from the profile).",
        ge=0,
        le=3600,
        json_schema_extra={"default_label": "from profile"},
        **_env("STREAM_HEARTBEAT_SECONDS"),
    )
    stream_store: str = Field(
        "memory",
        description="Where resumable streams (`X-Conversation-Id`) keep their bytes: `memory` "
        "(this replica only) or a Redis URL (`redis://host:6379/0`, `rediss://...`; Memorystore), "
        "so a resume, a DELETE or a second POST on any replica finds the session. A Redis outage "
        "degrades to in-process sessions; it never fails a stream.",
        pattern=r"^(memory|rediss?://\S+|unix://\S+)$",
        **_env("STREAM_STORE"),
    )
    stream_buffer_bytes: int = Field(
        4 * 1024 * 1024,
        description="Bytes of a resumable stream kept for a resume (the newest; the oldest drop "
        "first, and a resume from before them is a 400 `stream offset lost`).",
        ge=256,
        le=256 * 1024 * 1024,
        **_env("STREAM_BUFFER_BYTES"),
    )
    stream_session_ttl: float = Field(
        300.0,
        description="Seconds a finished resumable stream can still be replayed; after that its "
        "id is a 404. Live streams are never collected.",
        gt=0,
        le=7 * 86400,
        **_env("STREAM_SESSION_TTL"),
    )
    stream_max_live_per_key: int = Field(
        0,
        description="Most resumable generations (X-Conversation-Id) one API key may run at once "
        "on a replica, read or not; more is a 429 too_many_streams (0: half the slots). Without "
        "API keys every caller shares one count.",
        ge=0,
        le=10_000,
        **_env("STREAM_MAX_LIVE_PER_KEY"),
    )
    stream_unread_timeout: float = Field(
        120.0,
        description="Seconds a resumable generation may run with nobody reading it (its client "
        "gone, no GET /v1/stream on any replica) before it is stopped; 0: never.",
        ge=0,
        le=86400,
        **_env("STREAM_UNREAD_TIMEOUT"),
    )
    request_timeout: float = Field(
        0,
        description="Seconds a generation may run before it is ended with a timeout error (a "
        "504, or an error event mid-stream); 0 = no limit. Set it below the platform's own "
        "request timeout so clients get a clear error instead of a cut connection.",
        ge=0,
        le=86400,
        **_env("REQUEST_TIMEOUT"),
    )
    responses_store_size: int = Field(
        100,
        description="Most responses of the Responses API kept in memory (per replica) for "
        "previous_response_id and GET /v1/responses/{id}; the oldest go first; 0 = none kept.",
        ge=0,
        le=100_000,
        **_env("RESPONSES_STORE_SIZE"),
    )
    responses_store_ttl: float = Field(
        3600.0,
        description="Seconds a stored Responses API response is kept; after it, its id is a 404.",
        gt=0,
        le=7 * 86400,
        **_env("RESPONSES_STORE_TTL"),
    )

    # --- limits and safety (docs/security.md, Limits and safety) -----------------------------
    default_max_tokens: int = Field(
        0,
        description="Most tokens generated for a request that names no limit (no max_tokens, "
        "max_completion_tokens, max_output_tokens or n_predict), which then ends with "
        "finish_reason length; 0: to the end of the context, or MAX_TOKENS_LIMIT when that is "
        "set. Larger than MAX_TOKENS_LIMIT is an error at start-up.",
        ge=0,
        le=1 << 20,
        **_env("DEFAULT_MAX_TOKENS"),
    )
    max_tokens_limit: int = Field(
        0,
        description="Most tokens one request may generate (each choice): a request asking for "
        "more is a 400 naming this limit, and one that names no limit stops here too; 0: no "
        "limit but the context.",
        ge=0,
        le=1 << 20,
        **_env("MAX_TOKENS_LIMIT"),
    )
    default_temperature: float = Field(
        1.0,
        description="Temperature of a request that names none (OpenAI's and Anthropic's default "
        "is 1.0; a model card's recommended sampling goes here, as with llama-server's --temp). "
        "0: greedy.",
        ge=0,
        le=2,
        **_env("DEFAULT_TEMPERATURE"),
    )
    default_top_p: float = Field(
        1.0,
        description="top_p of a request that names none (1.0: off).",
        gt=0,
        le=1,
        **_env("DEFAULT_TOP_P"),
    )
    default_top_k: int = Field(
        0,
        description="top_k of a request that names none (0: off).",
        ge=0,
        le=1 << 20,
        **_env("DEFAULT_TOP_K"),
    )
    default_min_p: float = Field(
        0.0,
        description="min_p of a request that names none (0: off).",
        ge=0,
        le=1,
        **_env("DEFAULT_MIN_P"),
    )
    max_tokens_clamp: bool = Field(
        False,
        description="A request asking for more tokens than the context has left after its "
        "prompt, or than MAX_TOKENS_LIMIT, gets as many as there are, ending with "
        "finish_reason length, instead of a 400 (OpenAI's answer, and the default). For "
        "clients that reserve a fixed large budget for a model they do not know (Qwen Code "
        "asks for 32000).",
        **_env("MAX_TOKENS_CLAMP"),
    )
    slots_per_request: int = Field(
        0,
        description="Most slots one request may hold: its `n` choices, or a Vertex envelope's "
        "instances running at once (0: half of PARALLEL, at least 1), so one request never "
        "takes every slot.",
        ge=0,
        le=256,
        **_env("SLOTS_PER_REQUEST"),
    )
    max_prompt_bytes: int = Field(
        0,
        description="Prompts longer than this in UTF-8 bytes are refused before they are "
        "tokenized (0: the context size times the longest token, which no prompt that fits "
        "can exceed).",
        ge=0,
        le=1 << 31,
        **_env("MAX_PROMPT_BYTES"),
    )
    prompt_logprobs_max_tokens: int = Field(
        8192,
        description="Longest prompt whose tokens a request may score (Completions' echo with "
        "logprobs): a longer one is a 400. Scoring a prompt computes logits at every position "
        "(a bounded number per engine step) and returns an entry per token.",
        ge=1,
        le=1 << 20,
        **_env("PROMPT_LOGPROBS_MAX_TOKENS"),
    )
    max_tools: int = Field(
        128,
        description="Most tools in one request (OpenAI's own limit is 128).",
        ge=1,
        le=10_000,
        **_env("MAX_TOOLS"),
    )
    max_json_depth: int = Field(
        64,
        description="Deepest nesting of arrays and objects in a request body; deeper is a 400.",
        ge=8,
        le=512,
        **_env("MAX_JSON_DEPTH"),
    )
    body_timeout: float = Field(
        60.0,
        description="Seconds a client may take to send its request body; slower is a 408 "
        "(a trickled body cannot hold a connection forever).",
        gt=0,
        le=3600,
        **_env("BODY_TIMEOUT"),
    )
    header_timeout: float = Field(
        20.0,
        description="Seconds a new connection may take to send its request line and headers; "
        "slower is a 408 (a client that never finishes its headers cannot hold a connection). "
        "Later requests on a kept-alive connection have the keep-alive time.",
        gt=0,
        le=3600,
        **_env("HEADER_TIMEOUT"),
    )
    client_timeout: float = Field(
        120.0,
        description="Seconds a client socket may stall a read or a write (a reader that stops "
        "reading a stream); the connection is closed after it and its generation cancelled.",
        gt=0,
        le=86400,
        **_env("CLIENT_TIMEOUT"),
    )
    prepare_timeout: float = Field(
        30.0,
        description="Seconds a request's preparation (validation, chat template, JSON Schema "
        "conversion, grammar checks; run off the request loop) may take before a 503.",
        gt=0,
        le=3600,
        **_env("PREPARE_TIMEOUT"),
    )
    watchdog_seconds: float = Field(
        60.0,
        description="Health answers 503 (so the platform restarts the container) when one "
        "engine step, or one request's preparation, has run this long.",
        gt=0,
        le=86400,
        **_env("WATCHDOG_SECONDS"),
    )
    special_tokens_in_messages: Literal["text", "parse"] = Field(
        "text",
        description="Control-token text inside messages (`<|im_start|>` written by a user, a "
        "tool result or a document): text keeps it plain text, so nobody can forge a turn; "
        "parse makes it control tokens (what llama-server and vLLM do).",
        **_env("SPECIAL_TOKENS_IN_MESSAGES"),
    )
    grammar_max_bytes: int = Field(
        256 * 1024,
        description="Largest grammar text (GBNF, from `grammar`, a JSON schema or tools).",
        ge=1024,
        le=16 << 20,
        **_env("GRAMMAR_MAX_BYTES"),
    )
    grammar_max_rules: int = Field(
        10_000,
        description="Most rules a grammar may expand to (groups and repetitions included).",
        ge=16,
        le=1_000_000,
        **_env("GRAMMAR_MAX_RULES"),
    )
    grammar_max_symbols: int = Field(
        200_000,
        description="Most symbols a grammar may expand to (its size in memory).",
        ge=256,
        le=50_000_000,
        **_env("GRAMMAR_MAX_SYMBOLS"),
    )
    grammar_max_depth: int = Field(
        4096,
        description="Deepest nesting of groups in a grammar (llama.cpp's parser recurses per "
        "level).",
        ge=8,
        le=20_000,
        **_env("GRAMMAR_MAX_DEPTH"),
    )
    grammar_max_repetition: int = Field(
        2000,
        description="Largest repetition bound ({m,n}; a schema's minLength / minItems): over "
        "it, a 400; a schema's maxLength / maxItems over it is not enforced (as llama.cpp does "
        "above 2000).",
        ge=1,
        le=2000,
        **_env("GRAMMAR_MAX_REPETITION"),
    )
    grammar_max_alternatives: int = Field(
        1000,
        description="Most alternatives in one grammar rule (an enum's values, a union's "
        "members).",
        ge=2,
        le=100_000,
        **_env("GRAMMAR_MAX_ALTERNATIVES"),
    )
    grammar_max_optionals: int = Field(
        16,
        description="Most optional items in a row in a grammar (each can multiply the work "
        "of a sampling step).",
        ge=1,
        le=10_000,
        **_env("GRAMMAR_MAX_OPTIONALS"),
    )
    grammar_max_properties: int = Field(
        5000,
        description="Most properties in one JSON schema, all objects together (OpenAI's limit).",
        ge=1,
        le=1_000_000,
        **_env("GRAMMAR_MAX_PROPERTIES"),
    )
    grammar_max_optional_properties: int = Field(
        256,
        description="Most optional properties in one object of a JSON schema (conversion is "
        "quadratic in them).",
        ge=1,
        le=100_000,
        **_env("GRAMMAR_MAX_OPTIONAL_PROPERTIES"),
    )
    grammar_max_step_ms: float = Field(
        100.0,
        description="Most engine CPU time (the engine thread's own, so a busy machine does not "
        "count) one sampling step under a grammar may take: a grammar whose first step costs "
        "more is a 400; a later step over it ends its request with a retryable 503 (the engine "
        "thread is shared by every stream).",
        gt=0,
        le=60_000,
        **_env("GRAMMAR_MAX_STEP_MS"),
    )

    # --- Vertex AI identity (set by the platform; logged, never baked into the image) --------
    aip_mode: str | None = Field(
        None,
        description="PREDICTION when running on Vertex AI (logged at start-up).",
        **_env("AIP_MODE"),
    )
    aip_deployed_model_id: str | None = Field(
        None,
        description="Vertex deployed model id (logged at start-up).",
        **_env("AIP_DEPLOYED_MODEL_ID"),
    )
    aip_endpoint_id: str | None = Field(
        None,
        description="Vertex endpoint id (logged at start-up).",
        **_env("AIP_ENDPOINT_ID"),
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

    @model_validator(mode="after")
    def _quantized_v_needs_flash(self) -> Settings:
        if self.kv_cache_type_v not in UNQUANTIZED_KV and self.flash_attn == "off":
            raise ValueError(
                f"KV_CACHE_TYPE_V={self.kv_cache_type_v} needs flash attention: set FLASH_ATTN "
                "to auto or on, or keep the V cache at f16")
        return self

    @field_validator("lora_adapters")
    @classmethod
    def _adapter_list(cls, value: str | None) -> str | None:
        if value is not None:
            lora_entries(value)  # raises ValueError naming the bad entry
        return value

    @field_validator("embedding_task_prefixes", mode="before")
    @classmethod
    def _json_map(cls, value: Any) -> Any:
        """The flag gives a JSON string (the env var is parsed as JSON already)."""
        if isinstance(value, str):
            import json

            try:
                return json.loads(value)
            except ValueError as exc:
                raise ValueError(f"not valid JSON: {exc}") from None
        return value

    @field_validator("apis")
    @classmethod
    def _known_apis(cls, value: str) -> str:
        names = [p.strip() for p in value.split(",")]
        known = {"all", "openai", "responses", "anthropic", "gemini", "ollama", "embeddings"}
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise ValueError(f"{unknown or value!r}: APIS takes all, or some of "
                             f"{', '.join(sorted(known - {'all'}))}")
        return ",".join(dict.fromkeys(names))

    @field_validator("served_model_name", "model_tags")
    @classmethod
    def _name_list(cls, value: str | None) -> str | None:
        """A comma-separated list, kept normalized: parts stripped, duplicates dropped (the
        first kept), an empty part refused (``a,,b`` is a typo, not two names)."""
        if value is None:
            return None
        parts = [p.strip() for p in value.split(",")]
        if any(not p for p in parts):
            raise ValueError(f"{value!r}: a comma-separated list with an empty name in it")
        return ",".join(dict.fromkeys(parts))

    @model_validator(mode="after")
    def _default_within_limit(self) -> Settings:
        limit, default = self.max_tokens_limit, self.default_max_tokens
        if limit and default > limit:
            raise ValueError(
                f"DEFAULT_MAX_TOKENS ({default}) is larger than MAX_TOKENS_LIMIT ({limit}), the "
                "most any request may generate: lower the default or raise the limit"
            )
        return self

    @field_validator("health_route", "predict_route")
    @classmethod
    def _no_placeholders(cls, route: str) -> str:
        if "<" in route or ">" in route:
            raise ValueError("a route may not contain '<' or '>'")
        return route


def lora_entries(value: str | None) -> list[tuple[str, str, float]]:
    """LORA_ADAPTERS as (name, source, scale) triples. A trailing ``:number`` is the scale
    (``gs://b/a.gguf:0.5``); names are unique, and plain enough to be a model name."""
    import math
    import re

    out: list[tuple[str, str, float]] = []
    for entry in value.split(",") if value else ():
        name, eq, source = entry.strip().partition("=")
        name = name.strip()
        if not eq or not name or not source.strip():
            raise ValueError(f"{entry!r}: LORA_ADAPTERS takes name=path-or-gs://[:scale]")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}", name):
            raise ValueError(f"{name!r}: an adapter's name is letters, digits and ._:/- "
                             "(it is a model name)")
        scale = 1.0
        head, colon, tail = source.strip().rpartition(":")
        if colon and head and head not in ("gs", "file"):
            try:
                scale = float(tail)
            except ValueError:
                head = ""
            if head:
                source = head
        if not math.isfinite(scale) or abs(scale) > 16:
            raise ValueError(f"{name}: scale {tail} is not a number between -16 and 16")
        if any(name == n for n, _, _ in out):
            raise ValueError(f"{name}: two adapters with one name")
        out.append((name, source.strip(), scale))
    return out


def max_tokens_default(settings: Settings) -> int | None:
    """The limit of a request that names none: DEFAULT_MAX_TOKENS, else MAX_TOKENS_LIMIT, else
    None (to the end of the context)."""
    return settings.default_max_tokens or settings.max_tokens_limit or None


def max_tokens_bounds(settings: Settings) -> tuple[int | None, int | None]:
    """(the limit of a request that names none, the most a request may ask for), as /props
    and /v1/models show them; None: the end of the context."""
    return max_tokens_default(settings), settings.max_tokens_limit or None


def slots_per_request(settings: Settings) -> int:
    """SLOTS_PER_REQUEST, resolved (0 means half the slots)."""
    return settings.slots_per_request or max(1, settings.parallel // 2)


def stream_max_live(settings: Settings) -> int:
    """STREAM_MAX_LIVE_PER_KEY, resolved (0 means half the slots)."""
    return settings.stream_max_live_per_key or max(1, settings.parallel // 2)


def name_list(value: str | None) -> tuple[str, ...]:
    """SERVED_MODEL_NAME or MODEL_TAGS as its names (the validator has normalized it)."""
    return tuple(value.split(",")) if value else ()


def api_key_configured(settings: Settings) -> bool:
    """Whether the server requires an API key (API_KEY or API_KEY_FILE set: a file without a
    key stops the server at start, so a configured file always means keys)."""
    return settings.api_key is not None or settings.api_key_file is not None


def log_json(settings: Settings) -> bool:
    """LOG_FORMAT, resolved: auto is json on Cloud Run (K_SERVICE) and Vertex AI (AIP_MODE)."""
    if settings.log_format == "auto":
        return bool(settings.k_service or settings.aip_mode)
    return settings.log_format == "json"


def slots_endpoint_on(settings: Settings) -> bool:
    """SLOTS_ENDPOINT, resolved: auto is on unless an API key is configured (/slots shows
    how long the prompts in flight are)."""
    if settings.slots_endpoint == "auto":
        return not api_key_configured(settings)
    return settings.slots_endpoint == "on"


def setting_default(name: str) -> Any:
    """Setting ``name``'s default, as a consumer's dataclass field default: the default lives
    here only, so a config built without settings (tests, benches) cannot drift from it."""
    return Settings.model_fields[name].default


def from_settings(cls: type[C], settings: Settings, **derived: Any) -> C:
    """Dataclass ``cls`` with each field taken from the setting of the same name (vLLM's
    ``from_cli_args`` move), so no consumer copies settings by hand; ``derived`` gives the
    fields computed from settings (a file's text, a resolved value). A field that is neither a
    setting nor derived is an error, not a silent default."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in derived:
            continue
        if f.name not in Settings.model_fields:
            raise TypeError(f"{cls.__name__}.{f.name} is not a setting: pass it as derived")
        values[f.name] = getattr(settings, f.name)
    return cls(**values, **derived)
