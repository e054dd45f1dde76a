"""End to end: images named by http(s) URL, behind a real server (gunicorn, gevent, the
default model and a random-weight projector from tests/support/tiny_mmproj.py). A listed
host's image reads as the same image sent inline; a URL that two parsers could read as
different hosts is a 400 in each API's own shape, and nothing is connected to; and image hosts
that drip one byte at a time (tests/support/drip.py) no longer take every request-preparation
thread: each such request ends with its 400 at IMAGE_FETCH_TIMEOUT, its connection closed,
while another key's plain chat answers."""

from __future__ import annotations

import concurrent.futures as cf
import http.server
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from gguf import GGUFReader

from tests.support.drip import DripServer
from tests.support.images import data_url, encoded
from tests.support.server import ServerProcess, loopback_http, running_server, wait_for
from tests.support.tiny_mmproj import build_tiny_mmproj

KEY_A, KEY_B = "image-key-a-0123456789", "image-key-b-0123456789"
PNG = encoded("red")
PARAM = "messages.0.content.1.image_url.url"


class Images(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.seen.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", str(len(PNG)))
        self.end_headers()
        self.wfile.write(PNG)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def images() -> Iterator[http.server.ThreadingHTTPServer]:
    with loopback_http(Images) as srv:
        yield srv


@pytest.fixture(scope="module")
def drip() -> Iterator[DripServer]:
    srv = DripServer(interval=0.1, limit=600)  # a minute at most: the fetches hang up first
    yield srv
    srv.close()


def n_embd(model: Path) -> int:
    reader = GGUFReader(str(model))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    return int(reader.fields[f"{arch}.embedding_length"].parts[-1][0])


@pytest.fixture(scope="module")
def server(default_model, tmp_path_factory, images, drip) -> Iterator[ServerProcess]:
    mmproj = build_tiny_mmproj(tmp_path_factory.mktemp("urls") / "mmproj.gguf",
                               n_embd(default_model))
    hosts = f"127.0.0.1:{images.server_address[1]},127.0.0.1:{drip.port},127.0.0.2"
    env = {"MMPROJ": str(mmproj), "PARALLEL": "1", "API_KEY": f"{KEY_A},{KEY_B}",
           "IMAGE_URL_HOSTS": hosts, "IMAGE_FETCH_TIMEOUT": "1", "PREPARE_TIMEOUT": "20"}
    with running_server(env) as srv:
        yield srv


def chat(server: ServerProcess, key: str, url: str | None, timeout: float = 60):
    parts = [{"type": "text", "text": "Describe this image."}]
    if url is not None:
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return requests.post(server.url("/v1/chat/completions"), timeout=timeout,
                         headers={"Authorization": f"Bearer {key}"},
                         json={"messages": [{"role": "user", "content": parts}],
                               "temperature": 0, "max_tokens": 4})


def health(server: ServerProcess) -> requests.Response:
    return requests.get(server.url("/health"), timeout=10)


def test_an_image_from_a_listed_host_reads_as_the_same_image_inline(server, images):
    by_url = chat(server, KEY_A, f"http://127.0.0.1:{images.server_address[1]}/red.png")
    inline = chat(server, KEY_A, data_url(PNG))
    assert by_url.status_code == inline.status_code == 200
    assert by_url.json()["choices"][0]["message"] == inline.json()["choices"][0]["message"]
    assert by_url.json()["usage"]["prompt_tokens"] == inline.json()["usage"]["prompt_tokens"]
    assert Images.seen == ["/red.png"]


def test_a_url_read_two_ways_is_a_400_in_each_apis_shape(server, images):
    """H2: 127.0.0.2 is listed; the review's URL named it to the check and reached another
    port on 127.0.0.1. Refused before any connection, in the caller's API's error shape."""
    url = f"http://127.0.0.1:{images.server_address[1]}\\@127.0.0.2/../red.png"
    seen = len(Images.seen)
    auth = {"Authorization": f"Bearer {KEY_A}"}
    openai = chat(server, KEY_A, url)
    assert openai.status_code == 400
    assert openai.json()["error"]["code"] == "image_url_not_allowed"
    assert openai.json()["error"]["param"] == PARAM
    anthropic = requests.post(server.url("/v1/messages"), timeout=60, headers=auth, json={
        "model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": url}},
            {"type": "text", "text": "Describe this image."}]}]})
    assert anthropic.status_code == 400
    assert anthropic.json()["type"] == "error"
    assert anthropic.json()["error"]["type"] == "invalid_request_error"
    gemini = requests.post(server.url("/v1beta/models/m:generateContent"), timeout=60,
                           headers=auth, json={"contents": [{"role": "user", "parts": [
                               {"fileData": {"fileUri": url, "mimeType": "image/png"}},
                               {"text": "Describe this image."}]}]})
    assert gemini.status_code == 400
    assert gemini.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert len(Images.seen) == seen


def test_dripping_image_hosts_do_not_starve_another_keys_chat(server, drip):
    """H3: as many dripping image URLs as the server has preparation threads, then another
    key's plain chat. The chat answers; each dripping request gets its 400 (the fetch's
    deadline, not PREPARE_TIMEOUT's 503 with the thread still reading), the drip server sees
    each connection closed, and /health counts no thread left behind."""
    threads = health(server).json()["prep_threads"]["size"]
    with cf.ThreadPoolExecutor(threads) as pool:
        drips = [pool.submit(chat, server, KEY_A, f"http://127.0.0.1:{drip.port}/{i}.png")
                 for i in range(threads)]
        wait_for(lambda: drip.connections == threads, 60, "every drip connected")
        plain = chat(server, KEY_B, None, timeout=45)
        assert plain.status_code == 200 and plain.json()["choices"][0]["finish_reason"]
        answers = [f.result(timeout=120) for f in drips]
    for answer in answers:
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == "image_not_found"
        assert answer.json()["error"]["param"] == PARAM
    wait_for(lambda: drip.closed_by_client == threads, 30, "every drip hung up on")
    assert drip.finished == 0
    wait_for(lambda: health(server).json()["prep_threads"] == {
        "size": threads, "busy": 0, "stray": 0}, 30, "the threads back")
    assert health(server).status_code == 200 and "Traceback" not in server.logs()
