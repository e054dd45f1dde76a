"""The greenlet side of a submitted generation, shared by every engine."""

from __future__ import annotations

from collections.abc import Iterator

from app.base.bridge import Channel
from app.engine.types import Event, Failed, Finished


class ChannelHandle:
    """Reads a request's events from its channel; over at the first Failed, or once every one
    of its ``n`` choices has Finished."""

    def __init__(self, channel: Channel, n: int = 1):
        self._channel = channel
        self._over = False
        self._left = n

    @property
    def over(self) -> bool:
        """Every event has been read."""
        return self._over

    def next_event(self, timeout: float | None = None) -> Event:
        ev = self._channel.get(timeout)
        if isinstance(ev, Failed):
            self._over = True
        elif isinstance(ev, Finished):
            self._left -= 1
            self._over = self._left == 0
        return ev

    def __iter__(self) -> Iterator[Event]:
        while not self._over:
            yield self.next_event()
