"""The stand-in for llama.cpp under the scheduler (app.engine.scheduler), the one its unit tests
use: a 32-token vocabulary, a decode that computes a fixed logits row at each position it is
asked for, a greedy sampler that ends after a set number of tokens, and a memory that keeps each
sequence's KV cells (position, token). ``step`` checks after every step that each slot's KV
mirror (``KvSeq.tokens``) is exactly what its cells hold, so a broken invariant fails here, in a
fast test. For tests of what the scheduler decides: which positions it decodes together, which
slot a prompt takes, what it sends, what its KV keeps."""

from __future__ import annotations

import ctypes
from dataclasses import replace
from typing import Any

import numpy as np

from app.engine.llama_media import ImageSpan
from app.engine.scheduler import Features, Scheduler
from app.engine.slots import Job, Slot
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


class LlamaBatch:
    """llama_batch as the scheduler fills it."""

    def __init__(self, size: int):
        self.token = [0] * size
        self.pos = [0] * size
        self.n_seq_id = [0] * size
        self.seq_id = [[0] for _ in range(size)]
        self.logits = [False] * size
        self.n_tokens = 0


class Llama:
    """llama.cpp as the scheduler calls it: decode computes a row at each flagged index and puts
    each row's token in its sequence's cells; the memory calls remove and copy cells."""

    def __init__(self, batch: LlamaBatch):
        self.b = batch
        self.rows: dict[int, np.ndarray] = {}
        self.flagged: list[list[tuple[int, int]]] = []  # per decode: (seq, pos) with logits
        self.decodes: list[list[tuple[int, int]]] = []  # per decode: every row's (seq, pos)
        self.copies: list[tuple[int, int]] = []  # llama_memory_seq_cp: (from seq, to seq)
        self.cells: dict[int, list[tuple[int, int]]] = {}  # seq -> its cells (pos, token)
        self.fail_next = False  # the next decode fails (as a full KV cache does)
        self.saves: list[int] = []  # llama_state_seq_get_data: the sequences copied out ...
        self.restores: list[int] = []  # ... and llama_state_seq_set_data: copied back into

    def llama_decode(self, ctx: Any, batch: LlamaBatch) -> int:
        if self.fail_next:
            self.fail_next = False
            return 1
        self.rows = {i: row_at(batch.token[i], batch.pos[i]) for i in range(batch.n_tokens)
                     if batch.logits[i]}
        self.flagged.append([(batch.seq_id[i][0], batch.pos[i]) for i in self.rows])
        self.decodes.append([(batch.seq_id[i][0], batch.pos[i]) for i in range(batch.n_tokens)])
        for i in range(batch.n_tokens):
            self.cells.setdefault(batch.seq_id[i][0], []).append((batch.pos[i], batch.token[i]))
        return 0

    def llama_get_logits_ith(self, ctx: Any, i: int) -> Any:
        return self.rows[i].ctypes.data_as(ctypes.POINTER(ctypes.c_float))

    def llama_vocab_is_eog(self, vocab: Any, tok: int) -> bool:
        return tok == EOG

    def llama_memory_seq_rm(self, mem: Any, seq: int, p0: int, p1: int) -> bool:
        lo, hi = max(p0, 0), (p1 if p1 >= 0 else 1 << 62)
        self.cells[seq] = [(p, t) for p, t in self.cells.get(seq, []) if not lo <= p < hi]
        return True

    def llama_memory_seq_cp(self, mem: Any, src: int, dst: int, p0: int, p1: int) -> None:
        self.copies.append((src, dst))  # one stream per sequence: the whole stream is copied
        self.cells[dst] = list(self.cells.get(src, []))

    # llama_state_seq_*: a sequence's cells as a blob (int32 pairs: position, token), with a
    # 4-byte tag in front; a blob without it is refused, and the sequence cleared, as llama.cpp
    # does with one it cannot read
    TAG = b"KV01"

    def llama_state_seq_get_size(self, ctx: Any, seq: int) -> int:
        return len(self.TAG) + 8 * len(self.cells.get(seq, []))

    def llama_state_seq_get_data(self, ctx: Any, dst: Any, size: int, seq: int) -> int:
        data = self.TAG + np.asarray(self.cells.get(seq, []), dtype=np.int32).tobytes()
        if len(data) > size:
            return 0
        ctypes.memmove(dst, data, len(data))
        self.saves.append(seq)
        return len(data)

    def llama_state_seq_set_data(self, ctx: Any, src: Any, size: int, seq: int) -> int:
        data = bytes(src)[:size]
        self.restores.append(seq)
        if not data.startswith(self.TAG) or (size - len(self.TAG)) % 8:
            self.cells[seq] = []
            return 0
        pairs = np.frombuffer(data[len(self.TAG):], dtype=np.int32).reshape(-1, 2)
        self.cells[seq] = [(int(p), int(t)) for p, t in pairs]
        return size

    def llama_memory_seq_pos_min(self, mem: Any, seq: int) -> int:
        return min((p for p, _ in self.cells.get(seq, [])), default=-1)

    def llama_memory_seq_pos_max(self, mem: Any, seq: int) -> int:
        return max((p for p, _ in self.cells.get(seq, [])), default=-1)

    def held(self, seq: int) -> list[int]:
        """The tokens sequence ``seq``'s cells hold, in order."""
        return [t for _, t in self.cells.get(seq, [])]

    def check(self, sched: Scheduler) -> None:
        """Every slot's mirror is exactly what its cells hold, no draft left unsettled."""
        for slot in sched.slots:
            assert list(slot.kv.tokens) == self.held(slot.seq_id), f"seq {slot.seq_id}"
            assert slot.kv.drafted == 0, f"seq {slot.seq_id}: a draft left in its cells"

    def hold(self, slot: Slot, tokens: list[int]) -> None:
        """Put ``tokens`` in an idle slot's KV as a finished request would have left them."""
        for k, tok in enumerate(tokens):
            self.cells.setdefault(slot.seq_id, []).append((slot.kv.n_pos + k, tok))
        slot.kv.decoded(tokens)


class Projector:
    """libmtmd as the scheduler calls it: an image's cells, its placeholder at each, in 2-D
    (M-RoPE) when the span takes fewer positions than tokens."""

    def __init__(self, ll: Llama):
        self.ll = ll
        self.decoded: list[tuple[int, int, int]] = []  # (seq, image start, n_past)

    def decode(self, ctx: Any, span: ImageSpan, n_past: int, seq_id: int, n_batch: int) -> int:
        self.decoded.append((seq_id, span.start, n_past))
        for k in range(span.n):
            pos = n_past + min(k, span.n_pos - 1)
            self.ll.cells.setdefault(seq_id, []).append((pos, span.placeholder))
        return n_past + span.n_pos


class Tok:
    def piece(self, tok: int) -> bytes:
        return b"" if tok == EOG else Tables.piece(tok)

    def tokens(self, text: str, add_bos: bool = False) -> list[int]:
        return [ord(c) - ord("a") for c in text]


class Sampler:
    """Greedy over the row, then the end once ``stop_after`` tokens were sampled."""

    def __init__(self, ll: Llama, stop_after: int):
        self.ll, self.left, self.calls = ll, stop_after, 0
        self.injected: list[list[int]] = []

    def sample(self, ctx: Any, i: int) -> int:
        self.calls += 1
        self.left -= 1
        return EOG if self.left < 0 else int(self.ll.rows[i].argmax())

    def accept_injected(self, tokens: list[int]) -> None:
        self.injected.append(tokens)

    def observe(self, data: bytes) -> None:
        pass

    def free(self) -> None:
        pass


def scheduler(parallel: int = 2, chunk: int = 16, rows: int = 4, n_ctx: int = 256,
              features: Features | None = None,
              projector: bool = False) -> tuple[Scheduler, Llama]:
    """A scheduler over the stand-in (with its projector when asked); ``on_job_end`` marks a
    job done, as the engine does."""
    b = LlamaBatch(chunk + parallel + 64)
    ll = Llama(b)
    features = features or Features()
    if projector:
        features = replace(features, projector=Projector(ll))  # type: ignore[arg-type]
    sched = Scheduler(ll, ctx=None, mem=None, batch=b, vocab=None, tok=Tok(), tables=Tables,
                      n_ctx=n_ctx, n_batch=len(b.token), prefill_chunk=chunk,
                      parallel=parallel, on_job_end=ended, features=features)
    sched.score_rows = rows  # a small budget, so a short prompt takes several steps
    return sched, ll


def ended(job: Job) -> None:
    """A job's end, as the engine marks it (its sampler kept, for the tests to read)."""
    job.done = True


def job(tokens: list[int], ll: Llama, sink: list, max_new: int = 3, stop_after: int = 2,
        **params: Any) -> Job:
    req = GenerationRequest(tuple(tokens), SamplingParams(**params))
    return Job(req, sink=sink.append, tokens=list(tokens), max_new=max_new,
               assembler=TextAssembler(()), sampler=Sampler(ll, stop_after))  # type: ignore[arg-type]


def step(sched: Scheduler) -> None:
    """Admit, then one step, then the KV invariant checked."""
    sched.admit()
    if sched.busy():
        sched.step()
    sched.ll.check(sched)


def run(sched: Scheduler, limit: int = 50) -> None:
    for _ in range(limit):
        sched.admit()
        if not sched.busy():
            return
        step(sched)
    raise AssertionError("the scheduler did not finish")
