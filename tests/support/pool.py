"""The hub's worker-thread pool (app.base.bridge.offload) held full, for the tests of what a
full pool does to new requests and to /health."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import gevent

from app.base import bridge
from tests.support.server import wait_for


class Gate:
    """Offloaded calls that hold their pool thread until opened (bounded: 30 s at most)."""

    def __init__(self) -> None:
        self._open = bridge.ThreadEvent()

    def hold(self) -> str:
        if self._open.wait(30):
            self._open.set()  # the event resets: pass it on to the next holder
        return "held"

    def open(self) -> None:
        self._open.set()


@contextlib.contextmanager
def full_pool() -> Iterator[list[gevent.Greenlet]]:
    """Every thread of the pool held, and one call more waiting in gevent's queue (it lets
    one more call than threads in): a further call waits in spawn itself. Opened on exit."""
    size = gevent.get_hub().threadpool.maxsize
    gate = Gate()
    holders = [gevent.spawn(bridge.offload, gate.hold) for _ in range(size + 1)]
    try:
        wait_for(lambda: bridge.prep_threads(60)[0]["busy"] == size, 30, "a full pool",
                 nap=gevent.sleep)
        yield holders
    finally:
        gate.open()
        gevent.joinall(holders, timeout=30)
