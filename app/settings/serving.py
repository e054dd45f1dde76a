"""The HTTP server: keys and operations, host, port and routes, workers and the crash guard, logs,
how streams end and resume, the request timeout, the Responses store. One part of
app.settings.Settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from app.settings.fields import env


class ServingSettings(BaseModel):
    """The HTTP server."""

    # --- operations (docs/security.md; docs/operations.md) -----------------------------------
    api_key: str | None = Field(
        None,
        description="API keys, comma-separated: when set (or API_KEY_FILE), every route but "
        "the health routes needs `Authorization: Bearer <key>` or `x-api-key: <key>`; a "
        "missing or wrong key is a 401. Never logged nor shown.",
        min_length=1,
        max_length=65536,
        repr=False,
        **env("API_KEY"),
    )
    api_key_file: Path | None = Field(
        None,
        description="File of API keys, one a line (blank lines and # comments ignored), read "
        "at start; adds to API_KEY. A file without a key stops the server.",
        repr=False,
        **env("API_KEY_FILE"),
    )
    metrics_public: bool = Field(
        False,
        description="Serve /metrics without an API key when keys are configured (a scraper "
        "inside the network); off: /metrics needs a key like every other route.",
        **env("METRICS_PUBLIC"),
    )
    apis: str = Field(
        "all",
        description="The wire APIs served: all, or a comma-separated list of openai (Chat "
        "Completions, Completions), responses, anthropic, gemini, ollama, embeddings (OpenAI's "
        "and Vertex's), rerank (the rerank and score routes). An API left out has no routes (a 404), and the predict route does not "
        "dispatch to it.",
        **env("APIS"),
    )
    webui: Literal["on", "off"] = Field(
        "on",
        description="The playground page at / (chat with streaming, thoughts, tool calls, "
        "settings; conversations kept in the browser). It needs no key to load, and asks for "
        "one when keys are set; off: / is a 404. Vertex AI never routes / to the container.",
        **env("WEBUI"),
    )
    log_format: Literal["auto", "json", "text"] = Field(
        "auto",
        description="Log lines: json (one Cloud Logging structured entry a line: severity, "
        "trace, request id, httpRequest) or text; auto: json when K_SERVICE (Cloud Run) or "
        "AIP_MODE (Vertex AI) is set, else text.",
        **env("LOG_FORMAT"),
    )
    google_cloud_project: str | None = Field(
        None,
        description="Project id for trace links in JSON logs (projects/<id>/traces/<trace>); "
        "unset: the trace id alone.",
        min_length=1,
        max_length=128,
        **env("GOOGLE_CLOUD_PROJECT"),
    )
    k_service: str | None = Field(
        None,
        description="Cloud Run service name (set by Cloud Run; makes LOG_FORMAT=auto json).",
        **env("K_SERVICE"),
    )

    # --- HTTP --------------------------------------------------------------------------------
    host: str = Field(
        "0.0.0.0",
        description="Address to bind.",
        min_length=1,
        **env("HOST"),
    )
    port: int = Field(
        8080,
        description="Port to bind: AIP_HTTP_PORT (Vertex AI), else PORT (Cloud Run), else 8080.",
        ge=1,
        le=65535,
        **env("AIP_HTTP_PORT", "PORT"),
    )
    health_route: str = Field(
        "/health",
        description="Health route (Vertex: AIP_HEALTH_ROUTE). /health is always served too.",
        pattern=r"^/",
        **env("AIP_HEALTH_ROUTE", "HEALTH_ROUTE"),
    )
    predict_route: str = Field(
        "/predict",
        description="Vertex predict route (Vertex: AIP_PREDICT_ROUTE); also takes raw OpenAI "
        "bodies (rawPredict, streamRawPredict).",
        pattern=r"^/",
        **env("AIP_PREDICT_ROUTE", "PREDICT_ROUTE"),
    )
    max_instances: int = Field(
        64,
        description="Most instances in one predict envelope; more is a 400.",
        ge=1,
        le=10_000,
        **env("MAX_INSTANCES"),
    )
    max_body_bytes: int = Field(
        10 * 1024 * 1024,
        description="Largest request body in bytes; larger is a 413.",
        ge=1024,
        le=1 << 31,
        **env("MAX_BODY_BYTES"),
    )
    graceful_timeout: float = Field(
        10.0,
        description="Seconds in-flight requests get to finish after SIGTERM.",
        ge=0,
        le=3600,
        **env("GRACEFUL_TIMEOUT"),
    )
    crash_limit: int = Field(
        3,
        description="A worker that dies from a signal after the model was ready with no "
        "request in flight (a broken model or machine) is restarted; this many such deaths "
        "within CRASH_WINDOW seconds end the process (exit code 4) instead of a restart loop. "
        "A death with requests in flight never ends it (a restart after CRASH_BACKOFF_MAX's "
        "back-off); a death while loading is restarted once, in safe mode.",
        ge=1,
        le=1000,
        **env("CRASH_LIMIT"),
    )
    crash_window: float = Field(
        600.0,
        description="Seconds over which worker deaths after ready are counted: those with "
        "nothing in flight against CRASH_LIMIT, those with requests in flight for their "
        "back-off (a window without one starts it again at 1 s).",
        gt=0,
        le=86400 * 7,
        **env("CRASH_WINDOW"),
    )
    crash_backoff_max: float = Field(
        60.0,
        description="Longest wait, in seconds, before a worker that replaces one that died "
        "with requests in flight loads the model: 1 s after the first such death within "
        "CRASH_WINDOW, doubling with each more, up to this (health answers 503 meanwhile). "
        "0: load at once.",
        ge=0,
        le=3600,
        **env("CRASH_BACKOFF_MAX"),
    )
    worker_connections: int = Field(
        1000,
        description="Most simultaneous connections the gevent worker accepts.",
        ge=1,
        le=100_000,
        **env("WORKER_CONNECTIONS"),
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info",
        description="Log level.",
        **env("LOG_LEVEL"),
    )

    # --- streaming (docs/streaming.md: a profile, then overrides) ----------------------------
    stream_profile: Literal["openai", "strict", "llama.cpp"] = Field(
        "openai",
        description="Stream termination profile: openai ([DONE], usage on request), strict (no "
        "[DONE]: the stream ends when the response closes), llama.cpp (what llama-server sends).",
        **env("STREAM_PROFILE"),
    )
    stream_done: bool | None = Field(
        None,
        description="Send `data: [DONE]` at the end of a stream (default: from the profile). "
        "Per request: header X-Stream-Done: 1 or 0.",
        json_schema_extra={"default_label": "from profile"},
        **env("STREAM_DONE"),
    )
    stream_done_after_error: bool | None = Field(
        None,
        description="Send [DONE] after a mid-stream error event (default: from the profile).",
        json_schema_extra={"default_label": "from profile"},
        **env("STREAM_DONE_AFTER_ERROR"),
    )
    stream_role_content: Literal["empty", "null"] | None = Field(
        None,
        description='Content of the first (role) chunk: "empty" sends "", "null" sends null '
        "(default: from the profile).",
        json_schema_extra={"default_label": "from profile"},
        **env("STREAM_ROLE_CONTENT"),
    )
    stream_always_usage: bool | None = Field(
        None,
        description="Send the usage chunk even without stream_options.include_usage (default: "
        "from the profile).",
        json_schema_extra={"default_label": "from profile"},
        **env("STREAM_ALWAYS_USAGE"),
    )
    stream_heartbeat_seconds: float | None = Field(
        None,
        description="Send an SSE comment `: ping` when nothing was sent for this long; 0 = off "
        "(default: from the profile).",
        ge=0,
        le=3600,
        json_schema_extra={"default_label": "from profile"},
        **env("STREAM_HEARTBEAT_SECONDS"),
    )
    stream_store: str = Field(
        "memory",
        description="Where resumable streams (`X-Conversation-Id`) keep their bytes: `memory` "
        "(this replica only) or a Redis URL (`redis://host:6379/0`, `rediss://...`; Memorystore), "
        "so a resume, a DELETE or a second POST on any replica finds the session. A Redis outage "
        "degrades to in-process sessions; it never fails a stream.",
        pattern=r"^(memory|rediss?://\S+|unix://\S+)$",
        **env("STREAM_STORE"),
    )
    stream_buffer_bytes: int = Field(
        4 * 1024 * 1024,
        description="Bytes of a resumable stream kept for a resume (the newest; the oldest drop "
        "first, and a resume from before them is a 400 `stream offset lost`).",
        ge=256,
        le=256 * 1024 * 1024,
        **env("STREAM_BUFFER_BYTES"),
    )
    stream_session_ttl: float = Field(
        300.0,
        description="Seconds a finished resumable stream can still be replayed; after that its "
        "id is a 404. Live streams are never collected.",
        gt=0,
        le=7 * 86400,
        **env("STREAM_SESSION_TTL"),
    )
    stream_max_live_per_key: int = Field(
        0,
        description="Most resumable generations (X-Conversation-Id) one API key may run at once "
        "on a replica, read or not; more is a 429 too_many_streams (0: half the slots). Without "
        "API keys every caller shares one count.",
        ge=0,
        le=10_000,
        **env("STREAM_MAX_LIVE_PER_KEY"),
    )
    stream_unread_timeout: float = Field(
        120.0,
        description="Seconds a resumable generation may run with nobody reading it (its client "
        "gone, no GET /v1/stream on any replica) before it is stopped; 0: never.",
        ge=0,
        le=86400,
        **env("STREAM_UNREAD_TIMEOUT"),
    )
    request_timeout: float = Field(
        0,
        description="Seconds a generation may run before it is ended with a timeout error (a "
        "504, or an error event mid-stream); 0 = no limit. Set it below the platform's own "
        "request timeout so clients get a clear error instead of a cut connection.",
        ge=0,
        le=86400,
        **env("REQUEST_TIMEOUT"),
    )
    responses_store_size: int = Field(
        100,
        description="Most responses of the Responses API kept in memory (per replica) for "
        "previous_response_id and GET /v1/responses/{id}; the oldest go first; 0 = none kept.",
        ge=0,
        le=100_000,
        **env("RESPONSES_STORE_SIZE"),
    )
    responses_store_bytes: int = Field(
        256 * 1024 * 1024,
        description="Most bytes (as JSON: the responses with their echoed fields, and the "
        "conversations they continue) the Responses API store keeps in all; past it, the key "
        "holding the most loses its oldest; a response larger than this is not kept.",
        ge=1024,
        le=1 << 40,
        **env("RESPONSES_STORE_BYTES"),
    )
    responses_store_ttl: float = Field(
        3600.0,
        description="Seconds a stored Responses API response is kept; after it, its id is a 404.",
        gt=0,
        le=7 * 86400,
        **env("RESPONSES_STORE_TTL"),
    )

    @field_validator("apis")
    @classmethod
    def _known_apis(cls, value: str) -> str:
        names = [p.strip() for p in value.split(",")]
        known = {"all", "openai", "responses", "anthropic", "gemini", "ollama", "embeddings",
                 "rerank"}
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise ValueError(f"{unknown or value!r}: APIS takes all, or some of "
                             f"{', '.join(sorted(known - {'all'}))}")
        return ",".join(dict.fromkeys(names))

    @field_validator("health_route", "predict_route")
    @classmethod
    def _no_placeholders(cls, route: str) -> str:
        if "<" in route or ">" in route:
            raise ValueError("a route may not contain '<' or '>'")
        return route
