"""Embeddings over the fake embedder: OpenAI's /v1/embeddings and Vertex embedding instances."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from app.engine.fake import FakeEngine
from app.engine.fake_embed import FakeEmbedder, fake_vector
from tests.support.app import make_client

PREDICT = "/predict"


def unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def embedding_client(embedder: FakeEmbedder | None = None, **settings):
    engine = FakeEngine()
    engine.embedder = embedder or FakeEmbedder()  # type: ignore[attr-defined]
    return make_client(engine, **settings), engine.embedder  # type: ignore[attr-defined]


@pytest.fixture
def emb():
    return embedding_client()


def post(client, body, path="/v1/embeddings"):
    return client.post(path, json=body)


# ---- OpenAI /v1/embeddings ---------------------------------------------------------------


def test_a_string_gets_one_normalized_embedding(emb):
    client, _ = emb
    r = post(client, {"input": "the cat sat", "model": "fake-model"})
    assert r.status_code == 200, r.json
    body = r.json
    assert body["object"] == "list" and body["model"] == "fake-model"
    assert [d["object"] for d in body["data"]] == ["embedding"]
    assert body["data"][0]["index"] == 0
    got = np.array(body["data"][0]["embedding"], dtype=np.float32)
    assert np.allclose(got, unit(fake_vector("the cat sat", 16)), atol=1e-6)
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 3}


def test_a_list_keeps_its_order_and_counts_every_token(emb):
    client, embedder = emb
    texts = ["one", "two words", "and three words"]
    body = post(client, {"input": texts}).json
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    for text, d in zip(texts, body["data"], strict=True):
        assert np.allclose(d["embedding"], unit(fake_vector(text, 16)), atol=1e-6)
    assert body["usage"]["prompt_tokens"] == 6
    assert len(embedder.requests) == 1 and len(embedder.requests[0].inputs) == 3  # one batch


def test_base64_is_little_endian_float32_of_the_same_vector(emb):
    client, _ = emb
    floats = post(client, {"input": "hello there", "encoding_format": "float"}).json
    b64 = post(client, {"input": "hello there", "encoding_format": "base64"}).json
    raw = base64.b64decode(b64["data"][0]["embedding"])
    assert np.array_equal(np.frombuffer(raw, dtype="<f4"),
                          np.array(floats["data"][0]["embedding"], dtype=np.float32))


def test_token_lists_are_inputs_too(emb):
    client, embedder = emb
    one = post(client, {"input": [1, 2, 3]}).json
    many = post(client, {"input": [[1, 2, 3], [4, 5]]}).json
    assert len(one["data"]) == 1 and len(many["data"]) == 2
    assert one["data"][0]["embedding"] == many["data"][0]["embedding"]
    assert embedder.requests[0].inputs == ((1, 2, 3),)
    assert embedder.requests[1].inputs == ((1, 2, 3), (4, 5))


def test_dimensions_cut_then_renormalize(emb):
    client, _ = emb
    body = post(client, {"input": "matryoshka doll", "dimensions": 5}).json
    got = np.array(body["data"][0]["embedding"])
    assert len(got) == 5
    assert np.isclose(np.linalg.norm(got), 1.0, atol=1e-6)
    assert np.allclose(got, unit(fake_vector("matryoshka doll", 16)[:5]), atol=1e-6)


@pytest.mark.parametrize("dims", [0, -1, 17])
def test_dimensions_outside_the_model_are_a_400(emb, dims):
    client, embedder = emb
    r = post(client, {"input": "x", "dimensions": dims})
    assert r.status_code == 400
    assert r.json["error"]["param"] == "dimensions"
    assert "16" in r.json["error"]["message"]
    assert embedder.requests == []  # refused before any work


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": "x", "encoding_format": "binary"}, "encoding_format"),
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": [[]]}, "input"),
        ({"input": ["a", 1]}, "input"),
        ({"input": [True, 2]}, "input"),
        ({"input": 3.5}, "input"),
        ({}, "input"),
        ({"input": "x", "dimensions": "5"}, "dimensions"),
        ({"input": "x", "embd_normalize": 2}, "embd_normalize"),
        ({"input": "x", "stream": True}, "stream"),
    ],
)
def test_bad_requests_are_openai_400s_naming_the_field(emb, body, param):
    client, embedder = emb
    r = post(client, body)
    assert r.status_code == 400, r.json
    assert r.json["error"]["type"] == "invalid_request_error"
    assert r.json["error"]["param"] == param or r.json["error"]["param"].startswith(param)
    assert embedder.requests == []


def test_an_over_long_input_fails_the_request_naming_it(emb):
    client, _ = emb
    r = post(client, {"input": ["short", "word " * 40]})
    assert r.status_code == 400
    err = r.json["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "input"
    assert err["message"].startswith("input[1]: ")


def test_too_many_inputs_are_refused():
    client, embedder = embedding_client(embedding_max_inputs=3)
    r = post(client, {"input": ["a", "b", "c", "d"]})
    assert r.status_code == 400 and "at most 3" in r.json["error"]["message"]
    assert embedder.requests == []


def test_an_engine_failure_is_a_500_in_openai_shape(emb):
    client, _ = emb
    r = post(client, {"input": ["fine", "FAIL_EMBED here"]})
    assert r.status_code == 500
    assert r.json["error"]["message"].startswith("input[1]: ")


def test_without_an_embedder_the_route_says_embeddings_are_off():
    client = make_client(FakeEngine())
    r = post(client, {"input": "x"})
    assert r.status_code == 501
    assert "EMBEDDINGS=on" in r.json["error"]["message"]


def test_pooling_none_is_refused_saying_why():
    client, _ = embedding_client(FakeEmbedder(pooling="none"))
    r = post(client, {"input": "x"})
    assert r.status_code == 400
    assert r.json["error"]["code"] == "pooling_not_supported"


def test_normalization_can_be_turned_off():
    client, _ = embedding_client(embedding_normalize=False)
    got = post(client, {"input": "raw vector"}).json["data"][0]["embedding"]
    assert np.allclose(got, fake_vector("raw vector", 16), atol=1e-5)


def test_get_is_a_405_in_openai_shape(emb):
    client, _ = emb
    r = client.get("/v1/embeddings")
    assert r.status_code == 405 and "error" in r.json


# ---- Vertex AI embedding instances ---------------------------------------------------------


def test_vertex_instances_answer_as_googles_embedding_models(emb):
    client, embedder = emb
    r = post(client, {"instances": [{"content": "first text"}, {"content": "second one here"}]},
             PREDICT)
    assert r.status_code == 200, r.json
    preds = r.json["predictions"]
    assert len(preds) == 2
    for text, p in zip(["first text", "second one here"], preds, strict=True):
        values = p["embeddings"]["values"]
        assert np.allclose(values, unit(fake_vector(text, 16)), atol=1e-6)
        assert p["embeddings"]["statistics"] == {"token_count": len(text.split()),
                                                 "truncated": False}
    assert len(embedder.requests) == 1  # the envelope is one batch


def test_vertex_auto_truncate_is_on_by_default_and_reported(emb):
    client, _ = emb
    preds = post(client, {"instances": [{"content": "word " * 40}]}, PREDICT).json["predictions"]
    assert preds[0]["embeddings"]["statistics"] == {"token_count": 32, "truncated": True}


def test_vertex_auto_truncate_off_fails_only_that_instance(emb):
    client, _ = emb
    r = post(client, {"instances": [{"content": "fine"}, {"content": "word " * 40}],
                      "parameters": {"autoTruncate": False}}, PREDICT)
    assert r.status_code == 200
    ok, bad = r.json["predictions"]
    assert "embeddings" in ok
    assert bad["error"]["code"] == 400 and bad["error"]["status"] == "INVALID_ARGUMENT"
    assert "32" in bad["error"]["message"]


def test_vertex_output_dimensionality_and_instance_keys_win(emb):
    client, embedder = emb
    r = post(client, {"instances": [{"content": "a b"}, {"content": "c d",
                                                          "outputDimensionality": 8}],
                      "parameters": {"outputDimensionality": 4}}, PREDICT)
    sizes = [len(p["embeddings"]["values"]) for p in r.json["predictions"]]
    assert sizes == [4, 8]
    assert len(embedder.requests) == 2  # one request per distinct size


@pytest.mark.parametrize(
    "instance, param_word",
    [
        ({"content": "x", "task_type": "SUMMARIZE"}, "task_type"),
        ({"content": "x", "title": "T", "task_type": "RETRIEVAL_QUERY"}, "title"),
        ({"content": ""}, "content"),
        ({"content": "x", "autoTruncate": "yes"}, "autoTruncate"),
        ({"content": "x", "colour": "red"}, "colour"),
    ],
)
def test_vertex_bad_instances_fail_their_own_slot(emb, instance, param_word):
    client, _ = emb
    r = post(client, {"instances": [instance, {"content": "good"}]}, PREDICT)
    assert r.status_code == 200
    bad, good = r.json["predictions"]
    assert bad["error"]["status"] == "INVALID_ARGUMENT" and param_word in bad["error"]["message"]
    assert "embeddings" in good


def test_vertex_task_prefixes_and_titles_reach_the_model():
    client, _ = embedding_client(embedding_task_prefixes={"RETRIEVAL_QUERY": "query: "})
    r = post(client, {"instances": [
        {"content": "where is it", "task_type": "RETRIEVAL_QUERY"},
        {"content": "it is here", "task_type": "RETRIEVAL_DOCUMENT", "title": "Place"},
    ]}, PREDICT)
    q, d = (p["embeddings"]["values"] for p in r.json["predictions"])
    assert np.allclose(q, unit(fake_vector("query: where is it", 16)), atol=1e-6)
    # the fake embeds words: the title's blank line is a word break to it
    assert np.allclose(d, unit(fake_vector("Place it is here", 16)), atol=1e-6)


@pytest.mark.parametrize("fmt", ["embeddings", "text_embeddings", "Vertex_Embeddings"])
def test_vertex_request_format_names_the_embedding_api(emb, fmt):
    client, _ = emb
    r = post(client, {"instances": [{"@requestFormat": fmt, "content": "hi"}]}, PREDICT)
    assert "embeddings" in r.json["predictions"][0]


def test_an_envelope_mixing_chat_and_embeddings_answers_both(emb):
    client, _ = emb
    r = post(client, {"instances": [
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        {"content": "embed me"},
    ]}, PREDICT)
    chat, embedding = r.json["predictions"]
    assert chat["object"] == "chat.completion"
    assert "embeddings" in embedding


def test_vertex_queue_full_fills_every_embedding_slot():
    client, _ = embedding_client(FakeEmbedder(capacity=0))
    preds = post(client, {"instances": [{"content": "a"}, {"content": "b"}]},
                 PREDICT).json["predictions"]
    assert [p["error"]["status"] for p in preds] == ["RESOURCE_EXHAUSTED"] * 2


def test_raw_vertex_instance_and_raw_openai_body_through_predict(emb):
    client, _ = emb
    raw = post(client, {"content": "raw one"}, PREDICT)
    assert raw.status_code == 200 and "values" in raw.json["embeddings"]
    bad = post(client, {"content": "word " * 40, "autoTruncate": False}, PREDICT)
    assert bad.status_code == 400 and bad.json["error"]["status"] == "INVALID_ARGUMENT"
    oai = post(client, {"input": "raw two", "encoding_format": "float"}, PREDICT)
    assert oai.status_code == 200 and oai.json["object"] == "list"
    named = post(client, {"input": "raw three", "@requestFormat": "/v1/embeddings"}, PREDICT)
    assert named.status_code == 200 and named.json["data"][0]["object"] == "embedding"
    responses = post(client, {"input": "no embedding field"}, PREDICT)
    assert responses.json.get("object") == "response"  # plain input stays a Responses body


def test_large_answers_are_encoded_off_the_hub_with_the_same_content(emb):
    """Over 20,000 floats (and over 16 instances) the JSON is encoded on a worker thread."""
    client, _ = emb
    texts = [f"text number {i}" for i in range(1300)]  # 1300 x 16 floats
    body = post(client, {"input": texts}).json
    assert len(body["data"]) == 1300 and body["data"][1299]["index"] == 1299
    assert np.allclose(body["data"][7]["embedding"], unit(fake_vector(texts[7], 16)), atol=1e-6)
    r = post(client, {"instances": [{"content": t} for t in texts[:20]]}, PREDICT)
    assert r.status_code == 200 and r.mimetype == "application/json"
    assert len(r.json["predictions"]) == 20
