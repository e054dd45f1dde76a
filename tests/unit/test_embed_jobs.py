"""The embedding decode planner (app.engine.embed_jobs.pick): turns by waiting time, riding
along only when finished by the decode, an input always whole, bad inputs dropped."""

from __future__ import annotations

from app.base.bridge import Channel
from app.engine.embed import EmbedRequest
from app.engine.embed_jobs import Input, Job, pick


def job(n: int, tokens: int, since: float, bad: frozenset[int] = frozenset()) -> Job:
    j = Job(EmbedRequest(tuple(f"x{i}" for i in range(n))), Channel(), None, since)
    j.todo.extend(Input(i, f"x{i}") for i in range(n))
    j.left = n
    j.tok = tokens  # type: ignore[attr-defined]
    j.bad = bad  # type: ignore[attr-defined]
    return j


def ready(j: Job, n: int) -> None:
    """Tokenize like the embedder: the first n, a bad one leaves (its error settled)."""
    i = 0
    while i < n and i < len(j.todo):
        inp = j.todo[i]
        if inp.index in j.bad:  # type: ignore[attr-defined]
            del j.todo[i]
            j.left -= 1
            continue
        inp.tokens = [1] * j.tok  # type: ignore[attr-defined]
        i += 1


def taken(picked) -> list[tuple[int, int]]:
    return [(id(j), inp.index) for j, inp in picked]


def test_the_request_waiting_longest_fills_the_decode():
    big, small = job(100, 10, since=2.0), job(1, 5, since=1.0)
    head, picked = pick([big, small], seats=8, room=1000, ready=ready)
    assert head is small
    # the big one cannot finish in what is left, so it does not ride along
    assert taken(picked) == [(id(small), 0)]
    assert len(big.todo) == 100


def test_requests_that_finish_here_ride_along():
    big, a, b = job(100, 10, since=1.0), job(2, 10, since=2.0), job(3, 10, since=3.0)
    head, picked = pick([b, a, big], seats=8, room=1000, ready=ready)
    assert head is big
    assert len(picked) == 8 and all(j is big for j, _ in picked)  # seats full: nobody rides
    head, picked = pick([b, a, big], seats=8, room=75, ready=ready)
    assert head is big and len(picked) == 7  # room for seven of the big one's inputs
    big.todo.clear()
    head, picked = pick([b, a, big], seats=8, room=1000, ready=ready)
    assert head is a and [j for j, _ in picked] == [a, a, b, b, b]


def test_the_first_input_goes_whole_and_a_longer_one_waits():
    long = job(3, 500, since=1.0)
    head, picked = pick([long], seats=8, room=100, ready=ready)
    assert head is long and len(picked) == 1  # over the room, but alone: pooling needs it whole


def test_bad_inputs_leave_and_the_next_request_takes_the_turn():
    broken, other = job(2, 5, since=1.0, bad=frozenset({0, 1})), job(1, 5, since=2.0)
    head, picked = pick([broken, other], seats=8, room=100, ready=ready)
    assert head is other and taken(picked) == [(id(other), 0)]
    assert not broken.todo and broken.left == 0
