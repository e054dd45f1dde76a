"""The model pool (app.core.pool), a model's way out: keep_alive and the sweep, the operator's
load and unload, preload and shutdown, an engine's death, and waiting greenlets. Fakes:
tests/support/model_pool.py; the rest of the pool: tests/unit/test_model_pool.py."""

from __future__ import annotations

import math

import pytest

from app.base.errors import ModelNotReady, ModelTooLarge, ShuttingDown
from app.base.threads import start_native_thread
from tests.support.model_pool import (
    GB,
    LIMIT,
    Clock,
    Factory,
    catalog,
    executor,
    loaded,
    make_pool,
    spec,
    status,
    use,
)
from tests.support.server import wait_for


@pytest.fixture
def threads():
    with executor() as ex:
        yield ex


# ---- keep_alive and the sweep ------------------------------------------------------------


def test_keep_alive_zero_unloads_when_the_last_lease_ends():
    f = Factory()
    pool = make_pool(catalog(spec("a")), f)
    zero = pool.acquire("a", keep_alive=0)
    other = pool.acquire("a")
    zero.release()  # another lease holds it: it stays
    assert loaded(pool) == ["a"]
    other.release()
    assert loaded(pool) == ["a"]  # the last lease ended with the model's keep_alive
    zero = pool.acquire("a")
    zero2 = pool.acquire("a", keep_alive=0)
    zero.release()
    zero2.release()
    assert loaded(pool) == [] and f.of("a")[0].closed
    assert status(pool, "a")["status"] == "unloaded"
    use(pool, "a")
    assert len(f.of("a")) == 2


def test_keep_alive_seconds_from_the_lease_s_end_and_the_sweep():
    f, clock = Factory(), Clock()
    pool = make_pool(catalog(spec("a", keep_alive=300.0), spec("b")), f, clock=clock)
    with pool.acquire("a", keep_alive=30):
        clock.now = 1100.0
        assert status(pool, "a")["expires_at"] is None  # busy: no expiry
    assert status(pool, "a")["expires_at"] == 1130.0
    assert status(pool, "a")["expires_in"] == 30.0
    assert pool.sweep(1129.9) == []
    assert pool.sweep(1130.0) == ["a"]
    assert status(pool, "a")["status"] == "unloaded" and f.of("a")[0].closed
    use(pool, "a")  # the model's own keep_alive
    assert status(pool, "a")["expires_at"] == 1400.0
    assert pool.sweep() == [] and status(pool, "a")["last_used"] == 1100.0


def test_a_negative_keep_alive_keeps_it_for_ever():
    f, clock = Factory(), Clock()
    pool = make_pool(catalog(spec("a"), spec("b", keep_alive=math.inf)), f, clock=clock)
    use(pool, "a", keep_alive=-1)
    use(pool, "b")
    assert status(pool, "a")["expires_at"] is None and status(pool, "b")["expires_at"] is None
    assert pool.sweep(clock.now + 1e12) == []
    assert loaded(pool) == ["a", "b"]


def test_the_sweep_never_unloads_a_busy_model():
    f, clock = Factory(), Clock()
    pool = make_pool(catalog(spec("a", keep_alive=1.0)), f, clock=clock)
    use(pool, "a")
    with pool.acquire("a"):
        assert pool.sweep(clock.now + 100) == []
        clock.now += 100
    assert pool.sweep(clock.now + 0.5) == []  # its keep_alive runs from the lease's end
    assert pool.sweep(clock.now + 1) == ["a"]


def test_the_background_sweeper_unloads_expired_models():
    f, clock = Factory(), Clock()
    pool = make_pool(catalog(spec("a", keep_alive=5.0)), f, clock=clock)
    use(pool, "a")
    pool.start_sweeper(interval=0.01)
    try:
        clock.now += 6
        wait_for(lambda: status(pool, "a")["status"] == "unloaded", LIMIT, "the sweep")
    finally:
        pool.stop_sweeper()
    assert f.of("a")[0].closed


# ---- the operator's load and unload, preload, shutdown ----------------------------------


def test_load_and_unload_say_what_happened():
    f = Factory()
    pool = make_pool(catalog(spec("a"), spec("b")), f)
    assert pool.unload("a") == "not_loaded"
    assert pool.load("a") == "loaded"
    assert pool.load("a") == "already_loaded"
    assert pool.unload("a") == "unloaded"
    assert f.of("a")[0].closed and loaded(pool) == []


def test_unload_of_a_busy_model_drains_it(threads):
    f = Factory()
    pool = make_pool(catalog(spec("a")), f)
    lease = pool.acquire("a")
    assert pool.unload("a") == "draining"
    st = status(pool, "a")
    assert (st["status"], st["unloading"], st["leases"]) == ("loaded", True, 1)
    assert pool.unload("a") == "draining"
    with pytest.raises(ModelNotReady, match="unloading"):  # no new lease meanwhile
        pool.acquire("a", timeout=0.05)
    waiting = threads.submit(pool.acquire, "a")
    assert not f.of("a")[0].closed
    lease.release()  # the last lease: it unloads, then the waiter loads it again
    waiting.result(LIMIT).release()
    assert f.of("a")[0].closed and len(f.of("a")) == 2 and loaded(pool) == ["a"]


def test_unload_while_loading_calls_the_load_off():
    f = Factory()
    f.plans["a"] = "hold"
    pool = make_pool(catalog(spec("a")), f, spawn=start_native_thread)
    with pytest.raises(ModelNotReady):
        pool.acquire("a", timeout=0.01)
    wait_for(lambda: f.of("a"), LIMIT, "the load")
    assert pool.unload("a") == "cancelled"
    wait_for(lambda: status(pool, "a")["status"] == "unloaded", LIMIT, "the cancel")
    assert f.of("a")[0].closed
    f.plans["a"] = "ready"
    use(pool, "a")
    assert len(f.of("a")) == 2


def test_waiters_on_a_load_called_off_are_told(threads):
    f = Factory()
    f.plans["a"] = "hold"
    pool = make_pool(catalog(spec("a")), f, spawn=start_native_thread)
    waiting = threads.submit(pool.acquire, "a")
    wait_for(lambda: f.of("a"), LIMIT, "the load")
    assert pool.unload("a") == "cancelled"
    with pytest.raises(ModelNotReady, match="unloaded while it loaded"):
        waiting.result(LIMIT)
    assert len(f.of("a")) == 1


def test_preload_loads_the_preload_models():
    f = Factory()
    pool = make_pool(catalog(spec("a", preload=True), spec("b"), spec("c", preload=True)), f)
    assert pool.preload() == ["a", "c"]
    assert loaded(pool) == ["a", "c"]


def test_preloads_that_do_not_fit_together_are_an_error():
    sizes = {"a": 6 * GB, "b": 6 * GB}
    pool = make_pool(catalog(spec("a", preload=True), spec("b", preload=True)), Factory(),
                     estimate=lambda s: sizes[s.name], budget=lambda: 10 * GB)
    with pytest.raises(ModelTooLarge, match="do not fit together: a"):
        pool.preload()


def test_shutdown_closes_every_engine_and_refuses_leases():
    f = Factory()
    pool = make_pool(catalog(spec("a"), spec("b")), f)
    use(pool, "a")
    use(pool, "b")
    pool.shutdown()
    assert all(e.closed for e in f.engines)
    with pytest.raises(ShuttingDown):
        pool.acquire("a")


# ---- deaths --------------------------------------------------------------------------------


def test_a_dead_engine_fails_its_model_releases_its_room_and_reloads():
    f = Factory()
    pool = make_pool(catalog(spec("a"), spec("b"), max_loaded=1), f)
    lease = pool.acquire("a")
    f.of("a")[0].die("engine process killed by SIGSEGV")
    st = status(pool, "a")
    assert (st["status"], st["error"], st["leases"]) == (
        "failed", "engine process killed by SIGSEGV", 0)
    assert f.of("a")[0].closed
    use(pool, "b")  # its place is free: nothing to evict
    assert loaded(pool) == ["b"]
    lease.release()  # a lease of the dead engine ends: nothing to count
    assert status(pool, "a")["leases"] == 0
    use(pool, "a")
    assert len(f.of("a")) == 2 and loaded(pool) == ["a"]


def test_an_engine_whose_state_failed_unnoticed_is_found_by_acquire_and_sweep():
    f = Factory()
    pool = make_pool(catalog(spec("a"), spec("b")), f)
    use(pool, "a")
    use(pool, "b")
    f.of("a")[0].state.fail("the engine stopped: CRASH_LIMIT deaths")
    assert status(pool, "a")["status"] == "failed"
    use(pool, "a")
    assert len(f.of("a")) == 2 and f.of("a")[0].closed
    f.of("b")[0].state.fail("gone")
    assert pool.sweep() == []
    assert (status(pool, "b")["status"], status(pool, "b")["error"]) == ("failed", "gone")


def test_a_death_during_the_load_fails_it():
    f = Factory()
    f.plans["a"] = "hold"
    pool = make_pool(catalog(spec("a")), f, spawn=start_native_thread)
    with pytest.raises(ModelNotReady):
        pool.acquire("a", timeout=0.01)
    wait_for(lambda: f.of("a"), LIMIT, "the load")
    f.of("a")[0].on_fatal("killed by SIGKILL while loading")  # on_fatal alone wakes the load
    wait_for(lambda: status(pool, "a")["status"] == "failed", LIMIT, "the failure")
    assert status(pool, "a")["error"] == "killed by SIGKILL while loading"


def test_an_acquire_waits_while_the_engine_restarts(threads):
    f = Factory()
    pool = make_pool(catalog(spec("a")), f)
    use(pool, "a")
    engine = f.of("a")[0]
    engine.state.set("loading", detail="restarting: killed by SIGSEGV")
    assert status(pool, "a")["status"] == "loading"
    waiting = threads.submit(pool.acquire, "a")
    engine.state.set("ready", progress=1.0)
    assert waiting.result(LIMIT).engine is engine
    assert len(f.engines) == 1



# ---- under gevent --------------------------------------------------------------------------


def test_greenlets_wait_for_a_load_without_blocking_the_hub():
    """The web process's case: acquires in greenlets park on the hub (a bridge.Reply) while the
    load runs on a native thread, and every other greenlet runs meanwhile."""
    import gevent

    f = Factory()
    f.plans["a"] = "hold"
    pool = make_pool(catalog(spec("a")), f, spawn=start_native_thread)
    waiters = [gevent.spawn(pool.acquire, "a") for _ in range(2)]
    wait_for(lambda: f.of("a"), LIMIT, "the load", nap=gevent.sleep)
    ticks = gevent.spawn(lambda: [gevent.sleep(0.001) for _ in range(20)])
    ticks.get(timeout=LIMIT)  # the hub ran while both waited
    assert not any(w.ready() for w in waiters)
    f.of("a")[0].finish()
    leases = [w.get(timeout=LIMIT) for w in waiters]
    assert leases[0].engine is leases[1].engine and len(f.engines) == 1
    for lease in leases:
        lease.release()
