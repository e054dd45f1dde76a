"""OpenAI request validation and response objects, as pure functions over plain dicts."""

from __future__ import annotations

import json
import secrets
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from app.engine.types import ModelInfo, SamplingParams
from app.errors import BadRequest
from app.protocol.chat_template import flatten_content

SYSTEM_FINGERPRINT = "vertex-gguf"


class StreamOptions(BaseModel):
    """Unknown keys are ignored, not rejected (clients send vendor extensions)."""

    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repeat_penalty: float | None = Field(None, gt=0, le=10)
    n: int = Field(1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool | int | None = None
    user: str | None = None
    # llama.cpp's extension: false decodes the whole prompt even when a slot has its prefix
    cache_prompt: bool = True
    # llama.cpp's extension: a GBNF grammar the output must follow
    grammar: str | None = Field(None, min_length=1)

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 16:
            raise ValueError("at most 16 stop sequences")
        return v

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, v: bool | int | None) -> bool | int | None:
        if v:
            raise ValueError("logprobs are not supported by this server")
        return v

    def sampling(self) -> SamplingParams:
        stop = self.stop if isinstance(self.stop, list) else [self.stop] if self.stop else []
        return SamplingParams(
            max_tokens=self.max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            min_p=self.min_p or 0.0,
            seed=self.seed,
            stop=tuple(s for s in stop if s),
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repeat_penalty=1.0 if self.repeat_penalty is None else self.repeat_penalty,
            grammar=self.grammar,
        )


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Any] | None = None
    tool_choice: Any = None
    # llama.cpp's reasoning control: end a thought on request, or after this many tokens
    reasoning_control: bool = False
    reasoning_budget: int | None = Field(None, ge=0)
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None

    @field_validator("response_format")
    @classmethod
    def _known_format(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type", "text") not in {"text", "json_object", "json_schema"}:
            raise ValueError(
                f"response_format type {v.get('type')!r} is not one of text, json_object, "
                "json_schema"
            )
        return v

    def sampling(self) -> SamplingParams:
        params = super().sampling()
        changes: dict[str, Any] = {}
        if self.max_tokens is None and self.max_completion_tokens is not None:
            changes["max_tokens"] = self.max_completion_tokens
        grammar = response_grammar(self.response_format)
        if grammar is not None:
            changes["grammar"] = grammar
        return SamplingParams(**{**params.__dict__, **changes}) if changes else params

    def template_messages(self) -> list[dict[str, Any]]:
        out = []
        for i, m in enumerate(self.messages):
            msg = m.model_dump(exclude_none=True)
            msg["content"] = flatten_content(m.content, f"messages.{i}")
            if msg["role"] == "developer":
                msg["role"] = "system"
            out.append(msg)
        return out


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=1)

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix (fill-in-the-middle) is not supported")
        return v

    def single_prompt(self) -> str | tuple[int, ...]:
        p = self.prompt
        if isinstance(p, str):
            return p
        if len(p) == 0:
            raise BadRequest("prompt is empty", param="prompt")
        if all(isinstance(x, int) for x in p):
            return tuple(p)  # type: ignore[arg-type]
        if len(p) != 1:
            raise BadRequest(
                "a list of several prompts is not supported: send one prompt per request "
                "(or one instance per prompt in a Vertex envelope)",
                param="prompt",
            )
        only = p[0]
        return only if isinstance(only, str) else tuple(only)


def response_grammar(fmt: dict[str, Any] | None) -> str | None:
    """The GBNF grammar that constrains output to ``response_format`` (None for plain text)."""
    if not fmt or fmt.get("type", "text") == "text":
        return None
    from llama_cpp.llama_grammar import JSON_GBNF

    if fmt["type"] == "json_object":
        return JSON_GBNF
    spec = fmt.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise BadRequest(
            "response_format.json_schema.schema must be a JSON Schema object",
            param="response_format.json_schema.schema",
        )
    return schema_grammar(schema, "response_format.json_schema.schema")


def schema_grammar(schema: dict[str, Any], param: str) -> str:
    """A JSON Schema as a llama.cpp grammar; a schema the converter rejects is a 400."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception as exc:  # noqa: BLE001 - the converter raises assorted errors
        raise BadRequest(f"{param} cannot be enforced: {exc}", param=param) from None


def parse(model: type[BaseModel], body: Any) -> Any:
    """Validate a request body; the 400 names the first offending field."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"] if not str(p).startswith("function-"))
        msg = first["msg"]
        if first["type"] == "missing":
            msg = "field required"
        raise BadRequest(f"{loc}: {msg}" if loc else msg, param=loc or None) from None


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
) -> dict[str, Any]:
    """OpenAI usage; ``cached_tokens`` (prompt tokens served from the KV cache) when known."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


def chat_completion(
    rid: str,
    created: int,
    info: ModelInfo,
    choices: list[tuple[str | dict[str, Any], str]],
    use: dict[str, Any],
) -> dict[str, Any]:
    """``choices``: (text or a whole message, finish_reason) per choice index."""
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": info.name,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [
            {
                "index": i,
                "message": text if isinstance(text, dict) else {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
            for i, (text, finish) in enumerate(choices)
        ],
        "usage": use,
    }


def text_completion(
    rid: str, created: int, info: ModelInfo, choices: list[tuple[str, str]], use: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": info.name,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [
            {"index": i, "text": text, "logprobs": None, "finish_reason": finish}
            for i, (text, finish) in enumerate(choices)
        ],
        "usage": use,
    }


def models_list(info: ModelInfo) -> dict[str, Any]:
    return {"object": "list", "data": [model_card(info)]}


def model_card(info: ModelInfo) -> dict[str, Any]:
    return {
        "id": info.name,
        "object": "model",
        "created": info.created,
        "owned_by": "vertex-gguf",
        "meta": {"n_ctx": info.n_ctx, "n_ctx_train": info.n_ctx_train},
    }
