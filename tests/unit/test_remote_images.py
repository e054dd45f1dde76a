"""Images named by URL (app.model.remote): read only from the hosts and buckets the operator
lists, within the byte limit and the time limit, never following a redirect. Against a real
HTTP server on a loopback port; gs:// against the storage emulator is in
tests/e2e/test_vision.py."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator

import pytest

from app.base.errors import BadRequest, PayloadTooLarge
from app.model.remote import Fetcher
from tests.support.images import encoded

PNG = encoded("red", (8, 8))


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path == "/red.png":
            self.send_response(200)
            self.send_header("Content-Length", str(len(PNG)))
            self.end_headers()
            self.wfile.write(PNG)
        elif self.path == "/big":
            self.send_response(200)
            self.send_header("Content-Length", "999999999")
            self.end_headers()
        elif self.path == "/unsized":  # no length: the reader stops at the limit
            self.send_response(200)
            self.end_headers()
            for _ in range(64):
                self.wfile.write(b"x" * 4096)
        elif self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "http://169.254.169.254/latest/meta-data")
            self.end_headers()
        elif self.path == "/slow":  # a byte every 0.3 s, within each read's timeout
            self.send_response(200)
            self.end_headers()
            for _ in range(20):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.3)
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()


def fetcher(hosts: str = "127.0.0.1", max_bytes: int = 100_000, timeout: float = 2.0) -> Fetcher:
    return Fetcher(frozenset(), frozenset(hosts.split(",")), max_bytes, timeout, None)


def test_an_allowed_host_is_read(base):
    assert fetcher()(base + "/red.png", "p") == PNG


@pytest.mark.parametrize("url", ["http://localhost:1/x.png", "http://169.254.169.254/latest",
                                 "https://example.com/x.png"])
def test_other_hosts_are_refused_without_a_connection(url):
    with pytest.raises(BadRequest) as err:
        fetcher()(url, "m.0")
    assert err.value.code == "image_url_not_allowed" and "IMAGE_URL_HOSTS" in err.value.message
    assert err.value.param == "m.0"


def test_no_hosts_listed_refuses_every_url(base):
    with pytest.raises(BadRequest):
        fetcher(hosts="")(base + "/red.png", "p")


def test_a_redirect_is_not_followed(base):
    with pytest.raises(BadRequest) as err:
        fetcher()(base + "/redirect", "p")
    assert "answered 302" in err.value.message


def test_too_large_is_a_413_by_header_or_by_counting(base):
    with pytest.raises(PayloadTooLarge):
        fetcher()(base + "/big", "p")
    with pytest.raises(PayloadTooLarge):
        fetcher(max_bytes=50_000)(base + "/unsized", "p")


def test_a_trickle_ends_at_the_time_limit(base):
    with pytest.raises(BadRequest) as err:
        fetcher(timeout=1.0)(base + "/slow", "p")
    assert "IMAGE_FETCH_TIMEOUT" in err.value.message


def test_a_missing_image_is_a_400(base):
    with pytest.raises(BadRequest) as err:
        fetcher()(base + "/nope.png", "p")
    assert err.value.code == "image_not_found"


def test_gs_urls_outside_the_listed_buckets_are_refused():
    f = Fetcher(frozenset({"pictures"}), frozenset(), 1000, 1.0, None)
    with pytest.raises(BadRequest) as err:
        f("gs://secrets/x.png", "p")
    assert "IMAGE_BUCKETS" in err.value.message and err.value.code == "image_url_not_allowed"
