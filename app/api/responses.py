"""OpenAI Responses (``/v1/responses``), with ``/v1/responses/input_tokens`` and retrieval.

A request's ``input`` items (messages, function calls and their outputs, reasoning) become the
core's chat-template messages, ``instructions`` a system message before them; ``tools`` (flat
function tools), ``tool_choice``, ``text.format`` and ``reasoning.effort`` map onto the core's
tools, output format and reasoning budget. The answer is a ``response`` object whose ``output``
holds a reasoning item, a message and function calls; streamed, it is the typed event sequence
OpenAI sends (``event:`` + ``data:`` lines, a ``sequence_number`` on each, no ``[DONE]``).

Recent responses are kept in a bounded in-process store (RESPONSES_STORE_SIZE entries for
RESPONSES_STORE_TTL seconds), per API key, so ``previous_response_id`` continues a conversation
and ``GET /v1/responses/{id}`` returns one to the key that made it; each replica has its own
store.
"""

from __future__ import annotations

import copy
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from flask import Blueprint, Response, jsonify, request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from app import bridge, reqctx
from app.api.base import Api, read_body
from app.core.events import (
    Answer,
    CallArgs,
    CallStarted,
    ChoiceEnd,
    Event,
    Failure,
    Result,
    Text,
    Thinking,
    Tick,
    Usage,
    fold,
)
from app.core.input import ChatInput, OutputFormat, ToolChoice
from app.core.service import Run
from app.engine.types import SamplingParams
from app.errors import BadRequest, NotFound, ServiceError, as_service_error
from app.formats.spec import NAME_RE
from app.protocol import openai, tools
from app.protocol.sse import comment, event

# reasoning.effort as a thought budget in tokens (None: no budget). OpenAI's efforts are
# relative; these are the token counts this server ends a thought at.
EFFORT_BUDGET: dict[str, int | None] = {
    "none": 0,
    "minimal": 64,
    "low": 256,
    "medium": 1024,
    "high": 4096,
    "xhigh": 16384,
    "max": None,
}

# `include` values: the ones that ask for something this server cannot give are refused; the
# others concern tools or inputs a request here cannot have, or encrypted reasoning (the
# reasoning text is returned in clear), and change nothing.
INCLUDE_ACCEPTED = frozenset({
    "reasoning.encrypted_content",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
})
INCLUDE_REFUSED = {"message.output_text.logprobs": "logprobs are not supported by this server"}

# Fields some clients send that this server does not do, with what to use instead.
UNSUPPORTED = {
    "conversation": "use previous_response_id (conversations are not stored)",
    "prompt": "stored prompt templates are not supported: send input and instructions",
    "context_management": "not supported",
    "prompt_cache_retention": "not supported",
    "prompt_cache_options": "not supported",
    "messages": "this is the Responses API: send 'input' (or use /v1/chat/completions)",
    "max_tokens": "use max_output_tokens",
    "response_format": "use text.format",
    "reasoning_effort": "use reasoning.effort",
    "reasoning_budget": "use reasoning.effort (see the README for its budgets)",
    "n": "one answer per request",
    "stop": "not supported by the Responses API",
    "seed": "not supported by the Responses API",
}

MAX_METADATA = 16
UNSUPPORTED_PARTS = {"input_image", "input_file", "input_audio", "image_url", "image", "file"}


def _token() -> str:
    """The random part of every id (a function, so tests can make ids deterministic)."""
    return secrets.token_hex(12)


def item_id(prefix: str) -> str:
    return f"{prefix}_{_token()}"


# ---- the request ----------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ReasoningConfig(_Strict):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # summary's old name


class TextConfig(_Strict):
    format: dict[str, Any] | None = None
    # only the default: this server does not steer the length of the answer
    verbosity: Literal["medium"] | None = None


class StreamOptions(_Strict):
    # OpenAI pads events against length side channels; this server does not: only false
    include_obfuscation: Literal[False] | None = None


class ResponsesRequest(_Strict):
    """A ``POST /v1/responses`` body. Strict: a value of the wrong type is a 400, an unknown
    field is a 400 (see :func:`app.protocol.openai.parse`)."""

    model: str | None = None
    input: str | list[Any]
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(None, ge=1, lt=2**31)
    max_tool_calls: int | None = Field(None, ge=1, lt=2**31)  # built-in tools only: none here
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    store: bool = True
    previous_response_id: str | None = Field(None, min_length=1, max_length=256)
    include: list[str] | None = None
    truncation: Literal["disabled"] | None = None
    background: Literal[False] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=0)
    # informational: recorded nowhere but the response, change nothing
    metadata: dict[str, str] | None = None
    user: str | None = Field(None, max_length=256)
    service_tier: Literal["auto", "default"] | None = None
    prompt_cache_key: str | None = Field(None, max_length=256)
    safety_identifier: str | None = Field(None, max_length=256)
    # vertex-gguf's extension: the thought may be ended on request (POST
    # /v1/chat/completions/control with this response's id)
    reasoning_control: bool = False

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is None:
            return v
        if len(v) > MAX_METADATA:
            raise ValueError(f"at most {MAX_METADATA} pairs")
        for key, value in v.items():
            if len(key) > 64 or len(value) > 512:
                raise ValueError("keys have at most 64 characters and values at most 512")
        return v

    @field_validator("include")
    @classmethod
    def _include(cls, v: list[str] | None) -> list[str] | None:
        for value in v or []:
            if value in INCLUDE_REFUSED:
                raise ValueError(f"{value!r}: {INCLUDE_REFUSED[value]}")
            if value not in INCLUDE_ACCEPTED:
                raise ValueError(f"{value[:80]!r} is not a value this server knows")
        return v

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.max_output_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
        )


def parse_request(body: Any) -> ResponsesRequest:
    if isinstance(body, dict):
        for key, hint in UNSUPPORTED.items():
            if body.get(key) is not None:
                raise BadRequest(f"{key}: this server does not support this field ({hint})",
                                 param=key)
    return openai.parse(ResponsesRequest, body)


# ---- input items as chat-template messages --------------------------------------------------


def _text(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{param}: must be a string", param=param)
    return value


def _parts_text(content: Any, where: str, allowed: frozenset[str]) -> str:
    """A message's content (a string, or a list of text parts) as one string."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where}: must be a string or a list of content parts", param=where)
    texts: list[str] = []
    for j, part in enumerate(content):
        at = f"{where}.{j}"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in UNSUPPORTED_PARTS:
            raise BadRequest(f"{at}: content of type {kind!r} is not supported (this server "
                             "takes text only: no images, files or audio)", param=at)
        if kind not in allowed:
            raise BadRequest(f"{at}: content part of type {kind!r} is not supported here "
                             f"(use {', '.join(sorted(allowed))})", param=at)
        key = "refusal" if kind == "refusal" else "text"
        texts.append(_text(part.get(key), f"{at}.{key}"))
    return "".join(texts)


_USER_PARTS = frozenset({"input_text"})
_ASSISTANT_PARTS = frozenset({"output_text", "refusal", "input_text"})
_REASONING_PARTS = frozenset({"reasoning_text"})


def input_messages(items: str | list[Any]) -> list[dict[str, Any]]:
    """The ``input`` as chat-template messages. Consecutive assistant-side items (assistant
    messages, function calls, reasoning) merge into one assistant message; a reasoning item's
    text becomes the ``reasoning_content`` of that message."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    turn: dict[str, Any] | None = None  # the assistant message being merged

    def assistant() -> dict[str, Any]:
        nonlocal turn
        if turn is None:
            turn = {"role": "assistant", "content": ""}
        return turn

    def flush() -> None:
        nonlocal turn
        if turn is not None and (turn["content"] or turn.get("tool_calls")
                                 or turn.get("reasoning_content")):
            out.append(turn)
        turn = None

    for i, item in enumerate(items):
        where = f"input.{i}"
        if not isinstance(item, dict):
            raise BadRequest(f"{where}: an input item must be an object", param=where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            content = item.get("content")
            if role == "assistant":
                assistant()["content"] += _parts_text(content, f"{where}.content",
                                                      _ASSISTANT_PARTS)
                continue
            if role not in ("user", "system", "developer"):
                raise BadRequest(f"{where}.role: must be user, system, developer or assistant",
                                 param=f"{where}.role")
            text = _parts_text(content, f"{where}.content", _USER_PARTS)
            flush()
            out.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            call = {
                "id": _text(item.get("call_id"), f"{where}.call_id"),
                "type": "function",
                "function": {"name": _text(item.get("name"), f"{where}.name"),
                             "arguments": _text(item.get("arguments"), f"{where}.arguments")},
            }
            assistant().setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            call_id = _text(item.get("call_id"), f"{where}.call_id")
            output = _parts_text(item.get("output"), f"{where}.output", _USER_PARTS)
            flush()
            out.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "reasoning":
            content = item.get("content") or []
            text = _parts_text(content, f"{where}.content", _REASONING_PARTS)
            if text:
                turn_ = assistant()
                turn_["reasoning_content"] = turn_.get("reasoning_content", "") + text
        elif kind in UNSUPPORTED_PARTS:
            raise BadRequest(f"{where}: input of type {kind!r} is not supported (this server "
                             "takes text only: no images, files or audio)", param=where)
        else:
            raise BadRequest(
                f"{where}.type: input items of type {str(kind)[:60]!r} are not supported (use "
                "message, function_call, function_call_output or reasoning)",
                param=f"{where}.type",
            )
    flush()
    return out


# ---- tools, tool_choice, text.format --------------------------------------------------------

_TOOL_KEYS = frozenset({"type", "name", "description", "parameters", "strict"})


def parse_tools(specs: list[Any], max_tools: int) -> tuple[tuple[tools.Tool, ...], list[dict]]:
    """Flat function tools ``{type: function, name, description, parameters, strict}``: the
    core's tools, and the tools as the response echoes them."""
    if len(specs) > max_tools:
        raise BadRequest(f"tools: at most {max_tools} tools (MAX_TOOLS)", param="tools")
    out: list[tools.Tool] = []
    echo: list[dict[str, Any]] = []
    for i, spec in enumerate(specs):
        where = f"tools.{i}"
        if not isinstance(spec, dict):
            raise BadRequest(f"{where}: a tool must be an object", param=where)
        kind = spec.get("type")
        if kind != "function":
            raise BadRequest(
                f"{where}.type: tools of type {str(kind)[:60]!r} are not supported (only "
                "'function' tools; this server has no built-in tools)",
                param=f"{where}.type",
            )
        extra = sorted(k for k in spec if k not in _TOOL_KEYS and spec[k] is not None)
        if extra:
            raise BadRequest(f"{where}.{extra[0]}: this server does not support this field",
                             param=f"{where}.{extra[0]}")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise BadRequest(f"{where}.strict: must be true or false", param=f"{where}.strict")
        description = spec.get("description")
        if description is not None and not isinstance(description, str):
            raise BadRequest(f"{where}.description: must be a string",
                             param=f"{where}.description")
        tool = tools.make_tool(spec.get("name"), description, spec.get("parameters"), where,
                               f"{where}.name", f"{where}.parameters")
        out.append(tool)
        echo.append({"type": "function", "name": tool.name, "description": description,
                     "parameters": spec.get("parameters") or tool.parameters,
                     "strict": True if strict is None else strict})
    return tools.check_tools(out, max_tools), echo


def tool_choice(value: Any, has_tools: bool) -> ToolChoice:
    """``auto``, ``none``, ``required`` or ``{type: function, name}``."""
    if value in (None, "auto", "none"):
        return ToolChoice(value or "auto")
    if value == "required":
        choice = ToolChoice("required")
    elif isinstance(value, dict) and value.get("type") == "function":
        name = value.get("name")
        if not isinstance(name, str) or set(value) - {"type", "name"}:
            raise BadRequest("tool_choice: a named choice is {'type': 'function', 'name': ...}",
                             param="tool_choice")
        choice = ToolChoice("named", name)
    else:
        raise BadRequest("tool_choice: must be 'auto', 'none', 'required' or {'type': "
                         "'function', 'name': ...} (this server has function tools only)",
                         param="tool_choice")
    if not has_tools:
        raise BadRequest(f"tool_choice: {choice.mode} needs tools", param="tool_choice")
    return choice


def output_format(fmt: dict[str, Any] | None) -> tuple[OutputFormat | None, dict[str, Any]]:
    """``text.format`` as the core's output format, and as the response echoes it."""
    if fmt is None:
        return None, {"type": "text"}
    kind = fmt.get("type")
    keys = {"text": {"type"}, "json_object": {"type"},
            "json_schema": {"type", "name", "schema", "strict", "description"}}.get(kind)
    if keys is None:
        raise BadRequest("text.format.type: must be text, json_object or json_schema",
                         param="text.format.type")
    extra = sorted(k for k in fmt if k not in keys and fmt[k] is not None)
    if extra:
        raise BadRequest(f"text.format.{extra[0]}: this server does not support this field",
                         param=f"text.format.{extra[0]}")
    if kind == "text":
        return None, {"type": "text"}
    if kind == "json_object":
        return OutputFormat("json_object", param="text.format"), {"type": "json_object"}
    name = fmt.get("name", "response")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise BadRequest("text.format.name: 1-64 letters, digits, '_' or '-'",
                         param="text.format.name")
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise BadRequest("text.format.schema: must be a JSON Schema object",
                         param="text.format.schema")
    strict = fmt.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise BadRequest("text.format.strict: must be true or false", param="text.format.strict")
    echo = {"type": "json_schema", "name": name, "schema": schema, "strict": bool(strict)}
    if fmt.get("description") is not None:
        echo["description"] = _text(fmt["description"], "text.format.description")
    return OutputFormat("json_schema", schema, "text.format.schema"), echo


# ---- the store --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    response: dict[str, Any]  # the response object, as returned
    messages: list[dict[str, Any]]  # the conversation so far (instructions left out)
    expires: float


class ResponseStore:
    """The most recent ``size`` responses, each for ``ttl`` seconds, kept apart per API key
    (``scope``: reqctx.cache_scope(), as the prefix cache and resumable streams are): another
    key's id is the same 404 as an unknown one. Full, the store evicts the oldest response of
    the key holding the most (the writer's own on a tie), so one key storing many responses
    only ever evicts its own while another key holds fewer. Read from request threads and
    written from the hub: a native lock guards it."""

    def __init__(self, size: int, ttl: float, clock: Callable[[], float] = time.monotonic):
        self.size = size
        self.ttl = ttl
        self.clock = clock
        self._scopes: dict[str, OrderedDict[str, Stored]] = {}  # scope -> its LRU
        self._total = 0
        self._lock = bridge.allocate_lock()

    @property
    def enabled(self) -> bool:
        return self.size > 0

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return self._total

    def put(self, scope: str, rid: str, response: dict[str, Any],
            messages: list[dict[str, Any]]) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._expire()
            items = self._scopes.setdefault(scope, OrderedDict())
            if items.pop(rid, None) is not None:
                self._total -= 1
            items[rid] = Stored(response, messages, self.clock() + self.ttl)
            self._total += 1
            while self._total > self.size:
                victim = max(self._scopes,
                             key=lambda s: (len(self._scopes[s]), s == scope))
                self._scopes[victim].popitem(last=False)
                self._total -= 1
                if not self._scopes[victim]:
                    del self._scopes[victim]

    def get(self, scope: str, rid: str) -> Stored | None:
        with self._lock:
            self._expire()
            items = self._scopes.get(scope)
            return items.get(rid) if items is not None else None

    def delete(self, scope: str, rid: str) -> bool:
        with self._lock:
            self._expire()
            items = self._scopes.get(scope)
            if items is None or items.pop(rid, None) is None:
                return False
            self._total -= 1
            if not items:
                del self._scopes[scope]
            return True

    def _expire(self) -> None:
        """Each key's LRU is in the order its responses were stored, so expiry stops at the
        first that is still fresh."""
        now = self.clock()
        for scope in list(self._scopes):
            items = self._scopes[scope]
            while items and next(iter(items.values())).expires <= now:
                items.popitem(last=False)
                self._total -= 1
            if not items:
                del self._scopes[scope]


class ResponseNotFound(NotFound):
    """OpenAI answers an unknown response id with a 404 of type invalid_request_error."""


# ---- output items -----------------------------------------------------------------------------


def reasoning_item(rid: str, text: str, status: str) -> dict[str, Any]:
    return {"id": rid, "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": status}


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(mid: str, text: str, status: str) -> dict[str, Any]:
    return {"id": mid, "type": "message", "role": "assistant", "status": status,
            "content": [output_text(text)]}


def call_item(fid: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"id": fid, "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def wants_message(text: str, calls: int, reason: str) -> bool:
    """Whether the output has a message item: when there is text, or when there is nothing else
    to show for a finished answer (an empty reply is an empty message)."""
    return bool(text) or (calls == 0 and reason != "length")


def assistant_turn(reasoning: str | None, text: str,
                   calls: list[tuple[str, str, str]]) -> dict[str, Any]:
    """The output as the assistant message a continuation's prompt will show."""
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = [{"id": cid, "type": "function",
                              "function": {"name": name, "arguments": args}}
                             for cid, name, args in calls]
    return msg


def usage(prompt_tokens: int, completion_tokens: int, cached: int,
          reasoning_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion_tokens,
        "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, completion_tokens)},
        "total_tokens": prompt_tokens + completion_tokens,
    }


# ---- the API ----------------------------------------------------------------------------------


@dataclass
class ResponsesReq:
    """What rendering needs of a request: the fields a response echoes, and the conversation
    it continues (without instructions) for the store."""

    echo: dict[str, Any]
    history: list[dict[str, Any]]
    store: bool
    reasoning_tokens: int = 0  # completion tokens when the thought's last piece came
    scope: str = ""  # the API key's scope, taken at parsing: the store keeps it with the answer


class Responses(Api):
    name = "responses"
    paths = ("/v1/responses",)
    request_formats = ("responses", "/responses")
    id_prefix = "resp"

    def __init__(self, settings: Any, service: Any):
        super().__init__(settings, service)
        self.store = ResponseStore(settings.responses_store_size, settings.responses_store_ttl)

    def looks_like(self, body: dict[str, Any]) -> bool:
        return "input" in body and "messages" not in body and "prompt" not in body

    def error_body(self, err: ServiceError) -> dict[str, Any]:
        body = openai.error_body(err)
        if isinstance(err, ResponseNotFound):
            body["error"]["type"] = "invalid_request_error"
        return body

    def new_id(self) -> str:
        return item_id(self.id_prefix)

    def blueprint(self, bp: Blueprint) -> None:
        bp.add_url_rule("/v1/responses/input_tokens", "responses:input_tokens",
                        self.input_tokens, methods=["POST"])
        bp.add_url_rule("/v1/responses/<response_id>", "responses:get", self.retrieve,
                        methods=["GET"])
        bp.add_url_rule("/v1/responses/<response_id>", "responses:delete", self.delete,
                        methods=["DELETE"])

    # ---- parsing --------------------------------------------------------------------------
    def parse(self, body: Any) -> tuple[ChatInput, ResponsesReq]:
        req = parse_request(body)
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            prev = self.store.get(reqctx.cache_scope(), req.previous_response_id)
            if prev is None:
                raise ResponseNotFound(
                    f"Previous response with id {req.previous_response_id!r} not found.",
                    param="previous_response_id", code="previous_response_not_found")
            history = copy.deepcopy(prev.messages)
        history += input_messages(req.input)
        messages = list(history)
        if req.instructions:
            messages.insert(0, {"role": "system", "content": req.instructions})
        if not messages:
            raise BadRequest("input: is empty", param="input")
        offered, tools_echo = parse_tools(req.tools or [], self.settings.max_tools)
        choice = tool_choice(req.tool_choice, bool(offered))
        fmt, fmt_echo = output_format(req.text.format if req.text else None)
        effort = req.reasoning.effort if req.reasoning else None
        summary = (req.reasoning.summary or req.reasoning.generate_summary) if req.reasoning else None
        inp = ChatInput(
            messages=messages,
            params=req.sampling(),
            tools=offered,
            tool_choice=choice,
            parallel_tool_calls=req.parallel_tool_calls,
            output=fmt,
            reasoning_budget=EFFORT_BUDGET[effort] if effort else None,
            reasoning_control=req.reasoning_control,
            model=req.model,
        )
        text_echo: dict[str, Any] = {"format": fmt_echo}
        if req.text and req.text.verbosity:
            text_echo["verbosity"] = req.text.verbosity
        store = req.store and self.store.enabled
        echo = {
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "max_tool_calls": req.max_tool_calls,
            "metadata": dict(req.metadata or {}),
            "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": effort, "summary": summary},
            "store": store,
            "temperature": inp.params.temperature,
            "text": text_echo,
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "tools": tools_echo,
            "top_p": inp.params.top_p,
            "truncation": "disabled",
            "user": req.user,
        }
        return inp, ResponsesReq(echo, history, store, scope=reqctx.cache_scope())

    # ---- the response object --------------------------------------------------------------
    def response(self, req: ResponsesReq, run: Run, status: str, output: list[dict[str, Any]],
                 use: dict[str, Any] | None = None, error: dict[str, Any] | None = None,
                 ) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": run.id,
            "object": "response",
            "created_at": run.created,
            "status": status,
            "background": False,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error,
            "incomplete_details": ({"reason": "max_output_tokens"} if status == "incomplete"
                                   else None),
            "model": run.model,
            "output": output,
        }
        out.update(req.echo)
        out["usage"] = use
        return out

    def keep(self, req: ResponsesReq, resp: dict[str, Any], turn: dict[str, Any]) -> None:
        if req.store:
            self.store.put(req.scope, resp["id"], resp, [*req.history, turn])

    # ---- whole answers --------------------------------------------------------------------
    def answer(self, body: Any, gone: Callable[[], bool] | None = None) -> dict[str, Any]:
        req, run = self.start(body)
        result = fold(self._watch(run.events(gone=gone), run, req), run.n)
        return self.render(req, run, result)

    @staticmethod
    def _watch(events: Iterator[Event], run: Run, req: ResponsesReq) -> Iterator[Event]:
        """The events, noting how many tokens the thought took (the completion tokens when its
        last piece came)."""
        for ev in events:
            if isinstance(ev, Thinking):
                req.reasoning_tokens = run.tokens[ev.index]
            yield ev

    def render(self, req: ResponsesReq, run: Run, result: Result) -> dict[str, Any]:
        a: Answer = result.answers[0]
        length = a.reason == "length"
        items: list[dict[str, Any]] = []
        if a.reasoning:
            last = length and not a.text and not a.calls
            items.append(reasoning_item(item_id("rs"), a.reasoning,
                                        "incomplete" if last else "completed"))
        if wants_message(a.text, len(a.calls), a.reason):
            last = length and not a.calls
            items.append(message_item(item_id("msg"), a.text,
                                      "incomplete" if last else "completed"))
        for c in a.calls:
            items.append(call_item(item_id("fc"), c.id, c.name, c.arguments, "completed"))
        u = result.usage
        resp = self.response(
            req, run, "incomplete" if length else "completed", items,
            usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens, req.reasoning_tokens),
        )
        calls = [(c.id, c.name, c.arguments) for c in a.calls]
        self.keep(req, resp, assistant_turn(a.reasoning, a.text, calls))
        return resp

    # ---- streams --------------------------------------------------------------------------
    def render_stream(self, req: ResponsesReq, run: Run,
                      headers: Mapping[str, str]) -> Iterator[bytes]:
        return self._frames(req, run)

    def _frames(self, req: ResponsesReq, run: Run) -> Iterator[bytes]:
        w = EventWriter(lambda status, output, use=None, error=None:
                        self.response(req, run, status, output, use, error))
        yield from w.start()
        end: ChoiceEnd | None = None
        for ev in run.events(heartbeat=self.heartbeat):
            if isinstance(ev, Tick):
                yield comment()
            elif isinstance(ev, ChoiceEnd):
                end = ev
                yield from w.end(ev)
            elif isinstance(ev, Usage):
                frames, resp = w.finish(end, ev, req.reasoning_tokens)
                self.keep(req, resp, w.turn())
                yield from frames
            elif isinstance(ev, Failure):
                yield from w.fail(ev.error)
                return
            else:
                if isinstance(ev, Thinking):
                    req.reasoning_tokens = run.tokens[ev.index]
                yield from w.on(ev)

    # ---- the other routes -----------------------------------------------------------------
    def input_tokens(self) -> Response:
        body = read_body()
        count = self.service.count_tokens(lambda: self.parse(body)[0])
        return jsonify({"object": "response.input_tokens", "input_tokens": count})

    def _stored(self, response_id: str) -> Stored:
        entry = self.store.get(reqctx.cache_scope(), response_id)
        if entry is None:
            raise ResponseNotFound(f"Response with id {response_id[:100]!r} not found.",
                                   param="response_id")
        return entry

    def retrieve(self, response_id: str) -> Response:
        if request.args.get("stream", "false").lower() not in ("false", "0"):
            raise BadRequest("stream: replaying a stored response as a stream is not supported",
                             param="stream")
        return jsonify(self._stored(response_id).response)

    def delete(self, response_id: str) -> Response:
        if not self.store.delete(reqctx.cache_scope(), response_id):
            self._stored(response_id)  # the same 404 as a GET's
        return jsonify({"id": response_id, "object": "response", "deleted": True})


# ---- the stream's events ------------------------------------------------------------------------


@dataclass
class _Item:
    kind: Literal["reasoning", "message", "function_call"]
    index: int  # output_index
    id: str
    text: str = ""  # the reasoning, the message text, or the call's arguments
    call: int = -1
    call_id: str = ""
    name: str = ""
    status: str = "in_progress"
    closed: bool = False

    def added(self) -> dict[str, Any]:
        """The item as ``response.output_item.added`` shows it: empty, in progress."""
        if self.kind == "reasoning":
            return {"id": self.id, "type": "reasoning", "summary": [], "content": [],
                    "status": "in_progress"}
        if self.kind == "message":
            return {"id": self.id, "type": "message", "role": "assistant",
                    "status": "in_progress", "content": []}
        return call_item(self.id, self.call_id, self.name, "", "in_progress")

    def whole(self) -> dict[str, Any]:
        if self.kind == "reasoning":
            return reasoning_item(self.id, self.text, self.status)
        if self.kind == "message":
            return message_item(self.id, self.text, self.status)
        return call_item(self.id, self.call_id, self.name, self.text, self.status)


Build = Callable[..., dict[str, Any]]


class EventWriter:
    """The SSE events of one streamed response, from the core's events of its one choice.

    Every event has the next ``sequence_number``; items open with ``output_item.added`` (and a
    ``content_part.added`` for text), take deltas, and close with their ``done`` events before
    the next item opens. ``build(status, output, usage, error)`` makes the response object.
    """

    def __init__(self, build: Build):
        self.build = build
        self.seq = 0
        self.items: list[_Item] = []
        self.calls: dict[int, _Item] = {}
        self.open: _Item | None = None
        self.cut: frozenset[int] = frozenset()
        self.reason = "stop"

    def send(self, kind: str, **fields: Any) -> bytes:
        obj = {"type": kind, **fields, "sequence_number": self.seq}
        self.seq += 1
        return event(kind, obj)

    def start(self) -> list[bytes]:
        resp = self.build("in_progress", [])
        return [self.send("response.created", response=resp),
                self.send("response.in_progress", response=resp)]

    # ---- items ----------------------------------------------------------------------------
    def _open(self, kind: Literal["reasoning", "message", "function_call"], prefix: str,
              **attrs: Any) -> list[bytes]:
        out = self._close()
        item = _Item(kind, len(self.items), item_id(prefix), **attrs)
        self.items.append(item)
        self.open = item
        out.append(self.send("response.output_item.added", output_index=item.index,
                             item=item.added()))
        if kind == "message":
            out.append(self.send("response.content_part.added", item_id=item.id,
                                 output_index=item.index, content_index=0,
                                 part=output_text("")))
        elif kind == "reasoning":
            out.append(self.send("response.content_part.added", item_id=item.id,
                                 output_index=item.index, content_index=0,
                                 part={"type": "reasoning_text", "text": ""}))
        return out

    def _close(self, status: str = "completed") -> list[bytes]:
        item = self.open
        if item is None:
            return []
        self.open = None
        item.closed = True
        item.status = status
        at = {"item_id": item.id, "output_index": item.index}
        out: list[bytes] = []
        if item.kind == "message":
            out.append(self.send("response.output_text.done", **at, content_index=0,
                                 text=item.text, logprobs=[]))
            out.append(self.send("response.content_part.done", **at, content_index=0,
                                 part=output_text(item.text)))
        elif item.kind == "reasoning":
            out.append(self.send("response.reasoning_text.done", **at, content_index=0,
                                 text=item.text))
            out.append(self.send("response.content_part.done", **at, content_index=0,
                                 part={"type": "reasoning_text", "text": item.text}))
        else:
            out.append(self.send("response.function_call_arguments.done", **at,
                                 name=item.name, arguments=item.text))
        out.append(self.send("response.output_item.done", output_index=item.index,
                             item=item.whole()))
        return out

    def on(self, ev: Event) -> list[bytes]:
        out: list[bytes] = []
        if isinstance(ev, Thinking | Text):
            if not ev.text:
                return out
            kind: Literal["reasoning", "message"] = (
                "reasoning" if isinstance(ev, Thinking) else "message")
            if self.open is None or self.open.kind != kind:
                out += self._open(kind, "rs" if kind == "reasoning" else "msg")
            item = self.open
            assert item is not None
            item.text += ev.text
            at = {"item_id": item.id, "output_index": item.index, "content_index": 0}
            if kind == "message":
                out.append(self.send("response.output_text.delta", **at, delta=ev.text,
                                     logprobs=[]))
            else:
                out.append(self.send("response.reasoning_text.delta", **at, delta=ev.text))
        elif isinstance(ev, CallStarted):
            out += self._open("function_call", "fc", call=ev.call, call_id=ev.id, name=ev.name)
            assert self.open is not None
            self.calls[ev.call] = self.open
        elif isinstance(ev, CallArgs):
            item = self.calls.get(ev.call)
            if item is None or not ev.text:
                return out
            item.text += ev.text
            if not item.closed:  # a call's arguments come before the next item opens
                out.append(self.send("response.function_call_arguments.delta", item_id=item.id,
                                     output_index=item.index, delta=ev.text))
        return out

    def end(self, ev: ChoiceEnd) -> list[bytes]:
        """The choice is over: close the open item (an empty message if nothing was said)."""
        self.reason = ev.reason
        self.cut = ev.cut_calls
        calls = sum(1 for i in self.items if i.kind == "function_call")
        has_text = any(i.kind == "message" for i in self.items)
        out: list[bytes] = []
        if not has_text and wants_message("", calls, ev.reason):
            out += self._open("message", "msg")
        last = self.open
        incomplete = ev.reason == "length" or (last is not None and last.call in self.cut)
        out += self._close("incomplete" if incomplete and last is not None else "completed")
        return out

    def output(self) -> list[dict[str, Any]]:
        """The finished items; calls cut off by the token limit are left out, as in a
        non-streamed answer."""
        return [i.whole() for i in self.items
                if not (i.kind == "function_call" and i.call in self.cut)]

    def turn(self) -> dict[str, Any]:
        reasoning = "".join(i.text for i in self.items if i.kind == "reasoning")
        text = "".join(i.text for i in self.items if i.kind == "message")
        calls = [(i.call_id, i.name, i.text) for i in self.items
                 if i.kind == "function_call" and i.call not in self.cut]
        return assistant_turn(reasoning or None, text, calls)

    def finish(self, end: ChoiceEnd | None, use: Usage,
               reasoning_tokens: int) -> tuple[list[bytes], dict[str, Any]]:
        status = "incomplete" if end is not None and end.reason == "length" else "completed"
        resp = self.build(status, self.output(),
                          usage(use.prompt_tokens, use.completion_tokens, use.cached_tokens,
                                reasoning_tokens))
        return [self.send(f"response.{status}", response=resp)], resp

    def fail(self, exc: BaseException) -> list[bytes]:
        """An error after the first byte: OpenAI's ``error`` event, then ``response.failed``
        with what was generated so far (an open item marked incomplete)."""
        err = as_service_error(exc)
        body = openai.error_body(err)["error"]
        if self.open is not None:
            self.open.status = "incomplete"
        out = [self.send("error", code=str(body["code"]), message=err.message,
                         param=err.param)]
        resp = self.build("failed", [i.whole() for i in self.items],
                          error={"code": "server_error", "message": err.message})
        out.append(self.send("response.failed", response=resp))
        return out
