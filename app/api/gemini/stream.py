"""Gemini's answers: ``GenerateContentResponse`` objects (candidates of parts, a finish reason,
usage metadata), whole or streamed: with ``alt=sse`` each chunk is one ``data:`` event (no
``[DONE]``), else the chunks are one JSON array, written as they come. Errors are Google's
``{"error": {"code", "message", "status"}}``."""

from __future__ import annotations

import json
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
    return {"functionCall": {"id": call_id, "name": name, "args": args_object(args)}}


def candidate(index: int, parts: list[dict[str, Any]], reason: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": index}
    if reason is not None:
        out["finishReason"] = reason
    return out


def whole(answers: list[Answer], use: Usage, model: str, rid: str,
          thoughts: bool) -> dict[str, Any]:
    """The non-streamed answer: each candidate's thought (when asked for), text and calls; the
    thought's tokens in the usage are the first candidate's."""
    cands = []
    for a in answers:
        parts: list[dict[str, Any]] = []
        if thoughts and a.reasoning:
            parts.append({"text": a.reasoning, "thought": True})
        if a.text:
            parts.append({"text": a.text})
        parts += [function_call(c.id, c.name, c.arguments) for c in a.calls]
        cands.append(candidate(a.index, parts, finish_reason(a.reason)))
    return {"candidates": cands, "usageMetadata": usage(use, answers[0].thought_tokens),
            "modelVersion": model, "responseId": rid}


class Chunks(Renderer):
    """The chunks of a streamed answer. Text and thoughts go out as they come; a call goes out
    whole, in one part, once its arguments are complete (as Gemini sends calls)."""

    def __init__(self, model: str, rid: str, thoughts: bool, sse: bool):
        self.model, self.rid, self.thoughts, self.sse = model, rid, thoughts, sse
        self.calls: dict[int, dict[int, list[str]]] = {}  # choice -> call -> [id, name, args]
        self.first = True
        self.thought_tokens = 0  # the first candidate's (the usage shows those)

    def _out(self, obj: dict[str, Any]) -> bytes:
        obj = {**obj, "modelVersion": self.model, "responseId": self.rid}
        if self.sse:
            return frame(obj)
        head, self.first = (b"[" if self.first else b",\r\n"), False
        return head + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()

    def piece(self, ev: Event) -> list[bytes]:
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

    def _end(self, end: ChoiceEnd) -> dict[str, Any]:
        """A candidate's last chunk: its calls, with its finish reason."""
        if end.index == 0:
            self.thought_tokens = end.thought_tokens
        calls = self.calls.pop(end.index, {})
        parts = [function_call(*calls[k]) for k in sorted(calls) if k not in end.cut_calls]
        return {"candidates": [candidate(end.index, parts, finish_reason(end.reason))]}

    def choice_end(self, end: ChoiceEnd) -> list[bytes]:
        return [self._out(self._end(end))]

    def done(self, end: ChoiceEnd, use: Usage) -> list[bytes]:
        """The last candidate's end carries the usage, and ends the array when not SSE."""
        obj = self._end(end)
        out = [self._out({**obj, "usageMetadata": usage(use, self.thought_tokens)})]
        if not self.sse:
            out.append(b"]")
        return out

    def failure(self, err: ServiceError) -> list[bytes]:
        body = error_body(err)
        if self.sse:
            return [frame(body)]
        return [(b"[" if self.first else b",\r\n") + json.dumps(body).encode() + b"]"]
