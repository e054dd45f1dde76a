"""A stand-in for llama.cpp under the batch scheduler (app.engine.llama_batch): a 32-token
vocabulary, a decode that computes a fixed logits row at each position it is asked for, and a
greedy sampler that ends after a set number of tokens. For tests of what the scheduler decides:
which positions it decodes together, which slot a prompt takes, what it sends."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from app.engine.llama_batch import Batch
from app.engine.slots import Job
from app.engine.text import TextAssembler
from app.engine.types import GenerationRequest, SamplingParams

N = 32  # the stand-in vocabulary: token t spells chr(ord("a") + t), 31 is end-of-generation
EOG = N - 1


class Tables:
    n = N

    @staticmethod
    def piece(tok: int) -> bytes:
        return b"<eog>" if tok == EOG else bytes([ord("a") + tok])


def row_at(token: int, pos: int) -> np.ndarray:
    """The stand-in model's logits after ``token`` at ``pos``: a fixed pattern of both."""
    row = np.sin(np.arange(N, dtype=np.float32) * (token + 1) + pos).astype(np.float32) * 3
    row[EOG] = -2.0
    return row


class Batch_:
    """llama_batch as the scheduler fills it."""

    def __init__(self, size: int):
        self.token = [0] * size
        self.pos = [0] * size
        self.n_seq_id = [0] * size
        self.seq_id = [[0] for _ in range(size)]
        self.logits = [False] * size
        self.n_tokens = 0


class Llama:
    """llama.cpp as the scheduler calls it: decode computes a row at each flagged index."""

    def __init__(self, batch: Batch_):
        self.b = batch
        self.rows: dict[int, np.ndarray] = {}
        self.flagged: list[list[tuple[int, int]]] = []  # per decode: (seq, pos) with logits
        self.copies: list[tuple[int, int]] = []  # llama_memory_seq_cp: (from seq, to seq)

    def llama_decode(self, ctx: Any, batch: Batch_) -> int:
        self.rows = {i: row_at(batch.token[i], batch.pos[i]) for i in range(batch.n_tokens)
                     if batch.logits[i]}
        self.flagged.append([(batch.seq_id[i][0], batch.pos[i]) for i in self.rows])
        return 0

    def llama_get_logits_ith(self, ctx: Any, i: int) -> Any:
        return self.rows[i].ctypes.data_as(ctypes.POINTER(ctypes.c_float))

    def llama_vocab_is_eog(self, vocab: Any, tok: int) -> bool:
        return tok == EOG

    def llama_memory_seq_rm(self, *args: Any) -> bool:
        return True

    def llama_memory_seq_cp(self, mem: Any, src: int, dst: int, p0: int, p1: int) -> None:
        self.copies.append((src, dst))


class Tok:
    def piece(self, tok: int) -> bytes:
        return b"" if tok == EOG else Tables.piece(tok)


class Sampler:
    """Greedy over the row, then the end once ``stop_after`` tokens were sampled."""

    def __init__(self, ll: Llama, stop_after: int):
        self.ll, self.left, self.calls = ll, stop_after, 0

    def sample(self, ctx: Any, i: int) -> int:
        self.calls += 1
        self.left -= 1
        return EOG if self.left < 0 else int(self.ll.rows[i].argmax())

    def observe(self, data: bytes) -> None:
        pass

    def free(self) -> None:
        pass


def scheduler(parallel: int = 2, chunk: int = 16, rows: int = 4) -> tuple[Batch, Llama]:
    b = Batch_(chunk + parallel)
    ll = Llama(b)
    sched = Batch(ll, ctx=None, mem=None, batch=b, vocab=None, tok=Tok(), n_ctx=256,
                  prefill_chunk=chunk, parallel=parallel, over=lambda job: None, tables=Tables)
    sched.score_rows = rows  # a small budget, so a short prompt takes several steps
    return sched, ll


def job(tokens: list[int], ll: Llama, sink: list, max_new: int = 3, stop_after: int = 2,
        **params: Any) -> Job:
    req = GenerationRequest(tuple(tokens), SamplingParams(**params))
    return Job(req, sink=sink.append, tokens=list(tokens), max_new=max_new,
               assembler=TextAssembler(()), sampler=Sampler(ll, stop_after))  # type: ignore[arg-type]


def run(sched: Batch, limit: int = 50) -> None:
    for _ in range(limit):
        sched.admit()
        if not sched.busy():
            return
        sched.decode_step()
    raise AssertionError("the scheduler did not finish")
