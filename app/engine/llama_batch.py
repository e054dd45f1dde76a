"""The batch scheduler: PARALLEL slots over one llama.cpp context, on the engine thread.

Every step builds one ``llama_batch`` with the next token of each generating sequence plus
prompt chunks of sequences being admitted (PREFILL_CHUNK shared between them:
``slots.shares``), calls ``llama_decode`` once, and samples each sequence with its own
sampler; a prompt being scored (prompt_logprobs) is decoded in a second call of its own, so
its scores do not depend on the other sequences. A free slot goes to the oldest waiting job
of the key scope holding the fewest slots (``slots.next_waiting``: first come, first served
without API keys); the job takes the free slot whose cached tokens share the longest prefix
with its prompt (within its API key's scope) and decodes only the rest; a job with n choices
takes n slots, the others copying the leader's prompt KV. A finished job's KV stays for the
next request's prefix; a cancelled or failed one's is dropped at once. What a job's end means
to the engine (its counters) is the ``over`` callback.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import numpy as np

from app.base.errors import EngineFailure, ServiceError
from app.engine.llama_media import Projector
from app.engine.llama_vocab import Tokenizer
from app.engine.logprobs import chars, logits_row, rows_per_step, score
from app.engine.lora import Adapters, LoraSet, next_set
from app.engine.sampling import GrammarStepTooSlow, Vocab
from app.engine.slots import (
    PUBLIC,
    Job,
    Slot,
    before_image,
    drop,
    fail,
    next_waiting,
    place,
    shares,
    spread,
    taken,
    timeout_error,
)
from app.engine.speculative import (
    DraftModel,
    SpecConfig,
    SpecGate,
    next_draft_len,
    propose,
)
from app.engine.tokens import common_prefix, put
from app.engine.types import Finished, PromptScored, TextPiece, TokenScore

log = logging.getLogger(__name__)


class Batch:
    """The slots, the admission queue and the step, over one context (made anew at each load)."""

    def __init__(self, ll: Any, ctx: Any, mem: Any, batch: Any, vocab: Any, tok: Tokenizer | None,
                 n_ctx: int, prefill_chunk: int, parallel: int, over: Callable[[Job], None],
                 tables: Vocab | None = None):
        self.ll, self.ctx, self.mem, self.batch, self.vocab, self.tok = ll, ctx, mem, batch, vocab, tok
        self.tables = tables  # the vocabulary's tables: token texts for logprobs
        self.n_ctx = n_ctx
        self.prefill_chunk = prefill_chunk
        # prompt positions scored per step at most (prompt_logprobs): bounds the logits
        # llama.cpp returns from one decode, and the scoring time of one step
        self.score_rows = rows_per_step(tables.n if tables else 1, prefill_chunk)
        self.over = over  # a job has ended: the engine's accounting
        self.slots = [Slot(seq_id=i) for i in range(parallel)]
        self.waiting: deque[Job] = deque()  # prepared, admitted in order as slots free up
        self.steps = 0
        self.widths: Counter[int] = Counter()  # sequences sampled in one step -> steps
        # seconds inside llama_decode, and in whole steps: the difference is this server's own
        # work per step (scheduling, sampling, text), what bench/reply_length.py reports
        self.decode_seconds = 0.0
        self.step_seconds = 0.0
        self.projector: Projector | None = None  # MMPROJ: decodes a prompt's images
        # speculative decoding (SPEC_*, DRAFT_MODEL): None when off
        self.spec: SpecConfig | None = None  # None: this model cannot drop a drafted tail
        self.draft_model: DraftModel | None = None
        self.drafted = 0  # tokens drafted, and of them accepted, since start (/metrics)
        self.gate = SpecGate()  # whether drafting pays, per batch width (SPEC_ADAPTIVE)
        self.pred_gate = SpecGate()  # ... in steps where a request's prediction drafts
        self.emitted = 0  # tokens sampled since start (what a step's speculation bought)
        # LORA_ADAPTERS: None without; a step serves one adapter set, the sets in turn
        self.adapters: Adapters | None = None
        self._served: LoraSet = ()
        self.accepted = 0
        self.n_batch = 0  # the batch's capacity (an image's decode is split to fit it)

    def busy(self) -> bool:
        return any(s.job for s in self.slots)

    def reap(self) -> None:
        """Drop cancelled jobs and fail the ones past their deadline, freeing their slots. Their
        KV stays for prefix reuse (between steps it holds exactly ``cached``): a client that
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
        longest cached prefix of its prompt, and decoding only the rest."""
        while self.waiting:
            free = [s for s in self.slots if s.job is None]
            i = next_waiting(self.waiting, self.slots)
            job = self.waiting[i]
            if len(free) < 1 + len(job.followers):
                return  # the next request waits for enough slots for all its choices
            del self.waiting[i]
            job.queued = time.monotonic() - job.submitted
            prompt = np.asarray(job.tokens, dtype=np.int32)
            lora = job.request.lora
            # KV computed under adapters is theirs: the cache is partitioned by adapter set
            scope = job.request.cache_scope + (f"\0lora{lora}" if lora else "")
            # KV is reused only within a scope (an API key): cached_tokens is no oracle for
            # another key's prompts; a prompt to score needs logits where a reused prefix has
            # none
            reuse = job.request.cache_prompt and job.request.params.prompt_logprobs is None
            wanted = [span.mark for span in job.images]
            shared = {id(s): min(common_prefix(s.cached, prompt, s.marks, wanted),
                                 len(job.tokens) - 1)
                      if reuse and (s.scope == scope or s.scope == PUBLIC and not lora)
                      and s.follows is None else 0
                      for s in self.slots}
            slot, source = place(self.slots, free, shared)
            n_common = before_image(job, shared[id(source)])
            if source is not slot:  # the prefix is in a slot too far off: copy it over
                self.ll.llama_memory_seq_cp(self.mem, source.seq_id, slot.seq_id, -1, -1)
                slot.copy_of(source)
            if n_common < len(slot.cached) and not self.ll.llama_memory_seq_rm(
                self.mem, slot.seq_id, job.pos_at(n_common), -1
            ):
                n_common = 0  # this model's memory cannot drop a suffix: start afresh
                self.ll.llama_memory_seq_rm(self.mem, slot.seq_id, -1, -1)
            slot.keep(n_common)
            job.cached_tokens = n_common
            for follower in job.followers:
                follower.cached_tokens = n_common
            slot.job = job
            slot.scope = scope
            slot.n_past = job.pos_at(n_common)
            slot.n_prompt_done = n_common
            slot.last_token = -1
            slot.last_used = time.monotonic()
            free.remove(slot)
            for follower in job.followers:
                # each other choice gets a slot of its own; it takes a copy of the leader's prompt
                # KV (llama_memory_seq_cp into its own stream) once the prompt is decoded
                span = spread(self.slots)
                fslot = min(free, key=lambda s: (span(s), len(s.cached)))
                free.remove(fslot)
                self.ll.llama_memory_seq_rm(self.mem, fslot.seq_id, -1, -1)
                fslot.keep(0)
                fslot.job = follower
                fslot.scope = scope
                fslot.follows = slot
                fslot.n_past = fslot.n_prompt_done = 0
                fslot.last_token = -1
                fslot.last_used = time.monotonic()

    def decode_step(self) -> None:
        """One step: the next token of every generating sequence and the prompt chunks of those
        being admitted, in one ``llama_decode``, then each of them sampled. A prompt being
        scored (prompt_logprobs) takes its chunk in a decode of its own after that, at most
        ``score_rows`` positions, one such prompt per step: llama.cpp computes a sequence's
        logits slightly differently when other sequences share its batch (up to 0.28 in a log
        probability on a small model), and a score must not depend on who else was served."""
        for slot in self.slots:
            slot.i_batch = -1
        n = 0
        budget = self.prefill_chunk
        lora = self._step_lora()  # the adapter set this step serves (() without adapters)
        if lora is None:
            return
        # 1. one token for every sequence that is generating, and its draft when speculating
        t0, emitted = time.perf_counter(), self.emitted
        spec = self.spec
        generating: list[Slot] = []  # this step's set's sequences, generating ...
        prefilling: list[Slot] = []  # ... or with prompt left to decode
        for s in self.slots:
            if s.job is not None and s.follows is None and s.job.request.lora == lora:
                (generating if s.n_prompt_done >= len(s.job.tokens) else prefilling).append(s)
        # drafts where the gate measured that they pay: steps with a prediction's drafts are
        # measured apart (a prediction is kept far more often than the server's own guesses)
        predicted = ([s for s in generating if s.job.prediction is not None]
                     if spec is not None else [])
        measured = bool(generating) and spec is not None and (spec.server or bool(predicted))
        gate = self.pred_gate if predicted else self.gate
        drafting = measured and (not spec.adaptive or gate.choose(len(generating)))
        asking = (generating if spec.server else predicted) if drafting else []
        drafts = propose(spec, self.draft_model, self.n_ctx, asking) if asking else {}
        # while prompts are being decoded, drafts take at most half the step's budget: a wide
        # batch of long drafts must not hold back the prompts of requests just admitted
        room = self.prefill_chunk // 2 if drafts and prefilling else budget
        chunked = False
        for slot in generating:
            extra = self._take_injection(slot, budget - 1)
            for tok in [slot.last_token, *extra]:
                put(self.batch, n, tok, slot.n_past, slot.seq_id, False)
                slot.cached.append(tok)
                slot.n_past += 1
                n += 1
                budget -= 1
            self.batch.logits[n - 1] = True
            slot.i_batch = n - 1
            draft = [] if extra else drafts.get(slot.seq_id, [])[: max(0, min(budget, room))]
            if draft:  # checked in this decode: logits after each drafted token too
                for k, tok in enumerate(draft):
                    put(self.batch, n + k, tok, slot.n_past + k, slot.seq_id, True)
                n += len(draft)
                budget -= len(draft)
                room -= len(draft)
                slot.draft, slot.speculating = draft, True
        # 2. prompt chunks for sequences being admitted: the step's token budget shared
        # between them (``shares``), each up to its next image, decoded first if it is next
        filling = [s for s in prefilling if s.job.request.params.prompt_logprobs is None]
        scorer = next((s for s in prefilling if s not in filling), None)
        if budget > 0 and filling:
            for slot in filling:
                if slot.job.images and not self._decode_images(slot):
                    return
            wants = [next((s.start for s in slot.job.images if s.start >= slot.n_prompt_done),
                          len(slot.job.tokens)) - slot.n_prompt_done for slot in filling]
            for slot, take in zip(filling, shares(budget, wants), strict=True):
                if take > 0:
                    self._add_chunk(slot, n, take, every=False)
                    n += take
                    budget -= take
                    chunked = True
        width = 0
        if n:
            if not self._decode(n):
                return
            width += self._sample()
            if measured and not chunked:
                gate.record(len(generating), drafting, self.emitted - emitted,
                            time.perf_counter() - t0)
        # 3. the prompt being scored, alone: logits at every position of its chunk
        if scorer is not None and scorer.job is not None:
            job = scorer.job
            pos = scorer.n_prompt_done
            take = min(self.score_rows, len(job.tokens) - pos)
            self._add_chunk(scorer, 0, take, every=True)
            if not self._decode(take):
                return
            self._score_prompt(scorer, 0, pos, take)
            width += self._sample()
        self.steps += 1
        self.widths[width] += 1

    def _decode_images(self, slot: Slot) -> bool:
        """The image at the slot's next prompt position, if one is there, decoded into its
        sequence now (a ``llama_decode`` of its own: a batch of embeddings carries no token
        ids). False, with every request failed, if llama.cpp refused it."""
        job = slot.job
        assert job is not None and self.projector is not None
        for span in job.images:
            if span.start != slot.n_prompt_done:
                continue
            t0 = time.perf_counter()
            after = self.projector.decode(self.ctx, span, slot.n_past, slot.seq_id, self.n_batch)
            self.decode_seconds += time.perf_counter() - t0
            if after < 0:
                self._decode_failed(EngineFailure("llama_decode failed on an image"))
                return False
            slot.cached.extend([span.placeholder] * span.n)
            slot.marks.append(span.mark)
            slot.n_prompt_done += span.n
            slot.n_past = after
        return True

    def _add_chunk(self, slot: Slot, n: int, take: int, every: bool) -> None:
        """The next ``take`` prompt tokens of ``slot`` into the batch from index ``n``, with
        logits at the prompt's last position (``every``: at each)."""
        job = slot.job
        assert job is not None
        shift = slot.n_past - slot.n_prompt_done  # what images before saved (M-RoPE); else 0
        for k in range(take):
            i = slot.n_prompt_done + k
            last = i == len(job.tokens) - 1
            put(self.batch, n + k, job.tokens[i], i + shift, slot.seq_id, last or every)
            slot.cached.append(job.tokens[i])
            if last:
                slot.i_batch = n + k
        slot.n_prompt_done += take
        slot.n_past = slot.n_prompt_done + shift

    def _decode(self, n: int) -> bool:
        """``llama_decode`` of the batch's first ``n`` tokens; on failure every request in
        flight ends with the error (the KV cache is in an unknown state) and False."""
        self.batch.n_tokens = n
        t0 = time.perf_counter()
        rc = self.ll.llama_decode(self.ctx, self.batch)
        self.decode_seconds += time.perf_counter() - t0
        if rc == 0:
            return True
        self._decode_failed(EngineFailure(
            f"llama_decode failed (code {rc})"
            + (": no room left in the KV cache" if rc == 1 else "")
        ))
        return False

    def _decode_failed(self, err: ServiceError) -> None:
        """Every request in a slot ends with ``err``: the KV cache is in an unknown state."""
        for slot in self.slots:
            if slot.job is not None:
                self.fail_job(slot.job, err)
                self.release(slot, keep_cache=False)

    def _sample(self) -> int:
        """After a decode: choices waiting for a prompt now decoded take a copy of its KV, then
        every slot with logits in this decode samples its next token (and its ``i_batch`` is
        cleared, so a second decode in the step does not sample it again). How many sampled."""
        ll = self.ll
        for slot in self.slots:
            leader = slot.follows
            if leader is not None and leader.i_batch >= 0 and leader.job is not None:
                # the leader's prompt is in the KV now: share it, and sample from its logits
                ll.llama_memory_seq_cp(self.mem, leader.seq_id, slot.seq_id, -1, -1)
                slot.copy_of(leader)
                slot.n_past, slot.n_prompt_done = leader.n_past, leader.n_prompt_done
                slot.i_batch = leader.i_batch
                slot.follows = None
        width = 0
        for slot in self.slots:
            job = slot.job
            i, slot.i_batch = slot.i_batch, -1
            if i < 0 or job is None or job.sampler is None:
                continue
            if job.max_new == 0:  # max_tokens 0: the prompt alone (scored), nothing sampled
                self._finish(slot, "length")
                continue
            width += 1
            if slot.speculating:
                self._verify(slot, job, i)
                continue
            tok = self._take(slot, job, i)
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
                choice.cancelled = True             # step: nobody reads them any more
            self.fail_job(job, err)
            self.release(slot, keep_cache=True)  # its KV is whole: this token is not in it
            return None
        if job.request.params.logprobs is not None:
            row = logits_row(self.ll, self.ctx, i, self.tables.n)
            job.scores.append(score(row, tok, job.request.params.logprobs, self.tables,
                                    job.n_chars))
        return tok

    def _verify(self, slot: Slot, job: Job, i: int) -> None:
        """A speculating slot: sample at each drafted position in turn (batch indexes i, i+1,
        ...), keeping each drafted token the target samples too, up to the first it does not
        (or one past the whole draft); every sampled token is sent as without speculation.
        The drafted tail the target did not keep leaves the KV (``_settle``)."""
        draft = slot.draft
        job.draft_n += len(draft)
        self.drafted += len(draft)
        for j in range(len(draft) + 1):
            tok = self._take(slot, job, i + j)
            if tok is None:
                return  # released, and settled
            self._on_token(slot, tok)
            if slot.job is not job:
                return  # finished, and settled
            if j == len(draft) or tok != draft[j]:
                job.draft_len = next_draft_len(len(draft), j)
                break
            slot.cached.append(tok)  # the drafted token's KV is the target's own: kept
            slot.n_past += 1
            job.draft_accepted += 1
            self.accepted += 1
        self._settle(slot)

    def _settle(self, slot: Slot) -> None:
        """End a slot's speculation: the drafted positions it did not keep leave its KV, which
        again holds exactly ``cached``."""
        if slot.speculating:
            self.ll.llama_memory_seq_rm(self.mem, slot.seq_id, slot.n_past, -1)
            slot.draft, slot.speculating = [], False

    def _step_lora(self) -> LoraSet | None:
        """The adapter set this step serves: with adapters loaded, the sets of the jobs in
        slots taken in turn (the next after the last served, in a fixed order), so a request
        waits at most one step per other set in use between its own steps. Set on the context
        when it changes; None, with that set's jobs failed, if llama.cpp refused it."""
        if self.adapters is None:
            return ()
        sets = {s.job.request.lora for s in self.slots if s.job is not None}
        if not sets:
            return self.adapters.current
        wanted = self._served = next_set(sets, self._served)
        if self.adapters.apply(self.ctx, wanted):
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

    def _send(self, job: Job, text: str) -> None:
        """A piece of text, with the scores of the tokens sampled since the last one."""
        job.sink(TextPiece(text, job.n_generated, job.index, taken(job)))

    def _take_injection(self, slot: Slot, room: int) -> list[int]:
        """Tokens of text injected into this sequence (already sent to the client as text)."""
        job = slot.job
        if not job or not job.inject:
            return []
        toks = self.tok.tokens(job.inject, add_bos=False)
        if len(toks) > room or len(slot.cached) + 1 + len(toks) >= self.n_ctx:
            return []  # no room in this step's batch (or the context): try again next step
        text, job.inject = job.inject, ""
        if job.inject_unless and job.inject_unless in job.generated:
            return []  # the model got there first: injecting now would be wrong (or refused)
        data = text.encode()
        job.generated += data
        if job.request.params.logprobs is not None:
            job.n_chars += chars(data)
        assert job.sampler is not None
        job.sampler.accept_injected(toks)  # penalties (and a grammar built for it) move past it
        job.sampler.observe(job.generated)
        piece = job.assembler.feed(data) if job.assembler else text
        if piece:
            self._send(job, piece)
        return toks

    def _on_token(self, slot: Slot, tok: int) -> None:
        job = slot.job
        assert job is not None and job.assembler is not None
        self.emitted += 1
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
        if job.n_generated >= job.max_new or len(slot.cached) >= self.n_ctx:
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
        string's, the length limit's), not yet in ``cached``."""
        job = slot.job
        assert job is not None and job.assembler is not None
        place = job.prediction
        if place is not None and self.spec is not None:  # the last tokens, checked against it
            place.follow([*slot.cached[len(job.tokens):], *(() if last is None else (last,))])
        tail = job.assembler.flush()
        if tail:
            self._send(job, tail)
        job.sink(Finished(reason, len(job.tokens), job.n_generated, job.cached_tokens, job.index,
                          job.assembler.stopped_by, queue_seconds=job.queued,
                          scores=taken(job),
                          draft=(job.draft_n, job.draft_accepted)
                          if self.spec and (self.spec.server or job.prediction is not None)
                          else None,
                          predicted=None if place is None else place.accepted_rejected()))
        self.release(slot, keep_cache=True)

    def release(self, slot: Slot, keep_cache: bool = False) -> None:
        """Free the slot at once; its KV stays for prefix reuse by the next request when
        ``keep_cache`` (it holds exactly ``cached``), else it is dropped."""
        job = slot.job
        self._settle(slot)  # a drafted tail not kept leaves the KV first
        for other in self.slots:  # choices still waiting for this slot's prompt go with it
            if other.follows is slot and other.job is not None:
                other.job.cancelled = True
                other.follows = None
                self.release(other)
        if not keep_cache:
            self.ll.llama_memory_seq_rm(self.mem, slot.seq_id, -1, -1)
            slot.keep(0)
        slot.job = None
        slot.follows = None
        slot.i_batch = -1
        if job is not None:
            if job.cancelled and not job.done:
                log.debug("generation cancelled after %d tokens", job.n_generated)
            self.over(job)

    def drop(self, job: Job, err: ServiceError | None = None) -> None:
        drop(job, self.over, err)

    def fail_job(self, job: Job, err: ServiceError) -> None:
        fail(job, err, self.over)

    def fail_active(self, err: ServiceError) -> None:
        for slot in self.slots:
            if slot.job is not None:
                self.fail_job(slot.job, err)
                self.release(slot)


