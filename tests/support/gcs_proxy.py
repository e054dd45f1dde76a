"""A loopback HTTP proxy in front of the Cloud Storage emulator, for tests and benchmarks.

It forwards everything, counts media downloads (what proves a cache hit), and can misbehave on
purpose: answer 503 to the first N downloads, cut a download's connection half-way, flip a byte
of every download (a crc32c mismatch), cap each connection's bandwidth (the emulator on
loopback has no per-connection limit; real GCS does, which is what sliced downloads beat), or
hold every download until a test opens the gate (a download under way, for as long as it needs).
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
       "proxy-authorization", "proxy-authenticate"}


class Faults:
    def __init__(self) -> None:
        self.fail_media = 0  # answer 503 to this many media requests
        self.cut_media = 0  # cut this many media responses half-way
        self.corrupt = False  # flip one byte of every media response body
        self.bytes_per_second = 0  # per-connection cap; 0 = none
        self.gate: threading.Event | None = None  # media requests wait until it is set (<= 60 s)
        self.sent: list[tuple[str, str]] = []  # (method, path) of every request, as it came
        self.lock = threading.Lock()

    @property
    def media_requests(self) -> int:
        """Downloads asked for (what proves a cache hit)."""
        return sum(1 for method, path in self.sent if method == "GET" and "alt=media" in path)

    def take(self, attr: str) -> bool:
        with self.lock:
            n = getattr(self, attr)
            if n > 0:
                setattr(self, attr, n - 1)
                return True
            return False


class GcsProxy:
    def __init__(self, upstream: str):
        self.upstream = urlsplit(upstream)
        self.faults = Faults()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                try:
                    proxy._handle(self)
                except (ConnectionError, TimeoutError):
                    self.close_connection = True  # the client went away (a test ended)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> GcsProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        f = self.faults
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else None
        media = "alt=media" in h.path and h.command == "GET"
        with f.lock:
            f.sent.append((h.command, h.path))
        if media and f.gate is not None:
            f.gate.wait(60)
        if media and f.take("fail_media"):
            payload = b'{"error": {"code": 503, "message": "injected"}}'
            h.send_response(503)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(payload)))
            h.end_headers()
            h.wfile.write(payload)
            return
        conn = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=60)
        headers = {k: v for k, v in h.headers.items() if k.lower() not in HOP and k.lower() != "host"}
        headers["Host"] = f"{self.upstream.hostname}:{self.upstream.port}"
        conn.request(h.command, h.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        if media and f.corrupt and data:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        cut = media and resp.status < 300 and len(data) > 2 and f.take("cut_media")
        h.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in HOP and k.lower() != "content-length":
                h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if cut:
            h.wfile.write(data[: len(data) // 2])
            h.wfile.flush()
            h.connection.shutdown(socket.SHUT_RDWR)
            h.close_connection = True
            return
        self._send(h, data)

    def _send(self, h: BaseHTTPRequestHandler, data: bytes) -> None:
        rate = self.faults.bytes_per_second
        if not rate:
            h.wfile.write(data)
            return
        step = max(rate // 50, 1024)
        start = time.monotonic()
        sent = 0
        while sent < len(data):
            h.wfile.write(data[sent : sent + step])
            sent += step
            ahead = sent / rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
