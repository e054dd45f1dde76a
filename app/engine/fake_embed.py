"""A scripted embedder for fast protocol tests: the real one's interface and threading.

A text's vector is a fixed function of its words (so equal texts embed equally and the tests
can check values), one token per word; an input containing ``FAIL_EMBED`` fails on its own.
With pooling ``rank`` it is a reranker: each input is a pair's tokens, and its one output is
``fake_rank_logit`` of them.
Requests are answered on a native thread through the same channel as the real embedder's.
"""

from __future__ import annotations

import zlib

import numpy as np

from app.base.errors import BadRequest, ContextOverflow, EngineFailure, QueueFull
from app.base.threads import Mailbox, original_sleep, start_native_thread
from app.engine.embed import (
    Embedding,
    EmbedHandle,
    EmbedInfo,
    EmbedRequest,
    Outcome,
    RankInfo,
    refusal,
)
from app.engine.handle import new_channel

# a fake reranker's framing: BOS query SEP document SEP, as a BERT-style cross-encoder's
FAKE_RANK = RankInfo(template=None, prefix=(1,), middle=(2,), suffix=(2,), n_out=1)


def fake_vector(text: str, n_embd: int) -> np.ndarray:
    """The fake embedder's raw (unnormalized) vector for a text."""
    seed = zlib.crc32(text.encode("utf-8", "surrogatepass"))
    return np.random.default_rng(seed).standard_normal(n_embd).astype(np.float32) * 3


def fake_rank_logit(tokens: tuple[int, ...]) -> float:
    """The fake reranker's raw output for a pair's tokens (its score before any activation)."""
    seed = zlib.crc32(np.asarray(tokens, dtype=np.int64).tobytes())
    return float(np.float32(np.random.default_rng(seed).standard_normal() * 4))


class FakeEmbedder:
    def __init__(self, n_embd: int = 16, n_ctx: int = 32, pooling: str = "mean",
                 only: bool = False, capacity: int = 64, rank: RankInfo | None = None):
        if pooling == "rank" and rank is None:
            rank = FAKE_RANK
        self._info = EmbedInfo(n_embd=n_embd, pooling=pooling, n_ctx=n_ctx,  # type: ignore[arg-type]
                               only=only, rank=rank, max_bytes=n_ctx * 8)
        self.hold = False  # requests wait (unanswered) until this is False again
        self.capacity = capacity
        self.requests: list[EmbedRequest] = []
        self.running = 0
        self.handles: list[tuple[EmbedRequest, list[bool]]] = []

    @property
    def info(self) -> EmbedInfo:
        return self._info

    def stats(self) -> dict[str, object]:
        return {"waiting": 0, "decodes": len(self.requests), "batch_widths": {}}

    def submit(self, request: EmbedRequest, mailbox: Mailbox | None = None) -> EmbedHandle:
        refused = refusal(self._info.pooling, request.rank)
        if refused is not None:
            raise refused
        if self.running >= self.capacity:
            raise QueueFull("server is busy")
        self.requests.append(request)
        channel = mailbox or new_channel()
        cancel = [False]
        self.handles.append((request, cancel))
        self.running += 1

        def run() -> None:
            try:
                for _ in range(3000):  # bounded: at most 30 s held
                    if not self.hold or cancel[0]:
                        break
                    original_sleep(0.01)
                if request.rank:
                    channel.put([self._rank(x) for x in request.inputs])
                    return
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

    def _rank(self, item: str | tuple[int, ...]) -> Outcome:
        if not isinstance(item, tuple) or len(item) > self._info.n_ctx:
            return ContextOverflow(f"a pair of {len(item)} tokens, at most {self._info.n_ctx}",
                                   param="documents")
        return Embedding(np.array([fake_rank_logit(item)], dtype=np.float32), len(item))
