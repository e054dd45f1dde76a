"""Which model answers: every API's request leases the model it names (app.core.models). Over
a fake Models of two services on two fake engines (tests/support/models.py; two fake rerankers
for rerank): each API reaches the engine its request names (OpenAI chat and completions,
Anthropic, Responses, Gemini's paths, Ollama, the Vertex envelope per instance and a raw body,
embeddings, rerank, the count-tokens routes); an unknown model is a 404 naming the models there
are, and a full pool a 503 with Retry-After, in each API's own shape. How long a request holds
its model: tests/app/test_model_leases.py. The single-model server is every other file's."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.models import DIMS, HI, A, B, counts, embed_counts, two_models


@pytest.fixture
def setup():
    return two_models()


# ---- each API reaches the model it names --------------------------------------------------------

GENERATE: dict[str, tuple[str, Any]] = {
    # name: (path, {m} where the path names the model; the body, given the model)
    "chat": ("/v1/chat/completions", lambda m: {"model": m, "messages": HI}),
    "completions": ("/v1/completions", lambda m: {"model": m, "prompt": "hi"}),
    "anthropic": ("/v1/messages", lambda m: {"model": m, "max_tokens": 20, "messages": HI}),
    "responses": ("/v1/responses", lambda m: {"model": m, "input": "hi"}),
    "gemini": ("/v1beta/models/{m}:generateContent",
               lambda m: {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}),
    "gemini-vertex-path": ("/v1/projects/p/locations/l/publishers/google/models/{m}"
                           ":generateContent",
                           lambda m: {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}),
    "ollama-chat": ("/api/chat", lambda m: {"model": m, "messages": HI, "stream": False}),
    "ollama-chat-latest": ("/api/chat", lambda m: {"model": f"{m}:latest", "messages": HI,
                                                   "stream": False}),
    "ollama-generate": ("/api/generate", lambda m: {"model": m, "prompt": "hi",
                                                    "stream": False}),
}


@pytest.mark.parametrize("api", list(GENERATE))
def test_a_generation_reaches_the_model_it_names(setup, api):
    client, models, engs = setup
    path, body = GENERATE[api]
    for name in (B, A, B):
        before = counts(engs)
        resp = client.post(path.format(m=name), json=body(name))
        assert resp.status_code == 200, resp.get_data(as_text=True)
        after = counts(engs)
        assert {n: after[n] - before[n] for n in engs} == {A: int(name == A), B: int(name == B)}
        assert engs[name].reply.split()[0] in resp.get_data(as_text=True)
    assert models.settled() and models.opened == 3


@pytest.mark.parametrize("api", ["chat", "anthropic", "ollama-chat", "gemini"])
def test_a_stream_reaches_the_model_it_names(setup, api):
    client, models, engs = setup
    path, body = GENERATE[api]
    path = path.replace(":generateContent", ":streamGenerateContent?alt=sse")
    resp = client.post(path.format(m=B), json={**body(B), "stream": True}
                       if "gemini" not in api else body(B))
    assert resp.status_code == 200
    assert "beta" in resp.get_data(as_text=True) and counts(engs) == {A: 0, B: 1}
    assert models.settled()


def test_a_request_naming_no_model_gets_the_default(setup):
    client, models, engs = setup
    assert client.post("/v1/chat/completions", json={"messages": HI}).status_code == 200
    assert client.post("/v1/messages", json={"model": "", "max_tokens": 5,
                                             "messages": HI}).status_code == 200
    assert counts(engs) == {A: 2, B: 0}
    assert [name for name, _ in models.asked] == [None, None]


def test_embeddings_reach_the_model_they_name(setup):
    client, models, engs = setup
    for name in (A, B):
        got = client.post("/v1/embeddings", json={"model": name, "input": "some words"}).json
        assert len(got["data"][0]["embedding"]) == DIMS[name] and got["model"] == name
        got = client.post("/api/embed", json={"model": name, "input": ["x y"]}).json
        assert len(got["embeddings"][0]) == DIMS[name]
        got = client.post(f"/v1beta/models/{name}:embedContent",
                          json={"content": {"parts": [{"text": "x y"}]}}).json
        assert len(got["embedding"]["values"]) == DIMS[name]
        got = client.post(f"/v1beta/models/{name}:batchEmbedContents", json={"requests": [
            {"content": {"parts": [{"text": "x"}]}}]}).json
        assert len(got["embeddings"][0]["values"]) == DIMS[name]
    assert embed_counts(engs) == {A: 4, B: 4}
    assert models.settled() and models.opened == 8


def test_the_vertex_envelope_routes_each_instance(setup):
    client, models, engs = setup
    chat = {"@requestFormat": "chatCompletions", "messages": HI}
    body = {"instances": [
        {**chat, "model": B},
        {**chat, "model": A},
        {**chat},  # none: the default
        {"content": "embed me", "model": B},
        {"content": "embed me"},
        {"content": "embed me too", "model": B},
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "model": f"models/{B}"},
    ]}
    preds = client.post("/predict", json=body).json["predictions"]
    assert [p["model"] for p in preds[:3]] == [B, A, A]
    assert "beta" in preds[0]["choices"][0]["message"]["content"]
    assert [len(p["embeddings"]["values"]) for p in preds[3:6]] == [8, 16, 8]
    assert preds[6]["modelVersion"] == B
    assert counts(engs) == {A: 2, B: 2}
    assert embed_counts(engs) == {A: 1, B: 1}  # B's two instances embedded as one batch
    assert models.settled()


def test_the_envelope_parameters_name_every_instance_model(setup):
    client, models, engs = setup
    body = {"instances": [{"messages": HI}, {"content": "x"}], "parameters": {"model": B}}
    preds = client.post("/predict", json=body).json["predictions"]
    assert preds[0]["model"] == B and len(preds[1]["embeddings"]["values"]) == 8
    assert counts(engs) == {A: 0, B: 1} and models.settled()


def test_a_raw_vertex_body_routes_by_its_model(setup):
    client, models, engs = setup
    resp = client.post("/predict", json={"model": B, "messages": HI, "stream": True})
    assert resp.status_code == 200 and "beta" in resp.get_data(as_text=True)
    got = client.post("/predict", json={"content": "x", "model": B}).json
    assert len(got["embeddings"]["values"]) == 8
    assert counts(engs) == {A: 0, B: 1} and models.settled()


def test_count_tokens_routes_lease_the_model_they_name(setup):
    client, models, _ = setup
    assert client.post("/v1/messages/count_tokens",
                       json={"model": B, "messages": HI}).status_code == 200
    assert client.post("/v1/responses/input_tokens", json={"model": B, "input": "hi"}
                       ).status_code == 200
    assert client.post(f"/v1beta/models/{B}:countTokens",
                       json={"contents": [{"parts": [{"text": "hi"}]}]}).status_code == 200
    assert [name for name, _ in models.asked] == [B, B, B] and models.settled()


RERANK = {
    "/v1/rerank": lambda m: {"model": m, "query": "q", "documents": ["a", "b"]},
    "/v2/rerank": lambda m: {"model": m, "query": "q", "documents": ["a", "b"]},
    "/score": lambda m: {"model": m, "text_1": "q", "text_2": ["a", "b"]},
}


@pytest.mark.parametrize("path", list(RERANK))
def test_rerank_reaches_the_model_it_names(path):
    client, models, engs = two_models(rerank=True)
    for name in (B, A):
        before = embed_counts(engs)
        resp = client.post(path, json=RERANK[path](name))
        assert resp.status_code == 200, resp.get_data(as_text=True)
        after = embed_counts(engs)
        assert {n: after[n] - before[n] for n in engs} == {A: int(name == A), B: int(name == B)}
    assert models.settled() and models.opened == 2


# ---- an unknown model, a full pool: errors in each API's shape ----------------------------------

def _openai(body: dict) -> str:
    assert body["error"]["code"] == "model_not_found" and body["error"]["param"] == "model"
    assert body["error"]["type"] == "invalid_request_error"
    return body["error"]["message"]


def _anthropic(body: dict) -> str:
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    return body["error"]["message"]


def _google(body: dict) -> str:
    assert body["error"]["code"] == 404 and body["error"]["status"] == "NOT_FOUND"
    return body["error"]["message"]


def _ollama(body: dict) -> str:
    assert set(body) == {"error", "request_id"} and isinstance(body["error"], str)
    return body["error"]


SHAPES = {"chat": _openai, "completions": _openai, "anthropic": _anthropic,
          "responses": _openai, "gemini": _google, "gemini-vertex-path": _google,
          "ollama-chat": _ollama, "ollama-chat-latest": _ollama, "ollama-generate": _ollama}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", list(GENERATE))
def test_an_unknown_model_is_a_404_in_the_api_shape(setup, api, stream):
    client, models, engs = setup
    path, body = GENERATE[api]
    req = body("nope")
    if stream and "gemini" in api:
        path = path.replace(":generateContent", ":streamGenerateContent?alt=sse")
    elif stream:
        req["stream"] = True
    resp = client.post(path.format(m="nope"), json=req)
    assert resp.status_code == 404
    message = SHAPES[api](resp.json)
    assert "'nope'" in message and f"{A}, {B}" in message  # names the models there are
    assert counts(engs) == {A: 0, B: 0} and models.opened == 0


@pytest.mark.parametrize(("path", "body", "shape"), [
    ("/v1/embeddings", {"model": "nope", "input": "x"}, _openai),
    ("/api/embed", {"model": "nope", "input": "x"}, _ollama),
    ("/v1beta/models/nope:embedContent", {"content": {"parts": [{"text": "x"}]}}, _google),
    ("/v1/messages/count_tokens", {"model": "nope", "messages": HI}, _anthropic),
    ("/v1/responses/input_tokens", {"model": "nope", "input": "hi"}, _openai),
    ("/v1beta/models/nope:countTokens", {"contents": [{"parts": [{"text": "x"}]}]}, _google),
    ("/predict", {"model": "nope", "messages": HI}, _openai),  # a raw body: its API's shape
    ("/predict", {"model": "nope", "content": "x"}, _google),
])
def test_an_unknown_model_elsewhere_is_a_404_in_the_api_shape(setup, path, body, shape):
    client, models, _ = setup
    resp = client.post(path, json=body)
    assert resp.status_code == 404
    assert "'nope'" in shape(resp.json) and models.opened == 0


@pytest.mark.parametrize(("path", "shape"), [
    ("/v1/rerank", _openai), ("/v2/rerank", lambda b: b["message"]), ("/score", _openai)])
def test_an_unknown_reranker_is_a_404_in_the_api_shape(path, shape):
    client, models, _ = two_models(rerank=True)
    resp = client.post(path, json=RERANK[path]("nope"))
    assert resp.status_code == 404 and "'nope'" in shape(resp.json)


def test_an_unknown_model_fills_only_its_envelope_slot(setup):
    client, models, engs = setup
    body = {"instances": [{"messages": HI, "model": "nope"}, {"messages": HI, "model": B},
                          {"content": "x", "model": "nope"}, {"content": "y", "model": A}]}
    resp = client.post("/predict", json=body)
    assert resp.status_code == 200
    preds = resp.json["predictions"]
    assert "'nope'" in _openai(preds[0]) and preds[1]["model"] == B
    assert "'nope'" in _google(preds[2]) and len(preds[3]["embeddings"]["values"]) == 16
    assert models.settled()


@pytest.mark.parametrize(("path", "body", "check"), [
    ("/v1/chat/completions", {"model": B, "messages": HI},
     lambda b: b["error"]["type"] == "service_unavailable"),
    ("/v1/chat/completions", {"model": B, "messages": HI, "stream": True},
     lambda b: b["error"]["code"] == "overloaded"),
    ("/v1/messages", {"model": B, "max_tokens": 5, "messages": HI},
     lambda b: b["error"]["type"] == "overloaded_error"),
    (f"/v1beta/models/{B}:generateContent", {"contents": [{"parts": [{"text": "hi"}]}]},
     lambda b: b["error"]["status"] == "UNAVAILABLE"),
    ("/api/chat", {"model": B, "messages": HI}, lambda b: "no room" in b["error"]),
    ("/v1/embeddings", {"model": B, "input": "x"}, lambda b: b["error"]["code"] == "overloaded"),
])
def test_a_full_pool_is_a_503_with_retry_after_in_the_api_shape(setup, path, body, check):
    client, models, engs = setup
    models.busy = True
    resp = client.post(path, json=body)
    assert resp.status_code == 503 and resp.headers["Retry-After"] == "7"
    assert check(resp.json), resp.json
    assert counts(engs) == {A: 0, B: 0}
