"""SSE framing, as pure functions: a data event, a named event, a comment. What each API sends
in them is its own (app/api); OpenAI's termination policy is app.protocol.stream_policy."""

from __future__ import annotations

import json
from typing import Any

HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


def frame(obj: dict[str, Any]) -> bytes:
    """One SSE data event holding one compact JSON object."""
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def comment(text: str = "ping") -> bytes:
    """An SSE comment: a heartbeat that no client parses as data."""
    return f": {text}\n\n".encode()


def event(name: str, obj: dict[str, Any]) -> bytes:
    """A named SSE event (Anthropic's and Responses' streams, /models/sse)."""
    return f"event: {name}\n".encode() + frame(obj)
