"""One resumable stream in this process: the newest bytes of a response body, and the readers
waiting for more.

Offsets are byte offsets into the whole response body (0 = its first byte), never into the
ring: a reader that resumes from N gets byte N onwards, whatever was dropped before it. The ring
drops its oldest bytes logically at once (a resume below ``first`` is refused) and physically in
amortized steps, so a token's write never moves megabytes. A connected reader pins what it has
not read yet: a slow client never loses bytes (its connection's timeout bounds how long it may
hold them); the ring bounds what a reconnect can replay.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import gevent
import gevent.event

from app.base.errors import BadRequest, NotFound

CONVERSATION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
MAX_OFFSET = 2**53  # far past any stream; keeps offsets valid as Redis stream ids


class OffsetLost(BadRequest):
    """The bytes from this offset have dropped out of the ring."""

    code = "stream_offset_lost"

    def __init__(self, offset: int, first: int):
        super().__init__(f"stream offset lost, please restart: byte {offset} has dropped out of "
                         f"the stream's buffer (it keeps bytes from {first} on)", param="from")


class StreamNotFound(NotFound):
    code = "stream_not_found"

    def __init__(self) -> None:
        super().__init__("stream not found or expired")


def conversation_id(value: str | None, param: str = "X-Conversation-Id") -> str | None:
    """A valid conversation id, None when absent; anything else is a 400."""
    if value is None:
        return None
    if not CONVERSATION_ID.fullmatch(value):
        raise BadRequest(f"{param} must be 1-128 characters of A-Z a-z 0-9 . _ : -",
                         param=param)
    return value


def offset(value: str | int | None) -> int:
    """A ``from`` offset: a non-negative integer (default 0)."""
    if value is None or value == "":
        return 0
    if isinstance(value, bool) or not (isinstance(value, int) or (
            isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 19)):
        raise BadRequest("invalid 'from' offset: a byte offset (a non-negative integer)",
                         param="from")
    n = int(value)
    if n < 0 or n > MAX_OFFSET:
        raise BadRequest("invalid 'from' offset: a byte offset (a non-negative integer)",
                         param="from")
    return n


def check_start(pos: int, first: int, total: int, done: bool) -> None:
    """Whether a reader may start at ``pos`` of a session keeping bytes from ``first``, with
    ``total`` written so far: a 400 for bytes dropped from the ring, or past a finished end."""
    if pos < first:
        raise OffsetLost(pos, first)
    if done and pos > total:
        raise BadRequest(f"invalid 'from' offset: {pos} is past the stream's end ({total} "
                         "bytes)", param="from")


@dataclass(frozen=True)
class Status:
    """What the lookup route says of a session (unix seconds; ``completed_at`` 0 while live)."""

    conversation_id: str
    is_done: bool
    total_bytes: int
    started_at: int
    completed_at: int

    def body(self) -> dict[str, object]:
        return {"conversation_id": self.conversation_id, "is_done": self.is_done,
                "total_bytes": self.total_bytes, "started_at": self.started_at,
                "completed_at": self.completed_at}


class Session:
    """The bytes of one response body, the newest ``cap`` of them kept."""

    def __init__(self, conv_id: str, uid: str, scope: str, cap: int, keepalive: bytes):
        self.conv_id = conv_id
        self.uid = uid  # this POST's session (a second POST with the same id is another)
        self.scope = scope  # the API key's scope: another key's reader gets a 404
        self.cap = cap
        self.keepalive = keepalive  # the API's heartbeat frame, sent per connection
        self._buf = bytearray()
        self._start = 0  # the offset of _buf[0]
        self.total = 0
        self.started_at = time.time()
        self.completed_at: float | None = None  # wall clock, once done
        self.done_monotonic: float | None = None
        self.cancelled = False
        self.producer: gevent.Greenlet | None = None
        self.frames: Any = None  # what the producer drains (closed on a stop)
        self.flushing = False  # the Redis mirror has not written the end yet
        self._changed = gevent.event.Event()
        self._pins: dict[int, int] = {}  # connected readers' positions
        self.unread_since: float | None = time.monotonic()  # no reader since (None: read now)

    # ---- writing (the producer) --------------------------------------------------------------
    @property
    def first(self) -> int:
        """The earliest offset still kept."""
        return max(self._start, self.total - self.cap)

    @property
    def done(self) -> bool:
        return self.completed_at is not None

    @property
    def generating(self) -> bool:
        """Its generation still runs (what STREAM_MAX_LIVE_PER_KEY counts): not once the run
        has ended, even while its closing frames are still being rendered."""
        return not self.done and not getattr(self.frames, "ending", False)

    def write(self, data: bytes) -> None:
        if self.done or not data:
            return
        self._buf += data
        self.total += len(data)
        if len(self._buf) > self.cap + self.cap // 4:  # drop the oldest, a quarter at a time
            self._compact()
        self._wake()

    def _compact(self) -> None:
        """Drop the bytes before the ring that no connected reader still needs."""
        keep_from = min([self.total - self.cap, *self._pins.values()])
        if keep_from > self._start:
            del self._buf[: keep_from - self._start]
            self._start = keep_from

    def finish(self) -> None:
        """No more bytes: readers end once they have read them all (idempotent)."""
        if self.completed_at is None:
            self.completed_at = time.time()
            self.done_monotonic = time.monotonic()
            self._compact()  # kept for its TTL: no more than the ring
            self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, gevent.event.Event()
        changed.set()

    # ---- reading -----------------------------------------------------------------------------
    def read(self, pos: int, limit: int = 256 * 1024, pinned: bool = False) -> bytes:
        """Bytes from ``pos`` on (at most ``limit``); empty when none are there yet.
        ``pinned``: a connected reader's read (its pin kept the bytes)."""
        if pos < (self._start if pinned else self.first):
            raise OffsetLost(pos, self.first)
        if pos >= self.total:
            return b""
        i = pos - self._start
        return bytes(self._buf[i: i + limit])

    def wait(self, pos: int, timeout: float | None) -> None:
        """Until there are bytes beyond ``pos``, the session is done, or ``timeout``."""
        changed = self._changed
        if self.total > pos or self.done:
            return
        changed.wait(timeout)

    def pin(self, reader: int, pos: int | None) -> None:
        """A connected reader is at ``pos`` (None: it has gone)."""
        if pos is None:
            self._pins.pop(reader, None)
            if not self._pins:
                self.unread_since = time.monotonic()
                if self.done:
                    self._compact()
        else:
            self._pins[reader] = pos
            self.unread_since = None

    def unread_for(self, now: float) -> float:
        """Seconds since the last connected reader of this replica left (0 while one reads)."""
        return 0.0 if self.unread_since is None else now - self.unread_since

    def status(self) -> Status:
        return Status(self.conv_id, self.done, self.total, int(self.started_at),
                      int(self.completed_at or 0))

    def nbytes(self) -> int:
        return len(self._buf)
