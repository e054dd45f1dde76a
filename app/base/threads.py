"""Native OS threads and their primitives, with no gevent: what the engine needs to run.

The engine runs llama.cpp on native threads, in the web process (under gevent) or in an engine
process of its own (app.engine.child), which must not import gevent, Flask or anything of the
web stack (docs/crashes.md: one C++ runtime per process; an engine process loads only what the
engine needs). So the thread primitives live here, apart from the greenlet side
(app.base.bridge, which re-exports them).

Under gunicorn's gevent worker, ``threading``, ``time.sleep`` and ``_thread`` are
monkey-patched into greenlet primitives that must not be used across OS threads. Patching is
gevent.monkey's doing: while it is not imported nothing is patched, so the stdlib's own
functions are the originals; once it is, ``get_original`` still hands out the originals
whenever this module is imported (before or after the patching).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar


def original(module: str, name: str) -> Any:
    """The unpatched ``module.name``, whether gevent has patched it or not."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None:
        return monkey.get_original(module, name)
    return getattr(importlib.import_module(module), name)


_start_new_thread = original("_thread", "start_new_thread")
original_sleep: Callable[[float], None] = original("time", "sleep")  # for native threads
# gevent's os.close (25.8.1+) defers the close of a socket or pipe to the calling thread's hub
# loop once that thread has a hub, which a native thread that once ran greenlet code (a gs://
# download) never runs again: the descriptor would stay open. Descriptors a native thread
# closes, and files whose flock must end with the close, go through this one.
close_fd: Callable[[int], None] = original("os", "close")
_stack_size = original("_thread", "stack_size")
allocate_lock: Callable[[], Any] = original("_thread", "allocate_lock")
_stack_lock = allocate_lock()
thread_local: Callable[[], Any] = original("_thread", "_local")  # per OS thread
_held = thread_local()  # per OS thread: the wakes held back (held_wakes)


def start_native_thread(target: Callable[[], None], stack_size: int = 0) -> None:
    """Start ``target`` on a real OS thread, even when threading is monkey-patched; with
    ``stack_size`` (bytes), on a stack that large (address space; pages are mapped on use)."""
    if not stack_size:
        _start_new_thread(target, ())
        return
    with _stack_lock:
        old = _stack_size(stack_size)
        try:
            _start_new_thread(target, ())
        finally:
            _stack_size(old)


LOWEST_NICE = 19


def run_at_low_priority(fn: Callable[[], Any]) -> Any:
    """``fn()`` on a native thread of its own at the lowest CPU priority (nice 19), the
    calling thread waiting for it; its result, or its exception raised here. A model's load
    and warm-up run so beside models already serving: on a busy CPU they take what the others
    leave. Linux's nice is per thread and an unprivileged one can never lower it again, so a
    thread of its own: the caller (the engine thread, which serves afterwards) keeps its own,
    and so do the compute threads its first decode makes (OpenMP's team is per thread that
    starts it)."""
    done = allocate_lock()
    done.acquire()
    out: list[Any] = []

    def run() -> None:
        try:
            with contextlib.suppress(OSError):  # a platform without per-thread nice: as is
                os.setpriority(os.PRIO_PROCESS, 0, LOWEST_NICE)  # 0: this thread (Linux)
            out.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread
            out.append((False, exc))
        finally:
            done.release()

    _start_new_thread(run, ())
    done.acquire()
    ok, value = out[0]
    if not ok:
        raise value
    return value


class ThreadEvent:
    """An auto-reset event for a native thread to sleep on, settable from any thread."""

    def __init__(self) -> None:
        self._lock = allocate_lock()
        self._lock.acquire()

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # already set
            self._lock.release()

    def wait(self, timeout: float) -> bool:
        """Block the calling OS thread until set (then reset) or timeout."""
        return self._lock.acquire(True, timeout)


class Mailbox(Protocol):
    """Where a request's events go: put by the engine's threads, read by whoever submitted it
    (a greenlet's app.base.bridge.Channel, or an engine process's outbox to the web process)."""

    def put(self, item: Any) -> None: ...

    def get(self, timeout: float | None = None) -> Any: ...


class Held(Protocol):
    """What a thread gathers inside ``held_wakes`` under one key, flushed when the block ends."""

    def flush(self) -> None: ...


H = TypeVar("H", bound=Held)


@contextlib.contextmanager
def held_wakes() -> Iterator[None]:
    """What this thread's puts would do at once inside the block (wake a greenlet, send a
    message to the web process) is gathered per key (``held``) and done once when it ends.
    The engine holds one step's events so: per token, a cross-thread wake-up or a message
    costs as much as the engine's other per-token work together."""
    if getattr(_held, "batches", None) is not None:  # nested: the outer block flushes
        yield
        return
    batches: dict[Any, Held] = {}
    _held.batches = batches
    try:
        yield
    finally:
        _held.batches = None
        for batch in batches.values():
            batch.flush()


def held(key: Any, make: Callable[[Any], H]) -> H | None:
    """Inside ``held_wakes`` on this thread: the batch gathered under ``key`` (``make(key)``
    the first time in the block); outside one: None, and the caller acts at once."""
    batches = getattr(_held, "batches", None)
    if batches is None:
        return None
    batch = batches.get(key)
    if batch is None:
        batch = batches[key] = make(key)
    return batch  # type: ignore[return-value]
