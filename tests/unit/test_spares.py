"""Spares (app.engine.spare): the next load's engine process started ahead. A load takes the
spare when its environment is the spare's (the descriptors it is handed go to it) and starts
the next; a spare in another environment (safe mode) or gone is not used, and the load spawns
fresh; closed, no spare is left waiting. Fakes for the processes; a real spare end to end:
tests/e2e/test_models.py."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from app.engine import spare as spare_mod
from app.engine import spawn as spawn_mod
from app.engine.spare import Spare, Spares
from app.process.crash_guard import _Record

ENV = {"PATH": "/bin"}


class Proc:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.waited = False

    def wait(self) -> str:
        self.waited = True
        return ""

    def kill(self) -> None:
        pass


class Made:
    """Spares made (each with a real control socket, its far end kept to read what came)."""

    def __init__(self) -> None:
        self.spares: list[Spare] = []
        self.far: list[socket.socket] = []

    def __call__(self, env: dict[str, str]) -> Spare:
        ours, theirs = socket.socketpair()
        self.far.append(theirs)
        self.spares.append(Spare(Proc(1000 + len(self.spares)), ours.detach(), dict(env)))
        return self.spares[-1]


def until(check: Any) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def spares() -> tuple[Spares, Made, list[tuple]]:
    made, launched = Made(), []

    def launch(fd: int, record: Any, env: dict[str, str]) -> Proc:
        launched.append((fd, record, env))
        return Proc(1)

    return Spares(launch=launch, make_spare=made), made, launched


def test_the_first_load_spawns_and_starts_a_spare_the_next_takes_it():
    s, made, launched = spares()
    a, b = socket.socketpair()
    assert s(a.fileno(), None, ENV).pid == 1 and len(launched) == 1
    until(lambda: s.pid == 1000)
    proc = s(b.fileno(), None, ENV)
    assert proc.pid == 1000 and s.taken == 1 and len(launched) == 1
    msg, fds, _, _ = socket.recv_fds(made.far[0], 1, 3)  # what the spare was handed
    assert msg == b"T" and len(fds) == 1
    assert os.fstat(fds[0]).st_ino == os.fstat(b.fileno()).st_ino
    until(lambda: s.pid == 1001)  # the next one
    for f in fds:
        os.close(f)
    s.close()


def test_a_spare_of_another_environment_is_retired_and_the_load_spawns():
    s, made, launched = spares()
    s(0, None, ENV)
    until(lambda: s.pid == 1000)
    proc = s(0, None, {**ENV, "FLASH_ATTN": "off"})  # safe mode's environment
    assert proc.pid == 1 and len(launched) == 2 and s.taken == 0
    assert made.far[0].recv(1) == b""  # its control socket closed: it exits
    until(lambda: made.spares[0].proc.waited)  # and is reaped
    s.close()


def test_a_spare_that_is_gone_is_not_used(monkeypatch):
    s, made, launched = spares()
    s(0, None, ENV)
    until(lambda: s.pid == 1000)
    monkeypatch.setattr(spare_mod, "hand_over", lambda spare, fd, record: False)
    assert s(0, None, ENV).pid == 1 and len(launched) == 2 and s.taken == 0
    until(lambda: made.spares[0].proc.waited)
    s.close()


def test_closed_no_spare_waits_and_none_starts():
    s, made, _ = spares()
    s(0, None, ENV)
    until(lambda: s.pid == 1000)
    s.close()
    assert s.pid is None and made.far[0].recv(1) == b""
    s(0, None, ENV)  # (a spare would be started here, before its thread: none is)
    assert len(made.spares) == 1 and s.pid is None


def _env() -> dict[str, str]:
    root = str(Path(spare_mod.__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": root}


def _exit_code(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_real_spare_not_wanted_exits_and_one_taken_is_an_engine_process():
    """Real spares (python -m app.engine.child --control-fd): closed, one exits at once;
    taken, one runs with the descriptors it was handed: it writes the crash guard's record it
    got, reads the socket it got (whose end is closed here: it ends as an engine process
    whose web process went away does) and says it exited."""
    idle = spare_mod.spawn_spare(_env())
    os.close(idle.control)
    assert _exit_code(idle.proc.pid) == 0
    taken = spare_mod.spawn_spare(_env())
    record = _Record()
    ours, theirs = socket.socketpair()
    assert spare_mod.hand_over(taken, theirs.fileno(), record)
    theirs.close()
    ours.close()
    assert _exit_code(taken.proc.pid) == 0
    stage, _detail, exited, fault = record.read()
    assert (stage, exited, fault) == ("starting", True, "")
    record.close()


def test_a_spare_never_inherits_another_spawns_descriptors():
    """Spawns mark their descriptors inheritable only under spawn's lock: a spare started
    meanwhile waits for it, else it would hold another engine's socket open (that engine's
    death never seen as its socket's end)."""
    a, b = socket.socketpair()
    got: list[Spare] = []
    with spawn_mod._spawn_lock:
        os.set_inheritable(b.fileno(), True)
        starter = threading.Thread(target=lambda: got.append(spare_mod.spawn_spare(_env())))
        starter.start()
        starter.join(0.5)  # a spare that did not wait would be spawned by now
        os.set_inheritable(b.fileno(), False)
    starter.join(30)
    pid = got[0].proc.pid
    held = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            held.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
        except OSError:
            continue
    os.close(got[0].control)
    assert _exit_code(pid) == 0
    assert os.fstat(b.fileno()).st_ino not in held
    a.close()
    b.close()
