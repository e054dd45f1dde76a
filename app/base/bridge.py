"""The gevent/thread boundary: the only module that knows how a greenlet waits for the engine.

The engine runs on native OS threads (llama.cpp calls would freeze every greenlet otherwise),
in this process or in an engine process of its own. Under gunicorn's gevent worker,
``threading`` and ``queue`` are monkey-patched into greenlet primitives that must not be used
across OS threads, so the native side's primitives (app.base.threads, re-exported here) are the
original ``_thread`` functions, and this module wakes greenlets with
``loop.run_callback_threadsafe``.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import gevent
import gevent.event
from gevent._hub_local import get_hub_if_exists

from app.base import reqctx
from app.base.errors import Overloaded, RequestTimeout
from app.base.threads import (  # noqa: F401 - re-exported: the greenlet side's one import
    ThreadEvent,
    allocate_lock,
    held,
    held_wakes,
    original_sleep,
    start_native_thread,
    thread_local,
)

_POLL = 1.0  # seconds; only a safety net, the engine's callback wakes the greenlet at once


class Channel:
    """Items from any thread to the one greenlet that created the channel."""

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._ready = gevent.event.Event()
        self._loop = gevent.get_hub().loop

    def put(self, item: Any) -> None:
        """Called from the engine thread (or any thread). Inside ``held_wakes`` the owning
        greenlet is woken when the block ends, else at once."""
        self._items.append(item)
        wakes = held(self._loop, _Wakes)
        if wakes is None:
            self._loop.run_callback_threadsafe(self._ready.set)
        else:
            wakes.channels[id(self)] = self

    def get(self, timeout: float | None = None) -> Any:
        """Called from the owning greenlet; raises TimeoutError if nothing came in time.

        The wait always has a timer: a cross-thread callback alone does not keep the hub's
        loop alive, and a hub with nothing else to watch would report a deadlock.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._items:
                return self._items.popleft()
            self._ready.clear()
            if self._items:
                continue
            wait = _POLL if deadline is None else min(_POLL, deadline - time.monotonic())
            if wait <= 0:
                raise TimeoutError("no event from the engine in time")
            self._ready.wait(wait)


class _Wakes:
    """The channels of one hub a thread put to inside ``held_wakes``: one cross-thread wake-up
    (a callback and a write to the hub's wake-up descriptor) for them all when it ends."""

    def __init__(self, loop: Any) -> None:
        self.loop = loop
        self.channels: dict[int, Channel] = {}

    def flush(self) -> None:
        self.loop.run_callback_threadsafe(_wake_all, list(self.channels.values()))


def _wake_all(channels: list[Channel]) -> None:
    for channel in channels:
        channel._ready.set()


class Reply:
    """One answer from another OS thread, awaited by whoever made it: a greenlet (its hub
    serves every other connection meanwhile) or a native thread (a pool thread running an
    offloaded call), which blocks."""

    def __init__(self) -> None:
        self._channel = Channel() if get_hub_if_exists() is not None else None
        self._lock = None
        if self._channel is None:
            self._lock = allocate_lock()
            self._lock.acquire()
        self._value: Any = None

    def set(self, value: Any) -> None:
        """From any thread, once."""
        if self._channel is not None:
            self._channel.put(value)
            return
        self._value = value
        self._lock.release()

    def wait(self, timeout: float) -> Any:
        """The value; TimeoutError if none came in ``timeout`` seconds."""
        if self._channel is not None:
            return self._channel.get(timeout)
        if not self._lock.acquire(True, timeout):
            raise TimeoutError("no answer in time")
        return self._value


class _Job:
    """One offloaded call: queued, running on a pool thread, done, or abandoned by its
    caller (whose wait timed out)."""

    __slots__ = ("deadline", "loop", "started", "abandoned", "done")

    def __init__(self, deadline: float | None):
        self.deadline = deadline
        self.loop = gevent.get_hub().loop  # the caller's hub: where its log lines are written
        self.started: float | None = None
        self.abandoned = False
        self.done = False


class _Jobs:
    """What the hub's pool threads are doing for :func:`offload`, for /health: how many run,
    since when, and how many of them run for a caller that has already had its 503 (a stray
    thread still holds a pool thread)."""

    def __init__(self) -> None:
        self.lock = allocate_lock()
        self.running: dict[int, float] = {}  # id(job) -> when it started on its thread
        self.stray = 0

    def begin(self, job: _Job) -> bool:
        """On the pool thread: False when the caller left before the job started."""
        with self.lock:
            if job.abandoned:
                return False
            job.started = time.monotonic()
            self.running[id(job)] = job.started
            return True

    def end(self, job: _Job) -> None:
        with self.lock:
            self.running.pop(id(job), None)
            job.done = True
            if job.abandoned:
                self.stray -= 1

    def abandon(self, job: _Job) -> None:
        """On the caller's greenlet, when its wait timed out."""
        with self.lock:
            job.abandoned = True
            if job.started is not None and not job.done:
                self.stray += 1


_jobs = _Jobs()
_current_job = thread_local()  # per OS thread: the job it runs


def time_left() -> float | None:
    """Seconds until the caller of the offloaded call running on this thread gives up (its
    ``timeout``), or None: no such limit (or not on a pool thread). Work that waits on the
    network stops by then, so it does not hold the thread for a caller that has left."""
    job = getattr(_current_job, "job", None)
    if job is None or job.deadline is None:
        return None
    return job.deadline - time.monotonic()


def log_on_hub(logger: logging.Logger, level: int, msg: str, *args: Any) -> None:
    """``logger.log(level, msg, *args)``, written by the hub of the caller whose offloaded call
    runs on this thread (in the caller's context: its request id), else here. Under gevent
    the logging handlers' locks are gevent locks, and pool threads that contend for one wait
    forever (reproduced: several of ten threads logging at once never returned)."""
    job = getattr(_current_job, "job", None)
    if job is None:
        logger.log(level, msg, *args)
        return
    job.loop.run_callback_threadsafe(contextvars.copy_context().run, logger.log, level, msg,
                                     *args)


def offload(fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
    """``fn(*args)`` on one of the hub's native worker threads while the calling greenlet
    waits, so CPU-bound request work (validation, templates, schema conversion) leaves the hub
    free for every other connection; exceptions come back as raised. ``timeout`` bounds the
    whole wait, for a free thread and then for the work: past it the caller gets a 503, and a
    thread still running is counted as stray (:func:`prep_threads`) until it finishes."""
    job = _Job(None if timeout is None else time.monotonic() + timeout)

    @reqctx.carry  # the request's id (log lines) and key scope go with the work
    def run() -> tuple[bool, Any]:
        if not _jobs.begin(job):
            return False, None
        _current_job.job = job
        try:
            return True, fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, not logged here
            return False, exc
        finally:
            _current_job.job = None
            _jobs.end(job)

    timer = gevent.Timeout(timeout)  # over both waits: spawn itself waits for a free thread
    timer.start()
    pending = None
    try:
        pending = gevent.get_hub().threadpool.spawn(run)
        ok, value = pending.get()
    except BaseException as exc:
        if pending is not None:
            _jobs.abandon(job)  # a thread still working for nobody is counted
        if exc is not timer:
            raise
        if pending is None:
            raise Overloaded(f"no thread was free to prepare the request within {timeout:g} "
                             "s (PREPARE_TIMEOUT)") from None
        raise Overloaded(f"preparing the request took over {timeout:g} s") from None
    finally:
        timer.close()
    if not ok:
        raise value
    return value


def prep_threads(limit: float) -> tuple[dict[str, int], str | None]:
    """The hub's pool as /health shows it (``size``, ``busy``: running offloaded calls,
    ``stray``: those whose caller has left), and why the replica is stuck, if it is: every
    thread busy with calls that have all run past ``limit`` seconds, so no request can be
    prepared and only a restart helps."""
    size = gevent.get_hub().threadpool.maxsize
    now = time.monotonic()
    with _jobs.lock:
        busy, stray = len(_jobs.running), _jobs.stray
        youngest = max(_jobs.running.values(), default=now)
    stall = None
    if busy >= size and now - youngest > limit:
        stall = (f"all {size} request-preparation threads have been busy for over "
                 f"{now - youngest:.0f} s")
    return {"size": size, "busy": busy, "stray": stray}, stall


@contextlib.contextmanager
def deadline(seconds: float | None, what: str) -> Any:
    """Raise a 408 in the calling greenlet if the block takes longer than ``seconds``."""
    if not seconds:
        yield
        return
    timer = gevent.Timeout(seconds)
    timer.start()
    try:
        yield
    except gevent.Timeout as exc:
        if exc is not timer:
            raise
        raise RequestTimeout(f"{what} took over {seconds:g} s") from None
    finally:
        timer.close()
