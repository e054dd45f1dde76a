"""The engine process's wire: pickled messages in length-prefixed frames on one socket.

Both ends are our own code (app.engine.remote in the web process, app.engine.child in the
engine process), so pickle is the format: events, requests and errors cross as the objects
they are (app.base.errors pickles its errors whole). A message is a tuple whose first item
names it; app.engine.child lists them. The engine sends one message per step with every event
that step produced (app.base.threads.held_wakes gathers them), never one per token.

Nothing here imports gevent: both processes use it, on native threads.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
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
        self._file = io.BufferedReader(io.FileIO(fd, "rb", closefd=False), CHUNK)

    def recv(self) -> Any:
        """The next message; EOFError once the other end has closed (or died)."""
        head = self._file.read(HEADER.size)
        if len(head) < HEADER.size:
            raise EOFError("the other end closed")
        (size,) = HEADER.unpack(head)
        data = self._file.read(size)
        if len(data) < size:
            raise EOFError("the other end closed mid-message")
        return pickle.loads(data)


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
