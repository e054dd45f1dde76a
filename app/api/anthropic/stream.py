"""A Messages answer: its content blocks, stop reason and usage, its error body, and its stream
(named SSE events, a content block opened as its first piece comes)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from app.api.generation import Renderer
from app.base.errors import ContextOverflow, ServiceError
from app.core.events import (
    Answer,
    CallArgs,
    CallStarted,
    ChoiceEnd,
    Event,
    Text,
    Thinking,
    Usage,
    args_object,
)
from app.core.service import Run
from app.protocol.http_status import status_of
from app.protocol.sse import event

# ---- responses --------------------------------------------------------------------------------


@dataclass(frozen=True)
class MessageReq:
    """What rendering needs of a Messages request."""

    model: str | None
    omit_thinking: bool = False  # thinking.display omitted or updates


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
    return {"type": "tool_use", "id": tool_id(call_id), "name": name,
            "input": args_object(arguments)}


def content(a: Answer, omit_thinking: bool = False) -> list[dict[str, Any]]:
    """The blocks of one answer: its thought, its text, its calls (empty ones left out, as a
    stream leaves them out). ``omit_thinking`` (thinking.display ``omitted`` or ``updates``):
    the thinking block is there with an empty ``thinking``, as Anthropic sends it."""
    out: list[dict[str, Any]] = []
    if a.reasoning:
        out.append({"type": "thinking", "thinking": "" if omit_thinking else a.reasoning,
                    "signature": ""})
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
    return {"type": "error", "error": {"type": kind, "message": message(err)}}


def message(err: ServiceError) -> str:
    """The error's message; a context overflow worded as Anthropic words it, since clients act
    on those words (Claude Code compacts its history on ``prompt is too long``)."""
    if not isinstance(err, ContextOverflow) or err.tokens is None or err.limit is None:
        return err.message
    if err.requested is not None:
        return (f"input length and `max_tokens` exceed context limit: {err.tokens} + "
                f"{err.requested} > {err.limit}, decrease input length or `max_tokens` and try "
                "again")
    return f"prompt is too long: {err.tokens} tokens > {err.limit} maximum"


PING = event("ping", {"type": "ping"})


class _Blocks:
    """The content blocks of a stream: each started when its first piece comes, stopped
    before the next one starts; indices 0, 1, 2... in the order of the final ``content``."""

    def __init__(self, omit_thinking: bool = False) -> None:
        self.index = -1
        self.kind: str | None = None
        self.call: int | None = None
        self.omit_thinking = omit_thinking  # thinking blocks open and close, with no text

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
        if kind == "thinking" and self.omit_thinking:
            return out
        delta = ({"type": "thinking_delta", "thinking": ev.text} if kind == "thinking"
                 else {"type": "text_delta", "text": ev.text})
        out.append(self._delta(delta))
        return out


class MessageStream(Renderer):
    """A Messages stream: ``message_start`` and a ping, content blocks as they come, then
    ``message_delta`` (the stop reason, the usage) and ``message_stop``; a failure is an
    ``error`` event."""

    def __init__(self, run: Run, omit_thinking: bool = False):
        self.run = run
        self.blocks = _Blocks(omit_thinking)

    def start(self) -> list[bytes]:
        run = self.run
        start = {"id": run.id, "type": "message", "role": "assistant", "content": [],
                 "model": run.model, "stop_reason": None, "stop_sequence": None,
                 "usage": {"input_tokens": run.prompt_tokens, "output_tokens": 0}}
        return [event("message_start", {"type": "message_start", "message": start}),
                PING]  # as Anthropic does

    def piece(self, ev: Event) -> list[bytes]:
        return self.blocks.feed(ev)  # type: ignore[arg-type]

    def done(self, end: ChoiceEnd, use: Usage) -> list[bytes]:
        stop = end.stop_sequence if end.reason == "stop" else None
        delta = {"stop_reason": stop_reason(end.reason, stop), "stop_sequence": stop}
        return [*self.blocks.stop(),
                event("message_delta", {"type": "message_delta", "delta": delta, "usage":
                                        usage(use.prompt_tokens, use.completion_tokens,
                                              use.cached_tokens)}),
                event("message_stop", {"type": "message_stop"})]

    def failure(self, err: ServiceError) -> list[bytes]:
        return [event("error", error_body(err))]
