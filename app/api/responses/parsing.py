"""A Responses request: its schema, and its input items, tools, tool_choice and text.format
in the core's terms (chat-template messages, tools, output format, reasoning budget)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.api.responses.tools import Wire, call_name, flatten
from app.base.errors import BadRequest
from app.core.input import OutputFormat, ToolChoice, template_call
from app.engine.types import MEDIA, SamplingParams
from app.formats.chat_template import clean
from app.formats.spec import NAME_RE
from app.protocol import openai, tools
from app.protocol.logprobs import MAX_TOP

LOGPROBS = "message.output_text.logprobs"  # the include value that asks for logprobs

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
    LOGPROBS,
})

# Fields some clients send that this server does not do, with what to use instead.
UNSUPPORTED = {
    "conversation": "use previous_response_id (conversations are not stored)",
    "prompt": "stored prompt templates are not supported: send input and instructions",
    "messages": "this is the Responses API: send 'input' (or use /v1/chat/completions)",
    "max_tokens": "use max_output_tokens",
    "response_format": "use text.format",
    "reasoning_effort": "use reasoning.effort",
    "reasoning_budget": "use reasoning.effort (docs/responses.md gives its budgets)",
    "n": "one answer per request",
    "stop": "not supported by the Responses API",
    "seed": "not supported by the Responses API",
}

# Fields the Responses API defines that are accepted and change nothing here, with why (listed
# in docs/responses.md).
IGNORED = {
    "moderation": "no moderation runs here",
    "prompt_cache_options": "every prompt prefix is cached without being asked",
    "access_programs": "no access programs here",
    "background_options": "options of background mode, which is refused",
    "image": "options of image output; this server writes text",
}

MAX_METADATA = 16
UNSUPPORTED_PARTS = {"input_image", "input_file", "input_audio", "image_url", "image", "file"}


# ---- the request ----------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ReasoningConfig(_Strict):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # summary's old name


class TextConfig(_Strict):
    format: dict[str, Any] | None = None
    # accepted and echoed; the answer's length is not steered by it (Codex sends low)
    verbosity: Literal["low", "medium", "high"] | None = None


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
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP)
    # informational: recorded nowhere but the response, change nothing
    metadata: dict[str, str] | None = None
    user: str | None = Field(None, max_length=256)
    service_tier: Literal["auto", "default"] | None = None
    prompt_cache_key: str | None = Field(None, max_length=256)
    safety_identifier: str | None = Field(None, max_length=256)
    # Codex CLI's per-turn metadata (session and turn ids): informational
    client_metadata: dict[str, Any] | None = None
    # server-side compaction of a stored conversation: nothing is stored here between turns
    # but previous_response_id's store, so there is nothing to compact; accepted
    context_management: list[Any] | dict[str, Any] | None = None
    prompt_cache_retention: str | None = Field(None, max_length=32)  # every prefix is cached
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
            if value not in INCLUDE_ACCEPTED:
                raise ValueError(f"{value[:80]!r} is not a value this server knows")
        return v

    @property
    def logprobs(self) -> bool:
        """Whether the output text carries logprobs: asked by ``include`` (or by asking for
        alternatives with ``top_logprobs``)."""
        return LOGPROBS in (self.include or ()) or bool(self.top_logprobs)

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.max_output_tokens,
            max_tokens_param="max_output_tokens",
            temperature=self.temperature,  # None: the server's default
            top_p=self.top_p,
            top_k=None,  # not in the Responses API: the server's default
            min_p=None,
            logprobs=(self.top_logprobs or 0) if self.logprobs else None,
        )


def parse_request(body: Any) -> ResponsesRequest:
    if isinstance(body, dict):
        for key, hint in UNSUPPORTED.items():
            if body.get(key) is not None:
                raise BadRequest(f"{key}: this server does not support this field ({hint})",
                                 param=key)
    return openai.parse(ResponsesRequest, body, ignored=IGNORED)


# ---- input items as chat-template messages --------------------------------------------------


def _text(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{param}: must be a string", param=param)
    return value


def _parts_text(content: Any, where: str, allowed: frozenset[str],
                image: Callable[[dict[str, Any], str], Any] | None = None) -> str:
    """A message's content (a string, or a list of text parts) as one string; with ``image``,
    an ``input_image`` part becomes a MEDIA mark and ``image(part, param)`` takes it."""
    if isinstance(content, str):
        return clean(content)
    if not isinstance(content, list):
        raise BadRequest(f"{where}: must be a string or a list of content parts", param=where)
    texts: list[str] = []
    for j, part in enumerate(content):
        at = f"{where}.{j}"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_image" and image is not None and "input_text" in allowed:
            image(part, at)
            texts.append(MEDIA)
            continue
        if kind in UNSUPPORTED_PARTS:
            raise BadRequest(f"{at}: content of type {kind!r} is not supported here (images "
                             "come in a user turn's input_image parts; no files or audio)",
                             param=at)
        if kind not in allowed:
            raise BadRequest(f"{at}: content part of type {kind!r} is not supported here "
                             f"(use {', '.join(sorted(allowed))})", param=at)
        key = "refusal" if kind == "refusal" else "text"
        texts.append(clean(_text(part.get(key), f"{at}.{key}")))
    return "".join(texts)


_USER_PARTS = frozenset({"input_text"})
_ASSISTANT_PARTS = frozenset({"output_text", "refusal", "input_text"})
_REASONING_PARTS = frozenset({"reasoning_text"})


def forget_images(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A stored conversation's messages, its images' marks turned into words: the stored
    response keeps the text of its turns, not the images' bytes, so a turn that follows it
    no longer shows the model those images (send them again to have them seen)."""
    for m in messages:
        content = m.get("content")
        if isinstance(content, str) and MEDIA in content:
            m["content"] = content.replace(MEDIA, "[an image from an earlier turn]")
    return messages


def input_messages(items: str | list[Any],
                   image: Callable[[dict[str, Any], str], Any] | None = None
                   ) -> list[dict[str, Any]]:
    """The ``input`` as chat-template messages. Consecutive assistant-side items (assistant
    messages, function calls, reasoning) merge into one assistant message; a reasoning item's
    text becomes the ``reasoning_content`` of that message. ``image`` takes each
    ``input_image`` part of a user turn (see _parts_text)."""
    if isinstance(items, str):
        return [{"role": "user", "content": clean(items)}]
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
            text = _parts_text(content, f"{where}.content", _USER_PARTS, image)
            flush()
            out.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind in ("function_call", "custom_tool_call"):
            # a namespaced call (Codex's MCP tools) by the flat name the model knows it as; a
            # custom tool's input as the one argument it was offered with
            name = call_name(item.get("namespace"), _text(item.get("name"), f"{where}.name"),
                             where)
            arguments: Any = (_text(item.get("arguments"), f"{where}.arguments")
                              if kind == "function_call"
                              else {"input": _text(item.get("input"), f"{where}.input")})
            call = template_call(_text(item.get("call_id"), f"{where}.call_id"), name, arguments)
            assistant().setdefault("tool_calls", []).append(call)
        elif kind in ("function_call_output", "custom_tool_call_output"):
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

# keys of a function tool; defer_loading (load the tool's definition on demand) changes nothing
# here: every tool offered is in the prompt
_TOOL_KEYS = frozenset({"type", "name", "description", "parameters", "strict", "defer_loading"})


def parse_tools(specs: list[Any], max_tools: int
                ) -> tuple[tuple[tools.Tool, ...], list[dict], dict[str, Wire]]:
    """The core's tools: function tools ``{type: function, name, description, parameters,
    strict}``, and those inside namespace tools and custom tools, flattened (app.api.responses
    .tools); the tools as the response echoes them; and how calls to the flattened ones go
    back on the wire."""
    if len(specs) > max_tools:
        raise BadRequest(f"tools: at most {max_tools} tools (MAX_TOOLS)", param="tools")
    flat, wires = flatten(specs)
    if len(flat) > max_tools:
        raise BadRequest(f"tools: at most {max_tools} tools (MAX_TOOLS), namespaces' included",
                         param="tools")
    out: list[tools.Tool] = []
    shown: dict[str, dict[str, Any]] = {}  # a function tool as echoed, by its place
    for where, spec in flat:
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
        shown[where] = {"type": "function", "name": tool.name, "description": description,
                        "parameters": spec.get("parameters") or tool.parameters,
                        "strict": True if strict is None else strict}
    # function tools as read, the others (namespaces, custom and hosted tools) as sent
    echo = [shown.get(f"tools.{i}", spec) for i, spec in enumerate(specs)]
    return tools.check_tools(out, max_tools), echo, wires


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
