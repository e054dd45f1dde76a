"""The greenlet side of a submitted generation: reading its events (every engine), and for the
llama.cpp engine, cancelling it or injecting text through each job's control."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from app.base.threads import Mailbox
from app.engine.types import Event, Failed, Finished

if TYPE_CHECKING:
    from app.engine.slots import Job


def new_channel() -> Mailbox:
    """A channel for the calling greenlet to read (app.base.bridge.Channel). Imported on first
    use: an engine process, whose every request brings its own mailbox, never loads gevent."""
    from app.base.bridge import Channel

    return Channel()


class ChannelHandle:
    """Reads a request's events from its channel; over at the first Failed, or once every one
    of its ``n`` choices has Finished."""

    def __init__(self, channel: Mailbox, n: int = 1):
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


class JobHandle(ChannelHandle):
    """A submitted job (and its other choices) as seen by the request's greenlet: what it may do
    to them goes through their ``JobControl``, then ``wake`` stirs the engine thread."""

    def __init__(self, job: Job, channel: Mailbox, wake: Callable[[], None]):
        super().__init__(channel, 1 + len(job.followers))
        self._job = job
        self._wake = wake

    def cancel(self) -> None:
        if not self._over:
            for job in (self._job, *self._job.followers):
                job.control.cancel()
            self._wake()

    def inject(self, text: str, unless: str = "") -> None:
        if not self._over:
            self._job.control.inject(text, unless.encode())
            self._wake()
