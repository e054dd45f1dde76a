"""Small wire details (fast tier): a sampled end-of-generation token counts as a completion token
(a reply that ends at once has 1, as OpenAI, vLLM and llama-server count it; a stop string or
max_tokens ends a reply with none), the same in every usage the server writes (the scheduler's
own count: tests/unit/test_scheduler.py); and OpenAI-shaped error bodies carry ``code`` as a
string or null, never a number."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.base.errors import BadRequest, Internal, NotSupported, QueueFull, ServiceError
from app.engine.fake import FakeEngine
from app.process.worker import error_response
from app.protocol import openai
from app.protocol.http_status import HttpStatusError
from tests.support.app import make_client

MSGS = [{"role": "user", "content": "hi"}]
REPLY = "one two three"  # three tokens in the fake engine, then its end-of-generation token


def data_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def check_stream(text: str) -> list[dict[str, Any]]:
    """A Responses stream's events, each named by its ``type``."""
    events = data_lines(text)
    assert all("type" in e and "sequence_number" in e for e in events)
    return events


def anthropic_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out


def generation_tokens(client) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = client.get("/metrics").get_data(as_text=True)
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "vertex_gguf_generation_tokens_total" and s.labels.get("api") == "chat")


# ---- completion tokens: the end-of-generation token counts -----------------------------------


def test_a_reply_that_ends_at_once_counts_one_token_in_every_api():
    client = make_client(FakeEngine(reply=""))
    chat = client.post("/v1/chat/completions", json={"messages": MSGS}).get_json()
    assert chat["choices"][0]["message"]["content"] == ""
    assert chat["choices"][0]["finish_reason"] == "stop"
    assert chat["usage"]["completion_tokens"] == 1
    assert chat["usage"]["total_tokens"] == chat["usage"]["prompt_tokens"] + 1
    text = client.post("/v1/completions", json={"prompt": "hi"}).get_json()
    assert text["choices"][0]["text"] == "" and text["usage"]["completion_tokens"] == 1
    resp = client.post("/v1/responses", json={"input": "hi"}).get_json()
    assert resp["status"] == "completed" and resp["usage"]["output_tokens"] == 1
    msg = client.post("/v1/messages", json={"messages": MSGS, "max_tokens": 8}).get_json()
    assert msg["stop_reason"] == "end_turn" and msg["usage"]["output_tokens"] == 1


def test_streamed_usage_counts_it_too():
    client = make_client(FakeEngine(reply=REPLY), stream_heartbeat_seconds=0)
    chunks = data_lines(client.post("/v1/chat/completions", json={
        "messages": MSGS, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }).get_data(as_text=True))
    counts = [c["usage"]["completion_tokens"] for c in chunks if c.get("usage")]
    assert counts[-1] == 4 and counts == sorted(counts)  # three words, then the EOG
    whole = client.post("/v1/chat/completions", json={"messages": MSGS}).get_json()
    assert whole["usage"]["completion_tokens"] == 4
    events = anthropic_events(client.post("/v1/messages", json={
        "messages": MSGS, "max_tokens": 8, "stream": True}).get_data(as_text=True))
    delta = [d for name, d in events if name == "message_delta"][-1]
    assert delta["usage"]["output_tokens"] == 4
    done = check_stream(client.post("/v1/responses", json={"input": "hi", "stream": True})
                        .get_data(as_text=True))[-1]
    assert done["type"] == "response.completed" and done["response"]["usage"]["output_tokens"] == 4


def test_a_stop_string_or_a_limit_counts_no_end_token():
    client = make_client(FakeEngine(reply=REPLY))
    stopped = client.post("/v1/chat/completions", json={"messages": MSGS, "stop": ["two"]}).get_json()
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["usage"]["completion_tokens"] == 2  # "one", then "two" (the stop string)
    cut = client.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 3}).get_json()
    assert cut["choices"][0]["finish_reason"] == "length"
    assert cut["usage"]["completion_tokens"] == 3  # the limit came before the EOG token
    roomy = client.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 4}).get_json()
    assert roomy["choices"][0]["finish_reason"] == "stop"
    assert roomy["usage"]["completion_tokens"] == 4  # within the limit, the EOG token counts


def test_metrics_count_what_usage_says():
    client = make_client(FakeEngine(reply=""))
    client.post("/v1/chat/completions", json={"messages": MSGS})
    assert generation_tokens(client) == 1


# ---- error codes: a string or null -------------------------------------------------------------


@pytest.mark.parametrize("err, code", [
    (BadRequest("bad", param="x"), None),
    (BadRequest("bad grammar", code="invalid_grammar"), "invalid_grammar"),
    (Internal("boom"), None),
    (QueueFull("busy"), "queue_full"),
    (NotSupported("no slots"), "not_supported"),
    (HttpStatusError("no such route", 404), None),
    (ServiceError("odd"), None),
])
def test_openai_error_body_code_is_a_string_or_null(err, code):
    body = openai.error_body(err)["error"]
    assert body["code"] == code
    assert set(body) == {"message", "type", "param", "code"}


def _codes(text: str) -> list[Any]:
    out = []
    for d in data_lines(text):
        err = d.get("error") if isinstance(d.get("error"), dict) else None
        if err is not None:
            out.append(err.get("code"))
        elif d.get("type") == "error":
            out.append(d.get("code"))
    return out


def test_every_openai_shaped_error_carries_a_string_or_null_code():
    client = make_client(FakeEngine(), slots_endpoint="off")
    bodies = [
        client.post("/v1/chat/completions", json={"messages": MSGS, "temperature": 9}),
        client.post("/v1/completions", json={"prompt": "hi", "bogus": 1}),
        client.post("/v1/responses", json={"input": "hi", "bogus": 1}),
        client.get("/v1/no-such-route"),
        client.get("/v1/chat/completions"),  # a wrong method
        client.get("/slots"),  # off: 501
        client.post("/tokenize", json={"nope": 1}),
        client.post("/predict", json={"instances": "x"}),
    ]
    for resp in bodies:
        assert resp.status_code >= 400
        code = resp.get_json()["error"]["code"]
        assert code is None or isinstance(code, str), (resp.request.path, code)
    assert bodies[0].get_json()["error"]["code"] is None  # no code of its own: null, not 400
    assert bodies[3].get_json()["error"]["code"] == "not_found"
    assert bodies[4].get_json()["error"]["code"] == "method_not_allowed"
    assert bodies[5].get_json()["error"]["code"] == "not_supported"


def test_mid_stream_errors_carry_string_codes():
    client = make_client(FakeEngine(), stream_heartbeat_seconds=0)
    chat = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "FAIL_AFTER"}], "stream": True})
    assert _codes(chat.get_data(as_text=True)) == ["engine_error"]
    resp = client.post("/v1/responses", json={"input": "FAIL_AFTER", "stream": True})
    events = check_stream(resp.get_data(as_text=True))
    error = [e for e in events if e["type"] == "error"]
    assert len(error) == 1 and error[0]["code"] == "engine_error"
    failed = events[-1]
    assert failed["type"] == "response.failed"
    assert failed["response"]["error"]["code"] == "server_error"


def test_a_responses_stream_error_without_a_code_says_null():
    from app.api.responses.stream import EventWriter

    w = EventWriter(lambda status, output, use=None, error=None: {"status": status,
                                                                  "error": error})
    events = [json.loads(b.decode().split("data: ", 1)[1]) for b in w.failure(Internal("boom"))]
    assert events[0]["type"] == "error" and events[0]["code"] is None  # not "None", not 500
    assert events[1]["type"] == "response.failed"
    assert events[1]["response"]["error"]["code"] == "server_error"


@pytest.mark.parametrize("status, reason, code", [
    (408, "Request Timeout", "request_timeout"),
    (414, "URI Too Long", "uri_too_long"),
    (431, "Request Header Fields Too Large", "request_header_fields_too_large"),
    (400, "Bad Request", "bad_request"),
    (500, "Internal Server Error", "internal_server_error"),
])
def test_gunicorns_own_errors_carry_string_codes(status, reason, code):
    raw = error_response(status, reason, "why", "/v1/chat/completions")
    body = json.loads(raw.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == code and body["error"]["type"]
    messages = json.loads(error_response(status, reason, "why", "/v1/messages").split(
        b"\r\n\r\n", 1)[1])
    assert messages["type"] == "error" and "code" not in messages["error"]  # Anthropic's shape
