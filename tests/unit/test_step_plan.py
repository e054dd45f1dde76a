"""A scheduler step as a value (app.engine.step_plan), asserted without llama.cpp: which
sequences generate and which decode prompt chunks, the drafts and their room, text injected,
images first, a prompt being scored alone, and where logits are read. And the records the plan
reads: a slot's phase, a sequence's KV mirror (images kept with their tokens), and a job's
control, the one part of it other threads touch."""

from __future__ import annotations

from app.engine.kv import KvSeq
from app.engine.llama_media import ImageSpan
from app.engine.slots import Job, JobControl, Phase, Slot
from app.engine.speculative import SpecConfig, SpecGate
from app.engine.step_plan import DraftDecision, Injection, at_work, decide_drafts, plan_step
from app.engine.types import GenerationRequest, SamplingParams
from tests.support.fake_llama import Llama, LlamaBatch

SPEC = SpecConfig(draft_max=4, draft_min=1, p_min=0.5, ngram=True, adaptive=False)


def _slot(seq_id: int, prompt: list[int], done: int | None = None, lora=(),
          prompt_logprobs: int | None = None) -> Slot:
    """A slot serving a job with ``prompt``, ``done`` of it decoded (all: generating)."""
    done = len(prompt) if done is None else done
    params = SamplingParams(prompt_logprobs=prompt_logprobs)
    job = Job(GenerationRequest(tuple(prompt), params, lora=lora), sink=lambda e: None,
              tokens=list(prompt), max_new=50)
    slot = Slot(KvSeq(None, None, seq_id), job=job, n_prompt_done=done, last_token=7)
    slot.kv.decoded(prompt[:done])
    return slot


def _plan(generating, prefilling, drafts=None, injections=None, budget=16, rows=4):
    return plan_step(generating, prefilling, DraftDecision(), drafts or {}, injections or {},
                     budget, rows, n_ctx=256)


def test_generating_sequences_come_first_then_prompts_share_what_is_left():
    gen = [_slot(0, [1, 2, 3]), _slot(1, [4, 5])]
    long, short = _slot(2, list(range(40)), done=0), _slot(3, [9, 9, 9], done=0)
    plan = _plan(gen, [long, short])
    assert [(f.slot.seq_id, f.first, f.tokens, f.logits) for f in plan.feeds] == [
        (0, 0, (7,), 0), (1, 1, (7,), 1),  # each one token, its logits read
        (2, 2, tuple(range(11)), -1),  # the long prompt's share: no logits before its end
        (3, 13, (9, 9, 9), 15),  # the short prompt whole: logits at its last position
    ]
    assert plan.rows == 16 and plan.chunked and plan.scored is None


def test_drafts_take_half_the_budget_while_prompts_wait():
    gen = [_slot(0, [1, 2]), _slot(1, [3, 4])]
    drafts = {0: [5] * 10, 1: [6] * 10}
    alone = _plan(gen, [], drafts)
    assert [f.draft for f in alone.feeds] == [(5,) * 10, (6,) * 4]  # the budget, 16 in all
    beside = _plan(gen, [_slot(2, list(range(30)), done=0)], drafts)
    assert [len(f.draft) for f in beside.feeds[:2]] == [8, 0]  # half of 16 for drafts
    assert beside.feeds[2].tokens == tuple(range(6))  # the prompt gets the rest
    assert beside.feeds[0].end == 9 and beside.feeds[1].first == 9


def test_injected_text_rides_with_the_last_token_when_it_fits():
    gen = [_slot(0, [1, 2]), _slot(1, [3, 4])]
    fits = Injection("xyz", (23, 24, 25), dropped=False)
    plan = _plan(gen, [], drafts={0: [5, 5]}, injections={0: fits, 1: fits}, budget=5)
    assert plan.feeds[0].tokens == (7, 23, 24, 25) and plan.feeds[0].logits == 3
    assert plan.feeds[0].draft == ()  # no draft beside injected text
    assert plan.feeds[1].tokens == (7,) and plan.feeds[1].injection is None  # no room: later
    dropped = Injection("xyz", (23, 24, 25), dropped=True)
    plan = _plan(gen[:1], [], injections={0: dropped})
    assert plan.feeds[0].tokens == (7,) and plan.feeds[0].injection is dropped  # only taken


def test_an_image_at_the_next_position_is_decoded_first_and_the_chunk_follows_it():
    slot = _slot(0, [1, 2, -5, -5, -5, 3, 4], done=2)
    span = ImageSpan(2, 3, None, None, -5, 3, "a" * 64)
    slot.job.images = [span]
    plan = _plan([], [slot])
    assert plan.images == ((slot, span),)
    assert plan.feeds[0].tokens == (3, 4) and plan.feeds[0].logits == 1
    before = _slot(1, [1, 2, -5, -5, -5, 3], done=0)
    before.job.images = [ImageSpan(2, 3, None, None, -5, 3, "a" * 64)]
    assert _plan([], [before]).feeds[0].tokens == (1, 2)  # up to the image, no further


def test_a_prompt_being_scored_gets_a_decode_of_its_own():
    scored = _slot(0, list(range(10)), done=4, prompt_logprobs=1)
    plan = _plan([_slot(1, [1, 2])], [scored], rows=4)
    assert [f.slot.seq_id for f in plan.feeds] == [1]
    s = plan.scored
    assert s is not None and (s.first, s.tokens, s.every, s.logits) == (0, (4, 5, 6, 7), True, -1)
    last = _plan([], [_slot(2, list(range(6)), done=4, prompt_logprobs=0)]).scored
    assert last.tokens == (4, 5) and last.logits == 1  # the prompt's end: sampled there


def test_a_step_serves_one_adapter_set_and_each_slot_by_its_phase():
    base, tuned = _slot(0, [1, 2]), _slot(1, [3, 4], lora=((0, 1.0),))
    filling = _slot(2, [5, 6, 7], done=1)
    waiting = _slot(3, [5, 6, 7], done=0)
    waiting.follows = filling
    idle = Slot(KvSeq(None, None, 4))
    assert [s.phase for s in (base, filling, waiting, idle)] == [
        Phase.GENERATING, Phase.PREFILLING, Phase.WAITING, Phase.IDLE]
    assert at_work([base, tuned, filling, waiting, idle], ()) == ([base], [filling])
    assert at_work([base, tuned, filling], ((0, 1.0),)) == ([tuned], [])


def test_the_draft_decision():
    gate, pred_gate = SpecGate(), SpecGate()
    gen = [_slot(0, [1, 2]), _slot(1, [3, 4])]
    assert decide_drafts(None, gate, pred_gate, gen) == DraftDecision()  # speculation off
    assert decide_drafts(SPEC, gate, pred_gate, []) == DraftDecision()  # nobody generating
    always = decide_drafts(SPEC, gate, pred_gate, gen)
    assert always == DraftDecision(tuple(gen), True, gate) and not gate.steps  # not adaptive
    adaptive = SpecConfig(4, 1, 0.5, ngram=True, adaptive=True)
    first = decide_drafts(adaptive, gate, pred_gate, gen)
    assert first.drafting and gate.steps == {2: 1}  # the gate measures drafting first
    gate.record(2, True, 10, 1.0)
    assert decide_drafts(adaptive, gate, pred_gate, gen) == DraftDecision((), False, gate)
    # without the server's own drafts only a prediction drafts, measured by its own gate
    own = SpecConfig(4, 1, 0.5, ngram=False, adaptive=False, server=False)
    assert decide_drafts(own, gate, pred_gate, gen) == DraftDecision()
    from app.engine.prediction import Place, Prediction

    gen[1].job.prediction = Place(Prediction([1, 2, 3]))
    assert decide_drafts(own, gate, pred_gate, gen) == DraftDecision((gen[1],), True, pred_gate)


def test_a_sequences_kv_keeps_its_images_with_its_tokens():
    ll = Llama(LlamaBatch(8))
    a, b = KvSeq(ll, None, 0), KvSeq(ll, None, 1)
    a.decoded([1, 2])
    image = ImageSpan(2, 3, None, None, -5, 1, "d" * 64)  # M-RoPE: 3 tokens on 1 position
    a.decoded_image(image, after=3)
    a.decoded([4])
    assert (list(a.tokens), a.marks, a.n_pos) == ([1, 2, -5, -5, -5, 4], [image.mark], 4)
    b.copy_from(a)
    assert (list(b.tokens), b.marks, b.n_pos) == (list(a.tokens), [image.mark], 4)
    assert b.keep_first(5, pos=3) == 5 and b.marks == [image.mark]
    assert b.keep_first(2, pos=2) == 2 and b.marks == [] and b.n_pos == 2
    b.decoded([3], drafted=2)  # two drafted cells past the mirror
    b.draft_kept(9)
    assert (list(b.tokens), b.drafted, b.n_pos) == ([1, 2, 3, 9], 1, 4)
    b.drop_draft()
    assert b.drafted == 0


def test_a_memory_that_cannot_drop_a_suffix_starts_afresh():
    class Recurrent(Llama):
        def llama_memory_seq_rm(self, mem, seq, p0, p1):
            return p0 < 0 and super().llama_memory_seq_rm(mem, seq, p0, p1)

    kv = KvSeq(Recurrent(LlamaBatch(8)), None, 0)
    kv.decoded([1, 2, 3])
    assert kv.keep_first(2, pos=2) == 0 and list(kv.tokens) == [] and kv.n_pos == 0
    kv.decoded([1, 2])
    assert kv.keep_first(2, pos=2) == 2  # nothing to drop: nothing asked of the memory


def test_a_jobs_control_is_what_other_threads_touch():
    control = JobControl()
    control.inject("</th", b"</think>")
    control.inject("ink>", b"</think>")
    assert control.injecting and control.pending() == ("</think>", b"</think>")
    text, _ = control.pending()
    control.inject("!")  # comes while the engine injects what it read
    control.take(text)
    assert control.pending() == ("!", b"")  # kept for the next step
    job = Job(GenerationRequest("x"), sink=lambda e: None)
    assert not job.cancelled
    job.control.cancel()
    assert job.cancelled
