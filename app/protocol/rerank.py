"""The rerank and score wire shapes, as pure data: the requests (strict models) and the answers
of llama-server and Jina (``/rerank``, ``/v1/rerank``), Cohere's v1 (``/v1/rerank``, told apart
by its body) and v2 (``/v2/rerank``) as vLLM serves them, and vLLM's ``/score``.

Where they differ: Jina's answer has ``usage`` and returns the documents unless told not to;
llama-server's never returns them (its clients read only index and score, so the Jina answer
serves both); Cohere v1 returns them only when ``return_documents`` is true (an object
document with all its fields), chunks a long document (``max_chunks_per_doc``) and may rank
an object by some of its fields (``rank_fields``); Cohere v2 has no ``return_documents`` and
cuts documents at ``max_tokens_per_doc`` (4096 unless set). vLLM's ``/score`` pairs ``text_1``
with ``text_2`` (one against many, or pairwise) and answers in request order.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from app.base.errors import BadRequest

# a document: a string, or an object whose "text" (or rank_fields) holds what is ranked
Document = StrictStr | dict[StrictStr, Any]
PositiveInt = Annotated[StrictInt, Field(ge=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JinaRerank(_Strict):
    """llama-server's and Jina's request (vLLM's too: truncate_prompt_tokens, use_activation)."""

    query: StrictStr
    documents: list[Document]
    model: StrictStr | None = None
    top_n: StrictInt | None = None
    return_documents: StrictBool | None = None
    truncate_prompt_tokens: StrictInt | None = None  # vLLM: -1 fits the context, k at most k
    max_tokens_per_doc: PositiveInt | None = None
    use_activation: StrictBool | None = None
    priority: StrictInt | None = None  # vLLM's; accepted, requests are served in turn
    user: StrictStr | None = None


class CohereV1Rerank(_Strict):
    query: StrictStr
    documents: list[Document]
    model: StrictStr | None = None
    top_n: StrictInt | None = None
    rank_fields: list[StrictStr] | None = None
    return_documents: StrictBool | None = None
    max_chunks_per_doc: PositiveInt | None = None
    max_tokens_per_doc: PositiveInt | None = None
    use_activation: StrictBool | None = None


class RelevantSpans(BaseModel):
    mode: StrictStr
    threshold: float | None = None
    max_spans: StrictInt | None = None


class CohereV2Rerank(_Strict):
    query: StrictStr
    documents: list[Document]
    model: StrictStr | None = None
    top_n: StrictInt | None = None
    max_tokens_per_doc: PositiveInt | None = None
    return_documents: StrictBool | None = None  # not Cohere's (v2 dropped it); vLLM's, LiteLLM's
    relevant_spans: RelevantSpans | None = None
    priority: StrictInt | None = None
    use_activation: StrictBool | None = None


Texts = StrictStr | list[StrictStr]


class Score(_Strict):
    """vLLM's /score: text_1 against text_2 (or its other spellings of the two sides)."""

    text_1: Texts | None = None
    text_2: Texts | None = None
    queries: Texts | None = None
    documents: Texts | None = None
    items: Texts | None = None
    data_1: Texts | None = None
    data_2: Texts | None = None
    model: StrictStr | None = None
    truncate_prompt_tokens: StrictInt | None = None
    use_activation: StrictBool | None = None
    priority: StrictInt | None = None
    user: StrictStr | None = None


UNSUPPORTED: dict[str, str] = {
    "texts": "TEI's rerank form is not served: send the texts as 'documents'",
    "return_text": "TEI's rerank form is not served: use return_documents",
    "mm_processor_kwargs": "the rerankers served here read text only",
    "softmax": "use use_activation",
    "activation": "use use_activation",
}

# Cohere v1's fields that Jina's request does not have: a body holding one speaks Cohere v1
COHERE_V1_ONLY = ("rank_fields", "max_chunks_per_doc")


def speaks_cohere_v1(body: dict[str, Any], headers: Any = None) -> bool:
    """Whether a /v1/rerank body is Cohere's v1 request rather than Jina's: one of Cohere's own
    fields, a document object with more than its text (Cohere keeps them all), or Cohere's
    SDK (its X-Fern-SDK-Name header)."""
    if any(k in body for k in COHERE_V1_ONLY):
        return True
    docs = body.get("documents")
    if isinstance(docs, list) and any(isinstance(d, dict) and set(d) - {"text"} for d in docs):
        return True
    sdk = headers.get("X-Fern-SDK-Name", "") if headers is not None else ""
    return sdk.lower().startswith("cohere")


def document_text(doc: Any, i: int, rank_fields: list[str] | None = None) -> str:
    """What is ranked of a document: a string as it is; an object's ``text``, or with
    ``rank_fields`` those fields in that order, one ``key: value`` line each (Cohere v1)."""
    if isinstance(doc, str):
        return doc
    if rank_fields:
        lines = [f"{k}: {_field(doc[k], i, k)}" for k in rank_fields if k in doc]
        if not lines:
            raise BadRequest(f"documents[{i}]: has none of rank_fields "
                             f"({', '.join(rank_fields)})", param="documents")
        return "\n".join(lines)
    text = doc.get("text")
    if not isinstance(text, str):
        raise BadRequest(f"documents[{i}]: a document object needs a string 'text'",
                         param="documents")
    return text


def _field(value: Any, i: int, key: str) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"documents[{i}].{key}: a ranked field must be a string",
                         param="documents")
    return value


def top_n(value: int | None, n: int) -> int | None:
    """How many results to return (None: all); a negative count is a 400."""
    if value is None or value == 0:
        return None
    if value < 0:
        raise BadRequest(f"top_n must be positive, not {value}", param="top_n")
    return min(value, n)


def pair_limit(value: int | None) -> tuple[str, int | None]:
    """vLLM's truncate_prompt_tokens: None (a pair that does not fit is a 400), -1 (fit the
    context) or k (at most k tokens): the overflow policy and the pair bound."""
    if value is None:
        return "error", None
    if value == -1:
        return "truncate", None
    if value < 1:
        raise BadRequest("truncate_prompt_tokens must be -1 or at least 1",
                         param="truncate_prompt_tokens")
    return "truncate", value


def score_pairs(req: Score) -> tuple[list[tuple[str, str]], str, str, bool]:
    """The (first, second) pairs of a /score body, the two sides' wire names, and whether the
    first side is a list (pairwise) rather than one text against many."""
    sides = [("text_1", "text_2"), ("queries", "documents"), ("queries", "items"),
             ("data_1", "data_2")]
    for a, b in sides:
        one, two = getattr(req, a), getattr(req, b)
        if one is not None and two is not None:
            break
    else:
        raise BadRequest("give text_1 and text_2 (the texts to score against each other)",
                         param="text_1")
    ones = [one] if isinstance(one, str) else list(one)
    twos = [two] if isinstance(two, str) else list(two)
    if len(ones) == 1:
        return [(ones[0], t) for t in twos], a, b, False
    if len(ones) != len(twos):
        raise BadRequest(f"{a} has {len(ones)} texts and {b} {len(twos)}: give one {a}, or as "
                         f"many as {b}", param=a)
    return list(zip(ones, twos, strict=True)), a, b, True


# ---- answers ---------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def results(order: list[int], scores: list[float], docs: list[Any] | None,
            wrap: bool) -> list[dict[str, Any]]:
    """Ranked results: index and relevance_score, and each document when asked (``wrap``: a
    string document as ``{"text": ...}``, as Jina and Cohere answer it)."""
    out = []
    for i in order:
        item: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if docs is not None:
            doc = docs[i]
            item["document"] = {"text": doc} if wrap and isinstance(doc, str) else doc
        out.append(item)
    return out


def jina_answer(model: str, ranked: list[dict[str, Any]], tokens: int) -> dict[str, Any]:
    """llama-server's fields (object, usage with prompt_tokens) and Jina's, with an id that
    Cohere's SDK reads when it sent a body that could be either."""
    return {"id": new_id("rerank"), "object": "list", "model": model, "results": ranked,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def cohere_answer(version: str, ranked: list[dict[str, Any]], tokens: int,
                  model: str) -> dict[str, Any]:
    return {"id": new_id("rerank"), "results": ranked, "model": model,
            "meta": {"api_version": {"version": version}, "billed_units": {"search_units": 1},
                     "tokens": {"input_tokens": tokens, "output_tokens": 0}}}


def cohere_error(message: str) -> dict[str, Any]:
    """Cohere's error body (its SDKs read ``message``)."""
    return {"message": message}


def score_answer(model: str, scores: list[float], tokens: int) -> dict[str, Any]:
    return {
        "id": new_id("score"), "object": "list", "created": int(time.time()), "model": model,
        "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    }
