"""The engine process's wire: pickled messages in length-prefixed frames on one socket.

Both ends are our own code (app.engine.remote in the web process, app.engine.child in the
engine process), so pickle is the format: events, requests and errors cross as the objects
they are (app.base.errors pickles its errors whole). A message is a tuple whose first item
names it; app.engine.child lists them. The engine sends one message per step with every event
that step produced (app.base.threads.held_wakes gathers them), never one per token.

Nothing here imports gevent: both processes use it, on native threads.
"""

from __future__ import annotations

import os
import pickle
import struct
from collections import deque
from typing import Any

from app.base.threads import allocate_lock

HEADER = struct.Struct("<Q")  # the pickle's length
CHUNK = 1 << 16  # bytes read from the socket at a time (many small messages per read)


def frame(msg: Any) -> bytes:
    """``msg`` as one frame: its length, then its pickle."""
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


def write_all(fd: int, data: bytes) -> None:
    """Every byte of ``data`` to ``fd`` (a blocking descriptor); OSError when the peer is gone."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class Reader:
    """Frames read from one descriptor, by one thread."""

    def __init__(self, fd: int):
        self._fd = fd
        self._buf = bytearray()
        self._ready: deque[Any] = deque()

    def recv(self) -> Any:
        """The next message; EOFError once the other end has closed (or died)."""
        while not self._ready:
            self._fill()
        return self._ready.popleft()

    def recv_many(self) -> list[Any]:
        """Every message that has arrived (at least one, waiting for it): a reader that fell
        behind takes several engine steps at once, and wakes their readers once."""
        while not self._ready:
            self._fill()
        out = list(self._ready)
        self._ready.clear()
        return out

    def _fill(self) -> None:
        """One read, and the whole frames it completed."""
        chunk = os.read(self._fd, CHUNK)
        if not chunk:
            raise EOFError("the other end closed")
        buf = self._buf
        buf += chunk
        at = 0
        while len(buf) - at >= HEADER.size:
            (size,) = HEADER.unpack_from(buf, at)
            end = at + HEADER.size + size
            if len(buf) < end:
                break
            self._ready.append(pickle.loads(memoryview(buf)[at + HEADER.size:end]))
            at = end
        if at:
            del buf[:at]


class Writer:
    """Frames written to one descriptor by any thread, one whole frame at a time (the engine
    process's side: its threads block while the web process reads, which it always does)."""

    def __init__(self, fd: int):
        self._fd = fd
        self._lock = allocate_lock()
        self.broken = False

    def send(self, msg: Any) -> None:
        data = frame(msg)
        with self._lock:
            if self.broken:
                return
            try:
                write_all(self._fd, data)
            except OSError:
                self.broken = True  # the web process is gone: the reader sees it and exits
