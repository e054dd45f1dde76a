"""Anthropic Messages (``/v1/messages``, ``/v1/messages/count_tokens``).

A Messages request (system, content blocks, tools with ``input_schema``, ``tool_choice``,
``thinking``) becomes the core's ChatInput; the result becomes a ``message`` object with
thinking, text and tool_use blocks, and the events become Anthropic's named SSE events
(``message_start``, ``content_block_*``, ``message_delta``, ``message_stop``, ``ping``; no
``[DONE]``). Errors are ``{"type": "error", "error": {"type", "message"}}``, as HTTP errors before
the first byte and as an ``event: error`` after it.

Usage follows Anthropic's meaning: ``input_tokens`` are the prompt tokens that were decoded, the
ones served from the KV cache (a slot's reused prefix) are ``cache_read_input_tokens``; their sum
is the prompt's length, which is what ``count_tokens`` answers.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from flask import Blueprint, jsonify
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.api.base import Api, read_body
from app.core.events import (
    Answer,
    CallArgs,
    CallStarted,
    ChoiceEnd,
    Failure,
    Result,
    Text,
    Thinking,
    Tick,
    Usage,
)
from app.core.input import ChatInput, OutputFormat, ToolChoice
from app.core.service import Run
from app.engine.types import SamplingParams
from app.errors import BadRequest, ServiceError
from app.protocol import tools, validate
from app.protocol.http_status import status_of
from app.protocol.openai import MAX_STOP_CHARS
from app.protocol.sse import event

# ---- requests ---------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class CacheControl(_Strict):
    """Accepted and ignored: every prompt prefix is cached here without being asked."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class Metadata(_Strict):
    user_id: str | None = Field(None, max_length=256)


class ThinkingConfig(_Strict):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=1, lt=2**31)
    display: Literal["summarized"] | None = None

    @model_validator(mode="after")
    def _budget(self) -> ThinkingConfig:
        if self.type == "enabled" and self.budget_tokens is None:
            raise ValueError("budget_tokens is required when thinking is enabled")
        if self.type != "enabled" and self.budget_tokens is not None:
            raise ValueError(f"budget_tokens goes with type 'enabled', not {self.type!r}")
        return self


class ToolChoiceConfig(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _name(self) -> ToolChoiceConfig:
        if self.type == "tool" and not self.name:
            raise ValueError("type 'tool' needs the tool's name")
        if self.type != "tool" and self.name is not None:
            raise ValueError(f"name goes with type 'tool', not {self.type!r}")
        return self


class JsonFormat(_Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Strict):
    format: JsonFormat | None = None


class MessagesRequest(_Strict):
    """A Messages request. Strict like the OpenAI side: a field of the wrong type is a 400, an
    unknown field is a 400 naming it (unless null), never silently ignored. ``messages``,
    ``system`` and ``tools`` are checked block by block in :func:`template_messages` and
    :func:`offered_tools`, so a 400 names the block at fault."""

    model: str | None = None  # Vertex's Claude bodies name the model in the URL, not here
    max_tokens: int = Field(ge=1, lt=2**31)
    messages: list[Any] = Field(min_length=1)
    system: str | list[Any] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, lt=2**31)
    stream: bool = False
    tools: list[Any] | None = None
    tool_choice: ToolChoiceConfig | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    # informational: accepted, change nothing
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    anthropic_version: str | None = Field(None, max_length=64)  # Vertex's Claude bodies carry it
    cache_control: CacheControl | None = None

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and len(v) > 16:
            raise ValueError("at most 16 stop sequences")
        if any(len(s) > MAX_STOP_CHARS for s in v or []):
            raise ValueError(f"a stop sequence may have at most {MAX_STOP_CHARS} characters")
        return v

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            stop=tuple(s for s in self.stop_sequences or [] if s),
        )


class CountTokensRequest(MessagesRequest):
    """count_tokens takes the same body; ``max_tokens`` is not needed to count a prompt."""

    max_tokens: int | None = Field(None, ge=1, lt=2**31)  # type: ignore[assignment]


# Fields some clients send that this server does not do, with why.
_UNSUPPORTED = {
    "container": "this server runs no code execution containers",
    "mcp_servers": "this server connects to no MCP servers",
    "context_management": "not supported",
    "inference_geo": "one server, one place",
    "speed": "not supported",
    "diagnostics": "not supported",
    "n": "Messages has one answer per request",
}


def parse(model: type[BaseModel], body: Any) -> Any:
    """Validate a Messages request body (see app.protocol.validate)."""
    return validate.parse(model, body, _UNSUPPORTED, "see the README's Messages API coverage")


# ---- content blocks -------------------------------------------------------------------------

# Keys each block type may carry beyond ``type``; values of the informational ones (cache
# control, citations of an earlier answer, who called a tool) change nothing here.
_BLOCK_KEYS = {
    "text": {"text", "cache_control", "citations"},
    "tool_use": {"id", "name", "input", "cache_control", "caller", "toolset_name"},
    "tool_result": {"tool_use_id", "content", "is_error", "cache_control", "toolset_name"},
    "thinking": {"thinking", "signature"},
    "redacted_thinking": {"data"},
}
_ALLOWED = {
    "user": ("text", "tool_result"),
    "assistant": ("text", "thinking", "redacted_thinking", "tool_use"),
    "system": ("text",),
    "tool_result": ("text",),
}
TEXT_JOIN = "\n\n"  # text blocks of one turn, joined (clients split long prompts into blocks)


def _blocks(content: Any, where: str, allowed: tuple[str, ...]) -> list[dict[str, Any]]:
    """Content as checked blocks: a string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise BadRequest(f"{where}: must be a string or a list of content blocks", param=where)
    out = []
    for j, block in enumerate(content):
        at = f"{where}.{j}"
        if not isinstance(block, dict):
            raise BadRequest(f"{at}: a content block must be an object", param=at)
        kind = block.get("type")
        if kind not in allowed:
            known = kind in _BLOCK_KEYS
            why = ("is not allowed here" if known
                   else "is not supported by this server (text only: no images or documents)")
            raise BadRequest(f"{at}.type: content block type {kind!r} {why} (allowed: "
                             f"{', '.join(allowed)})", param=f"{at}.type")
        for key, value in block.items():
            if key != "type" and key not in _BLOCK_KEYS[kind] and value is not None:
                raise BadRequest(f"{at}.{key}: this server does not support this field",
                                 param=f"{at}.{key}")
        out.append(block)
    return out


def _string(block: dict[str, Any], key: str, at: str, default: str | None = None) -> str:
    value = block.get(key, default)
    if not isinstance(value, str):
        raise BadRequest(f"{at}.{key}: must be a string" if key in block
                         else f"{at}.{key}: field required", param=f"{at}.{key}")
    return value


def _text(blocks: list[dict[str, Any]], where: str) -> str:
    return TEXT_JOIN.join(_string(b, "text", f"{where}.{i}") for i, b in enumerate(blocks))


def _tool_result(block: dict[str, Any], at: str) -> dict[str, Any]:
    content = block.get("content")
    text = "" if content is None else _text(
        _blocks(content, f"{at}.content", _ALLOWED["tool_result"]), f"{at}.content")
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise BadRequest(f"{at}.is_error: must be true or false", param=f"{at}.is_error")
    if is_error:
        text = f"Error: {text}"  # the model should know the call failed
    return {"role": "tool", "tool_call_id": _string(block, "tool_use_id", at), "content": text}


def _user(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """A user turn: its tool results become tool messages and its text user messages, in the
    order they came."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, b in enumerate(blocks):
        at = f"{where}.{j}"
        if b["type"] == "text":
            texts.append(_string(b, "text", at))
            continue
        if texts:
            out.append({"role": "user", "content": TEXT_JOIN.join(texts)})
            texts = []
        out.append(_tool_result(b, at))
    if texts or not out:
        out.append({"role": "user", "content": TEXT_JOIN.join(texts)})
    return out


def _assistant(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    texts, thoughts, calls = [], [], []
    for j, b in enumerate(blocks):
        at = f"{where}.{j}"
        if b["type"] == "text":
            texts.append(_string(b, "text", at))
        elif b["type"] == "thinking":
            thoughts.append(_string(b, "thinking", at))
        elif b["type"] == "tool_use":
            args = b.get("input", {})
            if not isinstance(args, dict):
                raise BadRequest(f"{at}.input: must be an object", param=f"{at}.input")
            calls.append({"id": _string(b, "id", at), "type": "function", "function": {
                "name": _string(b, "name", at), "arguments": json.dumps(args, ensure_ascii=False)}})
        # redacted_thinking: encrypted by another server; nothing a model here can read
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thoughts:
        msg["reasoning_content"] = "".join(thoughts)
    if calls:
        msg["tool_calls"] = calls
    return msg


def template_messages(req: MessagesRequest) -> list[dict[str, Any]]:
    """``system`` and ``messages`` as chat-template messages."""
    out: list[dict[str, Any]] = []
    if req.system is not None:
        system = _text(_blocks(req.system, "system", _ALLOWED["system"]), "system")
        if system:
            out.append({"role": "system", "content": system})
    for i, m in enumerate(req.messages):
        where = f"messages.{i}"
        if not isinstance(m, dict):
            raise BadRequest(f"{where}: a message must be an object", param=where)
        for key, value in m.items():
            if key not in ("role", "content") and value is not None:
                raise BadRequest(f"{where}.{key}: this server does not support this field",
                                 param=f"{where}.{key}")
        role = m.get("role")
        if role not in ("user", "assistant"):
            hint = " (put the system prompt in the top-level 'system')" if role == "system" else ""
            raise BadRequest(f"{where}.role: must be 'user' or 'assistant'{hint}",
                             param=f"{where}.role")
        if "content" not in m:
            raise BadRequest(f"{where}.content: field required", param=f"{where}.content")
        blocks = _blocks(m["content"], f"{where}.content", _ALLOWED[role])
        if role == "user":
            out += _user(blocks, f"{where}.content")
        else:
            if i == len(req.messages) - 1:
                raise BadRequest(
                    f"{where}: the last message must be the user's: prefilling the answer "
                    "(a final assistant message) is not supported",
                    param=where,
                )
            out.append(_assistant(blocks, f"{where}.content"))
    return out


# Keys a tool definition may carry. Only client tools: server tools (web search, code
# execution, ...) have a versioned ``type`` and are refused.
_TOOL_KEYS = {"name", "description", "input_schema", "type", "cache_control", "strict",
              "eager_input_streaming", "input_examples", "allowed_callers"}


def offered_tools(raw: list[Any] | None, max_tools: int) -> tuple[tools.Tool, ...]:
    raw = raw or []
    if len(raw) > max_tools:  # before looking at each one
        raise BadRequest(f"tools: at most {max_tools} tools (MAX_TOOLS)", param="tools")
    out = []
    for i, t in enumerate(raw):
        where = f"tools.{i}"
        if not isinstance(t, dict):
            raise BadRequest(f"{where}: a tool must be an object", param=where)
        if t.get("type") not in (None, "custom"):
            raise BadRequest(
                f"{where}.type: server tool {t.get('type')!r} is not supported (client tools "
                "only: name, description, input_schema)", param=f"{where}.type")
        for key, value in t.items():
            if key not in _TOOL_KEYS and value is not None:
                raise BadRequest(f"{where}.{key}: this server does not support this field",
                                 param=f"{where}.{key}")
        if t.get("input_schema") is None:
            raise BadRequest(f"{where}.input_schema: field required",
                             param=f"{where}.input_schema")
        description = t.get("description")
        if description is not None and not isinstance(description, str):
            raise BadRequest(f"{where}.description: must be a string",
                             param=f"{where}.description")
        out.append(tools.make_tool(t.get("name"), description, t["input_schema"], where,
                                   f"{where}.name", f"{where}.input_schema"))
    return tools.check_tools(out, max_tools)


def tool_choice(choice: ToolChoiceConfig | None) -> tuple[ToolChoice, bool]:
    """(the core's tool choice, whether several calls may be made at once)."""
    if choice is None:
        return ToolChoice(), True
    parallel = not choice.disable_parallel_tool_use
    if choice.type == "tool":
        return ToolChoice("named", choice.name, param="tool_choice.name"), parallel
    return ToolChoice({"any": "required"}.get(choice.type, choice.type)), parallel  # type: ignore[arg-type]


def chat_input(req: MessagesRequest, max_tools: int) -> ChatInput:
    choice, parallel = tool_choice(req.tool_choice)
    kwargs: dict[str, Any] = {}
    thinking = req.thinking
    if thinking is not None and thinking.type == "disabled":
        kwargs["enable_thinking"] = False  # what Qwen 3's and similar templates read
    fmt = req.output_config.format if req.output_config else None
    return ChatInput(
        messages=template_messages(req),
        params=req.sampling(),
        tools=offered_tools(req.tools, max_tools),
        tool_choice=choice,
        parallel_tool_calls=parallel,
        output=OutputFormat("json_schema", fmt.schema_, "output_config.format.schema") if fmt else None,
        template_kwargs=kwargs,
        reasoning_budget=thinking.budget_tokens if thinking is not None else None,
        model=req.model,
    )


# ---- responses --------------------------------------------------------------------------------


def message_id() -> str:
    return "msg_" + secrets.token_hex(12)


def tool_id(call_id: str) -> str:
    """The tool_use id of a core call id: ``call_X`` is ``toolu_X`` (an id in another form, such
    as Mistral's nine characters, stays as the model's template wants it). The client sends it
    back in tool_result as it is, and it reaches the prompt as it is."""
    return "toolu_" + call_id[len("call_"):] if call_id.startswith("call_") else call_id


def stop_reason(reason: str, stop_sequence: str | None) -> str:
    if reason == "length":
        return "max_tokens"
    if reason == "tool_calls":
        return "tool_use"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": prompt_tokens - cached_tokens,
        "output_tokens": output_tokens,
        "cache_read_input_tokens": cached_tokens,
    }


def tool_use_block(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    try:
        args = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        args = {}
    return {"type": "tool_use", "id": tool_id(call_id), "name": name,
            "input": args if isinstance(args, dict) else {}}


def content(a: Answer) -> list[dict[str, Any]]:
    """The blocks of one answer: its thought, its text, its calls (empty ones left out, as a
    stream leaves them out)."""
    out: list[dict[str, Any]] = []
    if a.reasoning:
        out.append({"type": "thinking", "thinking": a.reasoning, "signature": ""})
    if a.text:
        out.append({"type": "text", "text": a.text})
    out += [tool_use_block(c.id, c.name, c.arguments) for c in a.calls]
    return out


# Anthropic's error type names, by HTTP status (errors/types in its API reference).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def error_body(err: ServiceError) -> dict[str, Any]:
    status = status_of(err)
    kind = ERROR_TYPES.get(status) or ("invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


PING = event("ping", {"type": "ping"})


class _Blocks:
    """The content blocks of a stream: each started when its first piece comes, stopped
    before the next one starts; indices 0, 1, 2... in the order of the final ``content``."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None
        self.call: int | None = None

    def _start(self, kind: str, block: dict[str, Any], call: int | None = None) -> list[bytes]:
        out = self.stop()
        self.index += 1
        self.kind, self.call = kind, call
        out.append(event("content_block_start", {"type": "content_block_start",
                                                 "index": self.index, "content_block": block}))
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                             "delta": delta})

    def stop(self) -> list[bytes]:
        if self.kind is None:
            return []
        out = []
        if self.kind == "thinking":  # thoughts here are not signed: an empty signature
            out.append(self._delta({"type": "signature_delta", "signature": ""}))
        out.append(event("content_block_stop", {"type": "content_block_stop",
                                                "index": self.index}))
        self.kind = self.call = None
        return out

    def feed(self, ev: Thinking | Text | CallStarted | CallArgs) -> list[bytes]:
        if isinstance(ev, CallStarted):
            block = {"type": "tool_use", "id": tool_id(ev.id), "name": ev.name, "input": {}}
            return self._start("tool_use", block, ev.call)
        if not ev.text:
            return []
        if isinstance(ev, CallArgs):
            if self.kind != "tool_use" or self.call != ev.call:
                return []  # a call's arguments follow its start (the core streams calls in order)
            return [self._delta({"type": "input_json_delta", "partial_json": ev.text})]
        kind = "thinking" if isinstance(ev, Thinking) else "text"
        block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else {
            "type": "text", "text": ""}
        out = [] if self.kind == kind else self._start(kind, block)
        delta = ({"type": "thinking_delta", "thinking": ev.text} if kind == "thinking"
                 else {"type": "text_delta", "text": ev.text})
        out.append(self._delta(delta))
        return out


@dataclass(frozen=True)
class _Req:
    model: str | None


class Messages(Api):
    name = "messages"
    paths = ("/v1/messages",)
    request_formats = ("messages", "anthropic", "/v1/messages")
    id_prefix = "msg"
    keepalive = PING
    count_path: ClassVar[str] = "/v1/messages/count_tokens"

    def looks_like(self, body: dict[str, Any]) -> bool:
        """A raw Vertex body is a Messages request when it carries ``anthropic_version`` (every
        Claude body on Vertex does), or has ``messages`` and something only Messages has: a
        top-level ``system``, ``stop_sequences`` or ``thinking``, a tool with ``input_schema``,
        a ``tool_choice`` object of type auto/any/tool/none, or a content block of type
        tool_use, tool_result, thinking or redacted_thinking."""
        if "anthropic_version" in body:
            return True
        if "messages" not in body:
            return False
        if any(k in body for k in ("system", "stop_sequences", "thinking")):
            return True
        ts = body.get("tools")
        if isinstance(ts, list) and any(isinstance(t, dict) and "input_schema" in t for t in ts):
            return True
        choice = body.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") in ("auto", "any", "tool", "none"):
            return True
        messages = body.get("messages")
        for m in messages if isinstance(messages, list) else ():
            blocks = m.get("content") if isinstance(m, dict) else None
            for b in blocks if isinstance(blocks, list) else ():
                if isinstance(b, dict) and b.get("type") in _ANTHROPIC_ONLY:
                    return True
        return False

    def new_id(self) -> str:
        return message_id()

    def error_body(self, err: ServiceError) -> dict[str, Any]:
        return error_body(err)

    def parse(self, body: Any) -> tuple[ChatInput, _Req]:
        req = parse(MessagesRequest, body)
        return chat_input(req, self.settings.max_tools), _Req(req.model)

    def render(self, req: Any, run: Run, result: Result) -> dict[str, Any]:
        a, u = result.answers[0], result.usage
        return {
            "id": run.id,
            "type": "message",
            "role": "assistant",
            "content": content(a),
            "model": run.model,
            "stop_reason": stop_reason(a.reason, a.stop_sequence),
            "stop_sequence": a.stop_sequence if a.reason == "stop" else None,
            "usage": usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens),
        }

    def render_stream(self, req: Any, run: Run, headers: Mapping[str, str]) -> Iterator[bytes]:
        return self._frames(run)

    def _frames(self, run: Run) -> Iterator[bytes]:
        start = {"id": run.id, "type": "message", "role": "assistant", "content": [],
                 "model": run.model, "stop_reason": None, "stop_sequence": None,
                 "usage": {"input_tokens": run.prompt_tokens, "output_tokens": 0}}
        yield event("message_start", {"type": "message_start", "message": start})
        yield PING  # as Anthropic does
        blocks = _Blocks()
        end: ChoiceEnd | None = None
        for ev in run.events(heartbeat=self.heartbeat):
            if isinstance(ev, Tick):
                yield PING
            elif isinstance(ev, ChoiceEnd):
                end = ev
                yield from blocks.stop()
            elif isinstance(ev, Usage):
                assert end is not None
                stop = end.stop_sequence if end.reason == "stop" else None
                delta = {"stop_reason": stop_reason(end.reason, stop), "stop_sequence": stop}
                yield event("message_delta", {"type": "message_delta", "delta": delta, "usage":
                            usage(ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens)})
                yield event("message_stop", {"type": "message_stop"})
            elif isinstance(ev, Failure):
                yield event("error", error_body(ev.error))
                return
            else:
                yield from blocks.feed(ev)

    # ---- count_tokens -----------------------------------------------------------------------
    def blueprint(self, bp: Blueprint) -> None:
        bp.add_url_rule(self.count_path, f"{self.name}:count_tokens", self.count_view,
                        methods=["POST"])

    def count_tokens(self, body: Any) -> dict[str, int]:
        """``{"input_tokens": N}``: the prompt this body would be, tokenized as it would be."""
        def build() -> ChatInput:
            return chat_input(parse(CountTokensRequest, body), self.settings.max_tools)

        return {"input_tokens": self.service.count_tokens(build)}

    def count_view(self) -> Any:
        return jsonify(self.count_tokens(read_body()))


# Content block types only a Messages request has (for telling a raw Vertex body apart).
_ANTHROPIC_ONLY = frozenset({"tool_use", "tool_result", "thinking", "redacted_thinking"})
