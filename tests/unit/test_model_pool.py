"""The model pool (app.core.pool): names, leases on engines loaded on demand (one load per
model, bounded waiters, failures), and room by MODELS_MAX and a memory budget, with eviction.
keep_alive, the operator's load and unload, and deaths: tests/unit/test_model_pool_unload.py.

Engines are fakes whose load the test drives (ready at once, held until the test says, failing)
and which die when told; the clock is a fake too (tests/support/model_pool.py). Most pools run
their loads and closes in the caller's thread (``spawn=run``), so what a release or a sweep
does is done when it returns; the tests of waiting use native threads, and every wait in them
is bounded.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.base.errors import ModelLoadFailed, ModelNotFound, ModelNotReady, ModelTooLarge, PoolBusy
from app.base.threads import start_native_thread
from app.core.pool import ModelPool
from app.model.catalog import ModelSpec
from tests.support.model_pool import (
    GB,
    LIMIT,
    Clock,
    Factory,
    FakeEngine,
    catalog,
    executor,
    loaded,
    make_pool,
    run,
    spec,
    status,
    use,
)
from tests.support.server import wait_for


@pytest.fixture
def threads():
    with executor() as ex:
        yield ex


# ---- names ---------------------------------------------------------------------------------


def test_names_and_aliases_resolve_and_none_is_the_default_model():
    f = Factory()
    pool = make_pool(catalog(spec("chat", aliases=("qwen3", "qwen3:8b")), spec("embed")), f)
    with pool.acquire(None) as lease:
        assert lease.name == "chat"
        with pool.acquire("QWEN3:8B") as again:
            assert again.engine is lease.engine
    assert len(f.of("chat")) == 1
    assert status(pool, "chat")["aliases"] == ("qwen3", "qwen3:8b")


def test_an_unknown_name_is_model_not_found_naming_the_models():
    pool = make_pool(catalog(spec("chat"), spec("embed")), Factory())
    with pytest.raises(ModelNotFound) as err:
        pool.acquire("gpt-4o")
    assert err.value.code == "model_not_found"
    assert "'gpt-4o'" in err.value.message and "chat, embed" in err.value.message
    for op in (pool.load, pool.unload):
        with pytest.raises(ModelNotFound):
            op("gpt-4o")


# ---- loading: one load, waiters, failures --------------------------------------------------


def test_two_acquires_of_an_unloaded_model_start_one_load(threads):
    f = Factory()
    f.plans["a"] = "hold"
    pool = make_pool(catalog(spec("a")), f, spawn=start_native_thread)
    first = threads.submit(pool.acquire, "a")
    wait_for(lambda: f.of("a"), LIMIT, "the load")
    second = threads.submit(pool.acquire, "a")
    wait_for(lambda: status(pool, "a")["status"] == "loading", LIMIT, "loading")
    assert not first.done() and not second.done()
    f.of("a")[0].finish()
    leases = [first.result(LIMIT), second.result(LIMIT)]
    assert len(f.of("a")) == 1
    assert leases[0].engine is leases[1].engine is f.of("a")[0]
    assert status(pool, "a")["leases"] == 2
    for lease in leases:
        lease.release()
    assert status(pool, "a")["leases"] == 0


def test_a_failed_load_fails_every_waiter_and_the_next_acquire_retries(threads):
    f = Factory()
    f.plans["a"] = "hold"
    pool = make_pool(catalog(spec("a")), f, spawn=start_native_thread)
    waiters = [threads.submit(pool.acquire, "a") for _ in range(3)]
    wait_for(lambda: f.of("a") and status(pool, "a")["waiting"] == 3, LIMIT, "the waiters")
    f.of("a")[0].finish("out of memory loading a")
    for w in waiters:
        with pytest.raises(ModelLoadFailed, match="out of memory loading a"):
            w.result(LIMIT)
    st = status(pool, "a")
    assert (st["status"], st["error"]) == ("failed", "out of memory loading a")
    assert len(f.of("a")) == 1 and f.of("a")[0].closed
    f.plans["a"] = "ready"
    use(pool, "a")
    assert len(f.of("a")) == 2
    assert status(pool, "a")["status"] == "loaded" and status(pool, "a")["error"] is None


def test_an_engine_that_cannot_be_made_fails_the_load_with_its_reason():
    def broken(spec: ModelSpec, on_fatal: Any) -> FakeEngine:
        raise FileNotFoundError("no file /models/a.gguf")

    pool = ModelPool(catalog(spec("a")), broken, spawn=run, poll=0.005)
    with pytest.raises(ModelLoadFailed, match="FileNotFoundError: no file /models/a.gguf"):
        pool.acquire("a")
    assert status(pool, "a")["status"] == "failed"


def test_waiters_past_the_bound_are_turned_away_with_retry_after(threads):
    f = Factory()
    f.plans["a"] = "hold"
    pool = make_pool(catalog(spec("a")), f, spawn=start_native_thread, max_waiters=1, retry_after=7)
    first = threads.submit(pool.acquire, "a")
    wait_for(lambda: f.of("a"), LIMIT, "the load")  # the first acquire waits by now
    with pytest.raises(PoolBusy) as err:
        pool.acquire("a")
    assert err.value.retry_after == 7 and err.value.code == "model_busy"
    f.of("a")[0].finish()
    first.result(LIMIT).release()
    use(pool, "a")  # loaded: no wait, whatever the bound


def test_a_wait_has_a_timeout_and_the_load_goes_on():
    f = Factory()
    f.plans["a"] = "hold"
    pool = make_pool(catalog(spec("a")), f, spawn=start_native_thread)
    with pytest.raises(ModelNotReady, match="still loading"):
        pool.acquire("a", timeout=0.05)
    f.of("a")[0].finish()
    wait_for(lambda: status(pool, "a")["status"] == "loaded", LIMIT, "the load")
    use(pool, "a")
    assert len(f.of("a")) == 1


def test_statuses_show_a_load_s_progress_and_the_estimate():
    f = Factory()
    f.plans["a"] = "hold"
    pool = make_pool(catalog(spec("a", pin=True), spec("b")), f, spawn=start_native_thread,
                     estimate=lambda s: {"a": 3 * GB}.get(s.name))
    with pytest.raises(ModelNotReady):
        pool.acquire("a", timeout=0.01)
    wait_for(lambda: f.of("a"), LIMIT, "the load")
    f.of("a")[0].state.set_download(50, 100, 1e6, 1.0)
    wait_for(lambda: status(pool, "a")["stage"] == "downloading", LIMIT, "the engine")
    st = status(pool, "a")
    assert (st["status"], st["stage"], st["progress"]) == ("loading", "downloading", 0.5)
    assert (st["bytes"], st["pinned"], st["preload"]) == (3 * GB, True, False)
    assert status(pool, "b") == {
        "name": "b", "aliases": (), "status": "unloaded", "error": None, "stage": None,
        "progress": None, "detail": None, "bytes": None, "devices": None, "pinned": False,
        "preload": False, "leases": 0, "waiting": 0, "unloading": False, "last_used": None, "expires_at": None,
        "expires_in": None}
    f.of("a")[0].finish()
    wait_for(lambda: status(pool, "a")["status"] == "loaded", LIMIT, "the load")
    assert status(pool, "a")["stage"] is None


# ---- room: MODELS_MAX, the memory budget, eviction ---------------------------------------


def test_models_max_evicts_the_least_recently_used_idle_model():
    f, clock = Factory(), Clock()
    pool = make_pool(catalog(spec("a"), spec("b"), spec("c"), max_loaded=2), f, clock=clock)
    for name in ("a", "b", "a"):  # a used last
        clock.now += 1
        use(pool, name)
    clock.now += 1
    use(pool, "c")
    assert loaded(pool) == ["a", "c"]
    assert f.of("b")[0].closed and not f.of("a")[0].closed
    assert status(pool, "b")["status"] == "unloaded"


def test_a_pinned_model_is_never_evicted():
    f, clock = Factory(), Clock()
    pool = make_pool(catalog(spec("a", pin=True), spec("b"), spec("c"), max_loaded=2), f,
                     clock=clock)
    for name in ("a", "b", "c"):  # a is the least recently used, but pinned
        clock.now += 1
        use(pool, name)
    assert loaded(pool) == ["a", "c"]


def test_a_busy_model_is_never_evicted_and_a_load_waits_for_room(threads):
    f, clock = Factory(), Clock()
    pool = make_pool(catalog(spec("a"), spec("b"), spec("c"), max_loaded=2), f, clock=clock)
    held = pool.acquire("a")  # the least recently used, but leased
    clock.now += 1
    use(pool, "b")
    clock.now += 1
    c = pool.acquire("c")
    assert loaded(pool) == ["a", "c"]  # b went, though a is older
    # now both loaded models are busy: b waits for room, and times out if none comes
    with pytest.raises(PoolBusy, match="no room to load model b.*busy"):
        pool.acquire("b", timeout=0.05)
    assert loaded(pool) == ["a", "c"] and status(pool, "b")["status"] == "unloaded"
    waiting = threads.submit(pool.acquire, "b")
    clock.now += 1
    c.release()
    waiting.result(LIMIT).release()
    assert loaded(pool) == ["a", "b"] and f.of("c")[0].closed
    held.release()


def test_the_memory_budget_evicts_until_the_new_model_fits():
    f, clock = Factory(), Clock()
    sizes = {"a": 4 * GB, "b": 4 * GB, "c": 6 * GB}
    pool = make_pool(catalog(spec("a"), spec("b"), spec("c")), f, clock=clock,
                     estimate=lambda s: sizes[s.name], budget=lambda: 10 * GB)
    for name in ("a", "b", "c"):
        clock.now += 1
        use(pool, name)
    assert loaded(pool) == ["b", "c"]  # a alone made room: 4 + 6 <= 10
    assert f.of("a")[0].closed


def test_a_budget_per_device_checks_each_device():
    f, clock = Factory(), Clock()
    sizes = {"a": {"CUDA0": 6 * GB, "CPU": 1 * GB}, "b": {"CUDA0": 1 * GB, "CPU": 2 * GB},
             "c": {"CUDA0": 4 * GB, "CPU": 1 * GB}, "d": 3 * GB}
    pool = make_pool(catalog(spec("a"), spec("b"), spec("c"), spec("d")), f, clock=clock,
                     estimate=lambda s: sizes[s.name],
                     budget=lambda: {"CUDA0": 8 * GB, "CPU": 100 * GB})
    for name in ("a", "b", "c"):  # c: 6 + 1 + 4 > 8 on CUDA0, so a goes (not b)
        clock.now += 1
        use(pool, name)
    assert loaded(pool) == ["b", "c"]
    st = status(pool, "a")
    assert (st["bytes"], st["devices"]) == (7 * GB, {"CUDA0": 6 * GB, "CPU": 1 * GB})
    clock.now += 1
    use(pool, "d")  # one number may land on any device: 1 + 4 + 3 fits CUDA0's 8
    assert loaded(pool) == ["b", "c", "d"]
    alone = make_pool(catalog(spec("e")), Factory(), estimate=lambda s: {"CUDA0": 9 * GB},
                      budget=lambda: {"CUDA0": 8 * GB})
    with pytest.raises(ModelTooLarge, match="needs 9.00 GB on CUDA0 .*budget of 8.00 GB"):
        alone.acquire("e")


def test_a_model_of_unknown_footprint_counts_nothing():
    f = Factory()
    pool = make_pool(catalog(spec("a"), spec("b")), f, estimate=lambda s: None,
                     budget=lambda: 1)
    use(pool, "a")
    use(pool, "b")
    assert loaded(pool) == ["a", "b"]


def test_an_unknown_footprint_is_asked_once_and_again_after_the_load():
    calls: list[str] = []

    def estimate(s: ModelSpec) -> int | None:  # a gs:// model: its header is here once loaded
        calls.append(s.name)
        return None if len(calls) == 1 else 2 * GB

    pool = make_pool(catalog(spec("a")), Factory(), estimate=estimate)
    assert status(pool, "a")["bytes"] is None
    assert status(pool, "a")["bytes"] is None and calls == ["a"]
    use(pool, "a")
    assert status(pool, "a")["bytes"] == 2 * GB and calls == ["a", "a"]


def test_a_files_size_estimate_is_replaced_by_the_header_s_after_the_load():
    answers = iter([GB, 3 * GB])  # a gs:// model: its listed size, then its downloaded header

    pool = make_pool(catalog(spec("a")), Factory(), estimate=lambda s: next(answers))
    assert status(pool, "a")["bytes"] == GB
    use(pool, "a")
    assert status(pool, "a")["bytes"] == 3 * GB


def test_a_model_that_cannot_fit_even_alone_is_too_large_and_shows_failed():
    f = Factory()
    sizes = {"pinned": 6 * GB, "big": 5 * GB, "huge": 11 * GB}
    pool = make_pool(catalog(spec("pinned", pin=True), spec("big"), spec("huge")), f,
                     estimate=lambda s: sizes[s.name], budget=lambda: 10 * GB)
    use(pool, "pinned")
    with pytest.raises(ModelTooLarge) as err:
        pool.acquire("big")
    msg = err.value.message
    assert "needs 5.00 GB" in msg and "4.00 GB" in msg and "10.00 GB" in msg
    assert err.value.retry_after is None and err.value.code == "model_too_large"
    assert (status(pool, "big")["status"], status(pool, "big")["error"]) == ("failed", msg)
    with pytest.raises(ModelTooLarge, match="needs 11.00 GB"):
        pool.acquire("huge")
    assert loaded(pool) == ["pinned"] and len(f.engines) == 1


def test_no_place_when_every_place_is_pinned():
    pool = make_pool(catalog(spec("a", pin=True), spec("b"), max_loaded=1), Factory())
    use(pool, "a")
    with pytest.raises(ModelTooLarge, match="MODELS_MAX.*pinned models \\(a\\)"):
        pool.acquire("b")
