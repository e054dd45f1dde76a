"""The gevent/thread boundary (app.base.bridge): items put from a native thread reach the
greenlet waiting on its channel; inside ``held_wakes`` they wake it only when the block ends,
with one cross-thread wake-up for every channel touched (the engine holds a step's tokens)."""

from __future__ import annotations

from typing import Any

from app.base import bridge


class CountingLoop:
    """The hub's loop, counting the cross-thread callbacks asked of it."""

    def __init__(self, loop: Any):
        self.loop, self.calls = loop, 0

    def run_callback_threadsafe(self, fn: Any, *args: Any) -> None:
        self.calls += 1
        self.loop.run_callback_threadsafe(fn, *args)


def channels(n: int) -> tuple[list[bridge.Channel], CountingLoop]:
    chans = [bridge.Channel() for _ in range(n)]
    loop = CountingLoop(chans[0]._loop)
    for c in chans:
        c._loop = loop
    return chans, loop


def in_thread(fn) -> bridge.ThreadEvent:
    done = bridge.ThreadEvent()

    def run() -> None:
        try:
            fn()
        finally:
            done.set()

    bridge.start_native_thread(run)
    return done


def test_a_put_wakes_the_waiting_greenlet_at_once():
    (chan,), loop = channels(1)
    in_thread(lambda: chan.put("a"))
    assert chan.get(timeout=10) == "a"
    assert loop.calls == 1


def test_held_wakes_wake_after_the_block_once_for_every_channel():
    (first, second), loop = channels(2)
    order: list[str] = []

    def engine_step() -> None:
        with bridge.held_wakes():
            first.put("a")
            second.put("b")
            first.put("c")
            order.append("put")
            bridge.original_sleep(0.3)  # a greenlet woken by the puts would read them now
            order.append("end")

    done = in_thread(engine_step)
    got = first.get(timeout=10)
    order.append("got")
    assert order == ["put", "end", "got"]
    assert (got, first.get(timeout=10), second.get(timeout=10)) == ("a", "c", "b")
    assert done.wait(10)
    assert loop.calls == 1  # three items, two channels, one wake-up


def test_held_wakes_nest_and_wake_when_the_outer_block_ends():
    (chan,), loop = channels(1)
    with bridge.held_wakes():
        with bridge.held_wakes():
            chan.put("x")
        assert loop.calls == 0
    assert loop.calls == 1
    assert chan.get(timeout=10) == "x"
