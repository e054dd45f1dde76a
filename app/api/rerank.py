"""The rerank seam (:class:`RerankApi`) and its APIs: llama-server's and Jina's ``/rerank``
(with Cohere's v1 on the same ``/v1/rerank``, told apart by its body), Cohere's ``/v2/rerank``,
and vLLM's ``/score``. Each is an adapter over app.core.rerank, so a pair gets the same score
through any of them; wire shapes are in app.protocol.rerank.

Through the Vertex predict route, an instance (or a raw body) with ``query`` and
``documents`` is a rerank request (``@requestFormat`` "rerank"; "/v2/rerank" and "score" name
the others), answered in its API's shape; a failing instance fills its own slot.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flask import Response, request

from app.api.base import Answer, Api, Facts, gone_probe, json_off_hub, read_body
from app.base.errors import BadRequest, ServiceError
from app.core.models import Models
from app.core.rerank import Reranker, RerankInput, RerankResult
from app.core.rerank_pairs import Fit
from app.core.service import Service
from app.protocol import openai, validate
from app.protocol import rerank as wire
from app.settings import Settings

HINT = "see docs/rerank.md, Fields"
OFFLOAD_RESULTS = 256  # answers with more results than this are encoded off the hub


class RerankApi(Api):
    """A rerank API: a body parsed (off the hub) into the core's RerankInput, its pairs scored,
    the result rendered, on one answer path; never streamed. Subclasses implement ``parse``,
    ``render`` and ``error_body``."""

    def reranker(self, service: Service) -> Reranker:
        """The rerank core over a leased model's service, with that model's limits (a few
        attributes: made per call)."""
        s = self.model_settings(service)
        return Reranker(service, s.rerank_max_documents, s.rerank_max_bytes,
                        self.settings.request_timeout or None)

    def parse(self, body: Any, facts: Facts) -> tuple[RerankInput, Any]:
        """The core's input and whatever ``render`` needs of the request (a worker thread)."""
        raise NotImplementedError

    def render(self, req: Any, result: RerankResult) -> dict[str, Any]:
        raise NotImplementedError

    def answer(self, body: Any, facts: Facts) -> dict[str, Any]:
        lease, facts = self.lease(body, facts)
        with lease:
            svc = lease.service
            inp, req = svc.offload(lambda: self.parse(body, facts))
            result = self.reranker(svc).run(inp, facts.gone, facts.label)
            if len(result.scores) > OFFLOAD_RESULTS:
                return svc.offload(lambda: self.render(req, result))
            return self.render(req, result)

    def respond(self, result: Answer) -> Response:
        if isinstance(result, dict) and len(result.get("results") or result.get("data")
                                             or ()) > OFFLOAD_RESULTS:
            return json_off_hub(result)
        return super().respond(result)


class _Asked:
    """What a rerank answer needs of its request."""

    def __init__(self, docs: list[Any], top_n: int | None, return_documents: bool):
        self.docs = docs
        self.top_n = top_n
        self.return_documents = return_documents


def _ranked(asked: _Asked, result: RerankResult) -> list[dict[str, Any]]:
    scores = [s.score for s in result.scores]
    docs = asked.docs if asked.return_documents else None
    return wire.results(result.ranked(asked.top_n), scores, docs, wrap=True)


def _activation(value: bool | None) -> bool:
    return True if value is None else value


class Rerank(RerankApi):
    """llama-server's and Jina's rerank, on every path they serve it; a body only Cohere's v1
    API sends (rank_fields, max_chunks_per_doc, document objects with more than a text, or
    Cohere's SDK) is answered by :class:`CohereV1`, as Cohere answers it, errors included."""

    name = "rerank"
    paths = ("/rerank", "/v1/rerank", "/reranking", "/v1/reranking")
    request_formats = ("jina_rerank", "/rerank")

    def __init__(self, settings: Settings, models: Models):
        super().__init__(settings, models)
        self.cohere_v1 = CohereV1(settings, models)

    def looks_like(self, body: dict[str, Any]) -> bool:
        return "query" in body and "documents" in body

    def variant(self, body: Any, headers: Mapping[str, str]) -> str:
        if isinstance(body, dict) and wire.speaks_cohere_v1(body, headers):
            return self.cohere_v1.name
        return self.name

    @staticmethod
    def error_body(err: ServiceError) -> dict[str, Any]:
        return openai.error_body(err)

    def view(self) -> Response:
        """The body says which API it speaks (content negotiation on the shared path)."""
        body = read_body()
        api: RerankApi = self
        if self.variant(body, request.headers) != self.name:
            api = self.cohere_v1
        try:
            return api.respond(api.serve(body, api.facts(request.headers, gone_probe())))
        except Exception as exc:  # noqa: BLE001 - in the shape of the API spoken
            return api.error_response(exc)

    def parse(self, body: Any, facts: Facts) -> tuple[RerankInput, _Asked]:
        req: wire.JinaRerank = validate.parse(wire.JinaRerank, body, wire.UNSUPPORTED, HINT)
        texts = [wire.document_text(d, i) for i, d in enumerate(req.documents)]
        overflow, pair_max = wire.pair_limit(req.truncate_prompt_tokens)
        if req.max_tokens_per_doc is not None and overflow == "error":
            overflow = "truncate"
        fit = Fit(overflow, max_doc_tokens=req.max_tokens_per_doc,  # type: ignore[arg-type]
                  max_pair_tokens=pair_max)
        inp = RerankInput(tuple((req.query, t) for t in texts), req.model, fit,
                          _activation(req.use_activation))
        asked = _Asked(req.documents, wire.top_n(req.top_n, len(texts)),
                       req.return_documents is not False)
        return inp, asked

    def render(self, req: _Asked, result: RerankResult) -> dict[str, Any]:
        return wire.jina_answer(result.model, _ranked(req, result), result.tokens)


class _Cohere(RerankApi):
    version = "1"

    @staticmethod
    def error_body(err: ServiceError) -> dict[str, Any]:
        return wire.cohere_error(err.message)

    def render(self, req: _Asked, result: RerankResult) -> dict[str, Any]:
        return wire.cohere_answer(self.version, _ranked(req, result), result.tokens,
                                  result.model)


class CohereV1(_Cohere):
    """Cohere's v1 rerank: served on /v1/rerank through :class:`Rerank` (the path is Jina's
    too), and through Vertex for a body only Cohere v1 sends, or ``@requestFormat``
    "cohere_v1_rerank"."""

    name = "rerank_cohere_v1"
    paths = ()
    request_formats = ("cohere_v1_rerank",)

    def looks_like(self, body: dict[str, Any]) -> bool:
        return "query" in body and "documents" in body and wire.speaks_cohere_v1(body)

    def parse(self, body: Any, facts: Facts) -> tuple[RerankInput, _Asked]:
        req: wire.CohereV1Rerank = validate.parse(wire.CohereV1Rerank, body, wire.UNSUPPORTED, HINT)
        texts = [wire.document_text(d, i, req.rank_fields) for i, d in enumerate(req.documents)]
        chunks = req.max_chunks_per_doc or 10  # Cohere's default
        fit = Fit("chunk", chunks=chunks, max_doc_tokens=req.max_tokens_per_doc)
        inp = RerankInput(tuple((req.query, t) for t in texts), req.model, fit,
                          _activation(req.use_activation))
        return inp, _Asked(req.documents, wire.top_n(req.top_n, len(texts)),
                           bool(req.return_documents))


class CohereV2(_Cohere):
    """Cohere's v2 rerank: documents cut at max_tokens_per_doc (4096 unless set), then to the
    context; no documents in the answer unless return_documents (vLLM's and LiteLLM's)."""

    name = "rerank_cohere_v2"
    paths = ("/v2/rerank",)
    request_formats = ("cohere_v2_rerank", "cohere")
    version = "2"

    def parse(self, body: Any, facts: Facts) -> tuple[RerankInput, _Asked]:
        req: wire.CohereV2Rerank = validate.parse(wire.CohereV2Rerank, body, wire.UNSUPPORTED, HINT)
        if req.relevant_spans is not None and req.relevant_spans.mode != "disabled":
            raise BadRequest("relevant_spans: this server does not find spans (Rerank v5 "
                                  "models only): leave it out", param="relevant_spans")
        texts = [wire.document_text(d, i) for i, d in enumerate(req.documents)]
        fit = Fit("truncate", max_doc_tokens=req.max_tokens_per_doc or 4096)
        inp = RerankInput(tuple((req.query, t) for t in texts), req.model, fit,
                          _activation(req.use_activation))
        return inp, _Asked(req.documents, wire.top_n(req.top_n, len(texts)),
                           bool(req.return_documents))


class Score(RerankApi):
    """vLLM's /score: each text_2 scored against text_1 (or pairwise), in request order."""

    name = "score"
    paths = ("/score", "/v1/score")
    request_formats = ("vllm_score",)

    def looks_like(self, body: dict[str, Any]) -> bool:
        return ("text_1" in body and "text_2" in body) or ("data_1" in body and "data_2" in body)

    @staticmethod
    def error_body(err: ServiceError) -> dict[str, Any]:
        return openai.error_body(err)

    def parse(self, body: Any, facts: Facts) -> tuple[RerankInput, None]:
        req: wire.Score = validate.parse(wire.Score, body, wire.UNSUPPORTED, HINT)
        pairs, first, second, indexed = wire.score_pairs(req)
        overflow, pair_max = wire.pair_limit(req.truncate_prompt_tokens)
        fit = Fit(overflow, max_pair_tokens=pair_max, first=first, second=second,  # type: ignore[arg-type]
                  first_indexed=indexed)
        return RerankInput(tuple(pairs), req.model, fit, _activation(req.use_activation)), None

    def render(self, req: None, result: RerankResult) -> dict[str, Any]:
        return wire.score_answer(result.model, [s.score for s in result.scores], result.tokens)
