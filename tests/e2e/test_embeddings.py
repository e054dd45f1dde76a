"""End to end: embeddings from a real server, on the real default model (a generative model
that also embeds) and on a tiny BERT-style embedding GGUF built by the test, through the
official openai SDK, LangChain and Vertex predict envelopes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import openai
import pytest
import requests
from langchain_openai import OpenAIEmbeddings

from tests.support.server import ServerProcess, running_server
from tests.support.tiny_bert import N_CTX, N_EMBD, build_tiny_bert

TEXTS = ["The cat sat on the mat.", "Paris is the capital of France.", "hello world",
         "Embeddings turn text into vectors.", "A second, slightly longer sentence here."]


@pytest.fixture(scope="module")
def server(default_model) -> ServerProcess:
    env = {"SERVED_MODEL_NAME": "smol,smol-embed", "EMBEDDINGS": "on", "EMBEDDING_CTX": "256",
           "PARALLEL": "2"}
    with running_server(env) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0, timeout=120)


def vectors(resp) -> np.ndarray:
    return np.array([d.embedding for d in resp.data], dtype=np.float32)


def test_openai_sdk_default_base64_and_float_agree(client):
    b64 = client.embeddings.create(model="smol-embed", input=TEXTS)  # the SDK asks for base64
    flt = client.embeddings.create(model="smol-embed", input=TEXTS, encoding_format="float")
    a, b = vectors(b64), vectors(flt)
    assert a.shape == (len(TEXTS), 576)
    assert np.array_equal(a, b)  # the same float32 values, however they travel
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    assert b64.model == "smol-embed"  # the alias asked for is echoed
    assert b64.usage.prompt_tokens == b64.usage.total_tokens > len(TEXTS)
    # different texts, different directions
    sims = a @ a.T
    assert (sims[~np.eye(len(TEXTS), dtype=bool)] < 0.9999).all()


def test_a_text_embeds_the_same_alone_and_in_a_batch(client):
    batch = vectors(client.embeddings.create(model="m", input=TEXTS, encoding_format="float"))
    for i, text in enumerate(TEXTS):
        alone = vectors(client.embeddings.create(model="m", input=text, encoding_format="float"))
        assert float(alone[0] @ batch[i]) > 0.99999, text
        assert np.abs(alone[0] - batch[i]).max() < 1e-4, text


def test_token_ids_embed_as_their_text_does(client, server):
    ids = requests.post(server.url("/tokenize"), json={"content": TEXTS[0], "add_special": True},
                        timeout=30).json()["tokens"]
    by_text = vectors(client.embeddings.create(model="m", input=TEXTS[0], encoding_format="float"))
    by_ids = vectors(client.embeddings.create(model="m", input=[ids], encoding_format="float"))
    assert np.abs(by_text - by_ids).max() < 1e-4


def test_dimensions_through_the_sdk(client):
    full = vectors(client.embeddings.create(model="m", input="matryoshka", encoding_format="float"))
    cut = vectors(client.embeddings.create(model="m", input="matryoshka", dimensions=64))
    assert cut.shape == (1, 64)
    assert np.isclose(np.linalg.norm(cut[0]), 1.0, atol=1e-5)
    assert np.allclose(cut[0], full[0, :64] / np.linalg.norm(full[0, :64]), atol=1e-5)
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model="m", input="x", dimensions=577)
    assert err.value.body["param"] == "dimensions"


def test_an_over_long_input_is_a_400_and_the_server_stays_up(client, server):
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model="m", input=["fine", "word " * 400])
    assert err.value.body["code"] == "context_length_exceeded"
    assert requests.get(server.url("/health"), timeout=10).status_code == 200


def test_langchain_openai_embeddings(server, client):
    # check_embedding_ctx_length=False: LangChain would otherwise send tiktoken ids of an
    # OpenAI tokenizer (meaningless to this model), as its docs say for other providers
    lc = OpenAIEmbeddings(model="smol", base_url=server.url("/v1"), api_key="x",
                          check_embedding_ctx_length=False, max_retries=0)
    docs = np.array(lc.embed_documents(TEXTS[:3]), dtype=np.float32)
    query = np.array(lc.embed_query(TEXTS[1]), dtype=np.float32)
    assert docs.shape == (3, 576)
    direct = vectors(client.embeddings.create(model="m", input=TEXTS[:3], encoding_format="float"))
    assert np.abs(docs - direct).max() < 1e-4
    assert int(np.argmax(docs @ query)) == 1


def test_vertex_envelope_answers_as_googles_embedding_models(server, client):
    body = {"instances": [{"content": TEXTS[0], "task_type": "RETRIEVAL_DOCUMENT",
                           "title": "Cats"},
                          {"content": "word " * 400},
                          {"content": TEXTS[2], "outputDimensionality": 32}],
            "parameters": {"autoTruncate": True}}
    r = requests.post(server.url("/predict"), json=body, timeout=120)
    assert r.status_code == 200, r.text
    first, long, small = r.json()["predictions"]
    assert len(first["embeddings"]["values"]) == 576
    assert long["embeddings"]["statistics"] == {"token_count": 256, "truncated": True}
    assert len(small["embeddings"]["values"]) == 32
    # the same text gets the same vector through either API
    oai = vectors(client.embeddings.create(model="m", input=TEXTS[2], dimensions=32))
    assert np.abs(np.array(small["embeddings"]["values"]) - oai[0]).max() < 1e-4
    assert small["embeddings"]["statistics"]["token_count"] == client.embeddings.create(
        model="m", input=TEXTS[2]).usage.prompt_tokens
    body["parameters"]["autoTruncate"] = False
    preds = requests.post(server.url("/predict"), json=body, timeout=120).json()["predictions"]
    assert "embeddings" in preds[0] and "embeddings" in preds[2]
    assert preds[1]["error"]["status"] == "INVALID_ARGUMENT"


def test_an_embedding_is_served_while_a_long_generation_streams(server, client):
    """Embeddings run in their own context: one is answered while a generation that has
    hundreds of tokens to go is still streaming (the stream is checked to go on after)."""
    with requests.post(server.url("/v1/chat/completions"), stream=True, timeout=300, json={
        "messages": [{"role": "user", "content": "Count from one to a thousand."}],
        "max_tokens": 1500, "ignore_eos": True, "stream": True, "temperature": 0,
    }) as stream:
        lines = stream.iter_lines()
        pieces = 0
        for line in lines:  # bounded: the stream ends at max_tokens
            if line.startswith(b"data: {"):
                pieces += 1
                if pieces == 3:
                    break
        resp = client.embeddings.create(model="m", input=TEXTS, encoding_format="float")
        assert len(resp.data) == len(TEXTS)
        finish = None
        after = 0
        for line in lines:
            if line.startswith(b"data: {"):
                after += 1
                choice = json.loads(line[6:])["choices"]
                if choice and choice[0]["finish_reason"]:
                    finish = choice[0]["finish_reason"]
        assert finish == "length"
        assert after > 100  # most of the generation came after the embedding's answer


# ---- an embedding-only model --------------------------------------------------------------


@pytest.fixture(scope="module", params=["mean", "cls"])
def bert(request, tmp_path_factory) -> ServerProcess:
    path = build_tiny_bert(Path(tmp_path_factory.mktemp("bert")) / "tiny-bert.gguf",
                           pooling=request.param)
    with running_server({"MODEL": str(path), "EMBEDDING_BATCH": "8"}) as srv:
        yield srv


def test_embedding_model_serves_embeddings_only(bert):
    c = openai.OpenAI(base_url=bert.url("/v1"), api_key="x", max_retries=0, timeout=60)
    texts = ["hello world", "the cat sat on the mat", "it is here"] * 6  # 18 > EMBEDDING_BATCH
    batch = vectors(c.embeddings.create(model="m", input=texts, encoding_format="float"))
    assert batch.shape == (18, N_EMBD)
    alone = vectors(c.embeddings.create(model="m", input=texts[1], encoding_format="float"))
    assert np.abs(alone[0] - batch[1]).max() < 1e-5
    assert np.abs(batch[1] - batch[4]).max() < 1e-5  # the same text, elsewhere in the batch
    stats = requests.get(bert.url("/health"), timeout=10).json()["embeddings"]
    assert max(int(w) for w in stats["batch_widths"]) <= 8  # many inputs, several decodes
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert "only embeds" in err.value.body["message"]
    # non-causal: a long input must be decoded whole or refused, never crash llama.cpp
    with pytest.raises(openai.BadRequestError) as err:
        c.embeddings.create(model="m", input="hello " * (N_CTX + 10))
    assert err.value.body["code"] == "context_length_exceeded"
    cut = requests.post(bert.url("/predict"), json={"instances": [
        {"content": "hello " * (N_CTX + 10)}]}, timeout=60).json()["predictions"][0]
    assert cut["embeddings"]["statistics"] == {"token_count": N_CTX, "truncated": True}
    assert requests.get(bert.url("/health"), timeout=10).status_code == 200


def test_by_default_a_generative_model_does_not_embed_and_the_log_says_where_it_went(
        server_factory):
    """EMBEDDINGS=auto on a chat model: no embedding context (its memory is asked for with
    EMBEDDINGS=on); the load log names each buffer's device, as a multi-GPU operator needs."""
    srv = server_factory()
    srv.wait_ready()
    r = requests.post(srv.url("/v1/embeddings"), json={"input": "x"}, timeout=30)
    assert r.status_code == 501 and "EMBEDDINGS=on" in r.json()["error"]["message"]
    assert "embeddings" not in requests.get(srv.url("/health"), timeout=10).json()
    logs = srv.logs()
    assert "placement: " in logs
    assert "model buffer size" in logs and "KV buffer size" in logs
    assert "split_mode=layer" in logs
