"""A stand-in for the engine's decode turns that hands decodes out one at a time, so a test
knows exactly which decode is in progress when it submits (embedding and rerank turns)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from app.base.bridge import ThreadEvent, allocate_lock
from tests.support.server import wait_for


class Gate:
    """Stands in for the decode turns: each embedding decode waits for the test to let it go,
    so the test knows exactly which decode is in progress when it submits."""

    def __init__(self) -> None:
        self.started = 0  # decodes that reached the gate
        self.open = False  # let every decode through
        self._go = ThreadEvent()
        self._lock = allocate_lock()

    @contextlib.contextmanager
    def guest(self) -> Iterator[None]:
        with self._lock:
            self.started += 1
        if not self.open:
            assert self._go.wait(60), "the test never let this decode go"
        yield

    def host_busy(self) -> bool:
        return False

    def release(self) -> None:
        """Let the decode waiting at the gate run."""
        self._go.set()

    def until_started(self, n: int) -> None:
        wait_for(lambda: self.started >= n, 30, f"decode {n} to reach the gate")

    def let_all_go(self) -> None:
        self.open = True
        self._go.set()
