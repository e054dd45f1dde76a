"""A scripted embedder for fast protocol tests: the real one's interface and threading.

A text's vector is a fixed function of its words (so equal texts embed equally and the tests
can check values), one token per word; an input containing ``FAIL_EMBED`` fails on its own.
Requests are answered on a native thread through the same channel as the real embedder's.
"""

from __future__ import annotations

import zlib

import numpy as np

from app.base.bridge import Channel, start_native_thread
from app.base.errors import BadRequest, ContextOverflow, EngineFailure, QueueFull
from app.engine.embed import Embedding, EmbedHandle, EmbedInfo, EmbedRequest, Outcome


def fake_vector(text: str, n_embd: int) -> np.ndarray:
    """The fake embedder's raw (unnormalized) vector for a text."""
    seed = zlib.crc32(text.encode("utf-8", "surrogatepass"))
    return np.random.default_rng(seed).standard_normal(n_embd).astype(np.float32) * 3


class FakeEmbedder:
    def __init__(self, n_embd: int = 16, n_ctx: int = 32, pooling: str = "mean",
                 only: bool = False, capacity: int = 64):
        self._info = EmbedInfo(n_embd=n_embd, pooling=pooling, n_ctx=n_ctx,  # type: ignore[arg-type]
                               only=only)
        self.capacity = capacity
        self.requests: list[EmbedRequest] = []
        self.running = 0
        self.handles: list[tuple[EmbedRequest, list[bool]]] = []

    @property
    def info(self) -> EmbedInfo:
        return self._info

    def stats(self) -> dict[str, object]:
        return {"waiting": 0, "decodes": len(self.requests), "batch_widths": {}}

    def submit(self, request: EmbedRequest) -> EmbedHandle:
        if self._info.pooling not in ("mean", "cls", "last"):
            raise BadRequest(f"pooling {self._info.pooling!r} gives no embedding per input",
                             code="pooling_not_supported")
        if self.running >= self.capacity:
            raise QueueFull("server is busy")
        self.requests.append(request)
        channel = Channel()
        cancel = [False]
        self.handles.append((request, cancel))
        self.running += 1

        def run() -> None:
            try:
                channel.put([self._one(x, request.truncate) for x in request.inputs])
            finally:
                self.running -= 1

        start_native_thread(run)
        return EmbedHandle(channel, cancel)

    def _one(self, item: str | tuple[int, ...], truncate: bool) -> Outcome:
        words = item.split() if isinstance(item, str) else [str(t) for t in item]
        if "FAIL_EMBED" in words:
            return EngineFailure("scripted embedding failure")
        if not words:
            return BadRequest("input is empty", param="input")
        cut = len(words) > self._info.n_ctx
        if cut and not truncate:
            return ContextOverflow(f"input has {len(words)} tokens, at most {self._info.n_ctx}",
                                   param="input")
        words = words[: self._info.n_ctx]
        return Embedding(fake_vector(" ".join(words), self._info.n_embd), len(words), cut)
