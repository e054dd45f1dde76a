"""A response's output items, and its stream: the typed event sequence OpenAI sends (``event:``
+ ``data:`` lines, a ``sequence_number`` on each, no ``[DONE]``)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from app.api.generation import Renderer
from app.api.responses.tools import Wire
from app.base.errors import as_service_error
from app.core.events import (
    CallArgs,
    CallStarted,
    ChoiceEnd,
    Event,
    Logprobs,
    Text,
    Thinking,
    Usage,
)
from app.core.input import template_call
from app.protocol import openai
from app.protocol.logprobs import chat_list
from app.protocol.sse import event


def _token() -> str:
    """The random part of every id (a function, so tests can make ids deterministic)."""
    return secrets.token_hex(12)


def item_id(prefix: str) -> str:
    return f"{prefix}_{_token()}"


# ---- output items -----------------------------------------------------------------------------


def reasoning_item(rid: str, text: str, status: str) -> dict[str, Any]:
    return {"id": rid, "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": status}


def output_text(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def message_item(mid: str, text: str, status: str,
                 logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"id": mid, "type": "message", "role": "assistant", "status": status,
            "content": [output_text(text, logprobs)]}


def call_item(fid: str, call_id: str, name: str, arguments: str, status: str,
              wire: Wire | None = None) -> dict[str, Any]:
    """A call as an output item: a ``function_call``, with its tool's own ``name`` and its
    ``namespace`` when the tool was declared in one, or a ``custom_tool_call`` with the
    ``input`` text for a custom tool (app.api.responses.tools)."""
    if wire is not None and wire.custom:
        return {"id": fid, "type": "custom_tool_call", "call_id": call_id, "name": wire.name,
                "input": custom_input(arguments), "status": status}
    item = {"id": fid, "type": "function_call", "call_id": call_id,
            "name": wire.name if wire else name, "arguments": arguments, "status": status}
    if wire is not None and wire.namespace is not None:
        item["namespace"] = wire.namespace
    return item


def custom_input(arguments: str) -> str:
    """A custom tool's input: the one string its call's arguments hold ("" until whole)."""
    try:
        value = json.loads(arguments).get("input", "") if arguments else ""
    except (json.JSONDecodeError, AttributeError):
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


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
        msg["tool_calls"] = [template_call(cid, name, args) for cid, name, args in calls]
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
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # a message's, when asked
    wire: Wire | None = None  # a call's tool when it is namespaced or custom

    def added(self) -> dict[str, Any]:
        """The item as ``response.output_item.added`` shows it: empty, in progress."""
        if self.kind == "reasoning":
            return {"id": self.id, "type": "reasoning", "summary": [], "content": [],
                    "status": "in_progress"}
        if self.kind == "message":
            return {"id": self.id, "type": "message", "role": "assistant",
                    "status": "in_progress", "content": []}
        return call_item(self.id, self.call_id, self.name, "", "in_progress", self.wire)

    def whole(self) -> dict[str, Any]:
        if self.kind == "reasoning":
            return reasoning_item(self.id, self.text, self.status)
        if self.kind == "message":
            return message_item(self.id, self.text, self.status, self.logprobs)
        return call_item(self.id, self.call_id, self.name, self.text, self.status, self.wire)


Build = Callable[..., dict[str, Any]]
Keep = Callable[[dict[str, Any], dict[str, Any]], None]


class EventWriter(Renderer):
    """The SSE events of one streamed response, from the core's events of its one choice.

    Every event has the next ``sequence_number``; items open with ``output_item.added`` (and a
    ``content_part.added`` for text), take deltas, and close with their ``done`` events before
    the next item opens. ``build(status, output, usage, error)`` makes the response object;
    ``keep(response, turn)`` stores the finished one before its last event goes out.

    Logprobs (when asked): each text delta carries the tokens' scores that came since the last
    one (a thought's come with the first), and the text's ``done`` events all of them; scores
    that come once the message is closed (a call after it) are not sent.
    """

    def __init__(self, build: Build, wires: dict[str, Wire] | None = None,
                 keep: Keep | None = None):
        self.build = build
        self.keep = keep
        self.wires = wires or {}  # how calls to namespaced and custom tools go back
        self.pending: list[dict[str, Any]] = []  # scores not sent yet
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
            item.logprobs += self.pending
            self.pending = []
            out.append(self.send("response.output_text.done", **at, content_index=0,
                                 text=item.text, logprobs=item.logprobs))
            out.append(self.send("response.content_part.done", **at, content_index=0,
                                 part=output_text(item.text, item.logprobs)))
        elif item.kind == "reasoning":
            out.append(self.send("response.reasoning_text.done", **at, content_index=0,
                                 text=item.text))
            out.append(self.send("response.content_part.done", **at, content_index=0,
                                 part={"type": "reasoning_text", "text": item.text}))
        elif item.wire is not None and item.wire.custom:
            out.append(self.send("response.custom_tool_call_input.done", **at,
                                 input=custom_input(item.text)))
        else:
            out.append(self.send("response.function_call_arguments.done", **at,
                                 name=item.wire.name if item.wire else item.name,
                                 arguments=item.text))
        out.append(self.send("response.output_item.done", output_index=item.index,
                             item=item.whole()))
        return out

    def piece(self, ev: Event) -> list[bytes]:
        out: list[bytes] = []
        if isinstance(ev, Logprobs):
            self.pending += chat_list(ev.tokens)
        elif isinstance(ev, Thinking | Text):
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
                scores, self.pending = self.pending, []
                item.logprobs += scores
                out.append(self.send("response.output_text.delta", **at, delta=ev.text,
                                     logprobs=scores))
            else:
                out.append(self.send("response.reasoning_text.delta", **at, delta=ev.text))
        elif isinstance(ev, CallStarted):
            out += self._open("function_call", "fc", call=ev.call, call_id=ev.id, name=ev.name,
                              wire=self.wires.get(ev.name))
            assert self.open is not None
            self.calls[ev.call] = self.open
        elif isinstance(ev, CallArgs):
            item = self.calls.get(ev.call)
            if item is None or not ev.text:
                return out
            item.text += ev.text
            custom = item.wire is not None and item.wire.custom  # its input comes whole, at done
            if not item.closed and not custom:  # arguments come before the next item opens
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

    def done(self, end: ChoiceEnd, use: Usage) -> list[bytes]:
        """The choice's end, then ``response.completed`` (or ``incomplete``), stored first."""
        out = self.end(end)
        status = "incomplete" if end.reason == "length" else "completed"
        resp = self.build(status, self.output(),
                          usage(use.prompt_tokens, use.completion_tokens, use.cached_tokens,
                                end.thought_tokens))
        if self.keep is not None:
            self.keep(resp, self.turn())
        out.append(self.send(f"response.{status}", response=resp))
        return out

    def failure(self, exc: BaseException) -> list[bytes]:
        """An error after the first byte: OpenAI's ``error`` event, then ``response.failed``
        with what was generated so far (an open item marked incomplete)."""
        err = as_service_error(exc)
        body = openai.error_body(err)["error"]
        if self.open is not None:
            self.open.status = "incomplete"
        out = [self.send("error", code=body["code"], message=err.message,
                         param=err.param)]
        resp = self.build("failed", [i.whole() for i in self.items],
                          error={"code": "server_error", "message": err.message})
        out.append(self.send("response.failed", response=resp))
        return out
