"""OpenAI request validation and response objects, as pure functions over plain dicts."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.base.errors import (
    BadRequest,
    ClientGone,
    Forbidden,
    GenerationTimeout,
    Internal,
    ModelNotFound,
    NotFound,
    NotSupported,
    QueueFull,
    ServiceError,
    Unauthorized,
    Unavailable,
)
from app.engine.types import VOCAB_TYPES, ModelInfo, SamplingParams, Speculation
from app.formats.chat_template import flatten_content
from app.protocol import validate
from app.protocol.http_status import lookup
from app.protocol.logprobs import MAX_TOP

SYSTEM_FINGERPRINT = "vertex-gguf"


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage in every chunk
    # OpenAI pads chunks against length side channels; this server does not: only false
    include_obfuscation: Literal[False] | None = None


MAX_STOP_CHARS = 256
MAX_LOGIT_BIAS = 1024
MAX_PROMPT_TOKEN_LISTS = 1  # one prompt per completions request
_INT64 = 2**63


class LoraEntry(BaseModel):
    """One entry of llama-server's ``lora`` field: an adapter's id and its scale."""

    model_config = ConfigDict(extra="forbid", strict=True)
    id: int = Field(ge=0, lt=2**31)
    scale: float = Field(ge=-16, le=16)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class Prediction(BaseModel):
    """OpenAI's Predicted Outputs: text the reply is expected to repeat. It only makes the
    reply faster (its tokens are drafted and checked), never different."""

    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["content"]
    content: str | list[TextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class _Sampling(BaseModel):
    """Fields common to chat and completions. Strict: a field of the wrong type is a 400, not
    coerced (``"stream": "yes"`` does not stream), and an unknown field is a 400 (see
    :func:`parse`), never silently ignored."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1, lt=2**31)
    # llama.cpp's name for max_tokens (-1: no limit)
    n_predict: int | None = Field(None, ge=-1, lt=2**31)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, lt=2**31)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = Field(None, ge=-_INT64, lt=2 * _INT64)
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repeat_penalty: float | None = Field(None, gt=0, le=10)
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False
    n: int = Field(1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # informational: recorded nowhere, change nothing (see docs/api.md, Request fields)
    user: str | None = Field(None, max_length=256)
    metadata: dict[str, str] | None = None
    service_tier: Literal["auto", "default"] | None = None
    store: Literal[False] | None = None
    prompt_cache_key: str | None = Field(None, max_length=256)
    safety_identifier: str | None = Field(None, max_length=256)
    # llama.cpp's extension: false decodes the whole prompt even when a slot has its prefix
    cache_prompt: bool = True
    # llama.cpp's extension: a GBNF grammar the output must follow
    grammar: str | None = Field(None, min_length=1)
    # vLLM's extension: logprobs name tokens "token_id:<id>" instead of their text
    return_tokens_as_token_ids: bool = False
    # llama-server's extension: this request's speculative-decoding limits (n_max 0: off)
    spec_n_max: int | None = Field(None, ge=0, le=128, alias="speculative.n_max")
    spec_n_min: int | None = Field(None, ge=0, le=128, alias="speculative.n_min")
    spec_p_min: float | None = Field(None, ge=0, le=1, alias="speculative.p_min")
    # llama-server's extension: LoRA adapter scales for this request (LORA_ADAPTERS' ids)
    lora: list[LoraEntry] | None = Field(None, max_length=64)

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else v or []
        if len(stops) > 16:
            raise ValueError("at most 16 stop sequences")
        if any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"a stop sequence may have at most {MAX_STOP_CHARS} characters")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is None:
            return v
        if len(v) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} entries")
        for key, bias in v.items():
            if not key.isascii() or not key.isdigit() or len(key) > 10:
                raise ValueError(f"keys are token ids (non-negative integers), not {key[:20]!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"token {key}: a bias must be between -100 and 100")
        return v

    @model_validator(mode="after")
    def _one_max(self) -> _Sampling:
        both = self.n_predict is not None and self.max_tokens is not None
        if both and self.n_predict != self.max_tokens:
            raise ValueError("n_predict and max_tokens are the same setting: send one")
        return self

    def limit(self) -> int | None:
        if self.max_tokens is not None:
            return self.max_tokens
        return None if self.n_predict in (None, -1) else self.n_predict

    def limit_param(self) -> str:
        """The field the limit came from (named in errors about it)."""
        named = self.max_tokens is None and self.n_predict not in (None, -1)
        return "n_predict" if named else "max_tokens"

    def sampling(self) -> SamplingParams:
        stop = self.stop if isinstance(self.stop, list) else [self.stop] if self.stop else []
        return SamplingParams(
            max_tokens=self.limit(),
            max_tokens_param=self.limit_param(),
            temperature=self.temperature,  # None: the server's default
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            seed=self.seed,
            stop=tuple(s for s in stop if s),
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repeat_penalty=1.0 if self.repeat_penalty is None else self.repeat_penalty,
            grammar=self.grammar,
            logit_bias=tuple((int(k), float(b)) for k, b in (self.logit_bias or {}).items()),
            ignore_eos=self.ignore_eos,
            speculative=Speculation(self.spec_n_max, self.spec_n_min, self.spec_p_min),
            lora=None if self.lora is None else tuple((e.id, e.scale) for e in self.lora),
        )


class Message(BaseModel):
    # extra fields (tool_calls, tool_call_id, reasoning_content, ...) go to the template as data
    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, lt=2**31)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP)
    tools: list[Any] | None = None
    tool_choice: Any = None
    # llama.cpp's reasoning control: end a thought on request, or after this many tokens
    reasoning_control: bool = False
    reasoning_budget: int | None = Field(None, ge=0)
    # OpenAI's: a thought budget from the effort table (reasoning_budget, when given, wins)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    # extra variables for the chat template (vLLM's and llama.cpp's; e.g. enable_thinking)
    chat_template_kwargs: dict[str, Any] | None = None
    modalities: list[Literal["text"]] | None = None
    # OpenAI's Predicted Outputs: drafted from, checked token by token (docs/speculative.md)
    prediction: Prediction | None = None

    @field_validator("response_format")
    @classmethod
    def _known_format(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type", "text") not in {"text", "json_object", "json_schema"}:
            raise ValueError(
                f"response_format type {v.get('type')!r} is not one of text, json_object, "
                "json_schema"
            )
        return v

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        reserved = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}
        for key in v or {}:
            if key in reserved or not key.isidentifier():
                raise ValueError(f"{key!r} cannot be set through chat_template_kwargs")
        return v

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> ChatRequest:
        if self.top_logprobs and not self.logprobs:
            raise BadRequest("top_logprobs needs logprobs: true", param="top_logprobs")
        return self

    def sampling(self) -> SamplingParams:
        params = super().sampling()
        if self.prediction is not None:
            params = replace(params, speculative=replace(params.speculative,
                                                         prediction=self.prediction.text()))
        if not self.logprobs:
            return params
        return replace(params, logprobs=self.top_logprobs or 0)

    def limit(self) -> int | None:
        if self.max_completion_tokens is not None:
            if self.max_tokens is not None and self.max_tokens != self.max_completion_tokens:
                raise BadRequest("max_tokens and max_completion_tokens differ: send one",
                                 param="max_completion_tokens")
            return self.max_completion_tokens
        return super().limit()

    def limit_param(self) -> str:
        if self.max_completion_tokens is not None:
            return "max_completion_tokens"
        return super().limit_param()

    def template_messages(self, image: Callable[[dict[str, Any], str], Any] | None = None
                          ) -> list[dict[str, Any]]:
        """The messages as templates take them; ``image`` takes each image part (see
        flatten_content)."""
        out = []
        for i, m in enumerate(self.messages):
            msg = m.model_dump(exclude_none=True)
            msg["content"] = flatten_content(m.content, f"messages.{i}", image)
            if msg["role"] == "developer":
                msg["role"] = "system"
            out.append(msg)
        return out


class CompletionRequest(_Sampling):
    # a string, token ids, or a list of exactly one of either (checked by hand: pydantic's union
    # of list types builds one error per element of a 500k-token prompt before it settles)
    prompt: Any
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=1)
    # the legacy form: how many likeliest alternatives per token (the token itself is always
    # there too)
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP)
    # 0 scores the prompt alone, with echo (as vLLM and OpenAI's older models do)
    max_tokens: int | None = Field(None, ge=0, lt=2**31)

    @model_validator(mode="after")
    def _zero_needs_echo(self) -> CompletionRequest:
        if self.limit() == 0 and not self.echo:
            raise BadRequest(f"{self.limit_param()} is 0: nothing would be generated; 0 is for "
                             "scoring the prompt, with echo (and logprobs)",
                             param=self.limit_param())
        return self

    def sampling(self) -> SamplingParams:
        return replace(super().sampling(), logprobs=self.logprobs)

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix (fill-in-the-middle) is not supported")
        return v

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        if isinstance(v, str):
            return v
        if not isinstance(v, list):
            raise ValueError("prompt must be a string, a list of token ids, or a list of one of those")
        if v and all(type(x) is str for x in v):
            return v
        if all(type(x) is int for x in v):
            return v
        if all(type(x) is list and all(type(t) is int for t in x) for x in v):
            return v
        raise ValueError("prompt must be a string, a list of token ids, or a list of one of those")

    def single_prompt(self) -> str | tuple[int, ...]:
        p = self.prompt
        if isinstance(p, str):
            return p
        if len(p) == 0:
            raise BadRequest("prompt is empty", param="prompt")
        if all(isinstance(x, int) for x in p):
            return tuple(p)
        if len(p) != 1:
            raise BadRequest(
                "a list of several prompts is not supported: send one prompt per request "
                "(or one instance per prompt in a Vertex envelope)",
                param="prompt",
            )
        only = p[0]
        return only if isinstance(only, str) else tuple(only)


# Fields some clients send that this server does not do, with what to use instead (OpenAI's
# own first: each is a 400, since ignoring it would change what the client gets back).
UNSUPPORTED = {
    "functions": "use 'tools'",
    "function_call": "use 'tool_choice'",
    "audio": "this server generates text only",
    "web_search_options": "this server has no web search",
    "typical_p": "not supported",
    "mirostat": "not supported",
    "n_probs": "use logprobs (and top_logprobs on chat)",
}

# Fields OpenAI's API defines that are accepted and change nothing here, with why (listed in
# docs/api.md, Request fields).
IGNORED = {
    "moderation": "no moderation runs here",
    "prompt_cache_options": "every prompt prefix is cached without being asked",
    "prompt_cache_retention": "every prompt prefix is cached without being asked",
    "verbosity": "the answer's length is not steered",
}


def parse(model: type[BaseModel], body: Any, unsupported: dict[str, str] | None = None,
          ignored: dict[str, str] | None = None) -> Any:
    """Validate an OpenAI request body (see app.protocol.validate)."""
    return validate.parse(model, body, UNSUPPORTED if unsupported is None else unsupported,
                          ignored=IGNORED if ignored is None else ignored)


wants_stream = validate.wants_stream


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None,
    predicted: tuple[int, int] | None = None, video_frames: int = 0,
) -> dict[str, Any]:
    """OpenAI usage; ``cached_tokens`` (prompt tokens served from the KV cache) when known;
    ``predicted`` (Predicted Outputs: the prediction's tokens accepted, and the rest of them)
    when the request brought a prediction; ``video_frames`` (the frames its videos gave, each
    an image to the projector) beside the cached tokens when it sent video."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    if video_frames:
        out.setdefault("prompt_tokens_details", {})["video_frames"] = video_frames
    if predicted is not None:
        out["completion_tokens_details"] = {"accepted_prediction_tokens": predicted[0],
                                            "rejected_prediction_tokens": predicted[1]}
    return out


def chat_completion(
    rid: str,
    created: int,
    model: str,
    choices: list[tuple[str | dict[str, Any], str, dict[str, Any] | None]],
    use: dict[str, Any],
    timings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``choices``: (text or a whole message, finish_reason, logprobs) per choice index;
    ``timings``: llama-server's object, when there is something to say in it."""
    return _with_timings({
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [
            {
                "index": i,
                "message": text if isinstance(text, dict) else {"role": "assistant", "content": text},
                "logprobs": logprobs,
                "finish_reason": finish,
            }
            for i, (text, finish, logprobs) in enumerate(choices)
        ],
        "usage": use,
    }, timings)


def text_completion(
    rid: str, created: int, model: str,
    choices: list[tuple[str, str, dict[str, Any] | None]], use: dict[str, Any],
    timings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``choices``: (text, finish_reason, logprobs) per choice index."""
    return _with_timings({
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [
            {"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish}
            for i, (text, finish, logprobs) in enumerate(choices)
        ],
        "usage": use,
    }, timings)


def _with_timings(body: dict[str, Any], timings: dict[str, Any] | None) -> dict[str, Any]:
    if timings is not None:
        body["timings"] = timings
    return body


# The server's bounds on generation length: (a request naming no limit gets this, at most
# this per request); None: the end of the context.
Length = tuple[int | None, int | None]


def models_list(info: ModelInfo, length: Length | None = None) -> dict[str, Any]:
    """The model, then each LoRA adapter as a model of its own whose parent is the model
    (vLLM's listing: a client picks an adapter by its ``model`` alone)."""
    return {"object": "list", "data": [model_card(info, length),
                                       *(adapter_card(info, name) for name, _ in info.adapters)]}


def adapter_card(info: ModelInfo, name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": info.created, "owned_by": "vertex-gguf",
            "parent": info.name, "root": info.name}


def model_card(info: ModelInfo, length: Length | None = None) -> dict[str, Any]:
    """The model as /v1/models lists it: OpenAI's fields, and llama-server's ``aliases``,
    ``tags`` and ``meta`` (its numeric ``vocab_type`` too, with the name beside it)."""
    return {
        "id": info.name,
        "object": "model",
        "created": info.created,
        "owned_by": "vertex-gguf",
        "aliases": list(info.names),
        "tags": list(info.tags),
        "meta": model_meta(info, length),
    }


def model_meta(info: ModelInfo, length: Length | None = None) -> dict[str, Any]:
    """llama-server's ``meta``, and the server's generation-length bounds
    (``max_tokens_default``, ``max_tokens_limit``: null when only the context bounds it)."""
    vocab = VOCAB_TYPES.index(info.vocab_type) if info.vocab_type in VOCAB_TYPES else None
    default, limit = length or (None, None)
    return {
        "vocab_type": vocab,
        "vocab_type_name": info.vocab_type or None,
        "n_vocab": info.n_vocab,
        "n_ctx": info.n_ctx,
        "n_ctx_train": info.n_ctx_train,
        "n_embd": info.n_embd,
        "n_params": info.n_params,
        "size": info.size,
        "max_tokens_default": default,
        "max_tokens_limit": limit,
        "modalities": info.modalities,  # as /props says
        "reranks": info.reranks,  # serves /v1/rerank, /v2/rerank and /score
    }


# OpenAI's error type names, by domain error (the nearest class wins).
ERROR_TYPES: dict[type[ServiceError], str] = {
    BadRequest: "invalid_request_error",
    Unauthorized: "invalid_request_error",  # OpenAI's, with code invalid_api_key
    Forbidden: "permission_error",
    NotFound: "not_found_error",
    ModelNotFound: "invalid_request_error",  # OpenAI's own type for code model_not_found
    NotSupported: "not_supported_error",  # llama-server's (a disabled /slots)
    ClientGone: "client_closed_request",
    QueueFull: "rate_limit_error",
    Unavailable: "service_unavailable",
    GenerationTimeout: "timeout",
    Internal: "internal_error",
}


def error_body(err: ServiceError) -> dict[str, Any]:
    """The OpenAI error object: ``{"error": {"message", "type", "param", "code"}}``; ``code``
    is a string or null, as OpenAI's is (the error's neutral code; null when it has none)."""
    return {
        "error": {
            "message": err.message,
            "type": lookup(ERROR_TYPES, err, "internal_error"),
            "param": err.param,
            "code": err.code,
        }
    }
