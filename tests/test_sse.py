"""SSE chunk sequences: golden transcripts of the pure writer, and the stream rules over HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.engine.types import Finished, TextPiece
from app.errors import EngineFailure
from app.protocol.sse import ChunkWriter, StreamPolicy

GOLDEN = Path(__file__).parent / "golden"
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def transcript(kind, policy, events, **kw) -> str:
    w = ChunkWriter(kind, "id-1", 1700000000, "m", policy, prompt_tokens=3, **kw)
    out = list(w.start())
    for ev in events:
        if isinstance(ev, TextPiece):
            out += w.text(ev)
        elif isinstance(ev, Finished):
            out += w.finish(ev)
        else:
            out += w.error(ev)
    return b"".join(out).decode()


SCRIPT = [TextPiece("Hel", 1), TextPiece("", 2), TextPiece("lo", 3), Finished("stop", 3, 3)]
CASES = {
    "chat_default": ("chat", StreamPolicy(), SCRIPT, {}),
    "chat_usage": ("chat", StreamPolicy(), SCRIPT, {"include_usage": True}),
    "chat_continuous_usage": ("chat", StreamPolicy(), SCRIPT, {"continuous_usage": True}),
    "chat_error": ("chat", StreamPolicy(), [TextPiece("Hel", 1), EngineFailure("boom")], {}),
    "completion_default": ("completion", StreamPolicy(), SCRIPT, {}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_transcripts(name):
    kind, policy, events, kw = CASES[name]
    got = transcript(kind, policy, events, **kw)
    path = GOLDEN / f"{name}.sse"
    assert got == path.read_text(), f"{name} differs from {path}"


def parse_stream(text: str) -> list:
    assert text.endswith("\n\n")
    out = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_chat_stream_follows_the_rules_over_http(client):
    resp = client.post("/v1/chat/completions", json={**CHAT, "stream": True, "stream_options": {"include_usage": True, "unknown": 1}})
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    assert resp.headers["Cache-Control"] == "no-cache"
    assert resp.headers["X-Accel-Buffering"] == "no"
    events = parse_stream(resp.get_data(as_text=True))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len({c["id"] for c in chunks}) == 1
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    for c in chunks[1:-2]:
        delta = c["choices"][0]["delta"]
        assert set(delta) == {"content"} and delta["content"]
        assert c["usage"] is None
    assert chunks[-2]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 10


def test_no_usage_chunk_without_include_usage(client):
    events = parse_stream(client.post("/v1/chat/completions", json={**CHAT, "stream": True}).get_data(as_text=True))
    assert all(e == "[DONE]" or (e["choices"] and "usage" not in e) for e in events)


def test_error_mid_stream_is_an_error_event(client):
    body = {"messages": [{"role": "user", "content": "FAIL_AFTER"}], "stream": True}
    text = client.post("/v1/chat/completions", json=body).get_data(as_text=True)
    blocks = text.split("\n\n")
    err_block = next(b for b in blocks if "error" in b)
    assert err_block.startswith('data: {"error":{')
    assert text.endswith("data: [DONE]\n\n")


def test_completion_stream(client):
    events = parse_stream(client.post("/v1/completions", json={"prompt": "x", "stream": True, "max_tokens": 2}).get_data(as_text=True))
    assert events[-1] == "[DONE]"
    assert all(e["object"] == "text_completion" for e in events[:-1])
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "Hello from "
    assert events[-2]["choices"][0]["finish_reason"] == "length"
