"""Which free slot a new prompt takes (app.engine.llama_batch.Batch.admit), on the stand-in
for llama.cpp: a slot's cached KV is another conversation's next turn, so a few shared tokens
(a chat template's opening) must not evict it while an empty slot is free; a long shared prefix
(a system prompt) is worth taking over; a request that reuses nothing takes what costs least."""

from __future__ import annotations

from app.engine.llama_batch import Job
from app.engine.text import TextAssembler
from app.engine.types import GenerationRequest, SamplingParams
from tests.support.fake_llama import Sampler, run, scheduler

TEMPLATE = [1, 2]  # the opening every rendered chat shares
SYSTEM = list(range(3, 23))  # a long system prompt: 20 tokens


def job(tokens: list[int], ll, cache_prompt: bool = True) -> Job:
    req = GenerationRequest(tuple(tokens), SamplingParams(), cache_prompt=cache_prompt)
    return Job(req, sink=lambda ev: None, tokens=list(tokens), max_new=3,
               assembler=TextAssembler(()), sampler=Sampler(ll, 2))  # type: ignore[arg-type]


def served(sched, j: Job) -> Job:
    sched.waiting.append(j)
    run(sched)
    return j


def holding(sched, prefix: list[int]) -> list[int]:
    """Indexes of the slots whose cache starts with ``prefix``."""
    return [i for i, s in enumerate(sched.slots) if s.cached[:len(prefix)] == prefix]


def test_a_template_prefix_does_not_evict_a_conversation_while_a_slot_is_empty():
    sched, ll = scheduler(parallel=2)
    first = TEMPLATE + [24, 25, 26, 27, 28, 29]
    served(sched, job(first, ll))
    turn_one = list(sched.slots[holding(sched, first)[0]].cached)  # its prompt and reply
    assert len(turn_one) > len(first)
    other = served(sched, job(TEMPLATE + [9, 9, 9, 9], ll))
    assert other.cached_tokens == 0  # it took the empty slot ...
    assert holding(sched, turn_one)  # ... and the first conversation's KV is still there
    turn_two = served(sched, job(turn_one + [10, 11], ll))
    assert turn_two.cached_tokens == len(turn_one)


def test_a_long_shared_system_prompt_takes_the_slot_that_holds_it():
    sched, ll = scheduler(parallel=2)
    served(sched, job(TEMPLATE + SYSTEM + [24, 25], ll))
    second = served(sched, job(TEMPLATE + SYSTEM + [26, 27], ll))
    assert second.cached_tokens == len(TEMPLATE + SYSTEM)


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
