"""End to end, operations: API keys with the openai and anthropic SDKs (right, wrong, none,
streaming), the prefix cache not shared across keys, request ids, and the JSON access log line
with the trace id of an X-Cloud-Trace-Context header."""

from __future__ import annotations

import json
import time

import anthropic
import openai
import pytest
import requests

from tests.support.server import running_server

KEY_ONE, KEY_TWO = "e2e-key-one", "e2e-key-two"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PROJECT = "e2e-project"


@pytest.fixture(scope="module")
def srv(default_model):
    env = {"API_KEY": f"{KEY_ONE},{KEY_TWO}", "LOG_FORMAT": "json",
           "GOOGLE_CLOUD_PROJECT": PROJECT, "PARALLEL": "4", "STREAM_HEARTBEAT_SECONDS": "0"}
    with running_server(env) as server:
        yield server


def oai(srv, key: str | None) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url("/v1"), api_key=key or "", max_retries=0)


def ant(srv, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url(""), api_key=key, max_retries=0)


def test_openai_sdk_right_wrong_and_no_key(srv):
    reply = oai(srv, KEY_ONE).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Say hi"}], max_tokens=4)
    assert reply.choices[0].finish_reason in {"stop", "length"}
    with pytest.raises(openai.AuthenticationError) as err:
        oai(srv, "wrong").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
    assert "wrong" not in str(err.value.body)
    resp = requests.post(srv.url("/v1/chat/completions"), timeout=30,
                         json={"messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 401 and resp.headers["WWW-Authenticate"] == "Bearer"
    assert resp.json()["request_id"] == resp.headers["X-Request-Id"]


def test_openai_sdk_streams_with_the_key(srv):
    stream = oai(srv, KEY_TWO).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Count to three"}], max_tokens=8,
        stream=True)
    chunks = list(stream)
    assert chunks and chunks[-1].choices[0].finish_reason in {"stop", "length"}
    raw = requests.post(srv.url("/v1/completions"), timeout=30, stream=True,
                        headers={"Authorization": f"Bearer {KEY_ONE}", "X-Request-Id": "e2e-s1"},
                        json={"prompt": "a", "max_tokens": 3, "stream": True})
    assert raw.status_code == 200 and raw.headers["X-Request-Id"] == "e2e-s1"
    assert b"data:" in raw.content


def test_anthropic_sdk_right_and_wrong_key(srv):
    msg = ant(srv, KEY_ONE).messages.create(
        model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert msg.stop_reason in {"end_turn", "max_tokens"}
    with ant(srv, KEY_TWO).messages.stream(
            model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}]) as stream:
        assert stream.get_final_message().usage.output_tokens >= 1
    with pytest.raises(anthropic.AuthenticationError) as err:
        ant(srv, "wrong").messages.create(
            model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 401
    assert err.value.body["error"]["type"] == "authentication_error"


def test_health_needs_no_key(srv):
    assert requests.get(srv.url("/health"), timeout=10).status_code == 200
    assert requests.get(srv.url("/v1/models"), timeout=10).status_code == 401


def cached(srv, key: str, prompt: str) -> int:
    reply = oai(srv, key).completions.create(model="m", prompt=prompt, max_tokens=1,
                                             temperature=0)
    return reply.usage.prompt_tokens_details.cached_tokens


def test_the_prefix_cache_does_not_cross_keys(srv):
    # a raw prompt no earlier request shares (a chat template's opening is shared by all)
    prompt = "Zebra quartz prefix: a long shared system prompt a tenant keeps secret. " * 8
    assert cached(srv, KEY_ONE, prompt) == 0
    assert cached(srv, KEY_TWO, prompt) == 0  # another key: nothing reused, nothing learnt
    assert cached(srv, KEY_ONE, prompt) > 50  # the same key: the prefix is reused
    assert cached(srv, KEY_TWO, prompt) > 50


def test_json_access_line_with_trace_and_request_id(srv):
    resp = requests.post(
        srv.url("/v1/chat/completions"), timeout=60,
        headers={"Authorization": f"Bearer {KEY_ONE}", "X-Request-Id": "e2e-log-1",
                 "X-Cloud-Trace-Context": f"{TRACE}/12345;o=1", "User-Agent": "e2e-agent"},
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert resp.status_code == 200 and resp.headers["X-Request-Id"] == "e2e-log-1"
    usage = resp.json()["usage"]
    deadline = time.monotonic() + 10
    entry = None
    while entry is None and time.monotonic() < deadline:
        for line in srv.logs().splitlines():
            if "e2e-log-1" in line and "httpRequest" in line:
                entry = json.loads(line)
        time.sleep(0.05)
    assert entry is not None, srv.logs()[-3000:]
    assert entry["logging.googleapis.com/trace"] == f"projects/{PROJECT}/traces/{TRACE}"
    assert entry["logging.googleapis.com/spanId"] == f"{12345:016x}"
    assert entry["request_id"] == "e2e-log-1" and entry["severity"] == "INFO"
    http = entry["httpRequest"]
    assert http["status"] == 200 and http["requestUrl"] == "/v1/chat/completions"
    assert http["userAgent"] == "e2e-agent" and http["latency"].endswith("s")
    assert entry["api"] == "chat"
    assert entry["prompt_tokens"] == usage["prompt_tokens"]
    assert entry["completion_tokens"] == usage["completion_tokens"]
    # every line is one JSON object, gunicorn's own included; no key anywhere
    lines = [ln for ln in srv.logs().splitlines() if ln.strip()]
    for line in lines:
        json.loads(line)
    assert any("gunicorn" in json.loads(ln).get("logger", "") for ln in lines)
    assert KEY_ONE not in srv.logs() and KEY_TWO not in srv.logs()


def test_concurrent_requests_keep_their_own_ids(srv):
    """Each connection's greenlet has its own context: four requests at once, each access line
    carries its own request id and its own token counts."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> tuple[str, int]:
        resp = requests.post(
            srv.url("/v1/completions"), timeout=60,
            headers={"x-api-key": KEY_TWO, "X-Request-Id": f"e2e-conc-{i}"},
            json={"prompt": "word " * (5 + 7 * i), "max_tokens": 2 + i})
        assert resp.headers["X-Request-Id"] == f"e2e-conc-{i}"
        return f"e2e-conc-{i}", resp.json()["usage"]["prompt_tokens"]

    with ThreadPoolExecutor(4) as pool:
        results = dict(pool.map(one, range(4)))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        entries = {}
        for line in srv.logs().splitlines():
            if "e2e-conc-" in line and "httpRequest" in line:
                entry = json.loads(line)
                entries[entry["request_id"]] = entry
        if len(entries) == 4:
            break
        time.sleep(0.05)
    assert set(entries) == set(results)
    for rid, prompt_tokens in results.items():
        assert entries[rid]["prompt_tokens"] == prompt_tokens
