"""The Responses API's stream rules, as a checker over a raw SSE body (openai-python's event
types, sequence numbers, item nesting)."""

from __future__ import annotations

import json
from typing import Any

from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

EVENTS = TypeAdapter(ResponseStreamEvent)


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) per SSE event; comments skipped. Every event has both lines."""
    out = []
    for block in text.split("\n\n"):
        lines = [ln for ln in block.split("\n") if ln and not ln.startswith(":")]
        if not lines:
            continue
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        out.append((lines[0][len("event: "):], json.loads(lines[1][len("data: "):])))
    return out


def check_stream(text: str) -> list[dict[str, Any]]:
    """The stream's rules: each event is one of openai-python's event types, its name is its
    type, sequence numbers run 0, 1, 2, ...; no [DONE]; created and in_progress first; items
    added at the next output index, one open at a time, their events carry output_index,
    item_id and content_index, and each closes (done events) before the next opens; the
    stream ends with completed, incomplete or failed."""
    assert "[DONE]" not in text
    events = sse_events(text)
    datas = [d for _, d in events]
    for i, (name, data) in enumerate(events):
        assert name == data["type"]
        assert data["sequence_number"] == i
        EVENTS.validate_python(data)
    kinds = [d["type"] for d in datas]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert datas[0]["response"]["output"] == [] and datas[0]["response"]["status"] == "in_progress"
    assert kinds[-1] in {"response.completed", "response.incomplete", "response.failed"}
    open_item: dict[str, Any] | None = None
    next_index = 0
    for d in datas[2:-1]:
        kind = d["type"]
        if kind == "error":
            continue
        if kind == "response.output_item.added":
            assert open_item is None, "an item opened before the previous one closed"
            assert d["output_index"] == next_index
            open_item = d["item"]
            next_index += 1
            continue
        assert open_item is not None, f"{kind} outside an item"
        assert d["output_index"] == next_index - 1
        if kind == "response.output_item.done":
            assert d["item"]["id"] == open_item["id"] and d["item"]["type"] == open_item["type"]
            open_item = None
        else:
            assert d["item_id"] == open_item["id"]
            if "content_part" in kind or "text" in kind:
                assert d["content_index"] == 0
    if kinds[-1] != "response.failed":
        assert open_item is None
    return datas
