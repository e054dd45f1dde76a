"""End to end with the real default model: DEFAULT_MAX_TOKENS stops a request that names no
limit (aider, inspect-ai and `llm` send none), and MAX_TOKENS_LIMIT refuses one that asks for
more, in each API's shape; /props and /v1/models show both. And how generated tokens are
counted: a sampled end-of-generation token counts, so a reply that ends at once has 1."""

from __future__ import annotations

import pytest
import requests

from tests.support.server import running_server

DEFAULT = 7
LIMIT = 48
STORY = [{"role": "user", "content": "Write a long story about a dragon who learns to cook."}]


@pytest.fixture(scope="module")
def srv(default_model):
    with running_server({"PARALLEL": "1", "DEFAULT_MAX_TOKENS": str(DEFAULT),
                         "MAX_TOKENS_LIMIT": str(LIMIT)}) as server:
        yield server


def post(srv, path: str, body: dict) -> requests.Response:
    return requests.post(srv.url(path), json=body, timeout=120)


def test_a_chat_without_max_tokens_stops_at_the_default(srv):
    # ignore_eos: the model cannot end on its own first, so the default is what stops it
    resp = post(srv, "/v1/chat/completions", {"messages": STORY, "temperature": 0,
                                              "ignore_eos": True})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["usage"]["completion_tokens"] == DEFAULT
    assert body["choices"][0]["finish_reason"] == "length"


def test_a_completion_and_a_response_stop_at_the_default_too(srv):
    text = post(srv, "/v1/completions", {"prompt": "Once upon a time", "temperature": 0,
                                         "ignore_eos": True}).json()
    assert text["usage"]["completion_tokens"] == DEFAULT
    assert text["choices"][0]["finish_reason"] == "length"
    resp = post(srv, "/v1/responses", {"input": STORY[0]["content"], "temperature": 0}).json()
    assert resp["usage"]["output_tokens"] == DEFAULT
    assert resp["status"] == "incomplete"


def test_a_request_over_the_limit_is_a_400_naming_it(srv):
    resp = post(srv, "/v1/chat/completions", {"messages": STORY, "max_tokens": LIMIT + 1})
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["param"] == "max_tokens" and "MAX_TOKENS_LIMIT" in err["message"]
    assert f"at most {LIMIT}" in err["message"]
    msg = post(srv, "/v1/messages", {"messages": STORY, "max_tokens": 4096})
    assert msg.status_code == 400 and msg.json()["type"] == "error"
    assert "max_tokens is 4096" in msg.json()["error"]["message"]
    ok = post(srv, "/v1/chat/completions", {"messages": STORY, "max_tokens": 3,
                                            "ignore_eos": True})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


def test_props_and_models_show_the_bounds(srv):
    props = requests.get(srv.url("/props"), timeout=10).json()
    assert props["default_generation_settings"]["params"]["n_predict"] == DEFAULT
    assert props["settings"]["max_tokens_limit"] == LIMIT
    meta = requests.get(srv.url("/v1/models"), timeout=10).json()["data"][0]["meta"]
    assert (meta["max_tokens_default"], meta["max_tokens_limit"]) == (DEFAULT, LIMIT)


def eos_id(srv) -> int:
    eos = requests.get(srv.url("/props"), timeout=10).json()["eos_token"]
    tokens = post(srv, "/tokenize", {"content": eos}).json()["tokens"]
    assert len(tokens) == 1, tokens
    return tokens[0]


def test_a_reply_that_ends_at_once_counts_its_end_token(srv):
    # the end-of-generation token forced first: no text, one completion token (as OpenAI, vLLM
    # and llama-server count it), in the answer and in a stream's usage chunk alike
    bias = {str(eos_id(srv)): 100}
    chat = post(srv, "/v1/chat/completions", {"messages": STORY, "logit_bias": bias}).json()
    assert chat["choices"][0]["message"]["content"] == ""
    assert chat["choices"][0]["finish_reason"] == "stop"
    assert chat["usage"]["completion_tokens"] == 1
    assert chat["usage"]["total_tokens"] == chat["usage"]["prompt_tokens"] + 1
    text = post(srv, "/v1/completions", {"prompt": "Hi", "logit_bias": bias}).json()
    assert text["choices"][0]["text"] == "" and text["usage"]["completion_tokens"] == 1
    stream = requests.post(srv.url("/v1/chat/completions"), timeout=120, json={
        "messages": STORY, "logit_bias": bias, "stream": True,
        "stream_options": {"include_usage": True}}).text
    assert '"completion_tokens":1,' in stream


def test_a_reply_cut_by_its_limit_counts_no_end_token(srv):
    body = post(srv, "/v1/chat/completions", {"messages": STORY, "max_tokens": 2,
                                              "temperature": 0}).json()
    assert body["usage"]["completion_tokens"] == 2 and body["choices"][0]["finish_reason"] == "length"
