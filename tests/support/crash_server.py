"""A test-only server: the real gunicorn master with its crash guard (app.process.server.Server), and an
engine that kills its own worker at a chosen stage, for tests/app/test_crash_guard.py.

    python -m tests.support.crash_server      # settings from the environment, as vertex-gguf's

What the engine does, from these test-only variables:
- ``CRASH_AT``: ``loading`` or ``warming_up`` (the worker dies there while starting),
  ``generating`` (a request whose prompt contains ``CRASH`` kills it mid-generation, with the
  signal named after it if any: ``CRASH SIGKILL``), or ``idle`` (the engine thread dies as soon
  as the model is ready, with no request in flight: a broken model or machine).
- ``CRASH_SIGNAL``: ``SIGSEGV`` (a real invalid read through ctypes), ``SIGABRT`` (libc's
  ``abort()``, as a ``GGML_ABORT``), ``SIGKILL`` (as the OOM killer), or any other signal's
  name (raised in the dying thread).

Nothing of this is in the app: the fault is this engine's, installed by this server only.
- ``CRASH_UNLESS_SAFE=1``: a worker in safe mode (CPU_EXTRA_BUFFERS=off) starts normally, as a
  build whose extra buffer types crash does once they are off.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

from app.base.boot import Boot
from app.base.bridge import start_native_thread
from app.base.state import LoadState
from app.edge import logs
from app.engine.fake import FakeEngine
from app.process.cli import load_settings
from app.process.server import Server
from app.settings import Settings


def die(name: str) -> None:
    """End this process the way a native crash does."""
    if name == "SIGSEGV":
        ctypes.string_at(0)  # reads address 0: a real segmentation fault
    elif name == "SIGABRT":
        ctypes.CDLL(None).abort()
    elif name == "SIGKILL":
        os.kill(os.getpid(), signal.SIGKILL)
    # to this thread, as the CPU raises SIGILL or SIGBUS in the thread that ran the instruction
    getattr(ctypes.CDLL(None), "raise")(int(getattr(signal, name)))
    time.sleep(60)  # a signal that does not end the process fails the test (bounded)


class CrashingEngine(FakeEngine):
    def __init__(self, state: LoadState, crash_at: str, signal_name: str, spared: bool):
        super().__init__(ready=False)
        self.state = state
        self.crash_at = crash_at
        self.signal_name = signal_name
        self.spared = spared
        start_native_thread(self._load)

    def _load(self) -> None:
        for stage in ("loading", "warming_up"):
            self.state.set(stage, progress=0.0)
            time.sleep(0.05)
            if stage == self.crash_at and not self.spared:
                die(self.signal_name)
        self.state.set("ready", progress=1.0)
        if self.crash_at == "idle":
            die(self.signal_name)

    def _generate(self, req, channel, handle) -> None:
        prompt = str(req.prompt)
        if self.crash_at == "generating" and "CRASH" in prompt:
            named = prompt.partition("CRASH")[2].split()[:1]
            die(named[0] if named and named[0].startswith("SIG") else self.signal_name)
        super()._generate(req, channel, handle)


class CrashServer(Server):
    def make_engine(self, settings: Settings, boot: Boot) -> CrashingEngine:
        spared = os.environ.get("CRASH_UNLESS_SAFE") == "1" and settings.cpu_extra_buffers == "off"
        return CrashingEngine(LoadState(boot.record), os.environ.get("CRASH_AT", ""),
                              os.environ.get("CRASH_SIGNAL", "SIGSEGV"), spared)


def main() -> None:
    _, settings, _ = load_settings([])
    logs.setup(settings)
    CrashServer(settings).run()


if __name__ == "__main__":
    main()
