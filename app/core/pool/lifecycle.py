"""How a model of the pool loads and unloads: its engine made and started, its readiness
awaited, its death noticed, its engine shut down; the table these change and the lock that
guards it. ModelPool (app.core.pool.pool) puts its public face on this.

One lock guards the table and is held only for bookkeeping: never across a load, a close, a
log line or a wait, since greenlets (the web process) and native threads (engines, loads,
tests) both take it. Loads and closes run on ``spawn`` (a native thread by default: an
engine's ``shutdown`` blocks its caller's thread). Waiters sleep on a bridge.Reply, which
blocks a native thread or parks a greenlet, and every change of the table wakes them all to
look again: few models, bounded waiters, so the simple broadcast is cheap and misses nothing.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from app.base.bridge import Reply
from app.base.errors import ModelLoadError
from app.base.threads import ThreadEvent, allocate_lock, start_native_thread
from app.core.pool.entry import (
    Bytes,
    CatalogLike,
    Entry,
    PoolEngine,
    Spec,
    keep_seconds,
    per_device,
)

log = logging.getLogger(__name__)

Make = Callable[[Spec, Callable[[str], None]], PoolEngine]


class Lifecycle:
    """The table of a catalog's models and the moves of each between unloaded, loading,
    loaded, closing and failed; every ``_begin_*`` runs under the lock, the rest outside it."""

    def __init__(self, catalog: CatalogLike, make: Make, *,
                 estimate: Callable[[Spec], Bytes | None] | None = None,
                 budget: Callable[[], Bytes | None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 spawn: Callable[[Callable[[], None]], Any] = start_native_thread,
                 max_waiters: int = 64, wait_timeout: float = 300.0, retry_after: int = 5,
                 load_timeout: float | None = None, poll: float = 0.02) -> None:
        self.catalog = catalog
        self._make = make
        self._estimate_fn = estimate
        self._budget_fn = budget
        self.clock = clock
        self._spawn = spawn
        self.max_waiters = max_waiters
        self.wait_timeout = wait_timeout
        self.retry_after = retry_after
        self.load_timeout = load_timeout
        self.poll = poll
        self._lock = allocate_lock()
        self._entries = {spec.name: Entry(spec) for spec in catalog.models}
        self._wakes: list[Reply] = []
        self._closed = False
        self._sweeper: ThreadEvent | None = None

    # ---- loading ----------------------------------------------------------------------------
    def _begin_load(self, e: Entry, evict: list[Entry]) -> Callable[[], None]:
        """Under the lock: ``e`` loading, ``evict`` closing; the job that closes them, then
        loads ``e`` (its room is theirs only once their engines are gone)."""
        closes = [self._begin_close(x) for x in evict]
        e.status, e.error, e.fatal, e.unloading, e.engine = "loading", None, None, False, None
        e.gen += 1
        return partial(self._load, e, e.gen, closes)

    def _load(self, e: Entry, gen: int, closes: list[tuple[Entry, int, Any]]) -> None:
        for close in closes:
            self._close(*close, f"evicted for {e.spec.name}")
        started = time.monotonic()
        engine: Any = None
        error: str | None = None
        try:
            engine = self._make(e.spec, partial(self._on_fatal, e, gen))
            with self._lock:
                e.engine = engine  # its progress, for statuses
            engine.start()
            error = self._await_ready(e, engine, started)
        except Exception as exc:  # noqa: BLE001 - any failure to load is the model's reason
            error = str(exc) if isinstance(exc, ModelLoadError) else f"{type(exc).__name__}: {exc}"
        with self._lock:
            ok = error is None and not e.unloading and not self._closed
            if ok:
                e.status, e.last_used = "loaded", self.clock()
                keep = keep_seconds(None, e.spec.keep_alive)
                e.expires_at = None if keep == math.inf else e.last_used + keep
                e.poke = None
                wakes = self._take_wakes()
        if not ok:
            if engine is not None:
                self._shutdown(engine)
            with self._lock:
                if error is None:  # unloaded while it loaded
                    e.status = "unloaded"
                else:
                    e.status, e.error = "failed", error
                e.engine, e.unloading, e.poke = None, False, None
                wakes = self._take_wakes()
        for w in wakes:
            w.set(None)
        took = time.monotonic() - started
        if ok:
            self._estimate(e, again=True)
            log.info("model %s loaded in %.1f s", e.spec.name, took)
        elif error is not None:
            log.error("model %s failed to load: %s", e.spec.name, error)

    def _await_ready(self, e: Entry, engine: PoolEngine, started: float) -> str | None:
        """None once the engine is ready (or the load was called off); else why it failed."""
        while True:
            poke = Reply()
            with self._lock:
                e.poke = poke
                fatal, off = e.fatal, e.unloading or self._closed
            state = engine.state
            if fatal is not None:
                return fatal
            if state.stage == "failed":
                return state.error or "the model could not be loaded"
            if state.ready or off:
                return None
            if self.load_timeout is not None and time.monotonic() - started > self.load_timeout:
                return f"not loaded within {self.load_timeout:g} s"
            with contextlib.suppress(TimeoutError):
                poke.wait(self.poll)

    def _on_fatal(self, e: Entry, gen: int, reason: str) -> None:
        """The engine's own: it died for good (from its thread)."""
        poke = dead = None
        with self._lock:
            if e.gen != gen:
                return
            if e.status == "loading":
                e.fatal, poke, e.poke = reason, e.poke, None
            elif e.status == "loaded":
                dead = self._died(e, reason)
        if poke is not None:
            poke.set(None)
        if dead is not None:
            self._retire(dead)

    def _died(self, e: Entry, reason: str | None) -> tuple[str, str, Any]:
        """Under the lock: the model failed with ``reason``, its room released (its process is
        gone), its leases void; returns what ``_retire`` needs to shut its engine down."""
        engine = e.engine
        reason = reason or "the engine failed"
        e.status, e.error, e.engine, e.leases, e.unloading = "failed", reason, None, 0, False
        e.expires_at = None
        e.gen += 1
        return e.spec.name, reason, engine

    def _retire(self, dead: tuple[str, str, Any]) -> None:
        name, reason, engine = dead
        with self._lock:
            wakes = self._take_wakes()
        for w in wakes:
            w.set(None)
        log.error("model %s failed: its engine died: %s", name, reason)
        self._spawn(partial(self._shutdown, engine))

    # ---- unloading ------------------------------------------------------------------------
    def _begin_close(self, e: Entry) -> tuple[Entry, int, Any]:
        """Under the lock: ``e`` closing (it keeps its room until its engine is gone)."""
        e.status, e.unloading, e.expires_at = "closing", False, None
        e.gen += 1
        return e, e.gen, e.engine

    def _close(self, e: Entry, gen: int, engine: Any, why: str) -> None:
        self._shutdown(engine)
        with self._lock:
            if e.gen == gen and e.status == "closing":
                e.status, e.engine = "unloaded", None
            wakes = self._take_wakes()
        for w in wakes:
            w.set(None)
        log.info("model %s unloaded: %s", e.spec.name, why)

    def _shutdown(self, engine: Any) -> None:
        try:
            engine.shutdown()
        except Exception:  # noqa: BLE001 - an engine that will not stop is gone to us anyway
            log.exception("shutting an engine down failed")

    def _estimate(self, e: Entry, again: bool = False) -> None:
        """The footprint, read outside the lock (a GGUF's header): once, and ``again`` after
        each load (a gs:// model's file is here now: its header says more than its size)."""
        if self._estimate_fn is None or (e.estimated and not again):
            return
        e.estimated = True
        try:
            e.need = per_device(self._estimate_fn(e.spec))
        except Exception as exc:  # noqa: BLE001 - unknown, counted as nothing
            log.debug("no footprint for model %s: %s", e.spec.name, exc)

    def _take_wakes(self) -> list[Reply]:
        wakes, self._wakes = self._wakes, []
        return wakes
