"""What one scheduler step will do, decided before anything is done: which sequences generate
and which decode prompt chunks, who drafts, and each sequence's rows in the ``llama_batch``
with the row whose logits it samples. A pure function of the slots' state, so a unit test can
assert a step without llama.cpp; the scheduler (app.engine.scheduler) then writes the batch,
decodes it and applies the result (vLLM's ``schedule()`` / ``update_from_output()``).
"""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.llama_media import ImageSpan
from app.engine.lora import LoraSet
from app.engine.slots import Phase, Slot, shares
from app.engine.speculative import SpecConfig, SpecGate


@dataclass(frozen=True)
class DraftDecision:
    """Whether a step drafts, for whom, and which gate measures it (None: not measured)."""

    asking: tuple[Slot, ...] = ()  # the sequences drafts are asked for
    drafting: bool = False
    gate: SpecGate | None = None


def decide_drafts(spec: SpecConfig | None, server_gate: SpecGate, prediction_gate: SpecGate,
                  generating: list[Slot]) -> DraftDecision:
    """Drafts where the gate measured that they pay. The server's own drafts (SPEC_NGRAM,
    DRAFT_MODEL) are asked for every generating sequence; without them only requests with a
    prediction draft. Steps where a prediction drafts are measured apart (a prediction is kept
    far more often than the server's guesses). The gate counts the step when asked."""
    if spec is None or not generating:
        return DraftDecision()
    predicted = tuple(s for s in generating if s.job is not None and s.job.prediction is not None)
    if not spec.server and not predicted:
        return DraftDecision()
    gate = prediction_gate if predicted else server_gate
    drafting = not spec.adaptive or gate.choose(len(generating))
    asking = (tuple(generating) if spec.server else predicted) if drafting else ()
    return DraftDecision(asking, drafting, gate)


@dataclass(frozen=True)
class Injection:
    """Text injected into a generating sequence (sent to the client as text already)."""

    text: str  # as the job's control held it: taken once the step decodes it
    tokens: tuple[int, ...]
    dropped: bool  # the reply already has what the text would close: taken, not decoded


@dataclass(frozen=True)
class Feed:
    """One sequence's rows in a decode, from row ``first``: ``tokens`` (kept in its KV once
    decoded), then its ``draft`` (logits at each; kept only as the model samples the same)."""

    slot: Slot
    first: int
    tokens: tuple[int, ...]
    prompt: bool  # a prompt chunk, from the slot's ``n_prompt_done``; else generation
    logits: int = -1  # the row the slot samples from; -1: none (a chunk short of the end)
    every: bool = False  # logits at every row: a prompt being scored
    draft: tuple[int, ...] = ()
    injection: Injection | None = None

    @property
    def end(self) -> int:
        """The row after its last."""
        return self.first + len(self.tokens) + len(self.draft)


@dataclass(frozen=True)
class StepPlan:
    """One step: the batch's rows (``feeds``, in row order), the images decoded into their
    sequences before it, and a prompt being scored, alone in a second decode."""

    generating: tuple[Slot, ...] = ()
    drafts: DraftDecision = DraftDecision()
    images: tuple[tuple[Slot, ImageSpan], ...] = ()
    feeds: tuple[Feed, ...] = ()
    scored: Feed | None = None

    @property
    def rows(self) -> int:
        return self.feeds[-1].end if self.feeds else 0

    @property
    def chunked(self) -> bool:
        """A prompt chunk shares the batch (the gate does not measure such a step: the
        chunk's time buys no tokens)."""
        return any(f.prompt for f in self.feeds)


def at_work(slots: list[Slot], lora: LoraSet) -> tuple[list[Slot], list[Slot]]:
    """The slots this step serves (its adapter set's): those generating, those prefilling."""
    generating: list[Slot] = []
    prefilling: list[Slot] = []
    for s in slots:
        if s.job is not None and s.job.request.lora == lora:
            phase = s.phase
            if phase is Phase.GENERATING:
                generating.append(s)
            elif phase is Phase.PREFILLING:
                prefilling.append(s)
    return generating, prefilling


def plan_step(generating: list[Slot], prefilling: list[Slot], decision: DraftDecision,
              drafts: dict[int, list[int]], injections: dict[int, Injection], budget: int,
              score_rows: int, n_ctx: int, align: int = 0) -> StepPlan:
    """The step's rows within ``budget`` tokens (PREFILL_CHUNK). First every generating
    sequence: its last token, then text injected into it (when it fits), else its draft;
    while prompts are being decoded, drafts take at most half the budget, so a wide batch
    of long drafts does not hold back the prompts of requests just admitted. Then what is
    left is shared between the prompts (``slots.shares``), each up to its next image, an
    image at its next position decoded first. A prompt being scored (prompt_logprobs) gets
    ``score_rows`` positions in a decode of its own: llama.cpp computes a sequence's logits
    slightly differently when other sequences share its batch (up to 0.28 in a log
    probability on a small model), and a score must not depend on who else was served.
    With ``align`` (DETERMINISTIC), a prompt piece also ends at the next multiple of
    ``align``: every run cuts a prompt at the same places (app.engine.deterministic)."""
    room = budget // 2 if drafts and prefilling else budget
    n = 0
    feeds: list[Feed] = []
    for slot in generating:
        inj = injections.get(slot.seq_id)
        if inj is not None and (len(inj.tokens) > budget - 1
                                or len(slot.kv) + 1 + len(inj.tokens) >= n_ctx):
            inj = None  # no room in this step's batch (or the context): next step
        extra = inj.tokens if inj is not None and not inj.dropped else ()
        toks = (slot.last_token, *extra)
        budget -= len(toks)
        draft = () if extra else tuple(drafts.get(slot.seq_id, ())[: max(0, min(budget, room))])
        budget -= len(draft)
        room -= len(draft)
        feeds.append(Feed(slot, n, toks, prompt=False, logits=n + len(toks) - 1, draft=draft,
                          injection=inj))
        n = feeds[-1].end
    filling = [s for s in prefilling if s.job.request.params.prompt_logprobs is None]
    scorer = next((s for s in prefilling if s not in filling), None)
    images: list[tuple[Slot, ImageSpan]] = []
    if budget > 0 and filling:
        starts: list[int] = []
        for slot in filling:
            done = slot.n_prompt_done
            for span in slot.job.images:
                if span.start == done:
                    images.append((slot, span))
                    done += span.n
            starts.append(done)
        wants = [next((s.start for s in slot.job.images if s.start >= done),
                      len(slot.job.tokens)) - done for slot, done in zip(filling, starts, strict=True)]
        for slot, done, take in zip(filling, starts, shares(budget, wants), strict=True):
            if align:
                take = min(take, align - done % align)
            if take > 0:
                feeds.append(_chunk(slot, n, done, take, every=False))
                n += take
    scored = None
    if scorer is not None:
        take = min(score_rows, len(scorer.job.tokens) - scorer.n_prompt_done)
        if align:
            take = min(take, align - scorer.n_prompt_done % align)
        scored = _chunk(scorer, 0, scorer.n_prompt_done, take, every=True)
    return StepPlan(tuple(generating), decision, tuple(images), tuple(feeds), scored)


def _chunk(slot: Slot, first: int, start: int, take: int, every: bool) -> Feed:
    """Prompt tokens ``start..start+take-1`` of the slot's job from row ``first``, with the
    logits of the prompt's last position when it is among them."""
    tokens = slot.job.tokens
    end = len(tokens) - 1
    logits = first + end - start if start <= end < start + take else -1
    return Feed(slot, first, tuple(tokens[start:start + take]), prompt=True, logits=logits,
                every=every)
