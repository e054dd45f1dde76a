"""A loopback HTTP server that answers every GET one byte per interval: the head (or only the
body) of a 200 that never ends within a test, as a hostile image host sends it. It records
each connection's request and whether the client closed the connection while the bytes were
still coming, which is how a test sees that a fetch gave up and hung up."""

from __future__ import annotations

import select
import socket
import threading

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: 50000\r\n\r\n"


class DripServer:
    """``slow_head``: the status line and headers drip too, not only the body. Every loop is
    bounded: at most ``limit`` bytes a connection, and ``close()`` stops them all."""

    def __init__(self, interval: float = 0.05, limit: int = 4000, slow_head: bool = False):
        self.interval, self.limit, self.slow_head = interval, limit, slow_head
        self.requests: list[bytes] = []
        self.closed_by_client = 0  # connections the client hung up on mid-drip
        self.finished = 0  # connections that ran to the limit (nobody hung up)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self.requests)

    def close(self) -> None:
        self._stop.set()
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:  # the accept timeout, or the listener closed
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            request = b""
            try:
                while b"\r\n\r\n" not in request and len(request) < 65536:
                    piece = conn.recv(4096)
                    if not piece:
                        return
                    request += piece
            except OSError:
                return
            with self._lock:
                self.requests.append(request)
            if not self.slow_head:
                conn.sendall(HEAD)
            data = (HEAD if self.slow_head else b"") + b"\x89" * self.limit
            for byte in data[: self.limit]:
                if self._stop.wait(self.interval) or self._hung_up(conn, bytes([byte])):
                    break
            else:
                with self._lock:
                    self.finished += 1

    def _hung_up(self, conn: socket.socket, byte: bytes) -> bool:
        """Send one byte; True (and counted) when the client has closed the connection."""
        try:
            conn.sendall(byte)
            readable, _, _ = select.select([conn], [], [], 0)
            gone = bool(readable) and conn.recv(1) == b""  # the client sends nothing more
        except OSError:
            gone = True
        if gone:
            with self._lock:
                self.closed_by_client += 1
        return gone

