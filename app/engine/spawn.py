"""An engine process's life seen from its parent: started with posix_spawn, its socket written
by a thread of its own, reaped when it ends. The parent is app.engine.remote's supervisor (the
web process runs gevent: nothing here may use its patched primitives, so the originals are
taken; app.base.threads)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from app.base.threads import (
    ThreadEvent,
    allocate_lock,
    close_fd,
    original,
    original_sleep,
    start_native_thread,
)
from app.engine.wire import frame, write_all
from app.process.crash_guard import _Record

EXIT_WAIT = 10.0  # seconds a process whose socket closed has to exit before it is killed
# gevent's would watch the child on the hub's loop; these run on the supervisor's thread
_waitpid = original("os", "waitpid")
_posix_spawn = original("os", "posix_spawn")
_spawn_lock = allocate_lock()


class Process(Protocol):
    """An engine process, as its supervisor sees it."""

    pid: int

    def wait(self) -> str:
        """Until it has exited (killed if it lingers): the signal that ended it, or ""."""
        ...

    def kill(self) -> None: ...


class Spawned:
    """A real engine process (``python -m app.engine.child``)."""

    def __init__(self, pid: int):
        self.pid = pid

    def wait(self) -> str:
        deadline = time.monotonic() + EXIT_WAIT
        while True:
            try:
                pid, status = _waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return ""
            if pid:
                break
            if time.monotonic() > deadline:
                self.kill()
                deadline = float("inf")
            original_sleep(0.02)
        if os.WIFSIGNALED(status):
            try:
                return signal.Signals(os.WTERMSIG(status)).name
            except ValueError:
                return f"signal {os.WTERMSIG(status)}"
        return ""

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


def spawn(fd: int, record: _Record | None, env: dict[str, str]) -> Process:
    """A fresh interpreter running app.engine.child on ``fd`` (``start_child``)."""
    args, fds = ["--fd", str(fd)], [fd]
    if record is not None:
        args += ["--stage-fd", str(record.stage_fd), "--fault-fd", str(record.fault_fd)]
        fds += [record.stage_fd, record.fault_fd]
    return start_child(args, fds, env)


def start_child(args: list[str], fds: list[int], env: dict[str, str]) -> Spawned:
    """``python -m app.engine.child ARGS`` (posix_spawn: no fork of this process, which runs
    gevent and threads) with ``fds`` inherited, in the server's process group (its CPU counted
    with the server's), with SIGTERM and SIGINT blocked until it ignores them: a signal to the
    group is the web process's to act on (a SIGTERM drains, then ends the engine process).
    The descriptors are inheritable only under the lock, for this spawn: another child that
    inherited an engine's socket would keep it open past the engine's death (no EOF seen)."""
    argv = [sys.executable, "-m", "app.engine.child", *args]
    with _spawn_lock:
        for f in fds:
            os.set_inheritable(f, True)
        try:
            pid = _posix_spawn(sys.executable, argv, env,
                               setsigmask={signal.SIGTERM, signal.SIGINT})
        finally:
            for f in fds:
                os.set_inheritable(f, False)
    return Spawned(pid)


Launch = Callable[[int, _Record | None, dict[str, str]], Process]


class Link:
    """One engine process's socket: frames queued by any greenlet or thread, written by a
    thread of its own (a large prompt never holds the hub while the other side reads it)."""

    def __init__(self, proc: Process, fd: int):
        self.proc = proc
        self.fd = fd
        self.closed = False
        self._out: deque[bytes] = deque()
        self._wake = ThreadEvent()
        self._writer_done = ThreadEvent()
        start_native_thread(self._write_main)

    def send(self, msg: Any) -> None:
        if not self.closed:
            self._out.append(frame(msg))
            self._wake.set()

    def _write_main(self) -> None:
        try:
            while not self.closed:
                if not self._out:
                    self._wake.wait(0.5)
                    continue
                chunks = []
                while self._out:
                    chunks.append(self._out.popleft())
                write_all(self.fd, b"".join(chunks))
        except OSError:
            self.closed = True  # the process is gone: the reader sees it
        finally:
            self._writer_done.set()

    def finish(self) -> None:
        """Once its reader has seen the end: the writer stopped, then the socket closed."""
        self.closed = True
        self._wake.set()
        self._writer_done.wait(5.0)
        close_fd(self.fd)
