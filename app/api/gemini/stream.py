"""Gemini's answers: ``GenerateContentResponse`` objects (candidates of parts, a finish reason,
usage metadata), whole or streamed: with ``alt=sse`` each chunk is one ``data:`` event (no
``[DONE]``), else the chunks are one JSON array, written as they come. Errors are Google's
``{"error": {"code", "message", "status"}}``."""

from __future__ import annotations

import json
from typing import Any

from app.base.errors import ServiceError
from app.core.events import Answer, CallArgs, CallStarted, Event, Text, Thinking, Usage
from app.protocol.http_status import status_of
from app.protocol.sse import frame

# google.rpc.Code names by HTTP status
GOOGLE_STATUS = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED", 409: "ABORTED", 413: "INVALID_ARGUMENT", 415: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL", 501: "UNIMPLEMENTED",
    503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}


def error_body(err: ServiceError) -> dict[str, Any]:
    status = status_of(err)
    return {"error": {"code": status, "message": err.message,
                      "status": GOOGLE_STATUS.get(status, "UNKNOWN")}}


def finish_reason(reason: str) -> str:
    return "MAX_TOKENS" if reason == "length" else "STOP"


def arguments(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def usage(use: Usage, thoughts: int = 0) -> dict[str, Any]:
    out = {"promptTokenCount": use.prompt_tokens,
           "candidatesTokenCount": use.completion_tokens - thoughts,
           "totalTokenCount": use.prompt_tokens + use.completion_tokens}
    if thoughts:
        out["thoughtsTokenCount"] = thoughts
    if use.cached_tokens:
        out["cachedContentTokenCount"] = use.cached_tokens
    return out


def function_call(call_id: str, name: str, args: str) -> dict[str, Any]:
    return {"functionCall": {"id": call_id, "name": name, "args": arguments(args)}}


def candidate(index: int, parts: list[dict[str, Any]], reason: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": index}
    if reason is not None:
        out["finishReason"] = reason
    return out


def whole(answers: list[Answer], use: Usage, model: str, rid: str, thoughts: bool,
          thought_tokens: int) -> dict[str, Any]:
    """The non-streamed answer: each candidate's thought (when asked for), text and calls."""
    cands = []
    for a in answers:
        parts: list[dict[str, Any]] = []
        if thoughts and a.reasoning:
            parts.append({"text": a.reasoning, "thought": True})
        if a.text:
            parts.append({"text": a.text})
        parts += [function_call(c.id, c.name, c.arguments) for c in a.calls]
        cands.append(candidate(a.index, parts, finish_reason(a.reason)))
    return {"candidates": cands, "usageMetadata": usage(use, thought_tokens),
            "modelVersion": model, "responseId": rid}


class Chunks:
    """The chunks of a streamed answer. Text and thoughts go out as they come; a call goes out
    whole, in one part, once its arguments are complete (as Gemini sends calls)."""

    def __init__(self, model: str, rid: str, thoughts: bool, sse: bool):
        self.model, self.rid, self.thoughts, self.sse = model, rid, thoughts, sse
        self.calls: dict[int, dict[int, list[str]]] = {}  # choice -> call -> [id, name, args]
        self.first = True

    def _out(self, obj: dict[str, Any]) -> bytes:
        obj = {**obj, "modelVersion": self.model, "responseId": self.rid}
        if self.sse:
            return frame(obj)
        head, self.first = (b"[" if self.first else b",\r\n"), False
        return head + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()

    def feed(self, ev: Event) -> list[bytes]:
        if isinstance(ev, Text) and ev.text:
            return [self._out({"candidates": [candidate(ev.index, [{"text": ev.text}], None)]})]
        if isinstance(ev, Thinking) and ev.text and self.thoughts:
            part = {"text": ev.text, "thought": True}
            return [self._out({"candidates": [candidate(ev.index, [part], None)]})]
        if isinstance(ev, CallStarted):
            self.calls.setdefault(ev.index, {})[ev.call] = [ev.id, ev.name, ""]
        elif isinstance(ev, CallArgs):
            call = self.calls.get(ev.index, {}).get(ev.call)
            if call is not None:
                call[2] += ev.text
        return []

    def finish(self, index: int, reason: str, cut: frozenset[int], use: Usage | None = None,
               thought_tokens: int = 0) -> list[bytes]:
        """A candidate's end: its calls, with its finish reason; the last candidate's carries
        the usage (``use``), and ends the array when not SSE."""
        calls = self.calls.pop(index, {})
        parts = [function_call(*calls[k]) for k in sorted(calls) if k not in cut]
        obj: dict[str, Any] = {"candidates": [candidate(index, parts, finish_reason(reason))]}
        if use is None:
            return [self._out(obj)]
        out = [self._out({**obj, "usageMetadata": usage(use, thought_tokens)})]
        if not self.sse:
            out.append(b"]")
        return out

    def error(self, err: ServiceError) -> list[bytes]:
        body = error_body(err)
        if self.sse:
            return [frame(body)]
        return [(b"[" if self.first else b",\r\n") + json.dumps(body).encode() + b"]"]
