"""What bounds a request and the server: token and sampling defaults, sizes, timeouts and the
grammar limits (docs/security.md); and the Vertex AI identity the platform sets. One part of
app.settings.Settings.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from app.settings.fields import env


class LimitSettings(BaseModel):
    """What bounds a request and the server."""

    # --- limits and safety (docs/security.md, Limits and safety) -----------------------------
    default_max_tokens: int = Field(
        0,
        description="Most tokens generated for a request that names no limit (no max_tokens, "
        "max_completion_tokens, max_output_tokens or n_predict), which then ends with "
        "finish_reason length; 0: to the end of the context, or MAX_TOKENS_LIMIT when that is "
        "set. Larger than MAX_TOKENS_LIMIT is an error at start-up.",
        ge=0,
        le=1 << 20,
        **env("DEFAULT_MAX_TOKENS"),
    )
    max_tokens_limit: int = Field(
        0,
        description="Most tokens one request may generate (each choice): a request asking for "
        "more is a 400 naming this limit, and one that names no limit stops here too; 0: no "
        "limit but the context.",
        ge=0,
        le=1 << 20,
        **env("MAX_TOKENS_LIMIT"),
    )
    default_temperature: float = Field(
        1.0,
        description="Temperature of a request that names none (OpenAI's and Anthropic's default "
        "is 1.0; a model card's recommended sampling goes here, as with llama-server's --temp). "
        "0: greedy.",
        ge=0,
        le=2,
        **env("DEFAULT_TEMPERATURE"),
    )
    default_top_p: float = Field(
        1.0,
        description="top_p of a request that names none (1.0: off).",
        gt=0,
        le=1,
        **env("DEFAULT_TOP_P"),
    )
    default_top_k: int = Field(
        0,
        description="top_k of a request that names none (0: off).",
        ge=0,
        le=1 << 20,
        **env("DEFAULT_TOP_K"),
    )
    default_min_p: float = Field(
        0.0,
        description="min_p of a request that names none (0: off).",
        ge=0,
        le=1,
        **env("DEFAULT_MIN_P"),
    )
    max_tokens_clamp: bool = Field(
        False,
        description="A request asking for more tokens than the context has left after its "
        "prompt, or than MAX_TOKENS_LIMIT, gets as many as there are, ending with "
        "finish_reason length, instead of a 400 (OpenAI's answer, and the default). For "
        "clients that reserve a fixed large budget for a model they do not know (Qwen Code "
        "asks for 32000).",
        **env("MAX_TOKENS_CLAMP"),
    )
    slots_per_request: int = Field(
        0,
        description="Most slots one request may hold: its `n` choices, or a Vertex envelope's "
        "instances running at once (0: half of PARALLEL, at least 1), so one request never "
        "takes every slot.",
        ge=0,
        le=256,
        **env("SLOTS_PER_REQUEST"),
    )
    max_prompt_bytes: int = Field(
        0,
        description="Prompts longer than this in UTF-8 bytes are refused before they are "
        "tokenized (0: the context size times the longest token, which no prompt that fits "
        "can exceed).",
        ge=0,
        le=1 << 31,
        **env("MAX_PROMPT_BYTES"),
    )
    prompt_logprobs_max_tokens: int = Field(
        8192,
        description="Longest prompt whose tokens a request may score (Completions' echo with "
        "logprobs): a longer one is a 400. Scoring a prompt computes logits at every position "
        "(a bounded number per engine step) and returns an entry per token.",
        ge=1,
        le=1 << 20,
        **env("PROMPT_LOGPROBS_MAX_TOKENS"),
    )
    max_tools: int = Field(
        128,
        description="Most tools in one request (OpenAI's own limit is 128).",
        ge=1,
        le=10_000,
        **env("MAX_TOOLS"),
    )
    max_json_depth: int = Field(
        64,
        description="Deepest nesting of arrays and objects in a request body; deeper is a 400.",
        ge=8,
        le=512,
        **env("MAX_JSON_DEPTH"),
    )
    body_timeout: float = Field(
        60.0,
        description="Seconds a client may take to send its request body; slower is a 408 "
        "(a trickled body cannot hold a connection forever).",
        gt=0,
        le=3600,
        **env("BODY_TIMEOUT"),
    )
    header_timeout: float = Field(
        20.0,
        description="Seconds a new connection may take to send its request line and headers; "
        "slower is a 408 (a client that never finishes its headers cannot hold a connection). "
        "Later requests on a kept-alive connection have the keep-alive time.",
        gt=0,
        le=3600,
        **env("HEADER_TIMEOUT"),
    )
    client_timeout: float = Field(
        120.0,
        description="Seconds a client socket may stall a read or a write (a reader that stops "
        "reading a stream); the connection is closed after it and its generation cancelled.",
        gt=0,
        le=86400,
        **env("CLIENT_TIMEOUT"),
    )
    prepare_timeout: float = Field(
        30.0,
        description="Seconds a request's preparation (validation, chat template, JSON Schema "
        "conversion, grammar checks; run off the request loop) may take before a 503.",
        gt=0,
        le=3600,
        **env("PREPARE_TIMEOUT"),
    )
    watchdog_seconds: float = Field(
        60.0,
        description="Health answers 503 (so the platform restarts the container) when one "
        "engine step, or one request's preparation, has run this long, or when every "
        "request-preparation thread has been held this long.",
        gt=0,
        le=86400,
        **env("WATCHDOG_SECONDS"),
    )
    special_tokens_in_messages: Literal["text", "parse"] = Field(
        "text",
        description="Control-token text inside messages (`<|im_start|>` written by a user, a "
        "tool result or a document): text keeps it plain text, so nobody can forge a turn; "
        "parse makes it control tokens (what llama-server and vLLM do).",
        **env("SPECIAL_TOKENS_IN_MESSAGES"),
    )
    grammar_max_bytes: int = Field(
        256 * 1024,
        description="Largest grammar text (GBNF, from `grammar`, a JSON schema or tools).",
        ge=1024,
        le=16 << 20,
        **env("GRAMMAR_MAX_BYTES"),
    )
    grammar_max_rules: int = Field(
        10_000,
        description="Most rules a grammar may expand to (groups and repetitions included).",
        ge=16,
        le=1_000_000,
        **env("GRAMMAR_MAX_RULES"),
    )
    grammar_max_symbols: int = Field(
        200_000,
        description="Most symbols a grammar may expand to (its size in memory).",
        ge=256,
        le=50_000_000,
        **env("GRAMMAR_MAX_SYMBOLS"),
    )
    grammar_max_depth: int = Field(
        4096,
        description="Deepest nesting of groups in a grammar (llama.cpp's parser recurses per "
        "level).",
        ge=8,
        le=20_000,
        **env("GRAMMAR_MAX_DEPTH"),
    )
    grammar_max_repetition: int = Field(
        2000,
        description="Largest repetition bound ({m,n}; a schema's minLength / minItems): over "
        "it, a 400; a schema's maxLength / maxItems over it is not enforced (as llama.cpp does "
        "above 2000).",
        ge=1,
        le=2000,
        **env("GRAMMAR_MAX_REPETITION"),
    )
    grammar_max_alternatives: int = Field(
        1000,
        description="Most alternatives in one grammar rule (an enum's values, a union's "
        "members).",
        ge=2,
        le=100_000,
        **env("GRAMMAR_MAX_ALTERNATIVES"),
    )
    grammar_max_optionals: int = Field(
        16,
        description="Most optional items in a row in a grammar (each can multiply the work "
        "of a sampling step).",
        ge=1,
        le=10_000,
        **env("GRAMMAR_MAX_OPTIONALS"),
    )
    grammar_max_properties: int = Field(
        5000,
        description="Most properties in one JSON schema, all objects together (OpenAI's limit).",
        ge=1,
        le=1_000_000,
        **env("GRAMMAR_MAX_PROPERTIES"),
    )
    grammar_max_optional_properties: int = Field(
        256,
        description="Most optional properties in one object of a JSON schema (conversion is "
        "quadratic in them).",
        ge=1,
        le=100_000,
        **env("GRAMMAR_MAX_OPTIONAL_PROPERTIES"),
    )
    grammar_max_step_ms: float = Field(
        100.0,
        description="Most engine CPU time (the engine thread's own, so a busy machine does not "
        "count) one sampling step under a grammar may take: a grammar whose first step costs "
        "more is a 400; a later step over it ends its request with a retryable 503 (the engine "
        "thread is shared by every stream).",
        gt=0,
        le=60_000,
        **env("GRAMMAR_MAX_STEP_MS"),
    )

    # --- Vertex AI identity (set by the platform; logged, never baked into the image) --------
    aip_mode: str | None = Field(
        None,
        description="PREDICTION when running on Vertex AI (logged at start-up).",
        **env("AIP_MODE"),
    )
    aip_deployed_model_id: str | None = Field(
        None,
        description="Vertex deployed model id (logged at start-up).",
        **env("AIP_DEPLOYED_MODEL_ID"),
    )
    aip_endpoint_id: str | None = Field(
        None,
        description="Vertex endpoint id (logged at start-up).",
        **env("AIP_ENDPOINT_ID"),
    )

    @model_validator(mode="after")
    def _default_within_limit(self) -> LimitSettings:
        limit, default = self.max_tokens_limit, self.default_max_tokens
        if limit and default > limit:
            raise ValueError(
                f"DEFAULT_MAX_TOKENS ({default}) is larger than MAX_TOKENS_LIMIT ({limit}), the "
                "most any request may generate: lower the default or raise the limit"
            )
        return self
