"""A spare engine process, started ahead: a model's load skips the interpreter's start and the
engine's imports (0.18 s of a 0.5 s switch between two small models, which llama-server's
router, starting a native child, does not pay).

A spare is ``python -m app.engine.child --control-fd N``: it imports llama.cpp and the engine,
then waits on its control socket. Taking it sends it what a fresh engine process is spawned
with (its socket to the web process, the crash guard's two records) as SCM_RIGHTS on that
socket; from there it is any engine process. ``Spares`` is a ``Launch`` (app.engine.spawn):
RemoteEngine hands it what it would hand ``spawn`` and gets a Process, the spare's when one
is ready with the same environment, else a fresh one; each one taken starts the next. One
spare at most, only where several models come and go (a pool): it costs an idle interpreter
with llama.cpp loaded (tens of MB), and a server of one model loads once.
"""

from __future__ import annotations

import _socket
import array
import contextlib
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass

from app.base.threads import allocate_lock, close_fd, start_native_thread
from app.engine.spawn import Process, spawn, start_child
from app.process.crash_guard import _Record

log = logging.getLogger(__name__)


@dataclass
class Spare:
    proc: Process
    control: int  # the web process's end of its control socket
    env: dict[str, str]


def spawn_spare(env: dict[str, str]) -> Spare:
    """A spare engine process: a fresh interpreter (``start_child``) that imports the engine
    and waits to be taken on a control socket."""
    # the C module's sockets: the web process runs gevent, whose patched ones are its hub's
    ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    control, child = ours.detach(), theirs.detach()
    try:
        proc = start_child(["--control-fd", str(child)], [child], env)
    except BaseException:
        close_fd(control)
        raise
    finally:
        close_fd(child)
    return Spare(proc, control, dict(env))


def hand_over(spare: Spare, fd: int, record: _Record | None) -> bool:
    """Give the spare an engine process's descriptors; False when it is gone (its socket
    refused them)."""
    fds = [fd] + ([record.stage_fd, record.fault_fd] if record is not None else [])
    sock = _socket.socket(fileno=spare.control)
    try:
        sock.sendmsg([b"T"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array.array("i", fds))])
        return True
    except OSError:
        return False
    finally:
        close_fd(sock.detach())  # closed now (gevent's os.close would defer it)


class Spares:
    """At most one spare engine process, ready for the next load (a ``Launch``)."""

    def __init__(self, launch: Callable[..., Process] = spawn,
                 make_spare: Callable[[dict[str, str]], Spare] = spawn_spare) -> None:
        self._launch = launch
        self._make_spare = make_spare
        self._lock = allocate_lock()
        self._spare: Spare | None = None
        self._starting = False
        self._closed = False
        self.taken = 0  # spares that became engine processes (for tests and logs)

    @property
    def pid(self) -> int | None:
        """The spare's process id (/health), None while there is none."""
        spare = self._spare
        return spare.proc.pid if spare is not None else None

    def __call__(self, fd: int, record: _Record | None, env: dict[str, str]) -> Process:
        with self._lock:
            spare, self._spare = self._spare, None
        proc = None
        if spare is not None and spare.env == env:
            if hand_over(spare, fd, record):
                self.taken += 1
                proc = spare.proc
            else:
                log.warning("the spare engine process %d was gone: starting one",
                            spare.proc.pid)
                start_native_thread(spare.proc.wait)  # reaped
        elif spare is not None:  # another environment (safe mode): not this one's
            self._retire(spare)
        if proc is None:
            proc = self._launch(fd, record, env)
        self._prime(env)
        return proc

    def _prime(self, env: dict[str, str]) -> None:
        """Start the next spare, in the background (the load that took this one goes on)."""
        with self._lock:
            if self._closed or self._spare is not None or self._starting:
                return
            self._starting = True

        def start() -> None:
            spare = None
            try:
                spare = self._make_spare(env)
            except Exception:  # noqa: BLE001 - without a spare, loads spawn as before
                log.exception("could not start a spare engine process")
            with self._lock:
                self._starting = False
                if spare is not None and not self._closed and self._spare is None:
                    self._spare, spare = spare, None
            if spare is not None:  # closed meanwhile
                self._retire(spare)

        start_native_thread(start)

    def _retire(self, spare: Spare) -> None:
        """A spare not wanted: its control socket closed (it exits), then reaped."""
        close_fd(spare.control)
        start_native_thread(spare.proc.wait)

    def close(self) -> None:
        """No more spares (the server stops): the one waiting exits."""
        with self._lock:
            self._closed = True
            spare, self._spare = self._spare, None
        if spare is not None:
            self._retire(spare)


def wait_to_be_taken(control_fd: int) -> list[int] | None:
    """In a spare (app.engine.child): import what a load needs, then wait on the control
    socket for an engine process's descriptors (its socket, then the crash guard's records
    when it has them); None when the web process closed it instead (no longer wanted, or
    gone)."""
    from llama_cpp import llama_cpp  # noqa: F401

    import app.engine.llama_engine  # noqa: F401 - what a load would import first

    sock = socket.socket(fileno=control_fd)
    try:
        msg, fds, _flags, _addr = socket.recv_fds(sock, 1, 3)
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):
            sock.close()
    if not msg:
        for f in fds:
            close_fd(f)
        return None
    return fds
