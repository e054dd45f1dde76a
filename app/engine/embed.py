"""The embedding interface: a capability beside the generation engine, not a wider engine.

An embedder turns inputs (texts or token lists) into one pooled vector each. It runs in a
context of its own, on a thread of its own, so an embedding request never waits behind a
generation, and it batches inputs across requests. Its answers are raw pooled vectors: cutting
to a requested size and normalizing is the core's (app.core.embed), the wire formats the APIs'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from app.base.bridge import Channel
from app.base.errors import ServiceError

Pooling = Literal["mean", "cls", "last", "none", "rank"]
POOLING_IDS: dict[int, Pooling] = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


@dataclass(frozen=True)
class EmbedRequest:
    """Inputs to embed together. ``truncate``: an input longer than the context keeps its
    first tokens (else that input fails with ContextOverflow)."""

    inputs: tuple[str | tuple[int, ...], ...]
    truncate: bool = False
    timeout: float | None = None  # seconds from submission; past it the request fails
    # whether the caller has gone (a socket peek): asked by the embedder's thread at every
    # decode, so a hung-up batch stops at the next one; quick and safe from any thread
    gone: Callable[[], bool] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Embedding:
    vector: np.ndarray  # float32, pooled, not normalized
    tokens: int  # the input's tokens (after truncation)
    truncated: bool = False


Outcome = Embedding | ServiceError  # one per input: an input's failure stays its own


@dataclass(frozen=True)
class EmbedInfo:
    n_embd: int
    pooling: Pooling
    n_ctx: int  # most tokens of one input
    only: bool  # the model embeds only: no generation context


class EmbedHandle:
    """One submitted request, seen from the request's greenlet."""

    def __init__(self, channel: Channel, cancel: list[bool]):
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

    def submit(self, request: EmbedRequest) -> EmbedHandle:
        """Queue a request; raises QueueFull or ShuttingDown at once."""
        ...

    def stats(self) -> dict[str, object]:
        """For health and tests: requests waiting, decodes run, inputs per decode."""
        ...
