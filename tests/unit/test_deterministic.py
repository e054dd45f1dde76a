"""DETERMINISTIC's rules (app.engine.deterministic) on the scheduler over the stand-in for
llama.cpp: one sequence per decode, the slots taking turns; prompts cut at multiples of the
chunk whatever prefix was reused; only canonically decoded cells reused or kept; and the same
rows decoded for a request whether it ran alone, beside others, or after a cache hit."""

from __future__ import annotations

from app.engine.deterministic import Canon
from app.engine.llama_media import ImageSpan
from app.engine.prompt_cache import PromptCache
from app.engine.scheduler import Features
from app.engine.slots import Job
from app.engine.types import TextPiece
from tests.support.fake_llama import job as make_job
from tests.support.fake_llama import run, scheduler, step

CHUNK = 8


def _det(parallel: int = 2, cache: PromptCache | None = None):
    return scheduler(parallel=parallel, chunk=CHUNK, n_ctx=256,
                     features=Features(prompt_cache=cache, canon=Canon(CHUNK)))


def _pieces(ll, seq: int) -> list[tuple[int, int]]:
    """The (first, last) positions of each decode of ``seq``'s rows."""
    return [(min(p for s, p in d if s == seq), max(p for s, p in d if s == seq))
            for d in ll.decodes if any(s == seq for s, _ in d)]


def test_reuse_takes_canonical_cells_only_up_to_where_the_new_prompt_is_cut_too():
    c = Canon(8)
    _, ll = _det()
    plain = make_job(list(range(1, 31)), ll, [])
    assert c.reuse(plain, 30, 24) == 24  # all the canonical cells
    assert c.reuse(plain, 20, 24) == 16  # back to where a fresh run's chunk starts
    assert c.reuse(plain, 7, 24) == 0
    assert c.reuse(plain, 0, 0) == 0
    # canonical cells ending where another prompt's image started: not a cut of this prompt
    assert c.reuse(plain, 30, 20) == 16
    with_image = make_job(list(range(1, 31)), ll, [])
    with_image.images = [ImageSpan(20, 5, None, None, -5, 5, "d")]
    assert c.reuse(with_image, 30, 20) == 20  # ... but of this one, whose image starts there
    assert c.reuse(with_image, 30, 25) == 25  # ... and ends there
    inside = make_job(list(range(1, 31)), ll, [])
    inside.images = [ImageSpan(10, 8, None, None, -5, 8, "d")]
    assert c.reuse(inside, 17, 40) == 10  # never inside an image: back to its start


def test_the_adapter_sets_each_take_turns_of_their_own():
    c = Canon(8)
    sched, _ = _det(parallel=3)
    s0, s1, s2 = sched.slots
    picks = []
    for lora in ("a", "b", "a", "b", "a", "b"):  # the sets served in turn
        gen = [s0, s2] if lora == "a" else [s1]
        picks.append(c.one(gen, [], lora)[0][0].seq_id)
    assert picks == [0, 1, 2, 1, 0, 1]  # set a's slots alternate: neither starves


def test_the_slots_take_turns_and_each_decode_holds_one_sequence():
    sched, ll = _det(parallel=2)
    a, b = [], []
    sched.waiting.append(make_job([1, 2, 3, 4, 5] * 4, ll, a, max_new=6, stop_after=9))
    sched.waiting.append(make_job([6, 7, 8] * 5, ll, b, max_new=6, stop_after=9))
    run(sched, limit=80)
    assert all(len({s for s, _ in d}) == 1 for d in ll.decodes)  # never two sequences
    seqs = [d[0][0] for d in ll.decodes]
    # while both have work, they alternate
    both = seqs[: 2 * min(seqs.count(0), seqs.count(1))]
    assert all(x != y for x, y in zip(both, both[1:], strict=False))
    assert len(a) > 0 and len(b) > 0


def test_prompt_pieces_end_at_multiples_of_the_chunk_after_any_reuse():
    sched, ll = _det(parallel=1)
    first = [1, 2, 3, 4, 5, 6, 7] * 3  # 21 tokens
    sched.waiting.append(make_job(first, ll, [], max_new=3, stop_after=2))
    run(sched)
    assert _pieces(ll, 0)[:3] == [(0, 7), (8, 15), (16, 20)]
    # kept: the canonical cells only (the last piece, 16..20, and the reply were cut short)
    assert len(sched.slots[0].kv) == 16 == sched.slots[0].kv.canonical
    ll.decodes.clear()
    second = first + [9, 10, 11, 12, 13, 14]  # 27 tokens, extending the first
    j = make_job(second, ll, [], max_new=1, stop_after=1)
    sched.waiting.append(j)
    run(sched)
    assert j.cached_tokens == 16
    assert _pieces(ll, 0)[0] == (16, 23) and _pieces(ll, 0)[1] == (24, 26)


def _rows_of(prompt: list[int], setup) -> list[list[tuple[int, int]]]:
    """The decodes of the request ``prompt`` (its rows: seq mapped to 0) after ``setup``."""
    sched, ll = _det(parallel=4)
    setup(sched, ll)
    ll.decodes.clear()
    got: list = []
    j = make_job(prompt, ll, got, max_new=5, stop_after=9)
    sched.waiting.append(j)
    others = [make_job([20 + k, 3, 4, 5, 6, 7] * 3, ll, [], max_new=5, stop_after=9)
              for k in range(3)] if setup is _busy else []
    sched.waiting.extend(others)
    run(sched, limit=200)
    seq = next(s.seq_id for s in sched.slots if s.kv.tokens[:3] == prompt[:3])
    pos0 = j.cached_tokens
    text = "".join(e.text for e in got if isinstance(e, TextPiece))
    return [[(0, p) for s, p in d] for d in ll.decodes if d[0][0] == seq], pos0, text


def _alone(sched, ll) -> None:
    pass


def _busy(sched, ll) -> None:
    pass


def _after_prefix(sched, ll) -> None:
    """A conversation that shares the request's first 19 tokens ran before."""
    sched.waiting.append(make_job(PROMPT[:19] + [30, 30], ll, [], max_new=4, stop_after=9))
    run(sched)


PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11] * 3  # 33 tokens


def test_a_request_decodes_the_same_rows_alone_beside_others_and_after_a_prefix_hit():
    rows, start, text = _rows_of(PROMPT, _alone)
    assert start == 0
    busy, start_b, text_b = _rows_of(PROMPT, _busy)
    assert busy == rows and text_b == text
    hit, start_h, text_h = _rows_of(PROMPT, _after_prefix)
    assert start_h == 16  # the prefix's canonical cells: 2 chunks of the 19 shared tokens
    # from there on, the same pieces as alone, then the same steps
    assert hit == [r for r in rows if r[0][1] >= 16] and text_h == text


def test_a_restored_prompt_holds_canonical_cells_only():
    cache = PromptCache(1 << 20, min_tokens=8)
    sched, ll = _det(parallel=1, cache=cache)
    long = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10] * 4 + [11, 12, 13]  # 43 tokens
    first = make_job(long, ll, [], max_new=3, stop_after=2)
    sched.waiting.append(first)
    run(sched)
    other = make_job([12] * 20, ll, [], max_new=2, stop_after=1)
    sched.waiting.append(other)  # takes the only slot: the first conversation is kept aside
    run(sched)
    assert len(cache) == 1 and len(cache.entries()[0].tokens) == 40
    again: Job = make_job(long + [14, 15], ll, [], max_new=1, stop_after=1)
    sched.waiting.append(again)
    ll.decodes.clear()
    step(sched)
    assert again.cached_tokens == 40
    assert _pieces(ll, 0)[0] == (40, 44)
