"""One HTTP GET for an image named by URL: to an address already checked (app.model.remote),
within a wall-clock deadline.

It connects to the address it is given and looks nothing up, so the host that was checked is
the host that is reached: a name cannot resolve once to a public address for the check and
again to the metadata server for the connection. The request is written from the checked
parts (host, port, path), never from the caller's text. TLS verifies the certificate against
the name, which is also the Host header and the SNI.

The deadline covers the connection, the TLS handshake, the headers and the body. Each read is
given only the time left, and a reaper thread shuts the connection down when the deadline
passes: some reads restart their timeout on every wait (a TLS record under gevent), so a
sender dripping one byte at a time would outlast a per-read timeout.
"""

from __future__ import annotations

import _socket  # the C socket: the reaper's copy is never gevent's (it is used on its thread)
import contextlib
import http.client
import io
import itertools
import os
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass

from app.base import bridge

_PIECE = 64 * 1024
Address = tuple[int, tuple]  # (socket family, sockaddr) as getaddrinfo gives them


class FetchFailed(Exception):
    """The image could not be read. The message is for the server's log only: the caller
    gets one message for every cause, so the errors tell nothing of what lies behind."""


class TooLarge(Exception):
    """The body is larger than the limit (declared or counted)."""


@dataclass(frozen=True)
class Target:
    """What is fetched, as checked: never rebuilt from the caller's text."""

    scheme: str  # http or https
    host: str  # a lower-case name, or a canonical address without brackets
    port: int
    path: str  # path and query, printable ASCII starting with /

    @property
    def default_port(self) -> int:
        return 443 if self.scheme == "https" else 80

    @property
    def authority(self) -> str:
        """The Host header: the host, bracketed when it is an IPv6 address, and the port
        when it is not the scheme's default."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == self.default_port else f"{host}:{self.port}"


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the deadline passed")
    return left


class _Reaper:
    """Shuts down connections whose fetch has passed its deadline, from a thread of its own
    (started on first use in each process). It holds a duplicate of each descriptor, so it
    never touches a socket object another thread is using."""

    def __init__(self) -> None:
        self._lock = bridge.allocate_lock()
        self._watched: dict[int, tuple[float, _socket.socket]] = {}
        self._reaped: set[int] = set()
        self._ids = itertools.count()
        self._wake = bridge.ThreadEvent()
        self._pid = 0

    def watch(self, sock: socket.socket, deadline: float) -> int:
        dup = _socket.socket(fileno=os.dup(sock.fileno()))
        with self._lock:
            if self._pid != os.getpid():  # first use here (a forked worker has no thread)
                self._pid = os.getpid()
                bridge.start_native_thread(self._main)
            token = next(self._ids)
            self._watched[token] = (deadline, dup)
        self._wake.set()
        return token

    def unwatch(self, token: int) -> bool:
        """Stop watching; True when the deadline had passed and the connection was shut."""
        with self._lock:
            entry = self._watched.pop(token, None)
            reaped = token in self._reaped
            self._reaped.discard(token)
        if entry is not None:
            entry[1].close()
        return reaped

    def watching(self) -> int:
        with self._lock:
            return len(self._watched)

    def _main(self) -> None:
        while True:
            now = time.monotonic()
            due: list[_socket.socket] = []
            with self._lock:
                for token, (deadline, dup) in list(self._watched.items()):
                    if deadline <= now:
                        del self._watched[token]
                        self._reaped.add(token)
                        due.append(dup)
                nearest = min((d for d, _ in self._watched.values()), default=now + 60)
            for dup in due:
                with contextlib.suppress(OSError):  # already closed by the peer
                    dup.shutdown(socket.SHUT_RDWR)
                dup.close()
            self._wake.wait(max(0.001, min(nearest - time.monotonic(), 60.0)))


_reaper = _Reaper()


class _Reads(io.RawIOBase):
    """The connection's bytes; each read is allowed only what is left of the deadline."""

    def __init__(self, sock: socket.socket, deadline: float):
        self._sock, self._deadline = sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:  # type: ignore[override]
        self._sock.settimeout(_left(self._deadline))
        return self._sock.recv_into(buf)


class _Wire:
    """What http.client's response reads from (it asks only for ``makefile``)."""

    def __init__(self, sock: socket.socket, deadline: float):
        self._sock, self._deadline = sock, deadline

    def makefile(self, mode: str, *args, **kwargs) -> io.BufferedReader:
        return io.BufferedReader(_Reads(self._sock, self._deadline))


def _connect(addresses: list[Address], deadline: float) -> socket.socket:
    """A connection to the first of ``addresses`` that answers."""
    last: BaseException | None = None
    for family, sockaddr in addresses:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(_left(deadline))
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    raise FetchFailed(f"no connection: {last!r}")


@contextlib.contextmanager
def _guarded(sock: socket.socket, deadline: float) -> Iterator[None]:
    token = _reaper.watch(sock, deadline)
    try:
        yield
    finally:
        if _reaper.unwatch(token):  # a read that ended at the shutdown is no body's end
            raise FetchFailed("the deadline passed")


def get(target: Target, addresses: list[Address], deadline: float, max_bytes: int,
        tls: ssl.SSLContext | None) -> bytes:
    """The body of ``GET target`` from one of ``addresses``, when it answers 200 before the
    deadline with at most ``max_bytes``; FetchFailed or TooLarge otherwise. The connection is
    closed when this returns."""
    try:
        sock = _connect(addresses, deadline)
        try:
            with _guarded(sock, deadline):
                if target.scheme == "https":
                    sock.settimeout(_left(deadline))
                    sock = (tls or _default_tls()).wrap_socket(sock,
                                                                server_hostname=target.host)
                return _exchange(sock, target, deadline, max_bytes)
        finally:
            sock.close()
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise FetchFailed(repr(exc)) from None


def _exchange(sock: socket.socket, target: Target, deadline: float, max_bytes: int) -> bytes:
    request = (f"GET {target.path} HTTP/1.1\r\nHost: {target.authority}\r\n"
               "User-Agent: vertex-gguf\r\nAccept: image/*\r\nAccept-Encoding: identity\r\n"
               "Connection: close\r\n\r\n")
    sock.settimeout(_left(deadline))
    sock.sendall(request.encode("ascii"))
    resp = http.client.HTTPResponse(_Wire(sock, deadline), method="GET")  # type: ignore[arg-type]
    try:
        resp.begin()
        if resp.status != 200:  # a redirect included: none is followed
            raise FetchFailed(f"answered {resp.status}")
        declared = resp.getheader("Content-Length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise TooLarge(f"the image is {declared} bytes, over {max_bytes}")
        data = bytearray()
        while piece := resp.read(_PIECE):
            data += piece
            if len(data) > max_bytes:
                raise TooLarge(f"the image is over {max_bytes} bytes")
        if resp.length:  # http.client's read(n) ends quietly where the sender hung up
            raise FetchFailed(f"the body stopped {resp.length} bytes short")
        return bytes(data)
    finally:
        resp.close()


_tls: list[ssl.SSLContext] = []


def _default_tls() -> ssl.SSLContext:
    """The system's trust store (the image installs ca-certificates; SSL_CERT_FILE works)."""
    if not _tls:
        _tls.append(ssl.create_default_context())
    return _tls[0]
