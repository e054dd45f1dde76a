"""An engine process that is a thread: app.engine.child's Child serving the fake engine over a
real socket, for fast tests of RemoteEngine (the wire, the dispatch, a death and the restart)
without a model or a second interpreter."""

from __future__ import annotations

import _socket
import os
from typing import Any

from app.base.state import LoadState
from app.base.threads import ThreadEvent, start_native_thread
from app.engine.child import Child
from app.engine.fake import FakeEngine
from app.engine.fake_embed import FakeEmbedder
from app.engine.remote import RemoteEngine
from app.process.crash_guard import CrashGuard


class ChildFake(FakeEngine):
    """The fake engine with what an engine process's engine has beside the interface."""

    def __init__(self, state: LoadState, embedder: FakeEmbedder | None = None,
                 fail: str = "", on_fatal: Any = None, **kw: Any):
        super().__init__(ready=False, **kw)
        self.state = state
        self._embedder = embedder
        self._fail = fail  # a load error to fail with, as LlamaEngine's does
        self._on_fatal = on_fatal

    @property
    def embedder(self) -> FakeEmbedder | None:
        return self._embedder if self.state.ready else None

    def start(self) -> None:
        self.state.set("loading", progress=0.5)
        if self._fail:
            self.state.fail(self._fail)
            self._on_fatal(self._fail)
            return
        self.state.set("ready", progress=1.0)

    def acquire_model(self, wait: bool = True, timeout: float = 3600.0) -> bool:
        return True

    def release_model(self) -> None:
        pass

    def shutdown(self, timeout: float = 5.0) -> None:
        pass


class ThreadChild:
    """A launched 'engine process': a thread serving ``Child`` on its own copy of the socket.
    ``die`` ends it as a crash would: its socket shut, nothing more answered."""

    def __init__(self, fd: int, record: Any, engines: list[ChildFake], embeds: bool,
                 fail: str = ""):
        self.pid = 4242  # what /props shows: no process of its own
        self.fd = os.dup(fd)  # the web side closes the descriptor it handed over
        self.signal = ""
        self.exit_code: int | None = None
        self._done = ThreadEvent()
        self._record = record
        self._engines = engines
        self._embeds = embeds
        self._fail = fail
        start_native_thread(self._main)

    def _make(self, child: Child, config: Any, paths: tuple, on_fatal: Any) -> ChildFake:
        engine = ChildFake(child.state, FakeEmbedder() if self._embeds else None,
                           fail=self._fail, on_fatal=on_fatal)
        self._engines.append(engine)
        return engine

    def _leave(self, code: int) -> None:
        self.exit_code = code
        if self._record is not None and code == 0:
            self._record.mark_exited()
        self._shut()

    def _main(self) -> None:
        try:
            Child(self.fd, self._record, self._make, self._leave).serve()
        finally:
            self._shut()
            self._done.set()

    def _shut(self) -> None:
        sock = _socket.socket(fileno=os.dup(self.fd))
        try:
            sock.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            sock.close()

    def die(self, signal: str = "SIGKILL") -> None:
        self.signal = signal
        self._shut()

    def wait(self) -> str:
        self._done.wait(10)
        os.close(self.fd)
        return self.signal

    def kill(self) -> None:
        self.die()


class FakeLauncher:
    """RemoteEngine's ``launch``: each call starts a ThreadChild; the children and their
    engines are kept for the test to act on."""

    def __init__(self, embeds: bool = False, fail: str = ""):
        self.children: list[ThreadChild] = []
        self.engines: list[ChildFake] = []
        self.embeds = embeds
        self.fail = fail  # each engine's load fails with this

    def __call__(self, fd: int, record: Any, env: dict[str, str]) -> ThreadChild:
        child = ThreadChild(fd, record, self.engines, self.embeds, self.fail)
        self.children.append(child)
        return child


def remote_fake(config: Any, embeds: bool = False, crash_limit: int = 3,
                on_fatal: Any = None, fail: str = "") -> tuple[RemoteEngine, FakeLauncher]:
    """A RemoteEngine whose engine processes are ThreadChild threads running the fake engine
    (``config``: any EngineConfig; the fake reads none of it)."""
    launcher = FakeLauncher(embeds, fail)
    guard = CrashGuard(crash_limit, 600.0, {}, 0.0, what="engine process")
    engine = RemoteEngine(config, LoadState(), lambda state: "/models/fake-model.gguf",
                          on_fatal=on_fatal, guard=guard, launch=launcher)
    return engine, launcher
