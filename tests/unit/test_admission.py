"""Which free slot a new prompt takes (app.engine.scheduler.Scheduler.admit), on the stand-in
for llama.cpp: a slot's cached KV is another conversation's next turn, so a few shared tokens
(a chat template's opening) must not evict it while an empty slot is free; a long shared prefix
(a system prompt) is copied to where the prompt goes; a request that reuses nothing takes what
costs least.
And the running sequences stay side by side (llama.cpp attends over every KV stream between the
lowest and the highest id in a batch), a cached prefix in a slot away from them copied over.
Which waiting request a freed slot goes to (another key's before this key's queue), and a short
prompt beside a long one sharing the step's budget."""

from __future__ import annotations

from app.engine.slots import Job
from app.engine.text import TextAssembler
from app.engine.types import GenerationRequest, SamplingParams
from tests.support.fake_llama import Sampler, run, scheduler, step

TEMPLATE = [1, 2]  # the opening every rendered chat shares
SYSTEM = list(range(3, 23))  # a long system prompt: 20 tokens


def job(tokens: list[int], ll, cache_prompt: bool = True, length: int = 2) -> Job:
    req = GenerationRequest(tuple(tokens), SamplingParams(), cache_prompt=cache_prompt)
    return Job(req, sink=lambda ev: None, tokens=list(tokens), max_new=length + 1,
               assembler=TextAssembler(()), sampler=Sampler(ll, length))  # type: ignore[arg-type]


def served(sched, j: Job) -> Job:
    sched.waiting.append(j)
    run(sched)
    return j


def holding(sched, prefix: list[int]) -> list[int]:
    """Indexes of the slots whose cache starts with ``prefix``."""
    return [i for i, s in enumerate(sched.slots) if list(s.kv.tokens[:len(prefix)]) == prefix]


def test_a_template_prefix_does_not_evict_a_conversation_while_a_slot_is_empty():
    sched, ll = scheduler(parallel=2)
    first = TEMPLATE + [24, 25, 26, 27, 28, 29]
    served(sched, job(first, ll))
    turn_one = list(sched.slots[holding(sched, first)[0]].kv.tokens)  # its prompt and reply
    assert len(turn_one) > len(first)
    other = served(sched, job(TEMPLATE + [9, 9, 9, 9], ll))
    assert other.cached_tokens == 0  # it took the empty slot ...
    assert holding(sched, turn_one)  # ... and the first conversation's KV is still there
    turn_two = served(sched, job(turn_one + [10, 11], ll))
    assert turn_two.cached_tokens == len(turn_one)


def test_a_long_shared_system_prompt_is_copied_and_the_conversation_kept():
    sched, ll = scheduler(parallel=2)
    first = TEMPLATE + SYSTEM + [24, 25]
    served(sched, job(first, ll))
    turn_one = list(sched.slots[holding(sched, first)[0]].kv.tokens)
    second = served(sched, job(TEMPLATE + SYSTEM + [26, 27], ll))
    assert second.cached_tokens == len(TEMPLATE + SYSTEM)
    assert ll.copies  # the prefix came over to the empty slot ...
    assert holding(sched, turn_one)  # ... and the first conversation is whole


def test_a_short_shared_prefix_is_decoded_again_not_copied():
    sched, ll = scheduler(parallel=2)
    served(sched, job(TEMPLATE + [24, 25, 26], ll))
    again = served(sched, job(TEMPLATE + [27, 28, 29], ll))
    assert again.cached_tokens == 0 and not ll.copies


def test_a_request_without_prompt_caching_leaves_cached_slots_alone():
    sched, ll = scheduler(parallel=2)
    first = TEMPLATE + SYSTEM + [24, 25]
    served(sched, job(first, ll))
    uncached = served(sched, job(first, ll, cache_prompt=False))
    assert uncached.cached_tokens == 0
    # both slots now hold that prompt: the uncached request took the empty one
    assert len(holding(sched, first)) == 2


def test_with_every_slot_full_the_least_cache_is_lost():
    sched, ll = scheduler(parallel=2)
    long_one = TEMPLATE + SYSTEM + [24]
    short_one = TEMPLATE + [25, 26]
    served(sched, job(long_one, ll))
    served(sched, job(short_one, ll))
    served(sched, job([27, 28, 29], ll))  # shares nothing with either
    assert holding(sched, long_one)
    assert not holding(sched, short_one)


def running(sched) -> list[int]:
    return sorted(s.seq_id for s in sched.slots if s.job is not None)


def start(sched, j: Job) -> int:
    """Admit ``j`` beside whatever runs; the seq id it got."""
    sched.waiting.append(j)
    step(sched)
    return next(s.seq_id for s in sched.slots if s.job is j)


def test_running_sequences_stay_side_by_side_as_requests_come_and_go():
    sched, ll = scheduler(parallel=8)
    for s in sched.slots:  # the least recently used slots are far apart
        s.last_used = -float(s.seq_id % 2)
    jobs = [job([3 + i, 4, 5], ll, length=40) for i in range(4)]
    for j in jobs:
        start(sched, j)
    ids = running(sched)
    assert ids[-1] - ids[0] == len(ids) - 1  # side by side, not one slot in two
    # one in the middle ends: the next request fills its place
    middle = sched.slots[ids[1]]
    middle.job.control.cancel()
    sched.reap()
    assert start(sched, job([9, 9, 9], ll, length=40)) == middle.seq_id
    assert running(sched) == ids


def test_a_prefix_cached_away_from_the_running_slots_is_copied_next_to_them():
    sched, ll = scheduler(parallel=8)
    conversation = TEMPLATE + SYSTEM + [24, 25]
    served(sched, job(conversation, ll))
    far = holding(sched, conversation)[0]
    turn_one = list(sched.slots[far].kv.tokens)
    # sequences now run at the other end
    for s in sched.slots:
        s.last_used = 0.0 if abs(s.seq_id - far) > 3 else 1.0
    runner = job([27, 28], ll, length=40)
    at = start(sched, runner)
    assert abs(at - far) > 3
    turn_two = job(turn_one + [10, 11], ll)
    placed = start(sched, turn_two)
    assert abs(placed - at) == 1  # beside the running one
    assert (far, placed) in ll.copies  # the cached conversation came with it
    assert turn_two.cached_tokens == len(turn_one)
    assert holding(sched, turn_one)  # and it is still where it was, for whoever needs it


def test_a_running_sequence_lends_its_prompt_to_a_new_one():
    sched, ll = scheduler(parallel=4, chunk=64)
    prompt = TEMPLATE + SYSTEM + [24]
    runner = job(prompt, ll, length=40)
    at = start(sched, runner)
    twin = job(TEMPLATE + SYSTEM + [25, 26], ll)
    placed = start(sched, twin)
    assert placed != at and (at, placed) in ll.copies
    assert twin.cached_tokens == len(TEMPLATE + SYSTEM)


def test_a_cancelled_reply_leaves_its_kv_for_the_next_turn():
    sched, ll = scheduler(parallel=2, chunk=64)
    prompt = TEMPLATE + SYSTEM + [24]
    stopped = job(prompt, ll, length=40)
    start(sched, stopped)
    step(sched)
    stopped.control.cancel()
    sched.reap()
    kept = list(next(s.kv.tokens for s in sched.slots if s.kv.tokens))
    assert kept[:len(prompt)] == prompt and len(kept) > len(prompt)
    nxt = served(sched, job(kept + [27, 28], ll))
    assert nxt.cached_tokens == len(kept)


def test_kv_of_the_public_scope_serves_every_scope_and_a_keys_serves_its_own():
    from app.engine.slots import PUBLIC

    sched, ll = scheduler(parallel=3, chunk=64)
    opening = job(TEMPLATE + SYSTEM, ll)
    opening.request = GenerationRequest(tuple(opening.tokens), SamplingParams(), cache_scope=PUBLIC)
    served(sched, opening)
    keyed = job(TEMPLATE + SYSTEM + [24], ll)
    keyed.request = GenerationRequest(tuple(keyed.tokens), SamplingParams(), cache_scope="key-a")
    served(sched, keyed)
    assert keyed.cached_tokens == len(TEMPLATE + SYSTEM)
    other = job(TEMPLATE + SYSTEM + [24, 25], ll)
    other.request = GenerationRequest(tuple(other.tokens), SamplingParams(), cache_scope="key-b")
    served(sched, other)
    assert other.cached_tokens == len(TEMPLATE + SYSTEM)  # the public part only, not key-a's


def keyed(tokens: list[int], ll, scope: str, length: int = 40) -> Job:
    j = job(tokens, ll, length=length)
    j.request = GenerationRequest(tuple(tokens), SamplingParams(), cache_scope=scope)
    return j


def test_a_freed_slot_goes_to_another_key_before_this_keys_queued_requests():
    sched, ll = scheduler(parallel=2)
    b1, b2 = keyed([3, 4, 5], ll, "key-b"), keyed([6, 7, 8], ll, "key-b")
    start(sched, b1)
    start(sched, b2)
    queued = [keyed([9, 10, 11], ll, "key-b"), keyed([12, 13, 14], ll, "key-b")]
    sched.waiting.extend(queued)
    a = keyed([15, 16, 17], ll, "key-a")
    sched.waiting.append(a)  # last in, behind key B's two
    b1.control.cancel()
    sched.reap()
    sched.admit()
    assert [s.job for s in sched.slots if s.job is not None] == [a, b2]
    assert list(sched.waiting) == queued  # then B's, in their order


def test_a_short_prompt_beside_a_long_one_gets_its_first_token_before_the_long_one_ends():
    """The step's prompt budget is shared: a short prompt admitted while a long one is being
    decoded in chunks gets its first token in a step or two, not after the long prompt (in slot
    order, the lower slot's long prompt took the whole budget until it was done)."""
    from tests.support.fake_llama import job as fake_job

    sched, ll = scheduler(parallel=2, chunk=16)
    seen: list = []
    long = fake_job(list(range(1, 29)) * 5, ll, seen)  # 140 tokens: 9 steps of 16
    sched.waiting.append(long)
    step(sched)
    short = fake_job([3, 4, 5], ll, seen)
    sched.waiting.append(short)
    held = next(s for s in sched.slots if s.job is long)
    for _ in range(20):
        step(sched)
        if short.n_generated:
            break
    assert short.n_generated == 1
    assert held.n_prompt_done < len(long.tokens)  # the long prompt is still being decoded
