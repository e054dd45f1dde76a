"""A Messages request: its schema, and its system, content blocks, tools and tool_choice in the
core's terms (chat-template messages, tools, a ChatInput)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.base.errors import BadRequest
from app.core import media
from app.core.input import EFFORT_BUDGET, ChatInput, OutputFormat, ToolChoice, template_call
from app.engine.types import SamplingParams
from app.formats.chat_template import clean
from app.protocol import tools, validate
from app.protocol.openai import MAX_STOP_CHARS

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
    # omitted and updates: thinking blocks come back with no text (this server's thoughts have
    # no progress updates apart from them)
    display: Literal["summarized", "omitted", "updates"] | None = None

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
    # a thought budget (the same table as Responses' reasoning.effort); thinking.budget_tokens,
    # when given, wins
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None


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
    # Claude Code's: clearing old thinking and tool results server-side; this server keeps no
    # history between requests, so there is nothing to clear
    context_management: dict[str, Any] | None = None

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
            temperature=self.temperature,  # None: the server's default
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=None,  # not in the Messages API: the server's default
            stop=tuple(s for s in self.stop_sequences or [] if s),
        )


class CountTokensRequest(MessagesRequest):
    """count_tokens takes the same body; ``max_tokens`` is not needed to count a prompt."""

    max_tokens: int | None = Field(None, ge=1, lt=2**31)  # type: ignore[assignment]


# Fields some clients send that this server does not do, with why: a 400, since ignoring them
# would change what the client gets back.
UNSUPPORTED = {
    "container": "this server runs no code execution containers",
    "mcp_servers": "this server connects to no MCP servers",
    "compaction": "a compaction request expects a summary block this server does not write",
    "thread": "no conversation is held here between requests: send the whole conversation",
    "n": "Messages has one answer per request",
}

# Fields Anthropic's API (and its beta) defines that are accepted and change nothing here, with
# why (listed in docs/anthropic.md).
IGNORED = {
    "inference_geo": "one server, one place",
    "speed": "the server runs at one speed",
    "diagnostics": "no prompt-cache diagnostics are reported",
    "user_profile_id": "no one is billed",
    "workspace_id": "no workspaces here",
    "betas": "the fields a beta adds are read where this server has them",
    "billing_policy": "no one is billed",
    "fallbacks": "one model, which does not decline for policy reasons",
    "fallback_credit_token": "no one is billed",
}


def parse(model: type[BaseModel], body: Any) -> Any:
    """Validate a Messages request body (see app.protocol.validate)."""
    return validate.parse(model, body, UNSUPPORTED, "see docs/anthropic.md, API coverage",
                          ignored=IGNORED)


# ---- content blocks -------------------------------------------------------------------------

# Keys each block type may carry beyond ``type``; values of the informational ones (cache
# control, citations of an earlier answer, who called a tool) change nothing here.
_BLOCK_KEYS = {
    "text": {"text", "cache_control", "citations"},
    "tool_use": {"id", "name", "input", "cache_control", "caller", "toolset_name"},
    "tool_result": {"tool_use_id", "content", "is_error", "cache_control", "toolset_name"},
    "thinking": {"thinking", "signature"},
    "redacted_thinking": {"data"},
    "image": {"source", "cache_control"},
}
_ALLOWED = {
    "user": ("text", "tool_result", "image"),
    "assistant": ("text", "thinking", "redacted_thinking", "tool_use"),
    "system": ("text",),
    "tool_result": ("text", "image"),
}
# an image block's place in its turn's text; ``Images`` reads the block
ImageReader = Callable[[dict[str, Any], str], str]
TEXT_JOIN = "\n\n"  # text blocks of one turn, joined (clients split long prompts into blocks)
# Roles Claude Code sends beside Anthropic's own: read as the user's turns
USER_ROLES = frozenset({"user", "ctx", "msg"})
# Claude Code's first system line: billing metadata with a nonce (cch=) that changes on every
# request, which would make every prompt differ from its first line on and defeat the prefix
# cache; nothing in it is for the model
BILLING = re.compile(r"^x-anthropic-billing-header:[^\n]*\n?", re.MULTILINE)


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
                   else "is not supported by this server (no documents)")
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


def _text(blocks: list[dict[str, Any]], where: str, image: ImageReader | None = None) -> str:
    return TEXT_JOIN.join(image(b, f"{where}.{i}") if b["type"] == "image" and image
                          else _string(b, "text", f"{where}.{i}") for i, b in enumerate(blocks))


class Images(media.Collected):
    """Collects a request's image blocks (``{"type": "image", "source": {"type": "base64",
    "media_type", "data"}}``), each leaving a MEDIA mark in its turn's text."""

    def __call__(self, block: dict[str, Any], at: str) -> str:
        source = block.get("source")
        if not isinstance(source, dict):
            raise BadRequest(f"{at}.source: field required (an object)", param=f"{at}.source")
        kind = source.get("type")
        if kind == "url":  # read only from the hosts the operator lists (IMAGE_URL_HOSTS)
            url = _string(source, "url", f"{at}.source")
            if not url.startswith(("http://", "https://", "gs://")):
                raise BadRequest(f"{at}.source.url: must be an http(s) URL",
                                 param=f"{at}.source.url")
            return self.take(url, f"{at}.source.url")
        if kind != "base64":
            raise BadRequest(f"{at}.source.type: must be 'base64' or 'url'",
                             param=f"{at}.source.type")
        return self.take(_string(source, "data", f"{at}.source"), f"{at}.source.data")


def _tool_result(block: dict[str, Any], at: str, image: ImageReader | None = None) -> dict[str, Any]:
    content = block.get("content")
    text = "" if content is None else _text(
        _blocks(content, f"{at}.content", _ALLOWED["tool_result"]), f"{at}.content", image)
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise BadRequest(f"{at}.is_error: must be true or false", param=f"{at}.is_error")
    if is_error:
        text = f"Error: {text}"  # the model should know the call failed
    return {"role": "tool", "tool_call_id": _string(block, "tool_use_id", at), "content": text}


def _user(blocks: list[dict[str, Any]], where: str, image: ImageReader | None
          ) -> list[dict[str, Any]]:
    """A user turn: its tool results become tool messages and its text (and images) user
    messages, in the order they came."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, b in enumerate(blocks):
        at = f"{where}.{j}"
        if b["type"] == "text":
            texts.append(clean(_string(b, "text", at)))
            continue
        if b["type"] == "image":
            texts.append(image(b, at) if image else _no_images(at))
            continue
        if texts:
            out.append({"role": "user", "content": TEXT_JOIN.join(texts)})
            texts = []
        out.append(_tool_result(b, at, image))
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
            calls.append(template_call(_string(b, "id", at), _string(b, "name", at), args))
        # redacted_thinking: encrypted by another server; nothing a model here can read
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thoughts:
        msg["reasoning_content"] = "".join(thoughts)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _system(content: Any, where: str) -> str:
    return BILLING.sub("", _text(_blocks(content, where, _ALLOWED["system"]), where))


def _no_images(at: str) -> str:
    raise BadRequest(f"{at}: images are not taken here", param=at)


def template_messages(req: MessagesRequest, image: ImageReader | None = None
                      ) -> tuple[list[dict[str, Any]], str]:
    """``system`` and ``messages`` as chat-template messages, and the text of a final assistant
    message: the start of the answer, which the reply continues (a prefill). ``image`` reads
    each image block (Images)."""
    out: list[dict[str, Any]] = []
    prefill = ""
    if req.system is not None:
        system = _system(req.system, "system")
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
        if role not in USER_ROLES and role not in ("assistant", "system"):
            raise BadRequest(f"{where}.role: must be 'user', 'assistant' or 'system'",
                             param=f"{where}.role")
        if "content" not in m:
            raise BadRequest(f"{where}.content: field required", param=f"{where}.content")
        if role == "system":  # a system turn in the conversation, at its place
            out.append({"role": "system", "content": _system(m["content"], f"{where}.content")})
            continue
        kind = "user" if role in USER_ROLES else "assistant"
        blocks = _blocks(m["content"], f"{where}.content", _ALLOWED[kind])
        if kind == "user":
            out += _user(blocks, f"{where}.content", image)
        elif i == len(req.messages) - 1:
            prefill = _prefill(blocks, f"{where}.content")
        else:
            out.append(_assistant(blocks, f"{where}.content"))
    return out, prefill


def _prefill(blocks: list[dict[str, Any]], where: str) -> str:
    """A final assistant message's text, which the answer continues; a call or a thought there
    cannot be continued."""
    for j, b in enumerate(blocks):
        if b["type"] != "text":
            raise BadRequest(f"{where}.{j}.type: a final assistant message is the start of the "
                             f"answer, so it holds text only, not {b['type']!r}",
                             param=f"{where}.{j}.type")
    return "".join(_string(b, "text", f"{where}.{j}") for j, b in enumerate(blocks))


# Keys a tool definition may carry. Only client tools: server tools (web search, code
# execution, ...) have a versioned ``type`` and are refused.
_TOOL_KEYS = {"name", "description", "input_schema", "type", "cache_control", "strict",
              "eager_input_streaming", "input_examples", "allowed_callers", "defer_loading"}


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


def chat_input(req: MessagesRequest, max_tools: int, max_image_bytes: int) -> ChatInput:
    choice, parallel = tool_choice(req.tool_choice)
    thinking = req.thinking
    fmt = req.output_config.format if req.output_config else None
    effort = req.output_config.effort if req.output_config else None
    budget = thinking.budget_tokens if thinking is not None else None
    if budget is None and effort is not None:
        budget = EFFORT_BUDGET[effort]
    images = Images(max_image_bytes)
    messages, prefill = template_messages(req, images)
    return ChatInput(
        messages=messages,
        media=tuple(images.items),
        prefill=prefill,
        params=req.sampling(),
        tools=offered_tools(req.tools, max_tools),
        tool_choice=choice,
        parallel_tool_calls=parallel,
        output=OutputFormat("json_schema", fmt.schema_, "output_config.format.schema") if fmt else None,
        reasoning_budget=budget,
        thinking=None if thinking is None else thinking.type != "disabled",
        effort=effort,
        model=req.model,
    )
