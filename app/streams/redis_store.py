"""Resumable streams shared between replicas through Redis (STREAM_STORE=redis://...).

The replica that runs a generation keeps its session in memory (app.streams.session) and a
greenlet mirrors it to Redis; readers, DELETEs and second POSTs on other replicas go through
Redis. Per session (``uid``, one per POST):

- ``c:<scope>/<conv>``: the conversation's current session uid (a second POST moves it);
- ``m:<uid>``: a hash: started_at, completed_at, total, first, done, keepalive;
- ``b:<uid>``: a Redis stream of the body's bytes. An entry's id is ``<offset + 1>-0`` (offset:
  the entry's first byte in the body), so a reader finds the entry holding any offset with one
  XREVRANGE and follows with XREAD; entries older than STREAM_BUFFER_BYTES are trimmed with
  XTRIM MINID; an entry with field ``e`` ends the stream;
- ``a:<uid>``: present while the producer lives (refreshed every second, expires in five): a
  reader whose producer died ends instead of waiting for ever;
- ``x:<uid>``: a tombstone: the session was stopped (DELETE, second POST) from another replica;
- ``r:<uid>``: present while a reader on some replica follows the session (refreshed every two
  seconds, expires in ten): the owner does not stop it as unread (STREAM_UNREAD_TIMEOUT);
- channel ``cancel``: a uid whose generation must stop: the owner stops it at once (and checks
  the tombstone every second, in case the message was lost).

Redis faults never fail a stream: the local session goes on, one warning is logged, and once
Redis answers again the mirror rewrites the session from its local ring (a restarted Redis has
lost it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import gevent
import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from app.streams.session import Session, Status, StreamNotFound, check_start

log = logging.getLogger(__name__)

PREFIX = "vertex-gguf:stream:"
CHANNEL = PREFIX + "cancel"
TICK = 1.0  # seconds between the producer's liveness refreshes (and pointer checks)
# seconds between two flushes of a session to Redis: a flush is one round trip (~100 µs of this
# process's CPU, bench/stream_resume.py), so a fast stream sends several tokens in each, and a
# reader on another replica lags by at most this much
FLUSH_EVERY = 0.05
ALIVE_MS = 5000  # the liveness key's lifetime
RETRY = 1.0  # seconds between attempts while Redis is unreachable
BLOCK_MS = 2000  # a reader's longest XREAD wait (below the socket timeout)
SEEK_RETRY = 0.1  # seconds before a reader seeks again after a gap (never a tight loop)
READING_EVERY = 2.0  # seconds between a remote reader's "still reading" marks
READING_TTL = 10  # seconds a mark lasts (a reader gone stops marking)
OUTAGE_GRACE = 30.0  # seconds a reader on another replica rides out a Redis outage
LIVE_EXPIRY = 3600  # seconds a live session's keys outlive their last refresh (a dead replica)

# delete, or set the lifetime of, a key only while it still holds this value (a pointer that
# another POST has moved is left alone)
_DEL_IF = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end"
_EXPIRE_IF = ("if redis.call('get', KEYS[1]) == ARGV[1] then "
              "return redis.call('expire', KEYS[1], ARGV[2]) end")
OUTAGES = (RedisConnectionError, RedisTimeoutError)  # Redis unreachable, as opposed to refusing


class _MetaGone(Exception):
    """A session's metadata vanished under a reader (a restarted Redis, an expiry)."""


def _ptr(conv_id: str, scope: str) -> str:
    return f"{PREFIX}c:{scope}/{conv_id}"


def _meta(uid: str) -> str:
    return f"{PREFIX}m:{uid}"


def _data(uid: str) -> str:
    return f"{PREFIX}b:{uid}"


def _alive(uid: str) -> str:
    return f"{PREFIX}a:{uid}"


def _stopped(uid: str) -> str:
    return f"{PREFIX}x:{uid}"


def _reading(uid: str) -> str:
    """Set, with a short expiry, while a reader on some replica follows the session."""
    return f"{PREFIX}r:{uid}"


def _start(entry_id: bytes) -> int:
    return int(entry_id.split(b"-", 1)[0]) - 1


def queue_bytes(pipe: Any, uid: str, data: bytes, written: int,
                entries: deque[tuple[int, int]], cap: int) -> int:
    """Queue on ``pipe`` one entry of ``data`` at body offset ``written`` of session ``uid``,
    the stream trimmed to the newest ``cap`` bytes and the status updated; ``entries`` (offset,
    length) of what Redis holds is kept in step. The new number of bytes written."""
    pipe.xadd(_data(uid), {"d": data}, id=f"{written + 1}-0")
    entries.append((written, len(data)))
    written += len(data)
    floor = written - cap
    trimmed = False
    while len(entries) > 1 and entries[0][0] + entries[0][1] <= floor:
        entries.popleft()
        trimmed = True
    if trimmed:
        pipe.xtrim(_data(uid), minid=f"{entries[0][0] + 1}-0", approximate=False)
    pipe.hset(_meta(uid), mapping={"total": written, "first": max(entries[0][0], floor, 0)})
    return written


class RedisStore:
    def __init__(self, url: str, cap: int, ttl: float, on_cancel: Callable[[str], None]):
        self.client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2,
                                           health_check_interval=15)
        self.cap = cap
        self.ttl = max(1, int(ttl))
        self.on_cancel = on_cancel
        self.replica = f"{socket.gethostname()}:{os.getpid()}"
        self.up = True
        self._retry_at = 0.0
        self._closed = False
        self._del_if = self.client.register_script(_DEL_IF)
        self._expire_if = self.client.register_script(_EXPIRE_IF)
        self._refused_logged = 0.0
        self._listener = gevent.spawn(self._listen)
        log.info("resumable streams are shared through Redis at %s",
                 self.client.connection_pool.connection_kwargs.get("host", url.split("@")[-1]))

    # ---- Redis faults ------------------------------------------------------------------------
    def _fault(self, exc: BaseException, what: str) -> None:
        if not isinstance(exc, OUTAGES):  # Redis answered, with an error: not an outage
            if time.monotonic() - self._refused_logged > 60:
                self._refused_logged = time.monotonic()
                log.warning("Redis (STREAM_STORE) refused a command while %s: %s", what, exc)
            return
        if self.up:  # one warning per outage
            log.warning("Redis (STREAM_STORE) failed while %s: %s. Resumable streams go on in "
                        "this replica only until it answers again.", what, exc)
        self.up = False
        self._retry_at = time.monotonic() + RETRY

    def _ok(self) -> None:
        if not self.up:
            log.warning("Redis (STREAM_STORE) answers again: sessions are shared again")
        self.up = True

    def _waiting(self) -> bool:
        """Whether Redis is known down and not due for another try."""
        return not self.up and time.monotonic() < self._retry_at

    def _try(self, what: str, fn: Callable[[], Any], default: Any = None) -> Any:
        if self._waiting():
            return default
        try:
            out = fn()
        except RedisError as exc:
            self._fault(exc, what)
            return default
        self._ok()
        return out

    # ---- the producer's side -----------------------------------------------------------------
    def mirror(self, session: Session) -> None:
        gevent.spawn(self._mirror, session)

    def _mirror(self, s: Session) -> None:
        s.flushing = True
        try:
            self._mirror_until_done(s)
        finally:
            s.flushing = False

    def _mirror_until_done(self, s: Session) -> None:
        written: int | None = None  # bytes of the body in Redis; None: (re)create the session
        created = False
        entries: deque[tuple[int, int]] = deque()  # (offset, length) of the entries in Redis
        last_tick = 0.0
        while True:
            if s.cancelled:  # stopped here (forgotten by the stop) or from elsewhere
                return
            if s.done_monotonic is not None and time.monotonic() - s.done_monotonic > self.ttl:
                return  # Redis was away for longer than the session is kept
            if self._waiting():
                written = None
                gevent.sleep(max(0.05, self._retry_at - time.monotonic()))
                continue
            try:
                if written is None:
                    if not self._create(s, created):
                        self.on_cancel(s.uid)  # stopped or replaced while Redis was away
                        return
                    created = True
                    written = s.first
                    entries.clear()
                pipe = self.client.pipeline(transaction=False)
                total = s.total
                if total > written:
                    if written < s.first:  # Redis fell behind the ring (an outage): rewrite
                        written = None
                        continue
                    data = s.read(written, limit=total - written)
                    written = queue_bytes(pipe, s.uid, data, written, entries, self.cap)
                done = s.done and written == s.total
                tick = done or time.monotonic() - last_tick >= TICK
                checks = None
                if tick:
                    last_tick = time.monotonic()
                    checks = len(pipe)
                    pipe.get(_ptr(s.conv_id, s.scope))
                    pipe.exists(_stopped(s.uid))
                    pipe.set(_alive(s.uid), 1, px=ALIVE_MS)
                    for key in (_meta(s.uid), _data(s.uid)):
                        pipe.expire(key, LIVE_EXPIRY)
                    pipe.eval(_EXPIRE_IF, 1, _ptr(s.conv_id, s.scope), s.uid, LIVE_EXPIRY)
                if done:
                    pipe.xadd(_data(s.uid), {"e": b"1"}, id=f"{written + 1}-0")
                    pipe.hset(_meta(s.uid), mapping={"done": 1,
                                                     "completed_at": int(s.completed_at or 0)})
                    for key in (_meta(s.uid), _data(s.uid)):
                        pipe.expire(key, self.ttl)
                    pipe.eval(_EXPIRE_IF, 1, _ptr(s.conv_id, s.scope), s.uid, self.ttl)
                    pipe.delete(_alive(s.uid))
                results = pipe.execute()
                self._ok()
            except RedisError as exc:
                self._fault(exc, "mirroring a stream")
                written = None
                if not isinstance(exc, OUTAGES):
                    gevent.sleep(RETRY)  # refused (out of memory...): try again, calmly
                continue
            if checks is not None and not s.cancelled:
                ptr, stopped = results[checks], results[checks + 1]
                if stopped or (ptr is not None and ptr.decode() != s.uid):
                    self.on_cancel(s.uid)  # stopped elsewhere, and the message was lost
                    return
            if done:
                return
            gevent.sleep(FLUSH_EVERY)
            s.wait(written, TICK)

    def _create(self, s: Session, again: bool) -> bool:
        """The session's pointer and metadata, its bytes cleared (they are rewritten from the
        ring). False when it was stopped from another replica, or when a newer POST has taken
        the id, while Redis was away."""
        ptr = _ptr(s.conv_id, s.scope)
        pipe = self.client.pipeline(transaction=False)
        pipe.get(ptr)
        pipe.exists(_stopped(s.uid))
        current, stopped = pipe.execute()
        if stopped:
            return False
        if current is not None and current.decode() != s.uid:
            if again:
                return False
            started = self.client.hget(_meta(current.decode()), "started_at")
            if started is not None and int(started) > int(s.started_at):
                return False  # a POST newer than this one, mirrored first
        pipe = self.client.pipeline(transaction=False)
        pipe.set(ptr, s.uid, ex=LIVE_EXPIRY)
        pipe.delete(_data(s.uid))
        pipe.hset(_meta(s.uid), mapping={
            "started_at": int(s.started_at), "completed_at": 0, "total": s.first,
            "first": s.first, "done": 0, "keepalive": s.keepalive, "owner": self.replica})
        pipe.expire(_meta(s.uid), LIVE_EXPIRY)
        pipe.set(_alive(s.uid), 1, px=ALIVE_MS)
        pipe.execute()
        return True

    def forget(self, session: Session) -> None:
        """A session stopped here (DELETE, second POST): its id no longer leads to it."""
        self._try("forgetting a stream", lambda: self._del_if(
            keys=[_ptr(session.conv_id, session.scope)], args=[session.uid]))

    # ---- other replicas' requests ------------------------------------------------------------
    def cancel(self, conv_id: str, scope: str) -> None:
        """Stop the session under this id wherever it runs, and forget it. The tombstone
        reaches an owner whose listener missed the message."""
        def go() -> None:
            ptr = _ptr(conv_id, scope)
            uid = self.client.get(ptr)
            if uid is not None:
                pipe = self.client.pipeline(transaction=False)
                pipe.set(_stopped(uid.decode()), 1, ex=LIVE_EXPIRY)
                pipe.publish(CHANNEL, uid)
                pipe.execute()
                self._del_if(keys=[ptr], args=[uid])

        self._try("stopping a stream", go)

    def _find(self, conv_id: str, scope: str) -> tuple[str, dict[bytes, bytes], bool]:
        uid = self.client.get(_ptr(conv_id, scope))
        if uid is None:
            raise StreamNotFound()
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(_meta(uid.decode()))
        pipe.exists(_alive(uid.decode()))
        meta, alive = pipe.execute()
        if not meta:
            raise StreamNotFound()
        return uid.decode(), meta, bool(alive)

    def lookup(self, conv_ids: list[str], scope: str) -> list[Status]:
        """Three round trips however many ids: the pointers, then every session's status."""
        def go() -> list[Status]:
            uids = self.client.mget([_ptr(c, scope) for c in conv_ids])
            found = [(c, u.decode()) for c, u in zip(conv_ids, uids, strict=True) if u]
            if not found:
                return []
            pipe = self.client.pipeline(transaction=False)
            for _, uid in found:
                pipe.hgetall(_meta(uid))
                pipe.exists(_alive(uid))
            replies = pipe.execute()
            out: list[Status] = []
            for k, (conv, _) in enumerate(found):
                meta, alive = replies[2 * k], replies[2 * k + 1]
                if not meta:
                    continue
                done = meta.get(b"done") == b"1" or not alive
                out.append(Status(conv, done, int(meta.get(b"total", 0)),
                                  int(meta.get(b"started_at", 0)),
                                  int(meta.get(b"completed_at", 0))))
            return out

        return self._try("looking up streams", go, [])

    def current(self, session: Session) -> bool:
        """Whether this replica's session is still the one its id leads to (a second POST or
        a DELETE elsewhere, whose message was lost, makes it stale). True when Redis cannot
        say: the local session is then the best there is."""
        def go() -> bool:
            pipe = self.client.pipeline(transaction=False)
            pipe.get(_ptr(session.conv_id, session.scope))
            pipe.exists(_stopped(session.uid))
            ptr, stopped = pipe.execute()
            return not stopped and (ptr is None or ptr.decode() == session.uid)

        return self._try("checking a stream", go, True)

    def follow(self, conv_id: str, scope: str, pos: int,
               heartbeat: float | None) -> Iterator[bytes]:
        """A session produced on another replica, from ``pos``; 404 and 400 raised here."""
        try:
            uid, meta, _ = self._find(conv_id, scope)
        except RedisError as exc:  # unreachable: what this replica has not, is not found
            self._fault(exc, "finding a stream")
            raise StreamNotFound() from None
        check_start(pos, int(meta.get(b"first", 0)), int(meta.get(b"total", 0)),
                    meta.get(b"done") == b"1")
        return self._read(uid, pos, meta.get(b"keepalive", b""), heartbeat)

    def _read(self, uid: str, pos: int, keepalive: bytes,
              heartbeat: float | None) -> Iterator[bytes]:
        key = _data(uid)
        last_id: bytes | None = None  # None: seek the entry holding pos
        quiet_since = time.monotonic()
        faulty_since: float | None = None
        marked = 0.0  # when this reader last said, in Redis, that it reads
        while True:
            try:
                if time.monotonic() - marked >= READING_EVERY:
                    self._mark_reading(uid)
                    marked = time.monotonic()
                if last_id is None:
                    found = self.client.xrevrange(key, max=f"{pos + 1}-0", min="-", count=1)
                    last_id = found[0][0] if found else b"0-0"
                    entries = found
                else:
                    got = self.client.xread({key: last_id}, count=256, block=BLOCK_MS)
                    entries = got[0][1] if got else []
                ended, lost = False, False
                for entry_id, fields in entries:
                    if b"e" in fields:
                        # the end at or before our offset is the end, whatever the offset (a
                        # reader that started past where the stream stopped has nothing more);
                        # after it, bytes before it were rewritten under us
                        if _start(entry_id) <= pos:
                            ended = True
                        else:
                            lost = True
                        break
                    start, data = _start(entry_id), fields[b"d"]
                    if start > pos:  # a gap: trimmed past us, or rewritten after an outage
                        lost = True
                        break
                    if start + len(data) > pos:
                        quiet_since = time.monotonic()
                        yield data[pos - start:]
                        pos = start + len(data)
                    last_id = entry_id
                if ended:
                    return
                if lost:
                    if not self._still_kept(uid, pos):
                        return
                    # seek again, calmly: a rewrite takes the producer a moment, and the
                    # heartbeat below must still run so a departed client is noticed
                    last_id = None
                    gevent.sleep(SEEK_RETRY)
                elif not entries and not self._producing(uid, pos):
                    return
                faulty_since = None
            except (*OUTAGES, _MetaGone) as exc:
                if not isinstance(exc, _MetaGone):
                    self._fault(exc, "reading a stream")
                now = time.monotonic()
                faulty_since = faulty_since or now
                if now - faulty_since > OUTAGE_GRACE:
                    return
                last_id = None
                gevent.sleep(RETRY)
            except RedisError as exc:  # refused: nothing to wait for
                self._fault(exc, "reading a stream")
                return
            if heartbeat and time.monotonic() - quiet_since >= heartbeat:
                quiet_since = time.monotonic()
                yield keepalive

    def read_lately(self, uid: str) -> bool:
        """Whether a reader on another replica has followed the session in the last
        READING_TTL seconds (unreachable Redis: assume so, a stop is not undone)."""
        return bool(self._try("checking a stream's readers",
                              lambda: self.client.exists(_reading(uid)), True))

    def _mark_reading(self, uid: str) -> None:
        self.client.set(_reading(uid), b"1", ex=READING_TTL)

    def _still_kept(self, uid: str, pos: int) -> bool:
        first = self.client.hget(_meta(uid), "first")
        return first is not None and pos >= int(first)

    def _producing(self, uid: str, pos: int) -> bool:
        """After a quiet wait: whether more may come. The producer's liveness key gone while
        the session is unfinished means it died; metadata gone means Redis restarted and the
        owner has not rewritten it yet (a fault, ridden out within the grace)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(_meta(uid), "done", "total")
        pipe.exists(_alive(uid))
        (done, total), alive = pipe.execute()
        if done is None and total is None:
            raise _MetaGone()
        if done == b"1":
            return int(total or 0) > pos  # its end marker is still to be read
        if not alive:
            log.warning("resumable stream %s: its producer is gone; the reader ends", uid)
            return False
        return True

    # ---- stops from other replicas -----------------------------------------------------------
    def _listen(self) -> None:
        while not self._closed:
            pubsub = None
            try:
                pubsub = self.client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(CHANNEL)
                while not self._closed:
                    msg = pubsub.get_message(timeout=1.0)
                    if msg and msg.get("type") == "message":
                        self.on_cancel(msg["data"].decode())
            except RedisError as exc:
                self._fault(exc, "listening for stops")
                gevent.sleep(RETRY)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(RedisError):
                        pubsub.close()

    def close(self) -> None:
        self._closed = True
        self._listener.kill(block=False)

