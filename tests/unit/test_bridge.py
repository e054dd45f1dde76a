"""The gevent/thread boundary (app.base.bridge): items put from a native thread reach the
greenlet waiting on its channel; inside ``held_wakes`` they wake it only when the block ends,
with one cross-thread wake-up for every channel touched (the engine holds a step's tokens).
``offload`` runs calls on the hub's pool within their caller's timeout, the wait for a free
thread included, and counts the threads still working for a caller that left."""

from __future__ import annotations

from typing import Any

import gevent
import pytest

from app.base import bridge
from app.base.errors import Overloaded
from tests.support.pool import Gate, full_pool
from tests.support.server import wait_for


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



def test_a_full_pool_answers_503_after_the_timeout_and_the_watchdog_sees_it():
    """H3: gevent's spawn waits for a free thread with no timeout of its own; the wait is now
    inside ``timeout`` (PREPARE_TIMEOUT), and a pool whose every thread is held that long
    makes /health answer 503 so the platform replaces the replica."""
    size = gevent.get_hub().threadpool.maxsize
    with full_pool() as holders:
        late = gevent.spawn(bridge.offload, lambda: "ran", timeout=0.2)
        late.join(20)
        assert late.ready(), "the call was still waiting for a thread"
        assert isinstance(late.exception, Overloaded) and "PREPARE_TIMEOUT" in str(
            late.exception)
        report, stall = bridge.prep_threads(0)
        assert report == {"size": size, "busy": size, "stray": 0} and "threads" in stall
        assert bridge.prep_threads(3600)[1] is None  # not held that long
    assert [h.value for h in holders] == ["held"] * (size + 1)
    assert bridge.prep_threads(0) == ({"size": size, "busy": 0, "stray": 0}, None)

def test_a_thread_that_outlives_its_caller_is_counted_until_it_ends():
    gate = Gate()
    try:
        with pytest.raises(Overloaded):
            bridge.offload(gate.hold, timeout=0.2)
        assert bridge.prep_threads(60)[0]["stray"] == 1
    finally:
        gate.open()
    wait_for(lambda: bridge.prep_threads(60)[0] == {
        "size": gevent.get_hub().threadpool.maxsize, "busy": 0, "stray": 0}, 30,
        "the stray thread's end", nap=gevent.sleep)


def test_an_offloaded_call_knows_how_long_its_caller_waits():
    left = bridge.offload(bridge.time_left, timeout=30)
    assert 0 < left <= 30
    assert bridge.offload(bridge.time_left) is None and bridge.time_left() is None


LOGGING_THREADS = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
from gevent import monkey; monkey.patch_all()
import gevent
from app.base import bridge

log = logging.getLogger("pool")

def work(i):
    for n in range(200):
        if sys.argv[1] == "hub":
            bridge.log_on_hub(log, logging.INFO, "line %d %d", i, n)
        else:
            log.info("line %d %d", i, n)

calls = [gevent.spawn(bridge.offload, work, i, timeout=20) for i in range(10)]
gevent.joinall(calls, timeout=30)
gevent.sleep(0.2)  # the hub writes the last lines
print(sum(1 for c in calls if c.successful()))
"""


def test_pool_threads_log_through_their_callers_hub():
    """Under gevent the logging handlers' locks are gevent locks: ten pool threads logging at
    once left some waiting forever (their callers had a 503; the e2e drip test met it). Lines
    written with log_on_hub go out on the caller's hub, each one, with no thread left
    waiting. A real monkey-patched process, as gunicorn's gevent worker is."""
    import subprocess
    import sys

    from tests.support.server import ROOT

    done = subprocess.run([sys.executable, "-c", LOGGING_THREADS, "hub"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["10"]
    assert sorted(done.stderr.split("\n"))[1:] == sorted(
        f"line {i} {n}" for i in range(10) for n in range(200))
