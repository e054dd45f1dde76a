"""The model pool: a catalog's models loaded on demand, one engine each, and unloaded when
idle, evicted for room, unloaded by an operator or dead (issue 50's lifecycle half): leases
for the requests, load, unload and preload for the operator and the start, a sweep for
keep_alive, statuses for the listings. How a model loads and unloads is app.core.pool.lifecycle.
"""

from __future__ import annotations

import logging
import math
import time
from functools import partial
from typing import Any

from app.base.bridge import Reply
from app.base.errors import (
    ModelLoadFailed,
    ModelNotFound,
    ModelNotReady,
    ModelTooLarge,
    PoolBusy,
    ShuttingDown,
)
from app.base.threads import ThreadEvent, start_native_thread
from app.core.pool.entry import Entry, Spec, keep_seconds, per_device, plan_room
from app.core.pool.lifecycle import Lifecycle
from app.core.pool.status import ModelStatus, status_of

log = logging.getLogger(__name__)

SHUTDOWN_WAIT = 60.0  # seconds one engine's shutdown may take at worker exit (it kills past it)

SAFETY_WAKE = 5.0  # seconds: the longest a waiter sleeps before looking again, woken or not


class Lease:
    """A loaded model's engine, held: while any lease on it lives, the model is neither evicted
    nor unloaded for idleness. End it when the request is over, its stream included."""

    def __init__(self, pool: ModelPool, entry: Entry, keep: float) -> None:
        self.spec: Spec = entry.spec
        self.name: str = entry.spec.name
        self.engine: Any = entry.engine
        self.keep = keep  # seconds the model stays loaded once this, the last lease, ends
        self._pool = pool
        self._entry = entry
        self._gen = entry.gen
        self.released = False

    def release(self) -> None:
        """End the lease (again: nothing)."""
        self._pool._release(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class ModelPool(Lifecycle):
    """The models of ``catalog``, each loaded by an engine ``make(spec, on_fatal)`` builds.

    ``estimate(spec)``: its footprint in bytes, or bytes per device (None: unknown);
    ``budget()``: the bytes every loaded model may take together, or per device (None: no
    check), asked before each load's plan; ``clock``: seconds, for keep_alive and
    use times; ``max_waiters``: acquires that may wait per model, past which PoolBusy says
    come back in ``retry_after`` s; ``wait_timeout``: an acquire's default wait;
    ``load_timeout``: a load's limit (None: none); ``poll``: how often a load's or a restart's
    progress is read (LoadState tells no one).
    """

    # ---- leases ---------------------------------------------------------------------------
    def acquire(self, name: str | None = None, keep_alive: float | None = None,
                timeout: float | None = None) -> Lease:
        """A lease on the model ``name`` (a name or alias; None: the default model), loading it
        first when it is not loaded: one load however many wait for it. ``keep_alive``
        (Ollama's: seconds; 0 unload when this lease ends, negative never) overrides the
        model's own for the idleness after this lease. Waits at most ``timeout`` s
        (``wait_timeout``; inf: no limit). Raises ModelNotFound, PoolBusy, ModelTooLarge,
        ModelLoadFailed, ModelNotReady (still loading at the timeout) or ShuttingDown."""
        e = self._entry(name)
        keep = keep_seconds(keep_alive, e.spec.keep_alive)
        with self._lock:
            if self._closed:
                raise ShuttingDown("server is shutting down")
            if e.ready:
                return self._lease(e, keep)
            if e.waiters >= self.max_waiters:
                raise PoolBusy(f"model {e.spec.name} already has {e.waiters} requests waiting "
                               "for it to load", retry_after=self.retry_after)
            e.waiters += 1
            waited = e.gen if e.status == "loading" else -1  # counted and waiting at once
        deadline = time.monotonic() + (self.wait_timeout if timeout is None else timeout)
        try:
            return self._wait(e, keep, deadline, waited)
        finally:
            with self._lock:
                e.waiters -= 1

    def _wait(self, e: Entry, keep: float, deadline: float, waited: int) -> Lease:
        """``waited``: the load (its generation) this acquire waits on: its failure is ours."""
        self._estimate(e)
        while True:
            budget = per_device(self._budget_fn()) if self._budget_fn is not None else None
            wake = Reply()
            job = dead = None
            with self._lock:
                if self._closed:
                    raise ShuttingDown("server is shutting down")
                if e.ready:
                    return self._lease(e, keep)
                if e.status == "failed" and e.gen == waited:
                    raise ModelLoadFailed(f"model {e.spec.name} failed to load: {e.error}")
                if e.status == "unloaded" and e.gen == waited:  # unload() called it off
                    raise ModelNotReady(f"model {e.spec.name} was unloaded while it loaded")
                if e.status == "loaded" and e.engine.state.stage == "failed":
                    dead = self._died(e, e.engine.state.error)
                elif e.status in ("unloaded", "failed"):
                    try:
                        evict = plan_room(e, self._entries.values(), self.catalog.max_loaded,
                                          budget)
                    except ModelTooLarge as exc:
                        e.status, e.error = "failed", exc.message
                        raise
                    if evict is not None:
                        job = self._begin_load(e, evict)
                waited = e.gen if e.status == "loading" else waited
                restarting = e.status == "loaded" and not e.unloading
                if job is None and dead is None:
                    self._wakes.append(wake)
            if dead is not None:
                self._retire(dead)
                continue
            if job is not None:
                self._spawn(job)
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._timed_out(e)
            try:
                wake.wait(min(left, self.poll if restarting else SAFETY_WAKE))
            except TimeoutError:
                with self._lock:  # not left behind: a restart's polls would pile them up
                    if wake in self._wakes:
                        self._wakes.remove(wake)

    def _lease(self, e: Entry, keep: float) -> Lease:
        e.leases += 1
        e.last_used = self.clock()
        e.expires_at = None
        return Lease(self, e, keep)

    def _release(self, lease: Lease) -> None:
        closing = None
        with self._lock:
            e = lease._entry
            if lease.released:
                return
            lease.released = True
            if e.gen != lease._gen:  # its engine died meanwhile: the count began anew
                return
            e.leases -= 1
            e.last_used = now = self.clock()
            if e.leases:
                return
            if e.unloading or lease.keep == 0:
                closing = self._begin_close(e)
            else:
                e.expires_at = None if lease.keep == math.inf else now + lease.keep
            wakes = self._take_wakes()
        if closing is not None:
            self._spawn(partial(self._close, *closing, "idle, keep_alive 0" if lease.keep == 0
                                else "unloaded when its last request ended"))
        for w in wakes:
            w.set(None)

    def _timed_out(self, e: Entry) -> Exception:
        name = e.spec.name
        if e.status == "loading":
            return ModelNotReady(f"model {name} is still loading")
        if e.status in ("unloaded", "failed"):
            busy = [x.spec.name for x in self._entries.values() if x.holds_room and x is not e]
            return PoolBusy(f"no room to load model {name}: the models holding it are busy "
                            f"({', '.join(busy)})", retry_after=self.retry_after)
        doing = "restarting" if e.status == "loaded" and not e.unloading else "unloading"
        return ModelNotReady(f"model {name} is {doing}")

    # ---- the operator's, and the platform's -------------------------------------------------
    def load(self, name: str | None, keep_alive: float | None = None,
             timeout: float | None = None) -> str:
        """Load the model (POST /models/load, Ollama's empty generate): ``loaded``, or
        ``already_loaded``; its keep_alive runs from now. Raises as ``acquire``."""
        e = self._entry(name)
        with self._lock:
            was = e.ready
        self.acquire(name, keep_alive, timeout).release()
        return "already_loaded" if was else "loaded"

    def unload(self, name: str | None) -> str:
        """Unload the model (POST /models/unload, Ollama's keep_alive 0): ``unloaded`` (idle:
        its engine shuts down now), ``draining`` (it takes no new lease and unloads when its
        last ends; an acquire meanwhile waits, then loads it again), ``cancelled`` (a load
        called off: its waiters get ModelNotReady), ``unloading`` (already so), or
        ``not_loaded``."""
        e = self._entry(name)
        closing = poke = None
        with self._lock:
            if e.status == "loaded" and e.leases:
                e.unloading, result = True, "draining"
            elif e.status == "loaded":
                closing, result = self._begin_close(e), "unloaded"
            elif e.status == "loading":
                e.unloading, poke, e.poke, result = True, e.poke, None, "cancelled"
            elif e.status == "closing" or e.unloading:
                result = "unloading"
            else:
                result = "not_loaded"
        if poke is not None:
            poke.set(None)
        if closing is not None:
            self._spawn(partial(self._close, *closing, "unloaded by the operator"))
        return result

    def preload(self, timeout: float | None = math.inf) -> list[str]:
        """Load the catalog's preload models, one after another, and return their names;
        raises as ``acquire`` (a start-up error), or ModelTooLarge when one unloaded another
        to make room: they do not fit together."""
        names = [spec.name for spec in self.catalog.models if spec.preload]
        for name in names:
            self.load(name, timeout=timeout)
        gone = [n for n in names if self._entries[n].status != "loaded"]
        if gone:
            raise ModelTooLarge(f"the preloaded models do not fit together: {', '.join(gone)} "
                                "unloaded to make room for the others")
        return names

    def sweep(self, now: float | None = None) -> list[str]:
        """Unload the idle models whose keep_alive ran out by ``now`` (the clock's time), and
        fail those whose engine failed unnoticed; returns the names unloaded."""
        now = self.clock() if now is None else now
        closes, dead = [], []
        with self._lock:
            for e in self._entries.values():
                if e.status != "loaded":
                    continue
                if e.engine.state.stage == "failed":
                    dead.append(self._died(e, e.engine.state.error))
                elif not e.leases and e.expires_at is not None and e.expires_at <= now:
                    closes.append(self._begin_close(e))
        for d in dead:
            self._retire(d)
        for close in closes:
            self._spawn(partial(self._close, *close, "idle past its keep_alive"))
        return [close[0].spec.name for close in closes]

    def start_sweeper(self, interval: float = 1.0) -> None:
        """Sweep every ``interval`` s on a native thread of its own, sleeping on a ThreadEvent
        (no greenlet: it takes the lock briefly and spawns the closes)."""
        if self._sweeper is not None:
            return
        stop = self._sweeper = ThreadEvent()

        def run() -> None:
            while not stop.wait(interval):
                try:
                    self.sweep()
                except Exception:  # noqa: BLE001 - the next sweep tries again
                    log.exception("sweeping the model pool failed")

        start_native_thread(run)

    def stop_sweeper(self) -> None:
        stop, self._sweeper = self._sweeper, None
        if stop is not None:
            stop.set()

    def shutdown(self) -> None:
        """Refuse new leases and shut every engine down, in the caller's thread (worker exit);
        a load under way is called off and shuts its own engine down."""
        self.stop_sweeper()
        with self._lock:
            self._closed = True
            closes = [self._begin_close(e) for e in self._entries.values()
                      if e.status == "loaded"]
            pokes = [e.poke for e in self._entries.values() if e.poke is not None]
            for e in self._entries.values():
                e.poke = None
            wakes = self._take_wakes()
        for r in [*pokes, *wakes]:
            r.set(None)
        # every engine at once: each drains, then may write its prompts (PROMPT_CACHE_DIR)
        # within what is left of the grace period, which one after another would not share
        done = [ThreadEvent() for _ in closes]
        for close, ev in zip(closes, done, strict=True):
            start_native_thread(lambda c=close, ev=ev: _then(ev, self._close, *c,
                                                             "shutting down"))
        for ev in done:
            ev.wait(SHUTDOWN_WAIT)

    # ---- what it shows ----------------------------------------------------------------------
    def engine(self, name: str | None) -> Any:
        """The model's engine now (loading, loaded or closing), None while it has none: what
        a route that holds no lease (/props, /health) may read, knowing it can go at once."""
        e = self._entry(name)
        with self._lock:
            return e.engine

    def statuses(self) -> list[ModelStatus]:
        """Every model of the catalog, in its order, as /v1/models and /api/ps show them."""
        for e in self._entries.values():
            self._estimate(e)
        now = self.clock()
        with self._lock:
            return [status_of(e, now) for e in self._entries.values()]

    def _entry(self, name: str | None) -> Entry:
        spec = self.catalog.get(name)
        if spec is None:
            raise ModelNotFound(f"model {name!r} does not exist: the models are "
                                f"{', '.join(self.catalog.names)}", param="model")
        return self._entries[spec.name]


def _then(done: ThreadEvent, fn: Any, *args: Any) -> None:
    """``fn(*args)``, then ``done`` set whatever happens."""
    try:
        fn(*args)
    finally:
        done.set()
