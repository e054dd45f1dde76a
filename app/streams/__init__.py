"""Resumable streams: a streaming response opted in with ``X-Conversation-Id`` is produced into a
session that outlives its connection, and any number of readers follow it from a byte offset.

The POST's own response is just the first reader (from byte 0): when its client goes away the
generation runs on into the session, and ``GET /v1/stream?conv_id=&from=N`` picks it up. Only a
DELETE, a second POST with the same id, the request timeout or shutdown stop it. With
STREAM_STORE=redis://... every session is also mirrored to Redis (app.streams.redis_store), so
a reader, a DELETE or a second POST on another replica reach it.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from collections.abc import Iterator

import gevent

from app.base import reqctx
from app.base.errors import TooManyStreams
from app.streams.session import (
    OffsetLost,
    Session,
    Status,
    StreamNotFound,
    check_start,
    conversation_id,
    offset,
)

__all__ = ["OffsetLost", "Streams", "StreamNotFound", "conversation_id", "offset"]

log = logging.getLogger(__name__)

KILL_WAIT = 5.0  # seconds a DELETE waits for the generation it stops to unwind
IDLE_WAIT = 30.0  # seconds a reader waits between checks when heartbeats are off
GC_EVERY = 60.0  # seconds between collections of expired sessions (as llama-server)
_readers = itertools.count()  # ids of connected readers (their pins)


class Streams:
    """This process's sessions by conversation id, and the Redis mirror when one is set."""

    def __init__(self, cap: int, ttl: float, heartbeat: float | None, store_url: str = "memory",
                 max_live: int = 0, unread_timeout: float = 0.0):
        self.cap = cap
        self.ttl = ttl
        self.heartbeat = heartbeat or None
        self.max_live = max_live  # live sessions per API key on this replica (0: no cap)
        self.unread_timeout = unread_timeout  # a generation nobody reads is stopped (0: never)
        self._sessions: dict[str, Session] = {}
        self._collector: gevent.Greenlet | None = None
        self.remote = None
        if store_url != "memory":
            from app.streams.redis_store import RedisStore

            self.remote = RedisStore(store_url, cap, ttl, self._cancelled_elsewhere)

    # ---- the POST ----------------------------------------------------------------------------
    def replace(self, conv_id: str, scope: str) -> None:
        """A POST with this id is starting: whatever ran under it stops now (on any replica),
        before the new request is even validated (llama-server's order)."""
        self.cancel(conv_id, scope, "replaced by a new request with the same id")

    def admit(self, scope: str) -> None:
        """A new resumable generation for this key, unless it already runs STREAM_MAX_LIVE_PER_KEY
        of them here (a 429): one key cannot park generations nobody reads ahead of every other
        key's requests."""
        if not self.max_live:
            return
        live = sum(1 for s in self._sessions.values() if s.scope == scope and s.generating)
        if live >= self.max_live:
            raise TooManyStreams(
                f"this API key already runs {live} resumable streams (X-Conversation-Id) on "
                f"this replica, the most it may (STREAM_MAX_LIVE_PER_KEY={self.max_live}): end "
                "one (DELETE /v1/stream) or wait for one to finish")

    def produce(self, conv_id: str, scope: str, frames: Iterator[bytes],
                keepalive: bytes) -> Iterator[bytes]:
        """Drain ``frames`` (a stream with no heartbeats of its own) into a new session on a
        greenlet of its own, and return the POST's response: a reader from byte 0."""
        key = _key(conv_id, scope)
        old = self._sessions.get(key)
        if old is not None:  # two POSTs with one id at once: the later wins
            self._evict(old, "replaced by a new request with the same id")
        session = Session(conv_id, secrets.token_hex(12), scope, self.cap, keepalive)
        self._sessions[key] = session
        session.frames = frames
        session.producer = gevent.spawn(reqctx.carry(self._drain), session)
        if self.remote is not None:
            self.remote.mirror(session)
        if self._collector is None:
            every = min(GC_EVERY, max(1.0, self.unread_timeout / 4)) if self.unread_timeout \
                else GC_EVERY
            self._collector = gevent.spawn(self._collect_every, every)
        return _Reader(session, 0, self.heartbeat)

    def _drain(self, session: Session) -> None:
        frames = session.frames
        try:
            for chunk in frames:
                if getattr(frames, "ending", False):
                    # the generation has ended: the frames left are its closing ones, rendered
                    # without waiting. They go out with the session's end, so no reader (a
                    # client that then starts its next stream), lookup or per-key count sees
                    # the last event before the end is recorded (security review round 3)
                    tail = [chunk]
                    try:
                        tail.extend(frames)
                    finally:
                        session.write(b"".join(tail))
                        session.finish()
                    break
                session.write(chunk)
                if self._unread(session, time.monotonic()):
                    session.cancelled = True
                    break
        except Exception:  # noqa: BLE001 - the renderers turn failures into events themselves
            log.exception("resumable stream %s: producing failed", session.conv_id)
        finally:
            frames.close()  # the run is closed: a stopped generation frees its slot
            session.finish()
            log.info("resumable stream %s ended after %d bytes%s", session.conv_id,
                     session.total, " (stopped)" if session.cancelled else "")

    def _unread(self, session: Session, now: float) -> bool:
        """A live generation that no reader has followed for STREAM_UNREAD_TIMEOUT seconds,
        here or (through Redis) on another replica: it is stopped."""
        if not self.unread_timeout or session.done:
            return False
        if session.unread_for(now) < self.unread_timeout:
            return False
        if self.remote is not None and self.remote.read_lately(session.uid):
            return False
        log.info("resumable stream %s: stopped, nobody has read it for %g s "
                 "(STREAM_UNREAD_TIMEOUT)", session.conv_id, self.unread_timeout)
        return True

    # ---- readers -----------------------------------------------------------------------------
    def follow(self, conv_id: str, scope: str, pos: int) -> Iterator[bytes]:
        """``GET /v1/stream``: the bytes from ``pos``, then live ones until the session ends.
        Errors (404, 400 offset lost) are raised here, before the first byte."""
        session = self._local(conv_id, scope)
        if session is not None:
            check_start(pos, session.first, session.total, session.done)
            return _Reader(session, pos, self.heartbeat)
        if self.remote is not None:
            return self.remote.follow(conv_id, scope, pos, self.heartbeat)
        raise StreamNotFound()

    # ---- DELETE, lookup ----------------------------------------------------------------------
    def cancel(self, conv_id: str, scope: str, why: str = "stopped by DELETE") -> None:
        """Stop the generation and forget the session, wherever it runs (idempotent)."""
        session = self._sessions.get(_key(conv_id, scope))
        if session is not None:
            self._evict(session, why)
        if self.remote is not None:  # and wherever else a session under this id runs
            self.remote.cancel(conv_id, scope)

    def lookup(self, conv_ids: list[str], scope: str) -> list[Status]:
        out: list[Status] = []
        missing: list[str] = []
        for conv in dict.fromkeys(conv_ids):
            session = self._local(conv, scope)
            if session is None:
                missing.append(conv)
            else:
                out.append(session.status())
        if self.remote is not None and missing:
            out += self.remote.lookup(missing, scope)
        return out

    def live(self) -> int:
        """Generations still running, or still being written to Redis (a draining worker
        waits for them)."""
        return sum(1 for s in self._sessions.values() if not s.done or s.flushing)

    def stats(self) -> dict[str, object]:
        body: dict[str, object] = {
            "sessions": len(self._sessions), "live": self.live(),
            "bytes": sum(s.nbytes() for s in self._sessions.values()),
            "store": "redis" if self.remote is not None else "memory",
        }
        if self.remote is not None:
            body["redis_up"] = self.remote.up
        return body

    # ---- internals ---------------------------------------------------------------------------
    def _local(self, conv_id: str, scope: str) -> Session | None:
        """This replica's session under the id, unless it has expired (the collector may not
        have run yet), or a POST or DELETE on another replica has superseded it since it
        finished (a live one learns of that by itself)."""
        key = _key(conv_id, scope)
        session = self._sessions.get(key)
        if session is not None and self._expired(session, time.monotonic()):
            del self._sessions[key]
            return None
        if session is not None and session.done and self.remote is not None \
                and not self.remote.current(session):
            self._evict(session, "superseded on another replica")
            return None
        return session

    def _evict(self, session: Session, why: str) -> None:
        key = _key(session.conv_id, session.scope)
        if self._sessions.get(key) is session:
            del self._sessions[key]
        if session.done:
            if self.remote is not None:
                self.remote.forget(session)
            return
        session.cancelled = True
        log.info("resumable stream %s: %s", session.conv_id, why)
        producer = session.producer
        if producer is not None and producer is not gevent.getcurrent():
            producer.kill(block=True, timeout=KILL_WAIT)
            if producer.dead:  # closing is idempotent; a producer killed before it ran never
                session.frames.close()  # closed its run
        session.finish()
        if self.remote is not None:
            self.remote.forget(session)

    def _cancelled_elsewhere(self, uid: str) -> None:
        """Another replica stopped (DELETE) or replaced (second POST) this replica's session."""
        for session in list(self._sessions.values()):
            if session.uid == uid:
                gevent.spawn(self._evict, session, "stopped from another replica")

    def _collect_every(self, seconds: float) -> None:
        while True:
            gevent.sleep(seconds)
            self._collect()

    def _expired(self, s: Session, now: float) -> bool:
        """Finished longer than STREAM_SESSION_TTL ago (a live session never expires)."""
        return s.done_monotonic is not None and now - s.done_monotonic > self.ttl

    def _collect(self) -> None:
        """Forget expired sessions: their memory, every GC_EVERY seconds (a request for one
        finds it expired at once, see _local); stop the generations nobody reads (one still
        waiting for a slot writes nothing, so its producer cannot notice by itself)."""
        now = time.monotonic()
        for key, s in list(self._sessions.items()):
            if self._expired(s, now):
                del self._sessions[key]
            elif self._unread(s, now):
                self._evict(s, "nobody read it (STREAM_UNREAD_TIMEOUT)")

    def close(self) -> None:
        if self._collector is not None:
            self._collector.kill(block=False)
        if self.remote is not None:
            self.remote.close()


class _Reader:
    """A connected reader of a session, from ``pos`` to the end. It is pinned from the start
    (the ring keeps what it has not read), and unpinned on ``close`` even if never iterated."""

    def __init__(self, session: Session, pos: int, heartbeat: float | None):
        self.session = session
        self.pos = pos
        self.heartbeat = heartbeat
        self._id = next(_readers)
        session.pin(self._id, pos)
        self._frames = self._run()

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        return next(self._frames)

    def close(self) -> None:
        self._frames.close()
        self.session.pin(self._id, None)

    def _run(self) -> Iterator[bytes]:
        s = self.session
        wait = self.heartbeat or IDLE_WAIT
        try:
            while True:
                data = s.read(self.pos, pinned=True)
                if data:
                    self.pos += len(data)
                    s.pin(self._id, self.pos)
                    yield data
                    continue
                if s.done:
                    return
                before = s.total
                s.wait(self.pos, wait)
                if self.heartbeat and s.total == before and not s.done:
                    yield s.keepalive  # per connection: never in the session's bytes
        finally:
            s.pin(self._id, None)


def _key(conv_id: str, scope: str) -> str:
    """Sessions are per API key: another key's POST, GET or DELETE with the same id never
    reaches them (ids are chosen by clients, so two tenants may pick the same one)."""
    return f"{scope}/{conv_id}"

