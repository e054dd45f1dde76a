"""SSE chunk sequences: golden transcripts per profile, client rules, and the stream over HTTP."""

from __future__ import annotations

import json
import time

import pytest

from app.api.openai.stream import ChunkWriter
from app.base.errors import EngineFailure
from app.core.events import ChoiceEnd, Text
from app.engine.fake import FakeEngine
from app.protocol.stream_policy import PROFILES, StreamPolicy, policy_from
from tests.support.app import make_client
from tests.support.server import DATA
from tests.support.stream_rules import outcomes

GOLDEN = DATA / "golden"
CHAT = {"messages": [{"role": "user", "content": "hi"}]}
# (a piece of text, the choice's completion tokens so far), then the choice's end
SCRIPT = [(Text("Hel"), 1), (Text(""), 2), (Text("lo"), 3), ChoiceEnd("stop", 3)]
FAILING = [(Text("Hel"), 1), EngineFailure("boom")]


def transcript(kind, policy, events, **kw) -> str:
    w = ChunkWriter(kind, "id-1", 1700000000, "m", policy, prompt_tokens=3, **kw)
    out = list(w.start())
    for ev in events:
        if isinstance(ev, tuple):
            piece, tokens = ev
            w.count(piece.index, tokens)
            out += w.text(piece.index, piece.text)
        elif isinstance(ev, ChoiceEnd):
            out += w.finish(ev)
        else:
            out += w.error(ev)
    return b"".join(out).decode()


CASES = {
    "chat_default": ("chat", StreamPolicy(), SCRIPT, {}),
    "chat_usage": ("chat", StreamPolicy(), SCRIPT, {"include_usage": True}),
    "chat_continuous_usage": ("chat", StreamPolicy(), SCRIPT, {"continuous_usage": True}),
    "chat_error": ("chat", StreamPolicy(), FAILING, {}),
    "completion_default": ("completion", StreamPolicy(), SCRIPT, {}),
}
for _name, _policy in PROFILES.items():
    CASES[f"profile_{_name}"] = ("chat", _policy, SCRIPT, {})
    CASES[f"profile_{_name}_error"] = ("chat", _policy, FAILING, {})


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_transcripts(name):
    kind, policy, events, kw = CASES[name]
    got = transcript(kind, policy, events, **kw)
    path = GOLDEN / f"{name}.sse"
    assert got == path.read_text(), f"{name} differs from {path}"


# Which client accepts which profile's streams: the point of the profiles.
EXPECTED = {
    ("openai", "ok"): {"inference-benchmarker": "ok", "genai-perf": "ok", "openai-python": "ok"},
    ("openai", "error"): {"inference-benchmarker": "error", "genai-perf": "error", "openai-python": "error"},
    ("strict", "ok"): {"inference-benchmarker": "broken: Connection closed before completion",
                       "genai-perf": "broken: no [DONE]", "openai-python": "ok"},
    ("strict", "error"): {"inference-benchmarker": "error", "genai-perf": "broken: no [DONE]",
                          "openai-python": "error"},
    ("llama.cpp", "ok"): {"inference-benchmarker": "ok", "genai-perf": "ok", "openai-python": "ok"},
    ("llama.cpp", "error"): {"inference-benchmarker": "error", "genai-perf": "broken: no [DONE]",
                             "openai-python": "error"},
}


@pytest.mark.parametrize("profile, case", sorted(EXPECTED))
def test_each_profile_passes_exactly_the_clients_it_is_meant_to(profile, case):
    events = SCRIPT if case == "ok" else FAILING
    body = transcript("chat", PROFILES[profile], events)
    assert outcomes(body) == EXPECTED[(profile, case)]


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_profiles_over_http_pass_the_client_rules(profile):
    client = make_client(FakeEngine(), stream_profile=profile)
    ok = client.post("/v1/chat/completions", json={**CHAT, "stream": True}).get_data(as_text=True)
    assert outcomes(ok) == EXPECTED[(profile, "ok")]
    bad = {"messages": [{"role": "user", "content": "FAIL_AFTER"}], "stream": True}
    err = client.post("/v1/chat/completions", json=bad).get_data(as_text=True)
    assert outcomes(err) == EXPECTED[(profile, "error")]


def test_individual_settings_override_the_profile():
    p = policy_from("strict", send_done=True, role_content="null", heartbeat_seconds=0)
    assert (p.send_done, p.done_after_error, p.role_content, p.heartbeat_seconds) == (True, False, "null", 0)
    client = make_client(FakeEngine(), stream_profile="llama.cpp", stream_always_usage=False)
    body = client.post("/v1/chat/completions", json={**CHAT, "stream": True}).get_data(as_text=True)
    first = json.loads(body.split("\n\n")[0][6:])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert '"choices":[]' not in body


def test_llama_cpp_profile_always_sends_usage():
    client = make_client(FakeEngine(), stream_profile="llama.cpp")
    body = client.post("/v1/chat/completions", json={**CHAT, "stream": True}).get_data(as_text=True)
    usage_chunk = json.loads(body.split("\n\n")[-3][6:])
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 11  # + EOG


def test_x_stream_done_header_overrides_per_request():
    client = make_client(FakeEngine())
    body = client.post("/v1/chat/completions", json={**CHAT, "stream": True},
                       headers={"X-Stream-Done": "0"}).get_data(as_text=True)
    assert "[DONE]" not in body and '"finish_reason":"stop"' in body
    strict = make_client(FakeEngine(), stream_profile="strict")
    body = strict.post("/v1/completions", json={"prompt": "x", "stream": True},
                       headers={"X-Stream-Done": "1"}).get_data(as_text=True)
    assert body.endswith("data: [DONE]\n\n")
    body = strict.post("/predict", json={"prompt": "x", "stream": True},
                       headers={"X-Stream-Done": "1"}).get_data(as_text=True)
    assert body.endswith("data: [DONE]\n\n")
    resp = client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers={"X-Stream-Done": "maybe"})
    assert resp.status_code == 400 and resp.get_json()["error"]["param"] == "X-Stream-Done"


def test_heartbeats_are_comments_when_tokens_are_slow():
    client = make_client(FakeEngine(delay=0.25), stream_heartbeat_seconds=0.05)
    body = client.post("/v1/chat/completions", json={**CHAT, "stream": True, "max_tokens": 2}).get_data(as_text=True)
    assert ": ping\n\n" in body
    assert outcomes(body) == EXPECTED[("openai", "ok")]
    text = "".join(json.loads(d[6:])["choices"][0]["delta"].get("content") or ""
                   for d in body.split("\n\n") if d.startswith("data: {"))
    assert text == "Hello from "


def test_no_heartbeat_when_off():
    client = make_client(FakeEngine(delay=0.05), stream_heartbeat_seconds=0)
    body = client.post("/v1/chat/completions", json={**CHAT, "stream": True, "max_tokens": 2}).get_data(as_text=True)
    assert ": ping" not in body


def test_request_timeout_mid_stream_is_an_error_event_then_done():
    client = make_client(FakeEngine(delay=0.05), request_timeout=0.12)
    body = client.post("/v1/chat/completions", json={**CHAT, "stream": True}).get_data(as_text=True)
    err = next(json.loads(b[6:]) for b in body.split("\n\n") if b.startswith('data: {"error":'))
    assert err["error"]["type"] == "timeout" and err["error"]["code"] == "generation_timeout"
    assert body.endswith("data: [DONE]\n\n")
    resp = client.post("/v1/chat/completions", json=CHAT)
    assert resp.status_code == 504 and resp.get_json()["error"]["code"] == "generation_timeout"


# ---- the default sequence over HTTP ----------------------------------------------------------


def parse_stream(text: str) -> list:
    assert text.endswith("\n\n")
    out = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_chat_stream_follows_the_rules_over_http(client):
    bad = client.post("/v1/chat/completions", json={**CHAT, "stream": True, "stream_options": {"include_usage": True, "unknown": 1}})
    assert bad.status_code == 400 and bad.get_json()["error"]["param"] == "stream_options.unknown"
    resp = client.post("/v1/chat/completions", json={**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    assert resp.headers["Cache-Control"] == "no-cache"
    assert resp.headers["X-Accel-Buffering"] == "no"
    events = parse_stream(resp.get_data(as_text=True))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len({c["id"] for c in chunks}) == 1
    assert len({(c["created"], c["model"], c["system_fingerprint"]) for c in chunks}) == 1
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    for c in chunks[1:-2]:
        delta = c["choices"][0]["delta"]
        assert set(delta) == {"content"} and delta["content"]
        assert c["usage"] is None
    assert chunks[-2]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 11  # ten words and the EOG token


def test_continuous_usage_over_http(client):
    body = client.post("/v1/chat/completions", json={**CHAT, "stream": True, "max_tokens": 3,
                       "stream_options": {"continuous_usage_stats": True}}).get_data(as_text=True)
    chunks = [e for e in parse_stream(body) if e != "[DONE]"]
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 3
    assert len({c["usage"]["prompt_tokens"] for c in chunks}) == 1


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


def test_client_disconnect_cancels_the_generation():
    engine = FakeEngine(delay=0.05)
    client = make_client(engine)
    resp = client.post("/v1/chat/completions", json={**CHAT, "stream": True}, buffered=False)
    it = resp.response
    next(iter(it))  # the role chunk
    resp.close()  # the client goes away: the WSGI iterator is closed
    deadline = time.monotonic() + 2
    while not engine.handles[-1].cancelled and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.handles[-1].cancelled
