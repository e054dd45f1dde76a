"""The scheduler: PARALLEL slots over one llama.cpp context, on the engine thread.

Each step decides, then acts. ``step_plan.plan_step`` decides, from the slots alone, the
step's ``llama_batch``: the next token of each generating sequence (with its draft, when
speculating), then prompt chunks of sequences being admitted (PREFILL_CHUNK shared between
them: ``slots.shares``), with the rows whose logits are read; a prompt being scored
(prompt_logprobs) gets a decode of its own. Then the step writes the batch, calls
``llama_decode`` once, commits the decoded tokens to each sequence's KV mirror (``kv.KvSeq``)
and samples each sequence with its own sampler.

A free slot goes to the oldest waiting job of the key scope holding the fewest slots
(``slots.next_waiting``: first come, first served without API keys); the job takes the free
slot whose cached tokens share the longest prefix with its prompt (within its API key's scope)
and decodes only the rest; a job with n choices takes n slots, the others copying the leader's
prompt KV. A finished job's KV stays for the next request's prefix; a cancelled or failed one's
is dropped at once. What a job's end means to the engine (its counters) is ``on_job_end``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.base.errors import EngineFailure, ServiceError
from app.engine.deterministic import Canon
from app.engine.kv import KvSeq
from app.engine.llama_media import ImageSpan, Projector
from app.engine.llama_vocab import Tokenizer
from app.engine.logprobs import chars, logits_row, rows_per_step, score
from app.engine.lora import Adapters, LoraSet, next_set
from app.engine.mtp import MtpDrafter
from app.engine.prefix import choose
from app.engine.prompt_cache import PromptCache, bring_back, keep_aside
from app.engine.prompt_file import DIGEST
from app.engine.sampling import GrammarStepTooSlow, Vocab
from app.engine.slots import (
    PUBLIC,
    Job,
    Slot,
    drop,
    fail,
    next_waiting,
    pop_scores,
    spread,
    timeout_error,
)
from app.engine.speculative import DraftModel, SpecConfig, SpecGate, next_draft_len, propose
from app.engine.step_plan import (
    Feed,
    Injection,
    StepPlan,
    at_work,
    decide_drafts,
    plan_step,
)
from app.engine.tokens import put
from app.engine.types import Finished, PromptScored, TextPiece, TokenScore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Features:
    """What the scheduler is given beside the context, each None when not loaded."""

    projector: Projector | None = None  # MMPROJ: decodes a prompt's images
    draft_model: DraftModel | None = None  # DRAFT_MODEL
    spec: SpecConfig | None = None  # speculative decoding; None: this model cannot drop a draft
    adapters: Adapters | None = None  # LORA_ADAPTERS: a step serves one set, the sets in turn
    prompt_cache: PromptCache | None = None  # PROMPT_CACHE_RAM_MB: slots' KV kept aside
    canon: Canon | None = None  # DETERMINISTIC: one sequence per step, prompts cut alike
    mtp: MtpDrafter | None = None  # SPEC_MTP: the model's own draft head, mirroring every decode


@dataclass
class StepStats:
    """The scheduler's counters since start (or since the warm-up: ``reset_stats``)."""

    steps: int = 0
    widths: Counter[int] = field(default_factory=Counter)  # sequences sampled in one step -> steps
    # seconds inside llama_decode, and in whole steps: the difference is this server's own work
    # per step (scheduling, sampling, text), what bench/reply_length.py reports
    decode_seconds: float = 0.0
    step_seconds: float = 0.0
    drafted: int = 0  # tokens drafted, and of them kept (/metrics)
    accepted: int = 0
    emitted: int = 0  # tokens sampled (what a step's speculation bought)

    def as_dict(self) -> dict[str, object]:
        return {
            "steps": self.steps,
            "batch_widths": {str(k): v for k, v in sorted(self.widths.items())},
            "decode_seconds": round(self.decode_seconds, 6),
            "step_seconds": round(self.step_seconds, 6),
        }


class Scheduler:
    """The slots, the admission queue and the step, over one context (made anew at each load)."""

    def __init__(self, ll: Any, ctx: Any, mem: Any, batch: Any, vocab: Any, tok: Tokenizer | None,
                 tables: Vocab | None, *, n_ctx: int, n_batch: int, prefill_chunk: int,
                 parallel: int, on_job_end: Callable[[Job], None],
                 features: Features = Features()):
        self.ll, self.ctx, self.batch, self.vocab, self.tok = ll, ctx, batch, vocab, tok
        self.tables = tables  # the vocabulary's tables: token texts for logprobs
        self.n_ctx = n_ctx
        self.n_batch = n_batch  # the batch's capacity (an image's decode is split to fit it)
        self.prefill_chunk = prefill_chunk
        # prompt positions scored per step at most (prompt_logprobs): bounds the logits
        # llama.cpp returns from one decode, and the scoring time of one step
        self.score_rows = rows_per_step(tables.n if tables else 1, prefill_chunk)
        self.on_job_end = on_job_end  # a job has ended: the engine's accounting
        self.features = features
        self.slots = [Slot(KvSeq(ll, mem, i, features.mtp)) for i in range(parallel)]
        self.waiting: deque[Job] = deque()  # prepared, admitted in turn as slots free up
        self.stats = StepStats()
        self.server_gate = SpecGate()  # whether the server's drafts pay, per batch width
        self.prediction_gate = SpecGate()  # ... in steps where a request's prediction drafts
        self._served: LoraSet = ()  # the adapter set the last step served

    # ---- between steps ---------------------------------------------------------------------
    def busy(self) -> bool:
        return any(s.job for s in self.slots)

    def reset_stats(self) -> None:
        """Forget the counters and the gates' measurements (the warm-up's)."""
        self.stats = StepStats()
        self.server_gate = SpecGate()
        self.prediction_gate = SpecGate()
        if self.features.mtp is not None:
            self.features.mtp.reset_stats()

    def clear_kv(self) -> None:
        """Drop every idle slot's KV: text no later prompt will reuse (the warm-up's)."""
        for slot in self.slots:
            slot.kv.clear()
        if self.features.prompt_cache is not None:
            self.features.prompt_cache.clear()

    def draft_report(self) -> dict[str, object]:
        """The drafts and the gates' rates, for /health and /metrics: the server's own drafts
        (SPEC_NGRAM, DRAFT_MODEL), and apart those from requests' predictions."""
        spec, s = self.features.spec, self.stats
        return {
            **({"draft_tokens": s.drafted, "draft_tokens_accepted": s.accepted}
               if spec is not None and (spec.server or s.drafted) else {}),
            **({"spec_rates": self.server_gate.as_dict()}
               if spec is not None and spec.server else {}),
            **({"prediction_rates": self.prediction_gate.as_dict()}
               if self.prediction_gate.rate else {}),
            **({"mtp": self.features.mtp.report()} if self.features.mtp is not None else {}),
        }

    def reap(self) -> None:
        """Drop cancelled jobs and fail the ones past their deadline, freeing their slots. Their
        KV stays for prefix reuse (between steps it holds exactly ``kv.tokens``): a client that
        stops a reply and sends its next turn finds the conversation still there."""
        now = time.monotonic()
        for slot in self.slots:
            job = slot.job
            if job is None:
                continue
            if job.cancelled:
                self.release(slot, keep_cache=True)
            elif job.deadline is not None and now > job.deadline:
                self.fail_job(job, timeout_error(job))
                self.release(slot, keep_cache=True)
        if any(j.cancelled or (j.deadline is not None and now > j.deadline) for j in self.waiting):
            keep: deque[Job] = deque()
            for job in self.waiting:
                if job.cancelled:
                    self.drop(job)
                elif job.deadline is not None and now > job.deadline:
                    self.drop(job, timeout_error(job))
                else:
                    keep.append(job)
            self.waiting = keep

    def admit(self) -> None:
        """Waiting jobs in turn by key scope (``slots.next_waiting``), each taking a free slot
        that keeps the running sequences' ids close together (``slots.place``), with the
        longest cached prefix of its prompt (``prefix.choose``), and decoding only the rest."""
        while self.waiting:
            free = [s for s in self.slots if s.job is None]
            i = next_waiting(self.waiting, self.slots)
            job = self.waiting[i]
            if len(free) < 1 + len(job.followers):
                return  # the next request waits for enough slots for all its choices
            del self.waiting[i]
            job.queued = time.monotonic() - job.submitted
            cache = self.features.prompt_cache
            r = choose(job, self.slots, free, cache, self.features.canon)
            scope = r.scope
            job.preloaded = None  # read from disk for this admission only
            slot, source, n_common, entry = r.slot, r.source, r.n_common, r.entry
            whole = cache is not None and cache.whole_only  # a recurrent model's memory
            if cache is not None:  # the conversation the slot held, before it is overwritten
                kept = n_common if source is slot and entry is None else 0
                self._keep_aside(slot, 0 if whole and kept < len(slot.kv) else kept)
            if entry is not None:  # the prefix was kept aside: copy it back
                n_common = r.n_entry if bring_back(cache, self.ctx, slot.kv, entry) else 0
            elif source is not slot:  # the prefix is in a slot too far off: copy it over
                slot.kv.copy_from(source.kv)
            n_common = slot.kv.keep_first(n_common, job.pos_at(n_common))
            if entry is not None and cache is not None:
                cache.stats.restored_tokens += n_common
            job.cached_tokens = n_common
            for follower in job.followers:
                follower.cached_tokens = n_common
            slot.job = job
            slot.scope = scope
            slot.n_prompt_done = n_common
            slot.last_token = -1
            slot.last_used = time.monotonic()
            free.remove(slot)
            for follower in job.followers:
                # each other choice gets a slot of its own; it takes a copy of the leader's prompt
                # KV (llama_memory_seq_cp into its own stream) once the prompt is decoded
                span = spread(self.slots)
                fslot = min(free, key=lambda s: (span(s), len(s.kv)))
                free.remove(fslot)
                if cache is not None:
                    self._keep_aside(fslot, 0)
                fslot.kv.clear()
                fslot.job = follower
                fslot.scope = scope
                fslot.follows = slot
                fslot.n_prompt_done = 0
                fslot.last_token = -1
                fslot.last_used = time.monotonic()

    def _keep_aside(self, slot: Slot, kept: int) -> None:
        """The slot's cells past its first ``kept`` tokens are about to go: into the prompt
        cache with them, when worth it (``prompt_cache.keep_aside``)."""
        cache = self.features.prompt_cache
        if cache is not None and slot.scope != PUBLIC and not slot.scope.startswith(DIGEST):
            keep_aside(cache, self.ctx, slot.kv, slot.scope, kept,
                       [(s.scope, s.kv) for s in self.slots])

    # ---- the step --------------------------------------------------------------------------
    def step(self) -> None:
        """One step: planned (``plan``), then the batch written, decoded and its result applied
        (the tokens committed to each sequence's KV, then each sequence sampled)."""
        t0 = time.perf_counter()
        try:
            self._step()
        finally:
            self.stats.step_seconds += time.perf_counter() - t0

    def plan(self, lora: LoraSet) -> StepPlan:
        """What this step does for the sequences of adapter set ``lora``: who drafts (the
        drafts themselves are made here, by the draft model or n-gram lookup), the text
        injected, and every row of the batch (``step_plan.plan_step``)."""
        generating, prefilling = at_work(self.slots, lora)
        f = self.features
        decision = decide_drafts(f.spec, self.server_gate, self.prediction_gate, generating)
        drafts = (propose(f.spec, f.draft_model, self.n_ctx, list(decision.asking), f.mtp)
                  if decision.asking and f.spec is not None else {})
        canon = f.canon
        if canon is not None:
            generating, prefilling = canon.one(generating, prefilling, lora)
        return plan_step(generating, prefilling, decision, drafts, self._injections(generating),
                         self.prefill_chunk, self.score_rows, self.n_ctx,
                         align=canon.chunk if canon is not None else 0)

    def _step(self) -> None:
        lora = self._step_lora()  # the adapter set this step serves (() without adapters)
        if lora is None:
            return
        t0, emitted = time.perf_counter(), self.stats.emitted
        plan = self.plan(lora)
        for feed in plan.feeds:
            if feed.injection is not None:
                self._inject(feed.slot, feed.injection)
        for slot, span in plan.images:
            if not self._decode_image(slot, span):
                return
        width = 0
        if plan.feeds:  # write, decode, apply
            if not self._decode(self._write(plan.feeds)):
                return
            self._commit(plan.feeds)
            if self.features.canon is not None:
                self.features.canon.settle(plan.feeds)
            width += self._sample(plan.feeds)
            gate = plan.drafts.gate
            if gate is not None and not plan.chunked:
                gate.record(len(plan.generating), plan.drafts.drafting,
                            self.stats.emitted - emitted, time.perf_counter() - t0)
        scored = plan.scored
        if scored is not None and scored.slot.job is not None:
            pos = scored.slot.n_prompt_done
            if not self._decode(self._write((scored,))):
                return
            self._commit((scored,))
            if self.features.canon is not None:
                self.features.canon.settle((scored,))
            self._score_prompt(scored.slot, scored.first, pos, len(scored.tokens))
            width += self._sample((scored,))
        self.stats.steps += 1
        self.stats.widths[width] += 1

    def _injections(self, generating: list[Slot]) -> dict[int, Injection]:
        """Text waiting to be injected into generating sequences, tokenized (by sequence id)."""
        out: dict[int, Injection] = {}
        for slot in generating:
            job = slot.job
            if job is None or not job.control.injecting:
                continue
            text, unless = job.control.pending()
            if text:
                out[slot.seq_id] = Injection(
                    text, tuple(self.tok.tokens(text, add_bos=False)),
                    dropped=bool(unless) and unless in job.generated)
        return out

    def _inject(self, slot: Slot, injection: Injection) -> None:
        """Text injected into this step's batch: taken from the job's control, sent to the
        client as text, and fed to the sampler; unless the model got there first (injecting
        now would be wrong, or refused), then only taken."""
        job = slot.job
        assert job is not None and job.sampler is not None
        job.control.take(injection.text)
        if injection.dropped:
            return
        data = injection.text.encode()
        job.generated += data
        if job.request.params.logprobs is not None:
            job.n_chars += chars(data)
        job.sampler.accept_injected(list(injection.tokens))  # penalties (and a grammar) move past
        job.sampler.observe(job.generated)
        piece = job.assembler.feed(data) if job.assembler else injection.text
        if piece:
            self._send(job, piece)

    def _decode_image(self, slot: Slot, span: ImageSpan) -> bool:
        """An image at the slot's next prompt position, decoded into its sequence (a
        ``llama_decode`` of its own: a batch of embeddings carries no token ids). False, with
        every request failed, if llama.cpp refused it."""
        projector = self.features.projector
        assert projector is not None and span.start == slot.n_prompt_done
        t0 = time.perf_counter()
        after = projector.decode(self.ctx, span, slot.kv.n_pos, slot.seq_id, self.n_batch)
        self.stats.decode_seconds += time.perf_counter() - t0
        if after < 0:
            self._decode_failed(EngineFailure("llama_decode failed on an image"))
            return False
        slot.kv.decoded_image(span, after)
        if self.features.canon is not None:
            self.features.canon.settle_image(slot, span)
        slot.n_prompt_done += span.n
        return True

    def _write(self, feeds: tuple[Feed, ...]) -> int:
        """The feeds' rows into the batch, each sequence from its next position; how many."""
        batch = self.batch
        for f in feeds:
            pos, seq = f.slot.kv.n_pos, f.slot.seq_id
            for k, tok in enumerate(f.tokens):
                put(batch, f.first + k, tok, pos + k, seq, f.every or f.first + k == f.logits)
            at = len(f.tokens)
            for k, tok in enumerate(f.draft):  # checked in this decode: logits at each
                put(batch, f.first + at + k, tok, pos + at + k, seq, True)
        return feeds[-1].end

    def _decode(self, n: int) -> bool:
        """``llama_decode`` of the batch's first ``n`` rows; on failure every request in
        flight ends with the error (the KV cache is in an unknown state) and False."""
        self.batch.n_tokens = n
        t0 = time.perf_counter()
        rc = self.ll.llama_decode(self.ctx, self.batch)
        if rc == 0 and self.features.mtp is not None:
            self.features.mtp.mirror(self.batch, n)  # its hidden states are this decode's only
        self.stats.decode_seconds += time.perf_counter() - t0
        if rc == 0:
            return True
        self._decode_failed(EngineFailure(
            f"llama_decode failed (code {rc})"
            + (": no room left in the KV cache" if rc == 1 else "")
        ))
        return False

    @staticmethod
    def _commit(feeds: tuple[Feed, ...]) -> None:
        """After a decode: the feeds' tokens are in their sequences' KV (a draft's cells
        beside them until each is kept or dropped), and the prompts that far decoded."""
        for f in feeds:
            f.slot.kv.decoded(f.tokens, drafted=len(f.draft))
            if f.prompt:
                f.slot.n_prompt_done += len(f.tokens)

    def _decode_failed(self, err: ServiceError) -> None:
        """Every request in a slot ends with ``err``: the KV cache is in an unknown state."""
        for slot in self.slots:
            if slot.job is not None:
                self.fail_job(slot.job, err)
                self.release(slot, keep_cache=False)

    def _sample(self, feeds: tuple[Feed, ...]) -> int:
        """After a decode: choices waiting for a prompt now decoded take a copy of its KV, then
        every slot with logits in this decode samples its next token, in slot order. How many
        sampled."""
        rows = {id(f.slot): f for f in feeds if f.logits >= 0}
        for slot in self.slots:
            leader = slot.follows
            if leader is not None and id(leader) in rows and leader.job is not None:
                # the leader's prompt is in the KV now: share it, and sample from its logits
                slot.kv.copy_from(leader.kv)
                slot.n_prompt_done = leader.n_prompt_done
                rows[id(slot)] = rows[id(leader)]
                slot.follows = None
        width = 0
        for slot in self.slots:
            job, feed = slot.job, rows.get(id(slot))
            if feed is None or job is None or job.sampler is None:
                continue
            if job.max_new == 0:  # max_tokens 0: the prompt alone (scored), nothing sampled
                self._finish(slot, "length")
                continue
            width += 1
            if feed.draft and feed.slot is slot:
                self._verify(slot, job, feed.logits, feed.draft)
                continue
            tok = self._take(slot, job, feed.logits)
            if tok is not None:
                self._on_token(slot, tok)
        return width

    def _take(self, slot: Slot, job: Job, i: int) -> int | None:
        """The job's next token, sampled at batch index ``i`` (with its score when asked);
        None when the sampler ended the request (a grammar's dead end): it is failed and its
        slot released."""
        try:
            tok = job.sampler.sample(self.ctx, i)
        except ServiceError as err:  # the grammar ended this request; others go on
            if isinstance(err, GrammarStepTooSlow):
                log.warning("request ended: %s", err.message)
            lead = job.leader or job
            for choice in (lead, *lead.followers):  # its other choices stop at the next
                choice.control.cancel()             # step: nobody reads them any more
            self.fail_job(job, err)
            self.release(slot, keep_cache=True)  # its KV is whole: this token is not in it
            return None
        if job.request.params.logprobs is not None:
            row = logits_row(self.ll, self.ctx, i, self.tables.n)
            job.scores.append(score(row, tok, job.request.params.logprobs, self.tables,
                                    job.n_chars))
        return tok

    def _verify(self, slot: Slot, job: Job, i: int, draft: tuple[int, ...]) -> None:
        """A slot whose draft this decode checked: sample at each drafted position in turn
        (batch indexes i, i+1, ...), keeping each drafted token the target samples too, up to
        the first it does not (or one past the whole draft); every sampled token is sent as
        without speculation. The drafted tail the target did not keep leaves the KV."""
        job.draft_n += len(draft)
        self.stats.drafted += len(draft)
        kept = job.draft_accepted
        try:
            for j in range(len(draft) + 1):
                tok = self._take(slot, job, i + j)
                if tok is None:
                    return  # released
                self._on_token(slot, tok)
                if slot.job is not job:
                    return  # finished
                if j == len(draft) or tok != draft[j]:
                    job.draft_len = next_draft_len(len(draft), j)
                    break
                slot.kv.draft_kept(tok)  # the drafted token's KV is the target's own
                job.draft_accepted += 1
                self.stats.accepted += 1
        finally:
            slot.kv.drop_draft()
            if self.features.mtp is not None:
                self.features.mtp.verified(slot.seq_id, len(draft), job.draft_accepted - kept)

    def _step_lora(self) -> LoraSet | None:
        """The adapter set this step serves: with adapters loaded, the sets of the jobs in
        slots taken in turn (the next after the last served, in a fixed order), so a request
        waits at most one step per other set in use between its own steps. Set on the context
        when it changes; None, with that set's jobs failed, if llama.cpp refused it."""
        adapters = self.features.adapters
        if adapters is None:
            return ()
        sets = {s.job.request.lora for s in self.slots if s.job is not None}
        if not sets:
            return adapters.current
        wanted = self._served = next_set(sets, self._served)
        if adapters.apply(self.ctx, wanted):
            return wanted
        for slot in self.slots:
            if slot.job is not None and slot.job.request.lora == wanted:
                self.fail_job(slot.job, EngineFailure("llama.cpp refused the LoRA adapters"))
                self.release(slot, keep_cache=False)
        return None

    def _score_prompt(self, slot: Slot, first: int, pos: int, count: int) -> None:
        """Score the prompt positions ``pos..pos+count-1`` just decoded (from batch index
        ``first``): the logits at position i are the next token's; once the whole prompt is
        scored, the scores go out (before any text)."""
        job = slot.job
        if job is None:
            return
        toks, tables = job.tokens, self.tables
        top_n = job.request.params.prompt_logprobs or 0
        for k in range(count):
            i = pos + k
            if i == 0:
                job.prompt_scores.append(TokenScore(toks[0], tables.piece(toks[0]), None))
            if i + 1 < len(toks):
                row = logits_row(self.ll, self.ctx, first + k, tables.n)
                job.prompt_scores.append(score(row, toks[i + 1], top_n, tables))
        if slot.n_prompt_done >= len(toks):
            job.sink(PromptScored(tuple(job.prompt_scores)))
            job.prompt_scores = []

    # ---- a job's tokens and its end --------------------------------------------------------
    def _send(self, job: Job, text: str) -> None:
        """A piece of text, with the scores of the tokens sampled since the last one."""
        job.sink(TextPiece(text, job.n_generated, job.index, pop_scores(job)))

    def _on_token(self, slot: Slot, tok: int) -> None:
        job = slot.job
        assert job is not None and job.assembler is not None
        self.stats.emitted += 1
        # every sampled token counts, an end-of-generation one too (OpenAI, vLLM and
        # llama-server count it: a reply that ends at once has 1 completion token); a stop
        # string or max_tokens ends a reply with no such token
        job.n_generated += 1
        if self.ll.llama_vocab_is_eog(self.vocab, tok):
            self._finish(slot, "stop")
            return
        raw = self.tok.piece(tok)
        job.generated += raw
        if job.request.params.logprobs is not None:
            job.n_chars += chars(raw)
        assert job.sampler is not None
        job.sampler.observe(job.generated)
        text = job.assembler.feed(raw)
        if job.assembler.stopped:
            if text:
                self._send(job, text)
            self._finish(slot, "stop", tok)
            return
        if job.n_generated >= job.max_new or len(slot.kv) >= self.n_ctx:
            text += job.assembler.flush()
            if text:
                self._send(job, text)
            self._finish(slot, "length", tok)
            return
        if text:
            self._send(job, text)
        slot.last_token = tok

    def _finish(self, slot: Slot, reason: str, last: int | None = None) -> None:
        """End the slot's job; ``last``: the token that ended it, if it is text (a stop
        string's, the length limit's), not yet in the KV."""
        job = slot.job
        assert job is not None and job.assembler is not None
        where, spec = job.prediction, self.features.spec
        if where is not None and spec is not None:  # the last tokens, checked against it
            where.follow([*slot.kv.tokens[len(job.tokens):], *(() if last is None else (last,))])
        tail = job.assembler.flush()
        if tail:
            self._send(job, tail)
        job.sink(Finished(reason, len(job.tokens), job.n_generated, job.cached_tokens, job.index,
                          job.assembler.stopped_by, queue_seconds=job.queued,
                          scores=pop_scores(job),
                          draft=(job.draft_n, job.draft_accepted)
                          if spec and (spec.server or job.prediction is not None) else None,
                          predicted=None if where is None else where.accepted_rejected()))
        self.release(slot, keep_cache=True)

    def release(self, slot: Slot, keep_cache: bool = False) -> None:
        """Free the slot at once; its KV stays for prefix reuse by the next request when
        ``keep_cache`` (it holds exactly ``kv.tokens``), else it is dropped."""
        job = slot.job
        slot.kv.drop_draft()  # a drafted tail not kept leaves the KV first
        for other in self.slots:  # choices still waiting for this slot's prompt go with it
            if other.follows is slot and other.job is not None:
                other.job.control.cancel()
                other.follows = None
                self.release(other)
        if not keep_cache:
            slot.kv.clear()
        elif self.features.canon is not None and job is not None:
            self.features.canon.keep(slot, job)
        slot.job = None
        slot.follows = None
        if job is not None:
            if job.cancelled and not job.done:
                log.debug("generation cancelled after %d tokens", job.n_generated)
            self.on_job_end(job)

    def drop(self, job: Job, err: ServiceError | None = None) -> None:
        drop(job, err, self.on_job_end)

    def fail_job(self, job: Job, err: ServiceError) -> None:
        fail(job, err, self.on_job_end)

    def fail_active(self, err: ServiceError) -> None:
        for slot in self.slots:
            if slot.job is not None:
                self.fail_job(slot.job, err)
                self.release(slot)
