"""Speculative decoding: where the drafts come from (DRAFT_MODEL, SPEC_NGRAM), and how a
sequence's drafted tokens are checked against the target model.

The check is llama-server's rule, exact for any sampler: the sequence's last token and its
draft go into the step's one batch with logits at every position; the sequence's own sampler
(grammar, penalties, seed) samples at each position in turn, and a drafted token is kept only
while the target's own sample equals it. Every token sent is the target's sample, given the same
tokens before it as without speculation, so the output is what it would have been (at
temperature 0 the same bytes). The KV cells of the rejected tail are removed from the target
here and from the draft model's context at its next sync.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from app.base.errors import ModelLoadError
from app.engine.llama_embed import open_context
from app.engine.tokens import common_prefix, put

if TYPE_CHECKING:
    from app.engine.mtp import MtpDrafter
    from app.engine.slots import Slot

log = logging.getLogger(__name__)

# n-gram drafting: the longest suffix of the sequence (of these lengths, longest first) found
# earlier in it proposes what followed it there
NGRAM_SIZES = (4, 3, 2)


@dataclass(frozen=True)
class SpecConfig:
    """The server's speculation settings (SPEC_*), which a request may narrow."""

    draft_max: int  # most tokens drafted per sequence per step
    draft_min: int  # a shorter draft is not checked (not worth the batch room)
    p_min: float  # the draft model stops drafting below this confidence in its next token
    ngram: bool  # draft from the sequence itself when there is no draft model
    adaptive: bool = True  # SPEC_ADAPTIVE: draft only where it measured faster (SpecGate)
    # the server drafts on its own (SPEC_NGRAM or DRAFT_MODEL); without, only a request's
    # prediction (Predicted Outputs) is drafted from
    server: bool = True


def ngram_draft(history: list[int], n_max: int) -> list[int]:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the longest
    suffix of ``history`` (4, 3 or 2 tokens), at most ``n_max`` of them; [] when none."""
    n = len(history)
    if n < 3 or n_max <= 0:
        return []
    arr = np.asarray(history, dtype=np.int32)
    for size in NGRAM_SIZES:
        if n <= size:
            continue
        suffix = arr[n - size:]
        # candidate starts: the suffix's first token, where a whole match ends before the end
        starts = np.flatnonzero(arr[: n - size] == suffix[0])
        for s in starts[::-1]:  # the latest occurrence first: closest to what is being copied
            if np.array_equal(arr[s:s + size], suffix):
                follow = arr[s + size: s + size + n_max]
                if len(follow):
                    return follow.tolist()
    return []


class DraftModel:
    """DRAFT_MODEL: a second, smaller model with the target's vocabulary, with one sequence per
    slot in a context of its own. ``draft`` brings each asking sequence's KV up to the
    target's tokens (reusing the common prefix), then drafts greedily for all of them at once:
    one decode per drafted position, every sequence in the same batch."""

    def __init__(self, ll, path: str, target_vocab, n_ctx: int, n_seq: int, n_batch: int,
                 gpu_layers: int, threads: int, flash_attn: int):
        self.ll = ll
        mparams = ll.llama_model_default_params()
        mparams.n_gpu_layers = gpu_layers
        self.model = ll.llama_model_load_from_file(path.encode(), mparams)
        if not self.model:
            raise ModelLoadError(f"DRAFT_MODEL {path}: llama.cpp could not load it")
        self.vocab = ll.llama_model_get_vocab(self.model)
        try:
            check_same_vocab(ll, target_vocab, self.vocab, path)
            self.ctx, self.mem = open_context(
                ll, self.model, f"DRAFT_MODEL {path}: a context", "lower CTX_SIZE or PARALLEL",
                n_ctx=n_ctx * n_seq, n_batch=n_batch, n_ubatch=min(n_batch, 512),
                n_seq_max=n_seq, n_threads=threads, n_threads_batch=threads,
                flash_attn_type=flash_attn, kv_unified=False)
        except BaseException:
            ll.llama_model_free(self.model)
            raise
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.batch = ll.llama_batch_init(n_batch, 0, 1)
        self.cached: dict[int, list[int]] = {i: [] for i in range(n_seq)}  # tokens in its KV
        self.path = path

    def draft(self, asks: list[tuple[int, list[int], int, float]]) -> dict[int, list[int]]:
        """``asks``: (seq id, the target's tokens, most to draft, least confidence). Returns
        each sequence's draft, stopped where the draft model's confidence in its next token
        (the softmax top probability) falls below the sequence's minimum, or at an
        end-of-generation token."""
        ll = self.ll
        # 1. sync: each sequence's KV holds its target tokens but the last, then the last is
        # decoded with logits (what the first draft token is sampled from)
        pending: dict[int, list[int]] = {}
        for seq, tokens, _, _ in asks:
            have = self.cached[seq]
            keep = min(common_prefix(have, np.asarray(tokens, dtype=np.int32)), len(tokens) - 1)
            if keep < len(have):
                ll.llama_memory_seq_rm(self.mem, seq, keep, -1)
                del have[keep:]
            pending[seq] = tokens[keep:]
        at: dict[int, int] = {}  # seq -> its batch index with logits in the last decode
        while any(pending.values()):
            n = 0
            at.clear()
            for seq, rest in pending.items():
                take = rest[: self.n_batch - n]
                for k, tok in enumerate(take):
                    put(self.batch, n, tok, len(self.cached[seq]), seq, k == len(rest) - 1)
                    self.cached[seq].append(tok)
                    n += 1
                if take and len(take) == len(rest):
                    at[seq] = n - 1
                pending[seq] = rest[len(take):]
                if n >= self.n_batch:
                    break
            if not self._decode(n):
                return {}
        # ``at`` now holds the sequences whose last token was decoded in the final round. If
        # some finished in an earlier round (one step's sync overflowed a batch: after steps
        # without drafting, say), their logits are gone: decode every sequence's last token
        # again, in one batch, so all the indexes point into the same, last decode
        if any(seq not in at for seq, *_ in asks):
            at.clear()
            n = 0
            for seq, *_ in asks:
                have = self.cached[seq]
                last = have.pop()
                ll.llama_memory_seq_rm(self.mem, seq, len(have), -1)
                put(self.batch, n, last, len(have), seq, True)
                have.append(last)
                at[seq] = n
                n += 1
            if not self._decode(n):
                return {}
        # 2. draft: greedy, every sequence one token per decode
        out: dict[int, list[int]] = {seq: [] for seq, *_ in asks}
        want = {seq: n_max for seq, _, n_max, _ in asks}
        p_min = {seq: p for seq, _, _, p in asks}
        live = dict(at)
        while live:
            n = 0
            nxt: dict[int, int] = {}
            for seq, i in live.items():
                tok, p = self._top(i)
                if p < p_min[seq] or ll.llama_vocab_is_eog(self.vocab, tok):
                    continue
                out[seq].append(tok)
                if len(out[seq]) >= want[seq] or len(self.cached[seq]) + 1 >= self.n_ctx:
                    continue
                put(self.batch, n, tok, len(self.cached[seq]), seq, True)
                self.cached[seq].append(tok)
                nxt[seq] = n
                n += 1
            if not n or not self._decode(n):
                break
            live = nxt
        return out

    def _top(self, i: int) -> tuple[int, float]:
        """The draft's likeliest next token at batch index ``i`` and its probability."""
        row = np.ctypeslib.as_array(self.ll.llama_get_logits_ith(self.ctx, i),
                                    shape=(self.n_vocab,))
        tok = int(np.argmax(row))
        top = row[tok]
        p = 1.0 / float(np.exp(row - top).sum())
        return tok, p

    def _decode(self, n: int) -> bool:
        """A draft decode; on failure the draft's KV is dropped (it is rebuilt at the next
        sync) and no draft is offered this step: the target goes on without speculation."""
        self.batch.n_tokens = n
        if self.ll.llama_decode(self.ctx, self.batch) == 0:
            return True
        log.warning("the draft model's decode failed: its cache is reset")
        self.ll.llama_memory_clear(self.mem, True)
        for have in self.cached.values():
            have.clear()
        return False

    def free(self) -> None:
        ll = self.ll
        if self.ctx:
            ll.llama_batch_free(self.batch)
            ll.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            ll.llama_model_free(self.model)
            self.model = None


def propose(spec: SpecConfig, draft_model: DraftModel | None, n_ctx: int,
            generating: list[Slot], mtp: MtpDrafter | None = None) -> dict[int, list[int]]:
    """This step's drafts, by sequence id, for the ``generating`` sequences whose requests
    let them speculate: from a request's prediction, else the draft model or the model's MTP
    head (all of them in one batch per drafted position), else from their own earlier tokens
    (n-gram lookup). None shorter than its request's minimum."""
    asks: list[tuple[Slot, int, float]] = []  # (slot, most to draft, least confidence)
    least: dict[int, int] = {}  # seq id -> the shortest draft worth checking
    for slot in generating:
        job = slot.job
        if job.control.injecting:
            continue
        want = job.request.params.speculative
        n_max = spec.draft_max if want.n_max is None else min(want.n_max, spec.draft_max)
        if job.draft_len:  # as the sequence's last drafts fared, within the limit
            n_max = min(n_max, job.draft_len)
        # room: the reply's length, and the context (the last token and a bonus one)
        n_max = min(n_max, job.max_new - job.n_generated - 1,
                    n_ctx - len(slot.kv) - 2)
        least[slot.seq_id] = max(1, spec.draft_min if want.n_min is None else want.n_min)
        if n_max >= least[slot.seq_id]:
            asks.append((slot, n_max, spec.p_min if want.p_min is None else want.p_min))
    out: dict[int, list[int]] = {}
    for slot, n_max, _ in asks:  # a request with a prediction drafts from it alone
        job = slot.job
        if job.prediction is not None:
            out[slot.seq_id] = job.prediction.draft(
                [*slot.kv.tokens[len(job.tokens):], slot.last_token], n_max)
    by_model = [a for a in asks if draft_model is not None and not a[0].job.images
                and a[0].job.prediction is None]
    if by_model:
        out.update(draft_model.draft(
            [(s.seq_id, [*s.kv.tokens, s.last_token], n, p) for s, n, p in by_model]))
    if mtp is not None:  # the head's own confidence floor is the request's (llama-server: 0)
        by_head = [(s.seq_id, s.last_token, s.kv.n_pos, n,
                    s.job.request.params.speculative.p_min or 0.0)
                   for s, n, _ in asks if s.job.prediction is None and not s.job.images
                   and mtp.in_sync(s.seq_id, s.kv.n_pos)]
        if by_head:
            out.update(mtp.draft(by_head))
    if spec.ngram:  # n-gram lookup for the rest (all of them without a draft model)
        for slot, n_max, _ in asks:
            if slot.seq_id not in out:
                out[slot.seq_id] = ngram_draft([*slot.kv.tokens, slot.last_token], n_max)
    return {seq: d for seq, d in out.items() if len(d) >= least[seq]}


def next_draft_len(drafted: int, kept: int) -> int:
    """A sequence's next draft length after ``kept`` of ``drafted`` tokens matched: halved
    when the first was turned down, one past what was kept after a partial match, doubled
    (to 128 at most) after a whole one."""
    if kept == drafted:
        return min(2 * drafted, 128)
    return max(1, drafted // 2) if kept == 0 else kept + 1


def check_same_vocab(ll, target, draft, path: str) -> None:
    """The draft must tokenize as the target does: the same number of tokens, the same special
    tokens, and the same text for every token. Else a ModelLoadError naming the difference."""
    n_t, n_d = ll.llama_vocab_n_tokens(target), ll.llama_vocab_n_tokens(draft)
    if n_t != n_d:
        raise ModelLoadError(f"DRAFT_MODEL {path} has {n_d} tokens in its vocabulary, the model "
                             f"{n_t}: a draft must share the model's vocabulary")
    for what in ("bos", "eos"):
        a = getattr(ll, f"llama_vocab_{what}")(target)
        b = getattr(ll, f"llama_vocab_{what}")(draft)
        if a != b:
            raise ModelLoadError(f"DRAFT_MODEL {path}: its {what} token is {b}, the model's {a}")
    text = ll.llama_vocab_get_text
    for tok in range(n_t):
        a, b = text(target, tok), text(draft, tok)
        if a != b:
            raise ModelLoadError(
                f"DRAFT_MODEL {path}: token {tok} is {b!r} there and {a!r} in the model: a draft "
                "must share the model's vocabulary")



class SpecGate:
    """Whether drafting pays on this device now, learned from the steps themselves.

    Checking k drafted tokens costs little where a decode is bound by memory bandwidth (a GPU)
    and about k decoded tokens where it is bound by compute (a small CPU, or a wide batch).
    Rather than model the device, the gate measures: for each batch width (in powers of two),
    the tokens a generation step emits per second with drafting and without (a moving
    average), and drafts where that is higher. Every EXPLORE-th step of a width tries the
    other choice, so a change in the traffic (a copy-heavy phase, wider batches) is seen.
    Only steps that decode no prompt chunk are measured (a chunk's time buys no tokens)."""

    EXPLORE = 16
    WEIGHT = 0.1  # of a new measurement in the average

    def __init__(self) -> None:
        self.rate: dict[tuple[int, bool], float] = {}
        self.steps: dict[int, int] = {}

    def choose(self, width: int) -> bool:
        """Whether a step of ``width`` generating sequences drafts."""
        b = width.bit_length()
        n = self.steps[b] = self.steps.get(b, 0) + 1
        on, off = self.rate.get((b, True)), self.rate.get((b, False))
        if on is None or off is None:
            return on is None  # measure each choice once first
        best = on >= off
        return not best if n % self.EXPLORE == 0 else best

    def record(self, width: int, drafted: bool, tokens: int, seconds: float) -> None:
        if seconds <= 0:
            return
        key = (width.bit_length(), drafted)
        rate = tokens / seconds
        old = self.rate.get(key)
        self.rate[key] = rate if old is None else old + self.WEIGHT * (rate - old)

    def as_dict(self) -> dict[str, float]:
        """The averages, for /health's engine stats: "8:on" is 8-15 sequences, drafting."""
        return {f"{1 << (b - 1)}:{'on' if on else 'off'}": round(r, 1)
                for (b, on), r in sorted(self.rate.items())}
