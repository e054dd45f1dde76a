"""Embeddings through the core: inputs in, finished vectors out, in no API's vocabulary.

The embedder (app.engine.embed) returns raw pooled vectors; here they are cut to the
requested size and normalized, so every API (OpenAI's /v1/embeddings, Vertex embedding
instances) answers the same numbers for the same text.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.base import bridge
from app.base.errors import BadRequest, ClientGone, GenerationTimeout, NotSupported, ServiceError
from app.core.service import Service
from app.engine.embed import Embedder, Embedding, EmbedHandle, EmbedRequest


@dataclass(frozen=True)
class EmbedInput:
    inputs: tuple[str | tuple[int, ...], ...]
    model: str | None = None  # as the request named it
    dimensions: int | None = None  # keep the first this many values (Matryoshka)
    truncate: bool = False  # an over-long input keeps its first tokens (else it fails)


@dataclass(frozen=True)
class Vector:
    values: np.ndarray  # float32: cut to the dimensions asked, normalized if configured
    tokens: int
    truncated: bool


@dataclass(frozen=True)
class EmbedResult:
    model: str
    items: list[Vector | ServiceError]  # per input, in order

    @property
    def tokens(self) -> int:
        return sum(v.tokens for v in self.items if isinstance(v, Vector))

    def first_error(self) -> ServiceError | None:
        return next((v for v in self.items if isinstance(v, ServiceError)), None)


@contextlib.contextmanager
def holding(engine: Any) -> Iterator[None]:
    """The model kept loaded while the block runs (woken first, off the hub, when an engine
    that sleeps when idle is asleep)."""
    hold = getattr(engine, "acquire_model", None)
    if hold is not None and not hold(wait=False):
        try:
            bridge.offload(engine.wait_awake)
        except BaseException:
            engine.release_model()
            raise
    try:
        yield
    finally:
        if hold is not None:
            engine.release_model()


class Embeddings:
    """Runs embedding inputs on the engine's embedder."""

    def __init__(self, service: Service, normalize: bool, max_inputs: int,
                 timeout: float | None):
        self.service = service
        self.normalize = normalize
        self.max_inputs = max_inputs
        self.timeout = timeout

    def embedder(self) -> Embedder:
        """The embedder; 503 while loading, 501 when embeddings are off."""
        self.service.info()
        emb = getattr(self.service.engine, "embedder", None)
        if emb is None:
            raise NotSupported(
                "this server does not serve embeddings: start it with EMBEDDINGS=on (a "
                "generative model) or serve an embedding model"
            )
        return emb

    def check(self, inp: EmbedInput) -> tuple[str, Embedder]:
        """The model name to answer with, and the embedder; every request-wide error."""
        model = self.service.model_name(inp.model)
        emb = self.embedder()
        if not inp.inputs:
            raise BadRequest("input is empty: give at least one text", param="input")
        if len(inp.inputs) > self.max_inputs:
            raise BadRequest(
                f"{len(inp.inputs)} inputs in one request; at most {self.max_inputs} are "
                "accepted (EMBEDDING_MAX_INPUTS)",
                param="input",
            )
        n_embd = emb.info.n_embd
        if inp.dimensions is not None and not 1 <= inp.dimensions <= n_embd:
            raise BadRequest(
                f"dimensions must be between 1 and {n_embd} (this model's embedding size), "
                f"not {inp.dimensions}",
                param="dimensions",
            )
        return model, emb

    def run(self, inp: EmbedInput, gone: Callable[[], bool] | None = None,
            api: str = "embeddings") -> EmbedResult:
        """Every input's vector or error; request-wide errors (bad dimensions, queue full,
        model loading, the client gone) are raised. ``api``: the metrics' label."""
        with holding(self.service.engine):
            model, emb = self.check(inp)
            # the embedder asks ``gone`` itself at every decode: a hang-up stops the batch at
            # the next one, not at this greenlet's next poll
            handle = emb.submit(EmbedRequest(inp.inputs, truncate=inp.truncate, timeout=self.timeout,
                                             gone=gone))
            outcomes = self.wait(handle, gone, api)
        result = EmbedResult(model, [self._finish(o, inp.dimensions) for o in outcomes])
        m = self.service.metrics.api(api)
        m.prompt_tokens.inc(result.tokens)
        if any(isinstance(o, GenerationTimeout) for o in outcomes):
            m.timeouts.inc()
        return result

    def wait(self, handle: EmbedHandle, gone: Callable[[], bool] | None,
             api: str = "embeddings") -> list:
        """The outcomes; polls ``gone`` while waiting (then the rest is skipped)."""
        limit = (self.timeout or 3600.0) + 60.0  # the engine answers by its own deadline
        deadline = time.monotonic() + limit
        try:
            while True:
                try:
                    return handle.result(handle.gone_poll if gone else limit)
                except ClientGone:  # the embedder saw it first
                    self.service.metrics.api(api).gone()
                    raise
                except GenerationTimeout:  # the whole request ran past its deadline
                    self.service.metrics.api(api).timeouts.inc()
                    raise
                except TimeoutError:
                    if gone is not None and gone():
                        self.service.metrics.api(api).gone()
                        raise ClientGone("the client went away") from None
                    if time.monotonic() > deadline:
                        raise
        except BaseException:
            handle.cancel()
            raise

    def _finish(self, outcome: Embedding | ServiceError, dims: int | None) -> Vector | ServiceError:
        if isinstance(outcome, ServiceError):
            return outcome
        vec = outcome.vector[:dims] if dims else outcome.vector
        if self.normalize:
            norm = float(np.linalg.norm(vec))
            vec = vec / norm if norm > 0 else vec
        return Vector(vec.astype(np.float32, copy=False), outcome.tokens, outcome.truncated)
