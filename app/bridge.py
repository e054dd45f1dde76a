"""The gevent/thread boundary: the only module that knows how a greenlet waits for the engine.

The engine runs on a native OS thread (llama.cpp calls would freeze every greenlet otherwise).
Under gunicorn's gevent worker, ``threading`` and ``queue`` are monkey-patched into greenlet
primitives that must not be used across OS threads, so this module takes the original
``_thread`` functions and wakes greenlets with ``loop.run_callback_threadsafe``.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import gevent
import gevent.event
from gevent.monkey import get_original

_start_new_thread = get_original("_thread", "start_new_thread")
allocate_lock: Callable[[], Any] = get_original("_thread", "allocate_lock")
_POLL = 1.0  # seconds; only a safety net, the engine's callback wakes the greenlet at once


def start_native_thread(target: Callable[[], None]) -> None:
    """Start ``target`` on a real OS thread, even when threading is monkey-patched."""
    _start_new_thread(target, ())


class ThreadEvent:
    """An auto-reset event for the engine thread to sleep on, settable from any thread."""

    def __init__(self) -> None:
        self._lock = allocate_lock()
        self._lock.acquire()

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # already set
            self._lock.release()

    def wait(self, timeout: float) -> bool:
        """Block the calling OS thread until set (then reset) or timeout."""
        return self._lock.acquire(True, timeout)


class Channel:
    """Items from any thread to the one greenlet that created the channel."""

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._ready = gevent.event.Event()
        self._loop = gevent.get_hub().loop

    def put(self, item: Any) -> None:
        """Called from the engine thread (or any thread)."""
        self._items.append(item)
        self._loop.run_callback_threadsafe(self._ready.set)

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
