"""The gunicorn worker the server runs: gunicorn's gevent worker, plus what a public endpoint
needs of it.

- A SIGTERM drain ends when the last request in flight ends, not when the last idle keep-alive
  connection closes (every load balancer holds some).
- A request's head (request line and headers) has HEADER_TIMEOUT from the connection's start
  (keep-alive waits between requests keep gunicorn's keepalive bound); slower is a 408.
- A connection still sending its head gives way to a new connection when the pool is nearly
  full (the oldest such first): connections that never finish their headers (slowloris) can
  never fill the pool, so the health route is always reachable.
- gunicorn's own errors (a 414 URI too long, a 431, a malformed header, a head too slow) are
  JSON in the API's error shape, like every other error, not gunicorn's HTML page.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import gevent
from gevent.monkey import get_original
from gunicorn.http import errors as http_errors
from gunicorn.workers.ggevent import GeventWorker

# seconds before the graceful timeout ends at which requests still running are ended with an
# error (their streams get an error event), so the worker exits before it is killed
GRACE_MARGIN = 1.5


class HeadTimeout(Exception):
    """A request head that did not arrive in time (408)."""


class HeadEvicted(HeadTimeout):
    """A connection still sending its head, closed to make room for a new one."""


def _error_class(name: str) -> type[BaseException] | None:
    return getattr(http_errors, name, None)  # some appear in later gunicorn releases only


# gunicorn's request errors -> (status, reason): the client's fault, answered in JSON. Checked in
# order (an invalid response header is the app's: not listed, a 500).
_CLIENT_ERRORS = [
    (cls, status, reason) for cls, status, reason in (
        (HeadTimeout, 408, "Request Timeout"),
        (_error_class("LimitRequestLine"), 414, "URI Too Long"),
        (_error_class("LimitRequestHeaders"), 431, "Request Header Fields Too Large"),
        (_error_class("ExpectationFailed"), 417, "Expectation Failed"),
        (_error_class("UnsupportedTransferCoding"), 501, "Not Implemented"),
        (_error_class("ForbiddenProxyRequest"), 403, "Forbidden"),
    ) if cls is not None
]
_BAD_REQUESTS = tuple(c for c in (_error_class(n) for n in (
    "InvalidRequestLine", "InvalidRequestMethod", "InvalidHTTPVersion", "InvalidHeader",
    "InvalidHeaderName", "ObsoleteFolding", "InvalidChunkSize", "ChunkMissingTerminator",
    "InvalidChunkExtension", "InvalidProxyLine", "InvalidProxyHeader", "InvalidSchemeHeaders",
    "InvalidH2CPreface")) if c is not None)
_APP_ERRORS = tuple(c for c in (_error_class(n) for n in (
    "InvalidResponseHeader", "InvalidResponseHeaderName")) if c is not None)


def classify(exc: BaseException) -> tuple[int, str]:
    """(status, reason) of an error raised before the app ran."""
    if not isinstance(exc, _APP_ERRORS):
        for cls, status, reason in _CLIENT_ERRORS:
            if isinstance(exc, cls):
                return status, reason
        if isinstance(exc, _BAD_REQUESTS):
            return 400, "Bad Request"
    return 500, "Internal Server Error"


def error_response(status: int, reason: str, message: str, path: str = "") -> bytes:
    """A whole HTTP response in the error shape of the API under ``path``: Anthropic's under
    /v1/messages, else OpenAI's (the shape of requests no API route took)."""
    kind = "invalid_request_error" if status < 500 else "api_error"
    if path.startswith("/v1/messages"):
        body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    else:  # OpenAI's code is a string: the reason's words (uri_too_long, request_timeout)
        code = reason.lower().replace(" ", "_")
        body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    data = json.dumps(body).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n")
    return head.encode("latin-1") + data


def native_logging_locks() -> None:
    """Give logging native locks again, after gevent's patching. gevent turns the logging
    module's lock and every handler's into gevent locks, and native threads (the engine's, the
    prep pool's) that contend for one wait for ever: of ten pool threads logging 200 lines each,
    one or two finished. A native lock is held for one line's write, so a greenlet that meets one
    held waits that long, as any C call would make it."""
    rlock = get_original("_thread", "RLock")  # the C one: threading's is built on patched locks

    def create_lock(handler: logging.Handler) -> None:
        handler.lock = rlock()

    logging._lock = rlock()  # type: ignore[attr-defined]
    logging.Handler.createLock = create_lock  # type: ignore[method-assign]
    for ref in list(logging._handlerList):  # type: ignore[attr-defined]
        handler = ref()
        if handler is not None:
            handler.lock = rlock()


class DrainingGeventWorker(GeventWorker):
    """gunicorn's gevent worker, but a SIGTERM drain ends when the last request in flight ends,
    request heads are bounded, and gunicorn's own errors are JSON (see the module)."""

    in_flight = 0
    client_timeout: float | None = None  # CLIENT_TIMEOUT (see app.process.gunicorn_conf.options)
    header_timeout: float | None = None  # HEADER_TIMEOUT
    _quitting = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._open = 0  # connections being handled
        self._heads_read: dict[Any, int] = {}  # connection's greenlet -> heads read on it
        self._reading: OrderedDict[Any, float] = OrderedDict()  # greenlets reading a head

    @property
    def head_room(self) -> int:
        """Pool slots no connection still sending its head may take: a new connection (a
        health probe) always finds one."""
        return max(1, self.worker_connections // 10)

    def patch(self) -> None:
        super().patch()
        native_logging_locks()  # gevent's patching made them gevent locks: see there

    # ---- connections and their heads -------------------------------------------------------
    def handle(self, listener, client, addr):
        me = gevent.getcurrent()
        self._open += 1
        self._heads_read[me] = 0
        try:
            self._make_room()
            return super().handle(listener, client, addr)
        finally:
            self._open -= 1
            self._heads_read.pop(me, None)
            self._reading.pop(me, None)

    def _make_room(self) -> None:
        while self._reading and self._open > self.worker_connections - self.head_room:
            oldest, _ = self._reading.popitem(last=False)
            oldest.kill(HeadEvicted, block=False)

    @contextlib.contextmanager
    def timeout_ctx(self) -> Iterator[None]:
        """Around reading each request head (gunicorn's keep-alive loop): the first head of a
        connection within HEADER_TIMEOUT, a 408 after it; later ones within the keep-alive
        time, idle wait included, closed quietly after it (as gunicorn does)."""
        me = gevent.getcurrent()
        first = self._heads_read.get(me) == 0
        if me in self._heads_read:
            self._heads_read[me] += 1
        self._reading[me] = time.monotonic()
        if first and self.header_timeout:
            timer = gevent.Timeout(self.header_timeout, HeadTimeout(
                f"the request line and headers took over {self.header_timeout:g} s "
                "(HEADER_TIMEOUT)"))
        else:
            timer = gevent.Timeout(self.cfg.keepalive, False)
        try:
            with timer:
                yield
        finally:
            self._reading.pop(me, None)

    def handle_error(self, req, client, addr, exc):
        """gunicorn's errors before the app ran, as JSON in the API's error shape."""
        status, reason = classify(exc)
        if isinstance(exc, HeadEvicted):
            message = "the connection sent no complete request head while the server was full"
        elif status == 500:
            message = "internal error"
            self.log.exception("Error handling request")
        else:
            message = str(exc) or reason
        if status != 500:
            ip = addr[0] if addr else ""
            self.log.warning("Invalid request from ip=%s: %s %s", ip, status, message)
        path = getattr(req or getattr(exc, "req", None), "path", "") or ""
        with contextlib.suppress(OSError):
            client.sendall(error_response(status, reason, message[:1000], path))

    # ---- requests and the drain -------------------------------------------------------------
    def handle_request(self, listener_name, req, sock, addr):
        if self.client_timeout:
            # a client that stops reading (or sending) is cut after this long, not held forever
            sock.settimeout(self.client_timeout)
        self.in_flight += 1
        try:
            return super().handle_request(listener_name, req, sock, addr)
        finally:
            self.in_flight -= 1
            if not self.alive and not self._busy():
                self._quit()

    def handle_exit(self, sig, frame):
        super().handle_exit(sig, frame)
        service = service_of(self)
        pool = pool_of(self)
        if pool is not None:  # several models: every loaded one drains, then aborts
            pool.drain()
            grace = max(0.0, self.cfg.graceful_timeout - GRACE_MARGIN)
            gevent.spawn_later(grace, pool.abort, "server is shutting down")
        elif service is not None:
            # new requests on kept-alive connections get a 503 the load balancer retries
            # elsewhere; whatever still runs near the end of the graceful timeout is ended with
            # an error event, not cut mid-stream by the worker's exit
            service.engine.drain()
            grace = max(0.0, self.cfg.graceful_timeout - GRACE_MARGIN)
            gevent.spawn_later(grace, service.engine.abort, "server is shutting down")
        if not self._busy():
            self._quit()
        else:
            gevent.spawn(self._quit_when_idle)

    def _busy(self) -> bool:
        """A request in flight, or a resumable stream still generating with no request on it
        (its client went away: it runs on into its session, and ends before the worker)."""
        hub = streams_of(self)
        return self.in_flight > 0 or (hub is not None and hub.live() > 0)

    def _quit_when_idle(self) -> None:
        deadline = time.monotonic() + self.cfg.graceful_timeout
        while self._busy() and time.monotonic() < deadline:
            gevent.sleep(0.1)
        self._quit()

    def _quit(self) -> None:
        # the worker's own SIGQUIT handler exits cleanly (worker_exit still runs)
        if not self._quitting:
            self._quitting = True
            os.kill(os.getpid(), signal.SIGQUIT)


def _extension(worker: Any, name: str) -> Any:
    """The worker's app's ``extensions[name]`` (None before the app is loaded)."""
    app = getattr(worker, "wsgi", None)
    return getattr(app, "extensions", {}).get(name) if app else None


def service_of(worker: Any) -> Any:
    return _extension(worker, "vertex_gguf")


def pool_of(worker: Any) -> Any:
    """The models of a server of several (app.model.catalog.pooled), else None."""
    return _extension(worker, "vertex_gguf_pool")


def streams_of(worker: Any) -> Any:
    return _extension(worker, "vertex_gguf_streams")
