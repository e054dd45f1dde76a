"""Images named by URL (app.model.remote): read only from the hosts, ports and buckets the
operator lists, from addresses that were checked, within the byte limit and a deadline, never
following a redirect, with one message for every failure. Against real HTTP(S) servers on
loopback ports (tests/support/drip.py drips one byte at a time); the gs:// reads against a
listener that never answers. A gs:// image read from the storage emulator is in
tests/e2e/test_vision.py."""

from __future__ import annotations

import http.server
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import gevent
import pytest

from app.base import bridge
from app.base.errors import BadRequest, Overloaded, PayloadTooLarge
from app.model.remote import Fetcher, parse_url
from app.settings.inputs import url_hosts, url_networks
from tests.support.drip import DripServer
from tests.support.images import encoded
from tests.support.server import wait_for

PNG = encoded("red", (8, 8))


class Handler(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str]]  # (path, Host header) of every request, per server

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.seen.append((self.path, self.headers.get("Host", "")))
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
        elif self.path == "/cut":  # promises more than it sends, then hangs up
            self.send_response(200)
            self.send_header("Content-Length", "5000")
            self.end_headers()
            self.wfile.write(b"x" * 10)
        elif self.path == "/forbidden":
            self.send_response(403)
            self.end_headers()
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, *args) -> None:
        pass


class Served:
    """A real HTTP(S) server on 127.0.0.1: its port and the requests it received."""

    def __init__(self, tls: ssl.SSLContext | None = None):
        self.seen: list[tuple[str, str]] = []
        handler = type("H", (Handler,), {"seen": self.seen})
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        if tls is not None:
            self.srv.socket = tls.wrap_socket(self.srv.socket, server_side=True)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def served() -> Iterator[Served]:
    srv = Served()
    yield srv
    srv.close()


@pytest.fixture
def drip() -> Iterator[DripServer]:
    srv = DripServer(interval=0.05, limit=200)  # 10 s at most: a fetch hangs up long before
    yield srv
    srv.close()


def fetcher(hosts: str, max_bytes: int = 100_000, timeout: float = 5.0, networks: str = "",
            tls: ssl.SSLContext | None = None) -> Fetcher:
    return Fetcher(frozenset(), url_hosts(hosts), max_bytes, timeout, None,
                   url_networks(networks), tls)


def refused(fetch: Fetcher, url: str) -> BadRequest:
    with pytest.raises(BadRequest) as err:
        fetch(url, "m.0")
    assert err.value.param == "m.0"
    return err.value


def test_an_allowed_host_and_port_is_read(served):
    assert fetcher(f"127.0.0.1:{served.port}")(f"http://127.0.0.1:{served.port}/red.png",
                                               "p") == PNG
    assert served.seen == [("/red.png", f"127.0.0.1:{served.port}")]


@pytest.mark.parametrize("url", ["http://localhost:1/x.png", "http://169.254.169.254/latest",
                                 "https://example.com/x.png"])
def test_other_hosts_are_refused_without_a_connection(url):
    err = refused(fetcher("127.0.0.1:1"), url)
    assert err.code == "image_url_not_allowed" and "IMAGE_URL_HOSTS" in err.message


def test_no_hosts_listed_refuses_every_url(served):
    assert refused(fetcher(""), f"http://127.0.0.1:{served.port}/red.png").code == \
        "image_url_not_allowed"
    assert served.seen == []


@pytest.mark.parametrize("form", [
    "http://127.0.0.1:{port}\\@127.0.0.2/../red.png",  # the review's: requests read 127.0.0.1
    "http://127.0.0.1:{port}\\@127.0.0.2/red.png",
    "http://127.0.0.1:{port}\\\\@127.0.0.2/red.png",
    "http://127.0.0.2\\@127.0.0.1:{port}/red.png",
    "http://127.0.0.2@127.0.0.1:{port}/red.png",
    "http://127.0.0.2:80@127.0.0.1:{port}/red.png",
    "http://127.0.0.1:{port}%2f@127.0.0.2/red.png",
    "http://127.0.0.1:{port}\t@127.0.0.2/red.png",
    "http://127.0.0.1:{port} @127.0.0.2/red.png",
])
def test_an_authority_two_parsers_could_read_differently_is_refused(served, form):
    """H2: 127.0.0.2 is listed; none of these reaches the server on 127.0.0.1."""
    err = refused(fetcher("127.0.0.2,127.0.0.2:80"), form.format(port=served.port))
    assert err.code == "image_url_not_allowed"
    assert served.seen == []


@pytest.mark.parametrize("url", [
    "http://a.example\\@b.example/x", "http://u@a.example/x", "http://u:p@a.example/x",
    "http://a.example/x\r\nX-Injected: 1", "http://a.example/ x", "http://a.ex\u0430mple/x",
    "http://a.example:0/x", "http://a.example:65536/x", "http://a..example/x",
    "http://[::1%25eth0]/x", "http://%61.example/x", "http:/a.example/x", "http://a.example:/x",
    "http://a.example:80:81/x", "http:///x", "https://[1.2.3.4]/x", "ftp://a.example/x",
])
def test_urls_read_only_one_way(url):
    assert parse_url(url) is None


def test_the_url_fetched_is_rebuilt_from_its_checked_parts():
    t = parse_url("HTTP://Images.Example:8080?q=1#@evil.example/x")
    assert (t.scheme, t.host, t.port, t.path, t.authority) == (
        "http", "images.example", 8080, "/?q=1", "images.example:8080")
    t = parse_url("https://[0:0::1]/a/../b%20c?x=@y")
    assert (t.host, t.port, t.path, t.authority) == ("::1", 443, "/a/../b%20c?x=@y", "[::1]")


def test_a_listed_host_allows_its_default_port_only_unless_it_names_one(served):
    """I1: an allowed host is not every port on it."""
    url = f"http://127.0.0.1:{served.port}/red.png"
    assert refused(fetcher("127.0.0.1"), url).code == "image_url_not_allowed"
    assert refused(fetcher(f"127.0.0.1:{served.port + 1}"), url).code == "image_url_not_allowed"
    assert served.seen == []
    assert fetcher(f"127.0.0.1,127.0.0.1:{served.port}")(url, "p") == PNG


def test_a_name_resolving_to_a_private_address_is_refused_unless_its_network_is_listed(served):
    """H2: a listed name is checked where it resolves: loopback, link-local and private
    addresses are refused unless the operator lists their range."""
    url = f"http://localhost:{served.port}/red.png"
    err = refused(fetcher(f"localhost:{served.port}"), url)
    assert err.code == "image_url_not_allowed" and "IMAGE_URL_NETWORKS" in err.message
    assert served.seen == []
    allowed = fetcher(f"localhost:{served.port}", networks="127.0.0.0/8,::1/128")
    assert allowed(url, "p") == PNG
    assert served.seen == [("/red.png", f"localhost:{served.port}")]


@pytest.mark.parametrize("address", ["127.0.0.1", "169.254.169.254", "10.1.2.3", "100.64.0.1",
                                     "::1", "fe80::1", "fc00::1", "::ffff:10.0.0.1", "0.0.0.0",
                                     "224.0.0.1", "192.168.1.1"])
def test_non_public_addresses_are_not_public(address):
    f = fetcher("")
    assert not f._public_or_listed(address)
    assert f._public_or_listed("8.8.8.8") and f._public_or_listed("2001:4860:4860::8888")
    assert fetcher("", networks="0.0.0.0/0,::/0")._public_or_listed(address)


class Lookups:
    """socket.getaddrinfo for the name ``images.test``: 127.0.0.1 first, 127.0.0.2 after (a
    rebinding name); every other name as the system resolves it."""

    def __init__(self, real):
        self.real, self.calls = real, 0

    def __call__(self, host, port, *args, **kwargs):
        if host != "images.test":
            return self.real(host, port, *args, **kwargs)
        self.calls += 1
        ip = "127.0.0.1" if self.calls == 1 else "127.0.0.2"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, int(port)))]


@pytest.fixture
def lookups(monkeypatch) -> Lookups:
    fake = Lookups(socket.getaddrinfo)
    monkeypatch.setattr(socket, "getaddrinfo", fake)
    return fake


def test_the_address_checked_is_the_address_connected_to(served, lookups):
    """One lookup: the connection goes to the address that was checked (no second lookup to
    rebind), and the Host header is the name."""
    f = fetcher(f"images.test:{served.port}", networks="127.0.0.1/32")
    assert f(f"http://images.test:{served.port}/red.png", "p") == PNG
    assert lookups.calls == 1 and served.seen == [("/red.png", f"images.test:{served.port}")]
    # the second answer (127.0.0.2) is outside the listed range: refused before connecting
    assert refused(f, f"http://images.test:{served.port}/red.png").code == "image_url_not_allowed"
    assert lookups.calls == 2 and len(served.seen) == 1


def self_signed(name: str, folder: Path) -> Path:
    """A certificate and key for ``name`` (PEM, one file), its own issuer."""
    import datetime

    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    pem = folder / "cert.pem"
    pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return pem


def test_https_verifies_the_name_and_sends_it_as_sni_and_host(tmp_path, lookups):
    pem = self_signed("images.test", tmp_path)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(pem)
    sni: list[str | None] = []
    server_tls.sni_callback = lambda sock, name, ctx: sni.append(name)
    srv = Served(server_tls)
    try:
        trust = ssl.create_default_context(cafile=str(pem))
        f = fetcher(f"images.test:{srv.port},127.0.0.1:{srv.port}", networks="127.0.0.1/32",
                    tls=trust)
        assert f(f"https://images.test:{srv.port}/red.png", "p") == PNG
        assert sni == ["images.test"] and srv.seen == [("/red.png", f"images.test:{srv.port}")]
        # the same server by its address: the certificate does not name it, so nothing is read
        assert refused(f, f"https://127.0.0.1:{srv.port}/red.png").code == "image_not_found"
        assert len(srv.seen) == 1
    finally:
        srv.close()


@pytest.mark.parametrize("path", ["/redirect", "/forbidden", "/nope.png", "/cut", "closed"])
def test_fetch_errors_say_nothing_of_what_answered(served, path):
    """I1: a redirect, a 403, a 404, a body cut short and a closed port get one message, so
    the errors are no oracle of what answers behind an allowed host."""
    closed = socket.create_server(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    port = closed_port if path == "closed" else served.port
    f = fetcher(f"127.0.0.1:{served.port},127.0.0.1:{closed_port}")
    err = refused(f, f"http://127.0.0.1:{port}{'/x' if path == 'closed' else path}")
    assert err.code == "image_not_found"
    assert err.message == refused(f, f"http://127.0.0.1:{served.port}/nope.png").message
    for leak in ("302", "403", "404", "Error", "refused", "Incomplete"):
        assert leak not in err.message


def test_too_large_is_a_413_by_header_or_by_counting(served):
    f = fetcher(f"127.0.0.1:{served.port}", max_bytes=50_000)
    with pytest.raises(PayloadTooLarge):
        f(f"http://127.0.0.1:{served.port}/big", "p")
    with pytest.raises(PayloadTooLarge):
        f(f"http://127.0.0.1:{served.port}/unsized", "p")


@pytest.mark.parametrize("slow_head", [False, True])
def test_a_drip_ends_at_the_deadline_and_the_connection_is_closed(slow_head):
    """H3: IMAGE_FETCH_TIMEOUT bounds the whole read, headers and body, not each read: the
    fetch gives up and hangs up while the host is still sending."""
    srv = DripServer(interval=0.05, limit=200, slow_head=slow_head)
    try:
        err = refused(fetcher(f"127.0.0.1:{srv.port}", timeout=0.5),
                      f"http://127.0.0.1:{srv.port}/red.png")
        assert err.code == "image_not_found" and "IMAGE_FETCH_TIMEOUT" in err.message
        wait_for(lambda: srv.closed_by_client == 1, 30, "the fetch hanging up")
        assert srv.finished == 0 and srv.connections == 1
    finally:
        srv.close()


def test_the_callers_deadline_ends_a_fetch_sooner(drip):
    """A fetch on a pool thread stops when its caller stops waiting (PREPARE_TIMEOUT), even
    within IMAGE_FETCH_TIMEOUT: no thread keeps reading for a caller that had its 503."""
    f = fetcher(f"127.0.0.1:{drip.port}", timeout=60)
    with pytest.raises(Overloaded):
        bridge.offload(f, f"http://127.0.0.1:{drip.port}/red.png", "p", timeout=0.5)
    wait_for(lambda: drip.closed_by_client == 1, 30, "the fetch hanging up")
    wait_for(lambda: bridge.prep_threads(60)[0]["stray"] == 0, 30, "the thread's end",
             nap=gevent.sleep)


def test_gs_urls_outside_the_listed_buckets_are_refused():
    f = Fetcher(frozenset({"pictures"}), frozenset(), 1000, 1.0, None)
    err = refused(f, "gs://secrets/x.png")
    assert "IMAGE_BUCKETS" in err.message and err.code == "image_url_not_allowed"
    # I1: a listed bucket in another case is no bucket name: a 400 (it was a 503)
    assert refused(f, "gs://PICTURES/x.png").code == "image_url_not_allowed"


def test_a_gs_read_ends_at_the_deadline():
    """I1: a storage host that never answers: the read ends at IMAGE_FETCH_TIMEOUT with a 400,
    not after the client library's own minute and its retries."""
    silent = socket.create_server(("127.0.0.1", 0))  # connections queue; nothing answers
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            Fetcher(frozenset({"pictures"}), frozenset(), 1000, 0.5,
                    f"http://127.0.0.1:{silent.getsockname()[1]}")("gs://pictures/x.png", "p")
        except BaseException as exc:  # noqa: BLE001 - examined below
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(30)
    silent.close()
    assert outcome, "the read was still waiting"
    assert isinstance(outcome[0], BadRequest) and outcome[0].code == "image_not_found"
    assert "IMAGE_FETCH_TIMEOUT" in outcome[0].message
