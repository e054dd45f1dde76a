"""The embedding interface: a capability beside the generation engine, not a wider engine.

An embedder turns inputs (texts or token lists) into one pooled vector each. It runs in a
context of its own, on a thread of its own, so an embedding request never waits behind a
generation, and it batches inputs across requests. Its answers are raw pooled vectors: cutting
to a requested size and normalizing is the core's (app.core.embed), the wire formats the APIs'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Literal, Protocol

import numpy as np

from app.base.errors import BadRequest, ServiceError
from app.base.threads import Mailbox

Pooling = Literal["mean", "cls", "last", "none", "rank"]
POOLING_IDS: dict[int, Pooling] = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


@dataclass(frozen=True)
class EmbedRequest:
    """Inputs to embed together. ``truncate``: an input longer than the context keeps its
    first tokens (else that input fails with ContextOverflow). ``rank``: the inputs are
    reranking pairs already built as tokens (app.core.rerank), whose outputs are a reranker's
    scores; an embedding request to a reranker, and a rank request to an embedder, are
    refused."""

    inputs: tuple[str | tuple[int, ...], ...]
    _: KW_ONLY  # options by name: a field added among them cannot shift callers' arguments
    truncate: bool = False
    rank: bool = False
    timeout: float | None = None  # seconds from submission; past it the request fails
    # whether the caller has gone (a socket peek): asked by the embedder's thread at every
    # decode, so a hung-up batch stops at the next one; quick and safe from any thread
    gone: Callable[[], bool] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Embedding:
    vector: np.ndarray  # float32, pooled, not normalized (a reranker's: its n_out outputs)
    tokens: int  # the input's tokens (after truncation)
    truncated: bool = False


Outcome = Embedding | ServiceError  # one per input: an input's failure stays its own

VECTOR_POOLING = ("mean", "cls", "last")  # the poolings that give one vector per input


def refusal(pooling: str, rank: bool) -> BadRequest | None:
    """Why this pooling cannot serve a request of this kind (None: it can): embeddings need
    one vector per input, reranking needs a classification head (pooling rank)."""
    if rank and pooling != "rank":
        return BadRequest(
            f"this model does not rerank: its pooling type is {pooling!r}, and reranking needs "
            "a reranker GGUF (pooling type rank: a cross-encoder with a classification head, "
            "or a decoder reranker such as Qwen3-Reranker)", code="model_not_supported")
    if not rank and pooling not in VECTOR_POOLING:
        if pooling == "rank":
            return BadRequest(
                "this model is a reranker (pooling type rank): it scores (query, document) "
                "pairs, not texts; use /v1/rerank (or /v2/rerank, /score)",
                code="pooling_not_supported")
        return BadRequest(
            f"this model's pooling type is {pooling!r}, which gives one vector per token, not "
            "one embedding per input; start the server with EMBEDDING_POOLING=mean, cls or "
            "last", code="pooling_not_supported")
    return None


@dataclass(frozen=True)
class RankInfo:
    """A reranker (pooling ``rank``): how a (query, document) pair becomes one input, as
    llama-server builds it, and what its outputs are. With a rerank ``template`` (GGUF key
    tokenizer.chat_template.rerank: decoder rerankers such as Qwen3-Reranker) the pair is the
    template with ``{query}`` and ``{document}`` filled in; without one (cross-encoders) it is
    ``prefix + query + middle + document + suffix`` (BOS, EOS and SEP as the vocabulary adds
    them)."""

    template: str | None
    prefix: tuple[int, ...]
    middle: tuple[int, ...]
    suffix: tuple[int, ...]
    n_out: int  # classifier outputs per input (llama_model_n_cls_out)
    labels: tuple[str, ...] = ()  # their names, when the GGUF has them (Qwen3: yes, no)
    # the graph already turns the outputs into probabilities (llama.cpp's softmax for Qwen3
    # rerankers): the first output is the score as it is
    normalized: bool = False


@dataclass(frozen=True)
class EmbedInfo:
    n_embd: int
    pooling: Pooling
    n_ctx: int  # most tokens of one input
    only: bool  # the model embeds only: no generation context
    rank: RankInfo | None = None  # a reranker: pairs in, scores out (pooling rank)
    max_bytes: int = 0  # an input text longer than this in bytes cannot fit n_ctx (0: unknown)


class EmbedHandle:
    """One submitted request, seen from the request's greenlet."""

    # seconds between the caller's own checks for a hang-up while it waits: the embedder here
    # asks the request's ``gone`` at every decode, so the caller's check is only a backstop
    gone_poll: float = 0.5

    def __init__(self, channel: Mailbox, cancel: list[bool]):
        self._channel = channel
        self._cancel = cancel

    def result(self, timeout: float | None = None) -> list[Outcome]:
        """Every input's outcome, in order; raises the request's error (queue full, shut
        down, timed out) or TimeoutError."""
        out = self._channel.get(timeout)
        if isinstance(out, ServiceError):
            raise out
        return out

    def cancel(self) -> None:
        """The client went away: inputs not yet decoded are skipped."""
        self._cancel[0] = True


class Embedder(Protocol):
    @property
    def info(self) -> EmbedInfo: ...

    def submit(self, request: EmbedRequest, mailbox: Mailbox | None = None) -> EmbedHandle:
        """Queue a request; raises QueueFull or ShuttingDown at once. ``mailbox``: where its
        answer goes (None: a channel the calling greenlet reads)."""
        ...

    def stats(self) -> dict[str, object]:
        """For health and tests: requests waiting, decodes run, inputs per decode."""
        ...
