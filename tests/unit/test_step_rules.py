"""The scheduler's rules that need no model: n-gram drafts, each step's drafts and their limits,
a prediction followed through edits, the next draft's length, the gate, the LoRA sets' turns
and where a prompt goes. The end-to-end
files (test_speculative, test_lora, test_batching) check the same rules through real servers;
these pin each rule's edges."""

from __future__ import annotations

import numpy as np
import pytest

from app.base.errors import QueueFull
from app.engine.admission import Admission
from app.engine.kv import KvSeq
from app.engine.lora import next_set
from app.engine.prediction import Place, Prediction
from app.engine.slots import Job, Slot, next_waiting, place, shares
from app.engine.speculative import SpecConfig, SpecGate, next_draft_len, ngram_draft, propose
from app.engine.tokens import Mark, common_prefix
from app.engine.types import GenerationRequest, SamplingParams, Speculation


def test_ngram_draft_copies_what_followed_the_latest_match():
    #         the suffix [7, 8, 9] appeared twice before; the latest one is followed by 4, 5
    history = [7, 8, 9, 1, 2, 7, 8, 9, 4, 5, 6, 7, 8, 9]
    assert ngram_draft(history, 2) == [4, 5]
    assert ngram_draft(history, 10) == [4, 5, 6, 7, 8, 9]
    assert ngram_draft(history, 0) == []
    assert ngram_draft([1, 2, 3, 4, 5], 4) == []  # no suffix seen before
    assert ngram_draft([1, 2], 4) == []


def test_next_draft_len_halves_follows_or_doubles():
    assert next_draft_len(8, 0) == 4  # turned down at once
    assert next_draft_len(1, 0) == 1  # never below one
    assert next_draft_len(8, 3) == 4  # one past what was kept
    assert next_draft_len(8, 8) == 16  # all kept
    assert next_draft_len(100, 100) == 128  # within the limit


def _slot(seq_id: int, cached: list[int] = ()) -> Slot:
    """A slot whose KV holds ``cached`` (no llama: the rules read the mirror alone)."""
    slot = Slot(KvSeq(None, None, seq_id))
    slot.kv.decoded(cached)
    return slot


def _generating(seq_id: int, cached: list[int], spec: Speculation | None = None,
                max_new: int = 100) -> Slot:
    params = SamplingParams(speculative=spec or Speculation())
    job = Job(GenerationRequest("x", params), sink=lambda e: None)
    job.max_new = max_new
    slot = _slot(seq_id, cached[:-1])
    slot.job, slot.last_token = job, cached[-1]
    return slot


def test_propose_keeps_each_requests_limits_and_the_room_left():
    spec = SpecConfig(draft_max=4, draft_min=2, p_min=0.5, ngram=True, adaptive=False)
    copy = [5, 6, 7, 1, 2, 3, 4, 5, 6, 7]  # after 5 6 7 came 1 2 3 4
    slots = [
        _generating(0, copy),
        _generating(1, copy, Speculation(n_max=2)),
        _generating(2, copy, Speculation(n_max=0)),  # off for this request
        _generating(3, copy, max_new=2),  # one token left to generate: no room for a draft
        _generating(4, [1, 2, 3, 4]),  # nothing to copy
        _generating(5, copy, Speculation(n_max=100)),  # a request lowers the limit, never raises
    ]
    drafts = propose(spec, None, 4096, slots)
    assert drafts == {0: [1, 2, 3, 4], 1: [1, 2], 5: [1, 2, 3, 4]}
    slots[0].job.draft_len = 1  # its last draft fared badly: shorter, and under the minimum
    assert 0 not in propose(spec, None, 4096, slots)
    assert propose(spec, None, len(copy) + 3, slots[:1]) == {}  # the context is nearly full


def test_the_gate_measures_both_choices_then_keeps_the_faster_and_explores():
    gate = SpecGate()
    assert gate.choose(8) is True  # not measured with drafting yet
    gate.record(8, True, 40, 1.0)
    assert gate.choose(8) is False  # then without
    gate.record(8, False, 20, 1.0)
    picks = [gate.choose(8) for _ in range(2 * SpecGate.EXPLORE)]
    assert picks.count(False) == 2  # the slower choice is tried every EXPLORE-th step
    assert gate.choose(1) is True  # another width is measured apart
    assert gate.as_dict() == {"8:on": 40.0, "8:off": 20.0}


def test_lora_sets_take_turns_in_a_fixed_order():
    a, b, c = (), ((0, 1.0),), ((1, 0.5),)
    in_use = {a, b, c}
    order = [a]
    for _ in range(4):
        order.append(next_set(in_use, order[-1]))
    assert order == [a, b, c, a, b]
    assert next_set({c}, b) == c
    assert next_set({a, b}, c) == a  # round to the first


def test_a_prompt_goes_beside_the_running_sequences():
    slots = [_slot(i) for i in range(6)]
    slots[2].job = slots[3].job = Job(GenerationRequest("x"), sink=lambda e: None)
    free = [s for s in slots if s.job is None]
    none = {id(s): 0 for s in slots}
    slot, source = place(slots, free, none)
    assert slot.seq_id in (1, 4) and source is slot
    # a long cached prefix far away is copied over, not decoded again
    slots[0].kv.decoded(list(range(40)))
    shared = {**none, id(slots[0]): 40}
    slot, source = place(slots, free, shared)
    assert slot.seq_id in (1, 4) and source is slots[0]


def test_a_prediction_is_followed_while_the_reply_repeats_it():
    where = Place(Prediction([1, 2, 3, 4, 5, 6, 7, 8]))
    assert where.draft([1], 3) == [2, 3, 4]
    assert where.draft([1, 2, 3, 4], 3) == [5, 6, 7]  # three drafts kept at once
    assert where.matched == 4
    where.follow([1, 2, 3, 4, 5, 6, 7, 8])  # the reply's end
    assert where.usage() == (8, 8) and where.draft([1, 2, 3, 4, 5, 6, 7, 8], 3) == []


def test_after_an_edit_the_place_is_found_again_forward_first():
    #              the reply drops 9 9 and repeats 3 4 further on: 3 4 5 is found after it
    where = Place(Prediction([1, 2, 9, 9, 3, 4, 5, 3, 4, 6]))
    assert where.draft([1, 2], 4) == [9, 9, 3, 4]
    assert where.draft([1, 2, 3], 4) == []  # lost: 2 3 is nowhere in it
    assert where.draft([1, 2, 3, 4], 4) == [5, 3, 4, 6]  # 3 4 found again
    assert where.draft([1, 2, 3, 4, 5, 3, 4], 2) == [6]
    assert where.matched == 2 + 2 + 3  # 1 2; the 3 4 that found the where; 5 3 4
    assert where.usage() == (10, 7)


def test_a_reply_that_leaves_after_a_partial_draft_counts_what_it_kept():
    where = Place(Prediction(list(range(100, 140))))
    assert where.draft([100], 8) == list(range(101, 109))
    where.follow([100, 101, 102, 103, 104, 999])  # four kept, then the edit
    assert where.matched == 5 and where.lost


def test_a_reply_repeating_the_prediction_counts_at_most_its_length():
    where = Place(Prediction([1, 2, 3, 4]))
    where.follow([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4])
    assert where.usage() == (4, 4)


def test_the_place_found_again_is_the_nearest_forward_then_backward():
    pred = Prediction([5, 6, 1, 2, 5, 6, 3, 4, 5, 6, 7])
    assert pred.find([9, 5, 6], 5) == (6, 2)
    assert pred.find([9, 5, 6], 7) == (10, 2)
    assert pred.find([9, 5, 6], 11) == (10, 2)
    assert pred.find([2, 5, 6], 9) == (6, 3)  # a longer match wins over a nearer one
    assert pred.find([9, 8], 0) == (-1, 0)
    assert pred.find([6], 0) == (-1, 0)


def test_without_server_drafting_only_predictions_are_drafted():
    spec = SpecConfig(draft_max=4, draft_min=1, p_min=0.5, ngram=False, adaptive=True,
                      server=False)
    copy = [5, 6, 7, 1, 2, 3, 4, 5, 6, 7]
    with_pred = _generating(0, copy)
    with_pred.job.tokens = copy[:-1]  # the prompt: all but the first generated token
    with_pred.job.prediction = Place(Prediction([7, 8, 9]))
    drafts = propose(spec, None, 4096, [with_pred, _generating(1, copy)])
    assert drafts == {0: [8, 9]}


def test_equal_image_ids_are_the_same_image_only_with_the_same_digest():
    ids = [1, 2, -5, -5, -5, 3]  # an image of 3 tokens at 2: ids from 28 bits of its digest
    prompt = np.asarray(ids, dtype=np.int32)
    image, twin = Mark(2, 3, "a" * 64), Mark(2, 3, "a" * 7 + "b" * 57)
    assert common_prefix(ids, prompt, [image], [image]) == 6
    assert common_prefix(ids, prompt, [image], [twin]) == 2  # the same ids, another image
    assert common_prefix(ids, prompt, [], [image]) == 2  # a cache that cannot say which
    assert common_prefix(ids[:2], prompt, [], [twin]) == 2  # the prefix ends before it anyway
    assert common_prefix([1, 9], prompt, [], [twin]) == 1


def _keyed(scope: str) -> Job:
    return Job(GenerationRequest("x", cache_scope=scope), sink=lambda e: None)


def test_a_freed_slot_goes_to_the_key_holding_the_fewest_then_the_oldest():
    slots = [_slot(i) for i in range(3)]
    slots[0].job, slots[1].job = _keyed("b"), _keyed("b")
    waiting = [_keyed("b"), _keyed("b"), _keyed("a"), _keyed("c")]
    assert next_waiting(waiting, slots) == 2  # a holds none; b's queued ones wait
    slots[2].job = _keyed("a")
    assert next_waiting(waiting, slots) == 3  # c holds none either
    slots[2].job = _keyed("c")
    assert next_waiting(waiting, slots) == 2  # a and c hold one each: the older, a's
    assert next_waiting([_keyed(""), _keyed(""), _keyed("")], slots) == 0  # one scope: FIFO


def test_one_key_may_fill_the_slots_but_only_its_share_of_the_queue():
    adm = Admission(parallel=2, max_queue=4, max_queue_per_key=0)  # 0: half the queue
    for _ in range(4):
        adm.take("b", 1)  # its two slots and two places in the queue
    with pytest.raises(QueueFull, match="MAX_QUEUE_PER_KEY"):
        adm.take("b", 1)
    adm.take("a", 2)  # another key still gets in: the queue is full now
    with pytest.raises(QueueFull, match="already waiting"):
        adm.take("c", 1)
    adm.give("b")
    adm.take("b", 1)
    assert (adm.total, adm.by_scope) == (6, {"b": 4, "a": 2})


def test_without_keys_every_caller_is_one_scope_under_max_queue_alone():
    adm = Admission(parallel=2, max_queue=4, max_queue_per_key=1)
    for _ in range(6):
        adm.take("", 1)
    with pytest.raises(QueueFull, match="already waiting"):
        adm.take("", 1)


def test_prompts_share_a_steps_budget_the_short_ones_whole():
    assert shares(256, [4000]) == [256]
    assert shares(256, [4000, 12]) == [244, 12]  # the short one whole, the rest to the long
    assert shares(256, [4000, 3000]) == [128, 128]
    assert shares(256, [4000, 50, 3000]) == [103, 50, 103]
    assert shares(256, [4000, 100, 3000]) == [85, 86, 85]  # 100 is more than a third
    assert shares(5, [10, 10]) == [3, 2]  # a remainder to the first of the shorter
    assert shares(1, [50, 3, 9]) == [0, 1, 0]  # a budget nearly spent: the shortest first
    assert shares(0, [10]) == [0] and shares(64, []) == []
