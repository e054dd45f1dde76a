"""The worker against hostile connections (security review round 2, M1 and L2), through the real
gunicorn master and worker (tests/support/crash_server.py with no crash: the fake engine): heads that
never finish cannot fill the pool or hold a connection, and gunicorn's own errors are JSON."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import time
from collections.abc import Iterator

import pytest
import requests

from tests.support.server import ServerProcess

PARTIAL = b"GET /health HTTP/1.1\r\nHo"


@contextlib.contextmanager
def fake_server(**env: object) -> Iterator[ServerProcess]:
    srv = ServerProcess({k: str(v) for k, v in env.items()}, module="tests.support.crash_server")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def answer(sock: socket.socket, limit: float = 30) -> bytes:
    """What the server sends on ``sock`` until it closes it (bounded)."""
    sock.settimeout(limit)
    got = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            got += chunk
    return got


def json_error(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert "content-type: application/json" in [h.lower() for h in lines[1:]], head
    return int(lines[0].split()[1]), json.loads(body)


def test_connections_that_never_finish_their_headers_cannot_shut_out_health():
    with fake_server(WORKER_CONNECTIONS=20, HEADER_TIMEOUT=600) as srv:
        held = []
        try:
            for _ in range(40):  # twice the pool
                s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
                s.sendall(PARTIAL)
                held.append(s)
            # the pool never fills with them: health answers, and so does an API
            assert requests.get(srv.url("/health"), timeout=10).status_code == 200
            r = requests.post(srv.url("/v1/completions"), json={"prompt": "hi"}, timeout=10)
            assert r.status_code == 200
            # the oldest of them were closed to make room, with a 408 in JSON
            closed = [answer(s, 10) for s in held[:10]]
            assert all(c == b"" or json_error(c)[0] == 408 for c in closed), closed
            assert any(c for c in closed)
        finally:
            for s in held:
                s.close()


def test_a_head_slower_than_header_timeout_is_a_408():
    with fake_server(HEADER_TIMEOUT=1) as srv, \
            socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(PARTIAL)
        status, body = json_error(answer(s))
        assert status == 408
        assert "HEADER_TIMEOUT" in body["error"]["message"]
        assert body["error"]["type"] == "invalid_request_error"


def test_a_kept_alive_connection_is_not_cut_by_the_header_timeout():
    with fake_server(HEADER_TIMEOUT=1) as srv:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        try:
            conn.request("GET", "/health")
            assert conn.getresponse().read() and conn.sock is not None
            sock = conn.sock
            time.sleep(2)  # idle past HEADER_TIMEOUT: the keep-alive time applies
            conn.request("GET", "/health")
            resp = conn.getresponse()
            assert resp.status == 200 and conn.sock is sock  # the same connection
            resp.read()
        finally:
            conn.close()


@pytest.mark.parametrize(("path", "headers", "status"), [
    ("/v1/responses/" + "x" * 5000, {}, 414),
    ("/v1/chat/completions", {"X-Big": "y" * 10_000}, 431),
    ("/v1/chat/completions", {f"X-H{i}": "1" for i in range(120)}, 431),
])
def test_gunicorns_own_errors_are_json_in_the_apis_shape(path, headers, status):
    with fake_server() as srv:
        r = requests.get(srv.url(path), headers=headers, timeout=10)
    assert r.status_code == status
    assert r.headers["Content-Type"] == "application/json"
    body = r.json()  # OpenAI's shape: gunicorn fails before the request's path is known
    assert body["error"]["code"] == {414: "uri_too_long", 431: "request_header_fields_too_large"}[status]
    assert body["error"]["message"]


def test_a_malformed_header_is_a_json_400():
    with fake_server() as srv, \
            socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n")
        status, body = json_error(answer(s))
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
