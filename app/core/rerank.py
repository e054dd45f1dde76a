"""Reranking through the core: (query, document) pairs in, one score each out, in no API's
vocabulary.

A reranker is a model with pooling ``rank`` (app.engine.embed.RankInfo): its pairs run on the
embedding engine, one sequence each, batched across requests and taking turns with other
requests at decodes exactly as embeddings do (app.engine.embed_jobs). The pairs are made into
tokens here, on a worker thread, before they are submitted: the embedding thread only decodes.
How a pair becomes tokens follows llama-server (app.core.rerank_pairs); what the outputs mean
follows vLLM: a one-logit cross-encoder's score is its sigmoid unless the request turns the
activation off (llama-server's raw logit), a model whose graph ends in a softmax (Qwen3
rerankers) gives its probability of "yes" as it is, or with the activation off the yes logit
less the no logit (vLLM's raw score for them).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from app.base.errors import BadRequest, GenerationTimeout, PayloadTooLarge, ServiceError
from app.core.embed import Embeddings, holding
from app.core.rerank_pairs import Built, Fit, PairMaker
from app.core.service import Service
from app.engine.embed import Embedder, Embedding, EmbedRequest, RankInfo, refusal


@dataclass(frozen=True)
class RerankInput:
    """What is asked: pairs of texts to score (query, document), how to fit each to the
    context, and whether the score goes through the activation (vLLM's use_activation)."""

    pairs: tuple[tuple[str, str], ...]
    model: str | None = None
    fit: Fit = Fit()
    activation: bool = True


@dataclass(frozen=True)
class Score:
    score: float
    tokens: int  # the pair's tokens (all of its chunks')
    truncated: bool  # some of its document was not scored


@dataclass(frozen=True)
class RerankResult:
    model: str
    scores: list[Score]  # per pair, in order

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.scores)

    def ranked(self, top_n: int | None = None) -> list[int]:
        """The pairs' indices, best score first (ties in request order), at most ``top_n``."""
        order = sorted(range(len(self.scores)), key=lambda i: (-self.scores[i].score, i))
        return order[:top_n] if top_n else order


def score_of(out: np.ndarray, rank: RankInfo, activation: bool) -> float:
    """A pair's score from its classifier outputs (see the module's docstring)."""
    first = float(out[0])
    if rank.normalized and not activation and len(out) == 2:
        # the softmax undone: log P(yes) - log P(no) is the yes logit minus the no logit,
        # vLLM's raw score for a Qwen3 reranker (its sigmoid is P(yes) again)
        yes, no = (min(max(float(x), 1e-30), 1.0) for x in out)
        return math.log(yes) - math.log(no)
    if rank.normalized or not activation:
        return first
    if len(out) == 1:
        return 1.0 / (1.0 + math.exp(-first)) if first >= 0 else math.exp(first) / (
            1.0 + math.exp(first))
    e = np.exp(out.astype(np.float64) - float(out.max()))
    return float(e[0] / e.sum())


class Reranker:
    """Runs reranking pairs on the engine's embedder."""

    def __init__(self, service: Service, max_documents: int, max_bytes: int,
                 timeout: float | None):
        self.service = service
        self.max_documents = max_documents
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.embeddings = Embeddings(service, normalize=False, max_inputs=max_documents,
                                     timeout=timeout)

    def embedder(self) -> tuple[Embedder, RankInfo]:
        """The reranker; 503 while loading, 400 when this model does not rerank."""
        self.service.info()
        emb = getattr(self.service.engine, "embedder", None)
        if emb is None:
            raise BadRequest("this model does not rerank: it is a generative model without a "
                             "classification head; serve a reranker GGUF (pooling type rank)",
                             code="model_not_supported")
        refused = refusal(emb.info.pooling, rank=True)
        if refused is not None or emb.info.rank is None:
            raise refused or BadRequest("this model does not rerank", code="model_not_supported")
        return emb, emb.info.rank

    def check(self, inp: RerankInput) -> tuple[str, Embedder, RankInfo]:
        """The model name to answer with, and the reranker; every request-wide error."""
        model = self.service.model_name(inp.model)
        side = inp.fit.second
        if not inp.pairs:
            raise BadRequest(f"{side} is empty: give at least one", param=side)
        if len(inp.pairs) > self.max_documents:
            raise BadRequest(
                f"{len(inp.pairs)} {side} in one request; at most {self.max_documents} are "
                "accepted (RERANK_MAX_DOCUMENTS)", param=side)
        size = sum(len(d.encode("utf-8", "surrogatepass")) for _, d in inp.pairs)
        size += sum(len(q.encode("utf-8", "surrogatepass")) for q in {q for q, _ in inp.pairs})
        if size > self.max_bytes:
            raise PayloadTooLarge(
                f"the texts to rerank are {size} bytes, over the {self.max_bytes} one request "
                "may hold (RERANK_MAX_BYTES)", param=side)
        emb, rank = self.embedder()
        return model, emb, rank

    def run(self, inp: RerankInput, gone: Callable[[], bool] | None = None,
            api: str = "rerank") -> RerankResult:
        """Every pair's score; any error is the request's (the first pair that fails names
        itself). ``api``: the metrics' label."""
        engine = self.service.engine
        with holding(engine):
            model, emb, rank = self.check(inp)
            maker = PairMaker(rank, emb.info.n_ctx, engine.tokenize, engine.pieces,
                              self.service.info().control_texts)
            built: list[Built] = self.service.offload(lambda: maker.build_all(inp.pairs, inp.fit))
            seqs = tuple(tuple(toks) for b in built for toks in b.chunks)
            handle = emb.submit(EmbedRequest(seqs, timeout=self.timeout, gone=gone, rank=True))
            outcomes = self.embeddings.wait(handle, gone, api)
        scores: list[Score] = []
        k = 0
        for i, b in enumerate(built):
            mine = outcomes[k:k + len(b.chunks)]
            k += len(b.chunks)
            for o in mine:
                if isinstance(o, ServiceError):
                    self._count(api, 0, o)
                    side = inp.fit.second
                    raise type(o)(f"{side}[{i}]: {o.message}", param=side, code=o.code)
            outs = [o for o in mine if isinstance(o, Embedding)]
            best = max(score_of(o.vector, rank, inp.activation) for o in outs)
            scores.append(Score(best, sum(o.tokens for o in outs), b.truncated))
        result = RerankResult(model, scores)
        self._count(api, result.tokens, None)
        return result

    def _count(self, api: str, tokens: int, err: ServiceError | None) -> None:
        m = self.service.metrics.api(api)
        m.prompt_tokens.inc(tokens)
        if isinstance(err, GenerationTimeout):
            m.timeouts.inc()
