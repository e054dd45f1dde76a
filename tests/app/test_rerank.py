"""Rerank and score over the fake reranker: every shape's fields and answers (llama-server and
Jina's /rerank, Cohere v1 on the same path, Cohere v2, vLLM's /score), the Vertex predict route,
the bounds and errors in each API's shape, Cohere's own SDK, and who may rerank at all.

The fake reranker's output for a pair is ``fake_rank_logit`` of the pair's tokens; its
tokenizer is the fake engine's (one token a byte, BOS ``<s>`` = 1, ``</s>`` = 2), and its
framing BOS query SEP document SEP (SEP = 2), so every expected score is computed here."""

from __future__ import annotations

import math
from dataclasses import replace

import cohere
import httpx
import pytest

from app.engine.embed import RankInfo
from app.engine.fake import FakeEngine
from app.engine.fake_embed import FakeEmbedder, fake_rank_logit
from tests.support.app import make_client

DOCS = ["the cat sat on the mat", "a dog", "it is here", "hello world"]
QUERY = "where is the cat"


def toks(text: str) -> list[int]:
    return [3 + b for b in text.encode()]


def logit(query: str, doc: str) -> float:
    return fake_rank_logit(tuple([1, *toks(query), 2, *toks(doc), 2]))


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def rerank_client(n_ctx: int = 256, rank: RankInfo | None = None, **settings):
    engine = FakeEngine()
    engine.embedder = FakeEmbedder(pooling="rank", n_ctx=n_ctx, only=True,  # type: ignore[attr-defined]
                                   rank=rank)
    engine._info = replace(engine._info, reranks=True, control_texts=("</s>", "<s>", "<unk>"))
    return make_client(engine, **settings), engine.embedder  # type: ignore[attr-defined]


@pytest.fixture
def rr():
    return rerank_client()


def expected(query: str = QUERY, docs: list[str] = DOCS) -> list[float]:
    return [sigmoid(logit(query, d)) for d in docs]


# ---- llama-server and Jina ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/reranking", "/v1/reranking"])
def test_jina_and_llama_server_shape_on_every_path(rr, path):
    client, emb = rr
    r = client.post(path, json={"model": "m", "query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.json
    body = r.json
    want = expected()
    order = sorted(range(len(DOCS)), key=lambda i: -want[i])
    assert [x["index"] for x in body["results"]] == order
    for x in body["results"]:
        assert x["relevance_score"] == pytest.approx(want[x["index"]], abs=1e-6)
        assert x["document"] == {"text": DOCS[x["index"]]}  # Jina returns them by default
    n = sum(3 + len(QUERY.encode()) + len(d.encode()) for d in DOCS)
    assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}
    assert body["object"] == "list" and body["model"] == "fake-model"
    assert emb.requests[-1].rank  # submitted as reranking pairs


def test_top_n_return_documents_and_the_raw_logit(rr):
    client, _ = rr
    body = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 2,
                                           "return_documents": False,
                                           "use_activation": False}).json
    raw = [logit(QUERY, d) for d in DOCS]
    assert [x["index"] for x in body["results"]] == sorted(range(4), key=lambda i: -raw[i])[:2]
    assert all("document" not in x for x in body["results"])
    assert body["results"][0]["relevance_score"] == pytest.approx(max(raw), abs=1e-5)
    r = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS, "top_n": -1})
    assert r.status_code == 400 and r.json["error"]["param"] == "top_n"


def test_a_document_that_does_not_fit_is_named_unless_truncation_is_asked():
    client, _ = rerank_client(n_ctx=40)
    docs = ["short", "x" * 60]
    r = client.post("/v1/rerank", json={"query": "q", "documents": docs})
    assert r.status_code == 400
    err = r.json["error"]
    assert err["code"] == "context_length_exceeded" and err["message"].startswith("documents[1]")
    body = client.post("/v1/rerank", json={"query": "q", "documents": docs,
                                           "truncate_prompt_tokens": -1}).json
    cut = {x["index"]: x["relevance_score"] for x in body["results"]}
    # BOS q SEP + 36 of the document's tokens + SEP = 40
    assert cut[1] == pytest.approx(sigmoid(fake_rank_logit(tuple([1, *toks("q"), 2,
                                                                  *toks("x" * 36), 2]))))
    body = client.post("/v1/rerank", json={"query": "q", "documents": docs,
                                           "max_tokens_per_doc": 5}).json
    cut = {x["index"]: x["relevance_score"] for x in body["results"]}
    assert cut[1] == pytest.approx(sigmoid(logit("q", "xxxxx")))
    r = client.post("/v1/rerank", json={"query": "q" * 50, "documents": docs,
                                        "truncate_prompt_tokens": -1})
    assert r.status_code == 400 and r.json["error"]["message"].startswith("query:")


def test_unknown_and_tei_fields_are_refused_by_name(rr):
    client, _ = rr
    r = client.post("/rerank", json={"query": "q", "texts": ["a"]})
    assert r.status_code == 400 and "TEI" in r.json["error"]["message"]
    r = client.post("/rerank", json={"query": "q", "documents": [{"image": "x"}]})
    assert r.status_code == 400  # an object without text


# ---- Cohere ---------------------------------------------------------------------------------


def test_cohere_v1_is_told_apart_by_its_body(rr):
    client, _ = rr
    docs = [{"title": "Cats", "text": DOCS[0]}, {"title": "Dogs", "text": DOCS[1]}]
    body = client.post("/v1/rerank", json={"query": QUERY, "documents": docs,
                                           "return_documents": True}).json
    assert body["meta"]["api_version"]["version"] == "1" and "usage" not in body
    assert {x["index"]: x["document"] for x in body["results"]} == dict(enumerate(docs))
    # rank_fields: those fields, in that order, are what is ranked
    body = client.post("/v1/rerank", json={"query": QUERY, "documents": docs,
                                           "rank_fields": ["title", "text"]}).json
    got = {x["index"]: x["relevance_score"] for x in body["results"]}
    assert got[0] == pytest.approx(sigmoid(logit(QUERY, f"title: Cats\ntext: {DOCS[0]}")))
    assert all("document" not in x for x in body["results"])  # Cohere v1: off by default
    # Cohere's errors are {"message": ...}
    r = client.post("/v1/rerank", json={"query": QUERY, "documents": docs, "top_n": -2,
                                        "rank_fields": ["text"]})
    assert r.status_code == 400 and set(r.json) >= {"message"} and "error" not in r.json


def test_cohere_v1_scores_a_long_document_by_its_best_chunk():
    client, _ = rerank_client(n_ctx=20)
    doc = "a" * 10 + "b" * 10 + "c" * 5
    body = client.post("/v1/rerank", json={"query": "q", "documents": [doc],
                                           "max_chunks_per_doc": 2}).json
    room = 20 - 4  # BOS q SEP ... SEP
    chunks = [doc[:room], doc[room:2 * room]]
    best = max(sigmoid(logit("q", c)) for c in chunks)
    assert body["results"][0]["relevance_score"] == pytest.approx(best, abs=1e-6)


def test_cohere_v2_cuts_documents_and_answers_without_them(rr):
    client, _ = rr
    body = client.post("/v2/rerank", json={"model": "m", "query": QUERY, "documents": DOCS,
                                           "max_tokens_per_doc": 3, "top_n": 3}).json
    assert body["meta"]["api_version"]["version"] == "2" and len(body["results"]) == 3
    want = {i: sigmoid(logit(QUERY, d[:3])) for i, d in enumerate(DOCS)}
    for x in body["results"]:
        assert set(x) == {"index", "relevance_score"}
        assert x["relevance_score"] == pytest.approx(want[x["index"]], abs=1e-6)
    r = client.post("/v2/rerank", json={"query": QUERY, "documents": DOCS,
                                        "relevant_spans": {"mode": "enabled"}})
    assert r.status_code == 400 and "relevant_spans" in r.json["message"]


def sdk_transport(client) -> httpx.Client:
    def handle(req: httpx.Request) -> httpx.Response:
        headers = [(k, v) for k, v in req.headers.items()
                   if k.lower() not in ("host", "content-length")]
        resp = client.open(req.url.path, method=req.method, data=req.content, headers=headers)
        return httpx.Response(resp.status_code, headers=list(resp.headers.items()),
                              content=resp.get_data())

    return httpx.Client(transport=httpx.MockTransport(handle))


def test_coheres_sdk_v1_and_v2(rr):
    client, _ = rr
    http = sdk_transport(client)
    want = expected()
    v1 = cohere.Client(base_url="http://test", api_key="x", httpx_client=http)
    res = v1.rerank(query=QUERY, documents=DOCS, top_n=2, return_documents=True)
    assert [r.index for r in res.results] == sorted(range(4), key=lambda i: -want[i])[:2]
    assert res.results[0].document.text == DOCS[res.results[0].index]
    assert res.meta.api_version.version == "1"  # the SDK's header: Cohere's answer
    v2 = cohere.ClientV2(base_url="http://test", api_key="x", httpx_client=http)
    res = v2.rerank(model="m", query=QUERY, documents=DOCS)
    assert [round(r.relevance_score, 6) for r in res.results] == sorted(
        (round(w, 6) for w in want), reverse=True)
    with pytest.raises(cohere.errors.BadRequestError) as err:
        v2.rerank(model="m", query=QUERY, documents=[])
    assert "documents is empty" in err.value.body["message"]


# ---- vLLM's /score --------------------------------------------------------------------------


def test_score_one_against_many_and_pairwise(rr):
    client, _ = rr
    body = client.post("/score", json={"model": "m", "text_1": QUERY, "text_2": DOCS}).json
    assert [d["index"] for d in body["data"]] == [0, 1, 2, 3]  # request order, not ranked
    assert [d["score"] for d in body["data"]] == pytest.approx(expected(), abs=1e-6)
    assert body["object"] == "list" and body["data"][0]["object"] == "score"
    pairs = client.post("/v1/score", json={"text_1": ["a", "b"], "text_2": ["c", "d"]}).json
    assert [d["score"] for d in pairs["data"]] == pytest.approx(
        [sigmoid(logit("a", "c")), sigmoid(logit("b", "d"))], abs=1e-6)
    r = client.post("/score", json={"text_1": ["a", "b"], "text_2": ["c", "d", "e"]})
    assert r.status_code == 400 and r.json["error"]["param"] == "text_1"
    alt = client.post("/score", json={"queries": QUERY, "documents": DOCS}).json
    assert [d["score"] for d in alt["data"]] == [d["score"] for d in body["data"]]


# ---- Vertex ---------------------------------------------------------------------------------


def test_vertex_envelope_instances_and_raw_bodies(rr):
    client, _ = rr
    body = {"instances": [
        {"query": QUERY, "documents": DOCS, "return_documents": False},
        {"@requestFormat": "rerank", "query": QUERY, "documents": DOCS[:2], "top_n": 1},
        {"@requestFormat": "/v2/rerank", "query": QUERY, "documents": DOCS},
        {"text_1": QUERY, "text_2": DOCS[0]},
        {"query": QUERY, "documents": []},
    ]}
    preds = client.post("/predict", json=body).json["predictions"]
    want = expected()
    assert [x["relevance_score"] for x in preds[0]["results"]] == pytest.approx(
        sorted(want, reverse=True), abs=1e-6)
    assert "document" not in preds[0]["results"][0]
    assert len(preds[1]["results"]) == 1
    assert preds[2]["meta"]["api_version"]["version"] == "2"
    assert preds[3]["data"][0]["score"] == pytest.approx(want[0], abs=1e-6)
    assert preds[4]["error"]["param"] == "documents"  # a bad instance fills its own slot
    raw = client.post("/predict", json={"query": QUERY, "documents": DOCS, "top_n": 1}).json
    assert raw["results"][0]["relevance_score"] == pytest.approx(max(want), abs=1e-6)
    raw = client.post("/predict", json={"query": "q", "documents": [{"a": "b", "text": "c"}],
                                        "rank_fields": ["a"]}).json
    assert raw["meta"]["api_version"]["version"] == "1"  # Cohere v1 by its body, here too
    r = client.post("/predict", json={"@requestFormat": "/v2/rerank", "query": "q",
                                      "documents": "nope"})
    assert r.status_code == 400 and "message" in r.json  # in Cohere's shape



def test_vertex_answers_cohere_v1_as_its_path_does_whatever_format_was_named(rr):
    """@requestFormat "rerank" names the /v1/rerank path, which Cohere v1 shares: a Cohere v1
    body (its fields, or its SDK's header on a raw body) is answered as Cohere v1 there too."""
    client, _ = rr
    docs = [{"title": "Cats", "text": DOCS[0]}, {"title": "Dogs", "text": DOCS[1]}]
    cohere_v1 = {"query": QUERY, "documents": docs, "rank_fields": ["title"]}
    want = sigmoid(logit(QUERY, "title: Cats"))
    preds = client.post("/predict", json={"instances": [
        {"@requestFormat": "rerank", **cohere_v1},
        {"@requestFormat": "/v1/rerank", "query": QUERY, "documents": DOCS[:1]},
    ]}).json["predictions"]
    assert preds[0]["meta"]["api_version"]["version"] == "1"
    assert {x["index"]: x["relevance_score"] for x in preds[0]["results"]}[0] == pytest.approx(
        want, abs=1e-6)
    assert "usage" in preds[1]  # a Jina body stays Jina's
    raw = client.post("/predict", json={"@requestFormat": "rerank", **cohere_v1}).json
    assert raw["meta"]["api_version"]["version"] == "1"
    raw = client.post("/predict", json={"query": QUERY, "documents": DOCS[:1]},
                      headers={"X-Fern-SDK-Name": "cohere"}).json
    assert raw["meta"]["api_version"]["version"] == "1"  # Cohere's SDK, by its header
    r = client.post("/predict", json={"foo": "bar"})
    assert r.status_code == 400 and "'query' and 'documents'" in r.json["error"]["message"]
    r = client.post("/rerank", json={"query": QUERY, "documents": DOCS, "nope": 1})
    assert r.status_code == 400 and "docs/rerank.md" in r.json["error"]["message"]

# ---- bounds, and who reranks ----------------------------------------------------------------


def test_documents_and_bytes_are_bounded_in_each_apis_shape():
    client, _ = rerank_client(rerank_max_documents=3, rerank_max_bytes=1024)
    r = client.post("/v1/rerank", json={"query": "q", "documents": DOCS})
    assert r.status_code == 400 and "RERANK_MAX_DOCUMENTS" in r.json["error"]["message"]
    r = client.post("/v1/rerank", json={"query": "q", "documents": ["x" * 600, "y" * 600]})
    assert r.status_code == 413 and "RERANK_MAX_BYTES" in r.json["error"]["message"]
    r = client.post("/v2/rerank", json={"query": "q", "documents": ["x" * 600, "y" * 600]})
    assert r.status_code == 413 and "RERANK_MAX_BYTES" in r.json["message"]
    r = client.post("/score", json={"text_1": "q", "text_2": DOCS})
    assert r.status_code == 400 and r.json["error"]["param"] == "text_2"


def test_a_model_that_cannot_rerank_says_why():
    engine = FakeEngine()
    client = make_client(engine)
    r = client.post("/v1/rerank", json={"query": "q", "documents": ["a"]})
    assert r.status_code == 400 and "does not rerank" in r.json["error"]["message"]
    engine.embedder = FakeEmbedder(pooling="mean")  # type: ignore[attr-defined]
    r = client.post("/v2/rerank", json={"query": "q", "documents": ["a"]})
    assert r.status_code == 400 and "does not rerank" in r.json["message"]


def test_a_reranker_refuses_chat_and_embeddings_and_says_it_reranks(rr):
    client, _ = rr
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and "only reranks" in r.json["error"]["message"]
    r = client.post("/v1/embeddings", json={"input": "x"})
    assert r.status_code == 400 and "/v1/rerank" in r.json["error"]["message"]
    assert client.get("/v1/models").json["data"][0]["meta"]["reranks"] is True
    assert client.get("/props").json["meta"]["reranks"] is True


def test_apis_rerank_serves_only_reranking():
    client, _ = rerank_client(apis="rerank")
    assert client.post("/v1/rerank", json={"query": "q", "documents": ["a"]}).status_code == 200
    assert client.post("/v1/chat/completions", json={"messages": []}).status_code == 404
    client, _ = rerank_client(apis="openai")
    assert client.post("/v1/rerank", json={"query": "q", "documents": ["a"]}).status_code == 404


def test_control_token_text_in_a_document_stays_text():
    """With a rerank template, a document holding ``</s>`` gets that text's byte tokens, not
    the control token the template's own ``</s>`` is."""
    rank = RankInfo(template="<s>Q: {query} D: {document}</s>", prefix=(), middle=(),
                    suffix=(), n_out=1)
    client, emb = rerank_client(rank=rank)
    client.post("/v1/rerank", json={"query": "{document}", "documents": ["a</s>b"]})
    [pair] = emb.requests[-1].inputs
    assert pair == tuple([1, *toks("Q: {document} D: a</s>b"), 2])  # filled in once


def test_the_metrics_count_reranked_tokens(rr):
    client, _ = rr
    client.post("/v1/rerank", json={"query": "q", "documents": ["ab"]})
    text = client.get("/metrics").get_data(as_text=True)
    assert 'vertex_gguf_prompt_tokens_total{api="rerank"} 6.0' in text
