"""Request fields that size native work, on every API, over the fake engine: Ollama's
``repeat_last_n`` in Ollama's meaning (-1 the context, more than the context cut to it, other
negatives a 400 in Ollama's shape), and every other such field either bounded by its API (a
400 in that API's shape naming the field) or refused where the API does not take it. The real
engine under a memory limit, with the same hostile values: tests/e2e/test_native_sizes.py; the
engine's own bound: tests/unit/test_native_sizes.py."""

from __future__ import annotations

import pytest

from app.engine.fake import FakeEngine
from tests.support.app import make_client

MODEL = "fake-model"
MESSAGES = [{"role": "user", "content": "hi"}]
GENERATE = {"model": MODEL, "prompt": "hi", "stream": False}
CHAT = {"model": MODEL, "messages": MESSAGES, "stream": False}
GEMINI = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}


def window(body: dict, path: str = "/api/generate") -> int:
    """The penalties' window the engine was asked for."""
    engine = FakeEngine()
    resp = make_client(engine).post(path, json=body)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    return engine.requests[-1].params.penalty_last_n


N_CTX = FakeEngine().info.n_ctx


@pytest.mark.parametrize("options, expected", [
    ({"repeat_last_n": -1}, N_CTX),  # Ollama's -1: the context
    ({"repeat_last_n": -1, "num_ctx": 100}, 100),  # ... num_ctx, when the request sets it
    ({"repeat_last_n": 2**31 - 1}, N_CTX),  # 8 GiB per choice, asked of llama.cpp
    ({"repeat_last_n": 2**31 - 1, "num_ctx": 128}, 128),
    ({"repeat_last_n": 2**32 + 2**31 - 1}, N_CTX),  # the same once cut to 32 bits
    ({"repeat_last_n": 1e300}, N_CTX),  # a whole number, as JSON may spell one
    ({"repeat_last_n": N_CTX}, N_CTX),
    ({"repeat_last_n": 0}, 0),  # off
    ({"repeat_last_n": 32.0}, 32),
    ({}, 64),  # Ollama's default
])
@pytest.mark.parametrize("path", ["/api/generate", "/api/chat"])
def test_ollamas_repeat_last_n_is_at_most_the_context(path, options, expected):
    body = {**(GENERATE if path == "/api/generate" else CHAT),
            "options": {"repeat_penalty": 1.1, **options}}
    assert window(body, path) == expected


def test_repeat_last_n_in_a_vertex_envelope_is_held_the_same():
    engine = FakeEngine()
    resp = make_client(engine).post("/predict", json={"instances": [
        {**CHAT, "options": {"repeat_last_n": 2**31 - 1, "num_predict": 1}}]})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    assert engine.requests[-1].params.penalty_last_n == N_CTX


@pytest.mark.parametrize("value", [-2, -(2**31), -(2**63), 1.5, "64", True])
@pytest.mark.parametrize("path", ["/api/generate", "/api/chat"])
def test_a_bad_repeat_last_n_is_a_400_in_ollamas_shape(path, value):
    body = {**(GENERATE if path == "/api/generate" else CHAT), "options": {"repeat_last_n": value}}
    engine = FakeEngine()
    resp = make_client(engine).post(path, json=body)
    assert resp.status_code == 400
    err = resp.get_json()
    assert set(err) == {"error", "request_id"} and "options.repeat_last_n" in err["error"]
    assert engine.requests == []


# llama-server's sampling extras that size native work (a window, a count of candidates, a
# sampler order): not taken on the OpenAI routes, so none can reach a llama.cpp constructor.
LLAMA_SERVER_EXTRAS = [
    ("repeat_last_n", 2**31 - 1), ("penalty_last_n", 2**31 - 1), ("dry_multiplier", 0.8),
    ("dry_base", 1e30), ("dry_allowed_length", 2**31 - 1), ("dry_penalty_last_n", 2**31 - 1),
    ("dry_sequence_breakers", ["\n"] * 10000), ("n_probs", 2**31 - 1), ("min_keep", 2**31 - 1),
    ("samplers", ["top_k", "top_k"]), ("typical_p", 0.5), ("mirostat", 2), ("mirostat_tau", 5),
    ("mirostat_eta", 0.1), ("xtc_probability", 0.5), ("top_n_sigma", 1.0), ("n_keep", 2**31 - 1),
    ("n_indent", 2**31 - 1), ("n_cmpl", 2**31 - 1),
]


@pytest.mark.parametrize("field, value", LLAMA_SERVER_EXTRAS)
@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": MESSAGES}),
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/responses", {"input": "hi"}),
])
def test_llama_servers_sizing_extras_are_refused_on_the_openai_routes(path, body, field, value):
    engine = FakeEngine()
    resp = make_client(engine).post(path, json={**body, field: value})
    assert resp.status_code == 400, resp.get_data(as_text=True)
    err = resp.get_json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == field
    assert engine.requests == []


OPENAI_SHAPE = ("error", "type", "invalid_request_error")


@pytest.mark.parametrize("path, body, field", [
    ("/v1/chat/completions", {"messages": MESSAGES, "top_k": 2**31}, "top_k"),
    ("/v1/chat/completions", {"messages": MESSAGES, "top_k": -1}, "top_k"),
    ("/v1/chat/completions", {"messages": MESSAGES, "n": 17}, "n"),
    ("/v1/chat/completions", {"messages": MESSAGES, "n": 2**31}, "n"),
    ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21},
     "top_logprobs"),
    ("/v1/chat/completions", {"messages": MESSAGES, "logit_bias": {str(i): 1 for i in range(1025)}},
     "logit_bias"),
    ("/v1/chat/completions", {"messages": MESSAGES, "speculative.n_max": 129}, "speculative.n_max"),
    ("/v1/chat/completions", {"messages": MESSAGES, "lora": [{"id": 0, "scale": 1}] * 65}, "lora"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "top_k": 2**63}, "top_k"),
    ("/v1/responses", {"input": "hi", "top_logprobs": 21}, "top_logprobs"),
    ("/v1/responses", {"input": "hi", "top_k": 40}, "top_k"),
])
def test_openai_sizing_fields_over_their_bounds_are_400s(path, body, field):
    engine = FakeEngine()
    resp = make_client(engine).post(path, json=body)
    assert resp.status_code == 400, resp.get_data(as_text=True)
    err = resp.get_json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == field
    assert engine.requests == []


@pytest.mark.parametrize("top_k", [2**31, -1])
def test_anthropics_top_k_is_bounded(top_k):
    resp = make_client(FakeEngine()).post("/v1/messages", json={
        "model": MODEL, "max_tokens": 4, "messages": MESSAGES, "top_k": top_k})
    assert resp.status_code == 400
    body = resp.get_json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "top_k" in body["error"]["message"]


@pytest.mark.parametrize("config, needle", [
    ({"candidateCount": 2**40}, "SLOTS_PER_REQUEST"),
    ({"topK": -1}, "generationConfig.topK"),
    ({"topK": 1.5}, "generationConfig.topK"),
    ({"responseLogprobs": True}, "generationConfig.responseLogprobs"),
    ({"logprobs": 2**31 - 1}, "generationConfig.logprobs"),
])
def test_geminis_sizing_fields_are_bounded(config, needle):
    engine = FakeEngine()
    resp = make_client(engine).post(f"/v1beta/models/{MODEL}:generateContent",
                                    json={**GEMINI, "generationConfig": config})
    assert resp.status_code == 400, resp.get_data(as_text=True)
    err = resp.get_json()["error"]
    assert err["code"] == 400 and err["status"] == "INVALID_ARGUMENT" and needle in err["message"]
    assert engine.requests == []


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": MESSAGES, "top_k": 2**31 - 1, "max_tokens": 2}),
    ("/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": MESSAGES, "top_k": 2**31 - 1}),
    (f"/v1beta/models/{MODEL}:generateContent",
     {**GEMINI, "generationConfig": {"topK": 2**40, "maxOutputTokens": 2}}),
    ("/api/generate", {**GENERATE, "options": {"top_k": 2**32 + 1, "num_predict": 2}}),
    ("/api/generate", {**GENERATE, "options": {"top_k": 1e300, "num_predict": 2}}),
])
def test_a_top_k_past_the_vocabulary_is_served(path, body):
    """top_k is a count of candidates: more than the vocabulary keeps them all, as it means;
    the engine turns it off before ctypes could cut it to 32 bits (tests/unit)."""
    engine = FakeEngine()
    resp = make_client(engine).post(path, json=body)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    assert engine.requests[-1].params.top_k >= 2**31 - 1
