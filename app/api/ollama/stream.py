"""Ollama's answers: NDJSON lines while streaming (one object per line, ``done: false``), then a
final object with ``done: true``, ``done_reason`` and the counters; or that final object alone,
carrying the whole message, when not streaming.

The durations are nanoseconds, measured here: ``total_duration`` from the request's arrival,
``prompt_eval_duration`` from then to the first token (queueing and the prompt's decode),
``eval_duration`` from the first token to the end; ``load_duration`` is 0, since the model is
loaded once at start (a wake from idle sleep falls in ``prompt_eval_duration``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from app.api.generation import Renderer
from app.base.errors import ServiceError
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

NDJSON = {"Content-Type": "application/x-ndjson", "Cache-Control": "no-cache",
          "X-Accel-Buffering": "no"}


def now_ns() -> int:
    """Monotonic nanoseconds (one place, so a test can fix the clock)."""
    return time.monotonic_ns()


def timestamp() -> str:
    """Now as Ollama writes it: RFC 3339 in UTC."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def error_body(err: ServiceError) -> dict[str, Any]:
    """Ollama's error: one message."""
    return {"error": err.message}


def line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


@dataclass(frozen=True)
class Clock:
    """When the request came, in monotonic nanoseconds (its first token's time is the run's:
    Run.first_token_ns, on the same clock)."""

    start: int = field(default_factory=lambda: now_ns())

    def counters(self, use: Usage, reason: str, first: int | None = None) -> dict[str, Any]:
        end = now_ns()
        first = first if first is not None else end
        return {
            "done_reason": reason,
            "done": True,
            "total_duration": end - self.start,
            "load_duration": 0,
            "prompt_eval_count": use.prompt_tokens,
            "prompt_eval_duration": first - self.start,
            "eval_count": use.completion_tokens,
            "eval_duration": end - first,
        }


def done_reason(reason: str) -> str:
    """Ollama's: ``length`` at the token limit, else ``stop`` (tool calls included)."""
    return "length" if reason == "length" else "stop"


class Lines(Renderer):
    """The NDJSON lines of one streamed answer (Ollama has one choice). ``chat``: the text is a
    ``message``'s (with ``thinking`` and ``tool_calls``); else ``response`` (generate).
    A call goes out whole, as Ollama sends it, once its arguments are complete."""

    def __init__(self, model: str, clock: Clock, chat: bool, run: Run):
        self.model, self.clock, self.chat, self.run = model, clock, chat, run
        self.calls: list[tuple[str, str]] = []  # (name, arguments so far)

    def _obj(self, text: str = "", thinking: str | None = None,
             calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        obj: dict[str, Any] = {"model": self.model, "created_at": timestamp()}
        if self.chat:
            msg: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking is not None:
                msg["thinking"] = thinking
            if calls:
                msg["tool_calls"] = calls
            obj["message"] = msg
        else:
            obj["response"] = text
            if thinking is not None:
                obj["thinking"] = thinking
        return obj

    def piece(self, ev: Event) -> list[bytes]:
        if isinstance(ev, Thinking | Text) and ev.text:
            obj = (self._obj(thinking=ev.text) if isinstance(ev, Thinking)
                   else self._obj(text=ev.text))
            return [line({**obj, "done": False})]
        if isinstance(ev, CallStarted):
            self.calls.append((ev.name, ""))
        elif isinstance(ev, CallArgs) and ev.call < len(self.calls):
            name, text = self.calls[ev.call]
            self.calls[ev.call] = (name, text + ev.text)
        return []

    def done(self, end: ChoiceEnd, use: Usage) -> list[bytes]:
        """The calls made (less any cut off by the limit), then the final object."""
        out: list[bytes] = []
        calls = [call(name, text) for i, (name, text) in enumerate(self.calls)
                 if i not in end.cut_calls]
        if calls:
            out.append(line({**self._obj(calls=calls), "done": False}))
        counters = self.clock.counters(use, done_reason(end.reason), self.run.first_token_ns)
        out.append(line({**self._obj(), **counters}))
        return out

    def failure(self, err: ServiceError) -> list[bytes]:
        return [line(error_body(err))]


def call(name: str, text: str) -> dict[str, Any]:
    return {"function": {"name": name, "arguments": args_object(text)}}


def whole(model: str, clock: Clock, first: int | None, chat: bool, a: Answer,
          use: Usage) -> dict[str, Any]:
    """The non-streamed answer: the final object with the whole message (or response)."""
    obj: dict[str, Any] = {"model": model, "created_at": timestamp()}
    if chat:
        msg: dict[str, Any] = {"role": "assistant", "content": a.text}
        if a.reasoning is not None:
            msg["thinking"] = a.reasoning
        if a.calls:
            msg["tool_calls"] = [call(c.name, c.arguments) for c in a.calls]
        obj["message"] = msg
    else:
        obj["response"] = a.text
        if a.reasoning is not None:
            obj["thinking"] = a.reasoning
    return {**obj, **clock.counters(use, done_reason(a.reason), first)}
