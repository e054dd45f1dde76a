"""The host-RAM prompt cache (app/engine/prompt_cache.py): its bookkeeping (bounded in bytes,
least recently used out first, by key scope, an entry extended by a later one dropped), and the
scheduler over the stand-in for llama.cpp keeping a conversation aside when its slot is taken
and copying it back for its next turn: the same reply as decoding it again, fewer tokens
decoded, never across key scopes, and a blob llama.cpp refuses costing only the decode."""

from __future__ import annotations

import ctypes

import numpy as np

from app.engine.prompt_cache import Entry, PromptCache
from app.engine.scheduler import Features
from app.engine.types import GenerationRequest, SamplingParams, TextPiece
from tests.support.fake_llama import job, run, scheduler


def _text(events: list) -> str:
    return "".join(e.text for e in events if isinstance(e, TextPiece))


def _entry(scope: str, tokens: list[int], size: int = 10) -> Entry:
    return Entry(scope, np.asarray(tokens, dtype=np.int32), (), len(tokens),
                 (ctypes.c_uint8 * size)())


def test_the_cache_is_bounded_by_bytes_least_recently_used_out_first():
    cache = PromptCache(max_bytes=25)
    a, b, c = _entry("k", [1, 2, 3]), _entry("k", [4, 5, 6]), _entry("k", [7, 8, 9])
    assert cache.put(a) and cache.put(b) and cache.bytes == 20
    assert cache.put(c)  # a, the oldest, goes for room
    assert cache.entries() == [b, c] and cache.bytes == 20 and cache.stats.evicted == 1
    assert not cache.put(_entry("k", [1], size=26))  # over the bound alone: refused
    assert cache.entries() == [b, c]


def test_the_best_entry_is_the_longest_prefix_within_the_scope():
    cache = PromptCache(max_bytes=1000)
    short, long_, other = _entry("k", [1, 2, 9]), _entry("k", [1, 2, 3, 4]), _entry("j", [1, 2, 3, 4, 5])
    for e in (short, long_, other):
        cache.put(e)
    prompt = np.asarray([1, 2, 3, 4, 5, 6], dtype=np.int32)
    assert cache.best("k", prompt) == (long_, 4)
    assert cache.best("j", prompt) == (other, 5)
    assert cache.best("nobody", prompt) == (None, 0)
    assert cache.covers("k", [1, 2, 3]) and not cache.covers("k", [1, 2, 3, 4, 5])


def test_a_recurrent_model_takes_only_an_entry_its_prompt_holds_whole():
    cache = PromptCache(max_bytes=1000, whole_only=True)
    long_, short = _entry("k", [1, 2, 3, 4, 9]), _entry("k", [1, 2, 7])
    cache.put(long_)
    cache.put(short)
    prompt = np.asarray([1, 2, 3, 4, 5, 6], dtype=np.int32)
    assert cache.best("k", prompt) == (None, 0)  # each shares a prefix, neither whole
    whole = _entry("k", [1, 2, 3])
    cache.put(whole)
    assert cache.best("k", prompt) == (whole, 3)


def test_an_entry_another_extends_is_dropped():
    cache = PromptCache(max_bytes=1000)
    first = _entry("k", [1, 2, 3])
    cache.put(first)
    cache.put(_entry("j", [1, 2, 3, 4]))  # another scope's: the first stays
    assert first in cache.entries()
    longer = _entry("k", [1, 2, 3, 4])
    cache.put(longer)
    assert first not in cache.entries() and longer in cache.entries()
    cache.take(longer)
    assert len(cache) == 1 and cache.bytes == 10


A = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 3  # two conversations, one slot between them
B = [20, 21, 22, 23, 24, 25, 26, 27, 28] * 4


def _turns(cache: PromptCache | None, second_scope: str = "") -> tuple[str, int, list, list]:
    """A, then B in the only slot, then A's next turn (A, its reply, more); A's second reply,
    its cached tokens, and the copies out and back."""
    sched, ll = scheduler(parallel=1, chunk=8, n_ctx=256, features=Features(prompt_cache=cache))
    first: list = []
    sched.waiting.append(job(A, ll, first, max_new=4, stop_after=99))
    run(sched)
    sched.waiting.append(job(B, ll, [], max_new=4, stop_after=99))
    run(sched)
    reply = [ord(c) - ord("a") for c in _text(first)]
    again: list = []
    nxt = job([*A, *reply, 13, 14, 15], ll, again, max_new=6, stop_after=99)
    nxt.request = GenerationRequest(tuple(nxt.tokens), SamplingParams(), cache_scope=second_scope)
    sched.waiting.append(nxt)
    run(sched)  # each step checks the KV mirror against the cells
    return _text(again), nxt.cached_tokens, ll.saves, ll.restores


def test_a_conversation_whose_slot_was_taken_is_copied_back_for_its_next_turn():
    plain, plain_cached, saves, _ = _turns(None)
    assert plain_cached == 0 and saves == []  # without the cache: decoded again
    cache = PromptCache(max_bytes=1 << 20, min_tokens=8)
    text, cached, saves, restores = _turns(cache)
    assert text == plain  # the same reply
    # A and its reply came back (but the reply's last token, sampled and never decoded): only
    # the new turn is decoded
    assert cached == len(A) + 3
    assert saves == [0, 0] and restores == [0]  # A kept aside when B came, B when A came back
    assert cache.stats.restored == 1 and cache.stats.restored_tokens == cached
    assert [len(e.tokens) for e in cache.entries()] == [len(B) + 3]  # B waits its turn


def test_another_scope_never_gets_a_conversation_kept_aside():
    cache = PromptCache(max_bytes=1 << 20, min_tokens=8)
    _, cached, _, restores = _turns(cache, second_scope="another key")
    assert cached == 0 and restores == [] and cache.stats.restored == 0


def test_a_blob_llama_cpp_refuses_costs_only_the_decode():
    plain, *_ = _turns(None)
    cache = PromptCache(max_bytes=1 << 20, min_tokens=8)
    real_put = cache.put

    def spoiled(entry: Entry) -> bool:  # every blob kept aside is damaged
        entry.blob[0] = 0
        return real_put(entry)

    cache.put = spoiled  # type: ignore[method-assign]
    text, cached, _, restores = _turns(cache)
    assert restores == [0] and cache.stats.failed == 1  # tried, refused, dropped
    assert text == plain and cached == 0


def test_a_short_conversation_is_not_worth_a_copy():
    cache = PromptCache(max_bytes=1 << 20, min_tokens=64)  # A and B are shorter
    _, cached, saves, _ = _turns(cache)
    assert saves == [] and cached == 0 and len(cache) == 0


def test_a_recurrent_models_entry_survives_its_own_prompt_asked_again():
    cache = PromptCache(max_bytes=1 << 20, min_tokens=8, whole_only=True)
    sched, ll = scheduler(parallel=1, chunk=8, n_ctx=256, features=Features(prompt_cache=cache))
    sched.waiting.append(job(A, ll, [], max_new=2, stop_after=99))
    run(sched)
    sched.waiting.append(job(B, ll, [], max_new=2, stop_after=99))
    run(sched)  # A kept aside whole
    kept = cache.entries()[0]
    again = job(list(kept.tokens), ll, [], max_new=2, stop_after=99)  # all of it, no more
    sched.waiting.append(again)
    run(sched)
    # the prompt holds the entry but has no token after it: a recurrent memory could not keep
    # it less the last token, so it stays in the cache rather than being lost to a clear
    assert ll.restores == [] and kept in cache.entries()
