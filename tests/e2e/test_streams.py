"""Resumable streams end to end: real gunicorn servers, the real model, a real Redis.

One server (memory store): a client that drops mid-stream and resumes from its last whole
event gets exactly what an uninterrupted stream of the same request sends; resume after the
end, expiry, a lost offset, DELETE freeing the slot, a second POST replacing the first, the
lookup, the path form, the Vertex predict forms, and httpx-sse reconnecting three times.
Two servers sharing a redis-server: resume on the other replica, DELETE there stops the
producer here, a second POST there replaces the first, and Redis killed and restarted
mid-stream fails nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import requests
from httpx_sse import connect_sse

from tests.support.server import VERTEX_HEALTH, VERTEX_PREDICT, ServerProcess, free_port, wait_for

LONG = {"messages": [{"role": "user", "content": "Tell a long story about a lighthouse."}],
        "max_tokens": 3500, "ignore_eos": True, "temperature": 0, "stream": True}
SHORT = {"messages": [{"role": "user", "content": "What is the capital of France?"}],
         "max_tokens": 60, "temperature": 0, "stream": True}
ENV = {"CTX_SIZE": "4096", "PARALLEL": "2", "STREAM_HEARTBEAT_SECONDS": "0"}


def start(env: dict[str, str]) -> ServerProcess:
    srv = ServerProcess({**ENV, **env})
    srv.wait_ready()
    return srv


@pytest.fixture(scope="module")
def server(default_model) -> Iterator[ServerProcess]:
    srv = start({"STREAM_SESSION_TTL": "3"})
    yield srv
    srv.stop()


def events(data: bytes) -> list[bytes]:
    return [e + b"\n\n" for e in data.split(b"\n\n") if e]


def normalized(data: bytes) -> list[object]:
    """The events with what differs between two runs of one request (id, created) removed."""
    out: list[object] = []
    for ev in events(data):
        if ev.startswith(b"data: {"):
            obj = json.loads(ev[6:])
            obj.pop("id", None)
            obj.pop("created", None)
            out.append(obj)
        else:
            out.append(ev)
    return out


def text_of(data: bytes) -> str:
    return "".join((c.get("delta") or {}).get("content") or ""
                   for obj in normalized(data) if isinstance(obj, dict)
                   for c in obj.get("choices", []))


def read_some(srv: ServerProcess, conv: str, body: dict, n_events: int,
              path: str = "/v1/chat/completions") -> bytes:
    """POST with the conversation id, read ``n_events`` whole events, hang up."""
    got = b""
    with requests.post(srv.url(path), json=body, headers={"X-Conversation-Id": conv},
                       stream=True, timeout=60) as r:
        assert r.status_code == 200, r.text
        for chunk in r.iter_content(chunk_size=None):
            got += chunk
            if got.count(b"\n\n") >= n_events:
                break
    return got[: _boundary(got, n_events)]


def _boundary(data: bytes, n_events: int) -> int:
    pos = 0
    for _ in range(n_events):
        pos = data.index(b"\n\n", pos) + 2
    return pos


def resume(srv: ServerProcess, conv: str, start: int, timeout: float = 120) -> requests.Response:
    return requests.get(srv.url("/v1/stream"), params={"conv_id": conv, "from": start},
                        timeout=timeout)


def lookup(srv: ServerProcess, conv: str) -> dict | None:
    found = requests.post(srv.url("/v1/streams/lookup"), json={"conversation_ids": [conv]},
                          timeout=10).json()
    return found[0] if found else None


def busy_slots(srv: ServerProcess) -> int:
    return sum(1 for s in requests.get(srv.url("/slots"), timeout=10).json() if s["is_processing"])


# ---- one replica -------------------------------------------------------------------------------


def test_a_dropped_client_resumes_with_exactly_the_uninterrupted_bytes(server):
    uninterrupted = requests.post(server.url("/v1/chat/completions"), json=SHORT,
                                  timeout=120).content
    head = read_some(server, "drop-1", SHORT, 4)
    done = wait_for(lambda: (s := lookup(server, "drop-1")) and s["is_done"] and s, what="end")
    tail = resume(server, "drop-1", len(head))
    assert tail.status_code == 200
    assert tail.headers["Content-Type"].startswith("text/event-stream")
    whole = head + tail.content
    assert len(whole) == done["total_bytes"]
    assert normalized(whole) == normalized(uninterrupted)
    assert whole.endswith(b"data: [DONE]\n\n")  # the openai profile's terminator
    assert text_of(whole)
    # after the end, within the TTL: the whole body again; the path form too
    assert resume(server, "drop-1", 0).content == whole
    assert requests.get(server.url(f"/v1/stream/drop-1?from={len(head)}"),
                        timeout=60).content == tail.content
    # ... and after the TTL (3 s here): gone
    wait_for(lambda: resume(server, "drop-1", 0).status_code == 404, 30, "expiry")
    assert lookup(server, "drop-1") is None


def test_resumable_streams_one_after_another_stay_under_the_cap(server):
    """Security round 3: a key sending resumable streams one after another got 429
    too_many_streams from its own finished ones. At STREAM_MAX_LIVE_PER_KEY=1 (half of two
    slots), ten streams, each read until its [DONE] and the next started at once on a new
    connection, the old one still open: every one is admitted, and each is done by the lookup
    as soon as its [DONE] has arrived."""
    body = {**SHORT, "max_tokens": 8}
    held = []
    try:
        for i in range(10):
            r = requests.post(server.url("/v1/chat/completions"), json=body, stream=True,
                              headers={"X-Conversation-Id": f"seq-{i}"}, timeout=60)
            held.append(r)
            assert r.status_code == 200, r.text
            for line in r.iter_lines():  # bounded: the stream ends
                if line == b"data: [DONE]":
                    break
            status = lookup(server, f"seq-{i}")
            assert status is not None and status["is_done"], status
    finally:
        for r in held:
            r.close()


def test_offset_errors(default_model):
    srv = start({"STREAM_BUFFER_BYTES": "1024"})
    try:
        whole = requests.post(srv.url("/v1/chat/completions"), json={**SHORT, "ignore_eos": True},
                              headers={"X-Conversation-Id": "ring"}, timeout=120).content
        assert len(whole) > 4096 and whole.endswith(b"data: [DONE]\n\n")  # the reader lost nothing
        lost = resume(srv, "ring", 0)
        assert lost.status_code == 400 and "offset lost" in lost.json()["error"]["message"]
        newest = len(whole) - 1024
        assert resume(srv, "ring", newest).content == whole[newest:]
        assert resume(srv, "ring", "x").status_code == 400
        assert resume(srv, "nobody", 0).status_code == 404
    finally:
        srv.stop()


def test_delete_frees_the_slot_and_a_second_post_replaces_the_first(server):
    read_some(server, "del-1", LONG, 3)
    assert lookup(server, "del-1")["is_done"] is False  # still generating without a client
    assert busy_slots(server) == 1
    assert requests.delete(server.url("/v1/stream"), params={"conv_id": "del-1"},
                           timeout=30).status_code == 204
    # freed at the engine's next step: long before the 3500 tokens asked for could be made
    wait_for(lambda: busy_slots(server) == 0, 10, "the slot freed")
    assert lookup(server, "del-1") is None
    assert resume(server, "del-1", 0).status_code == 404
    assert requests.delete(server.url("/v1/stream/del-1"), timeout=30).status_code == 204

    with requests.post(server.url("/v1/chat/completions"), json=LONG,
                       headers={"X-Conversation-Id": "twice"}, stream=True, timeout=60) as first:
        chunks = first.iter_content(chunk_size=None)
        next(chunks)
        second = requests.post(server.url("/v1/chat/completions"), json=SHORT,
                               headers={"X-Conversation-Id": "twice"}, timeout=120).content
        rest = b"".join(chunks)  # the first's reader ends: its generation was stopped
    assert b"[DONE]" not in rest
    assert second.endswith(b"data: [DONE]\n\n")
    assert resume(server, "twice", 0).content == second
    wait_for(lambda: busy_slots(server) == 0, 10, "the first's slot freed")


def test_vertex_predict_forms(default_model):
    srv = start({"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(free_port()),
                 "AIP_HEALTH_ROUTE": VERTEX_HEALTH, "AIP_PREDICT_ROUTE": VERTEX_PREDICT})
    try:
        predict = srv.url(VERTEX_PREDICT)
        head = read_some(srv, "vx", SHORT, 3, path=VERTEX_PREDICT)  # streamRawPredict + header
        done = wait_for(lambda: (s := lookup(srv, "vx")) and s["is_done"] and s, what="end")
        tail = requests.post(predict, json={"stream_resume": {"conversation_id": "vx",
                                                              "from": len(head)}}, timeout=60)
        assert tail.status_code == 200 and tail.content.endswith(b"data: [DONE]\n\n")
        assert len(head) + len(tail.content) == done["total_bytes"]
        found = requests.post(predict, json={"stream_lookup": {"conversation_ids": ["vx"]}},
                              timeout=10).json()
        assert found[0]["total_bytes"] == done["total_bytes"]
        read_some(srv, "vx-long", LONG, 3, path=VERTEX_PREDICT)
        stop = requests.post(predict, json={"stream_cancel": {"conversation_id": "vx-long"}},
                             timeout=30)
        assert stop.status_code == 200 and stop.json()["status"] == "stopped"
        wait_for(lambda: busy_slots(srv) == 0, 10, "the slot freed")
    finally:
        srv.stop()


def test_an_sse_client_reconnects_through_three_disconnects(server):
    """What a browser's EventSource loop does: read, lose the connection, reconnect from the
    byte after the last whole event, until the stream's end."""
    body = {**SHORT, "max_tokens": 120, "ignore_eos": True}  # events enough for three drops
    uninterrupted = requests.post(server.url("/v1/chat/completions"), json=body,
                                  timeout=120).content
    kept = b""  # the whole events received so far: their bytes are the offset
    deltas: list[str] = []
    drops = 0
    with httpx.Client(timeout=60) as client:
        while True:
            if not kept:
                source = connect_sse(client, "POST", server.url("/v1/chat/completions"),
                                     json=body, headers={"X-Conversation-Id": "sse"})
            else:
                source = connect_sse(client, "GET", server.url("/v1/stream"),
                                     params={"conv_id": "sse", "from": len(kept)})
            with source as es:
                assert es.response.status_code == 200
                ended = False
                for n, sse in enumerate(es.iter_sse()):
                    kept += f"data: {sse.data}\n\n".encode()
                    if sse.data == "[DONE]":
                        ended = True
                        break
                    deltas.append(sse.data)
                    if drops < 3 and n == 5:  # hang up mid-stream
                        break
            if ended:
                break
            drops += 1
            assert drops <= 3
    assert drops == 3
    assert normalized(kept) == normalized(uninterrupted)


def test_shutdown_ends_a_detached_generation_with_an_error_event(default_model):
    """SIGTERM while a generation runs on with no client: the worker waits for it, ends it with
    the stream's error event near the end of GRACEFUL_TIMEOUT, and exits; a reader connected
    before gets the whole session."""
    srv = start({"GRACEFUL_TIMEOUT": "4"})
    try:
        head = read_some(srv, "bye", LONG, 3)
        with requests.get(srv.url("/v1/stream"), params={"conv_id": "bye", "from": len(head)},
                          stream=True, timeout=60) as follower:
            chunks = follower.iter_content(chunk_size=None)
            rest = next(chunks)
            srv.proc.send_signal(15)
            rest += b"".join(chunks)
        assert srv.proc.wait(30) == 0
        last = events(head + rest)[-2:]
        assert any(b'"error"' in e and b"shutting down" in e for e in last), last
    finally:
        srv.stop()


# ---- two replicas and Redis ---------------------------------------------------------------------


class Redis:
    """A redis-server on a free loopback port, no persistence (a restart loses everything)."""

    def __init__(self, tmp: Path):
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed (.ci/run installs Debian's package)")
        self.binary, self.dir, self.port = binary, tmp, free_port()
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.answers, 20, "redis-server")

    def answers(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory) -> Iterator[Redis]:
    srv = Redis(tmp_path_factory.mktemp("redis"))
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def replicas(default_model, redis_server) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    # STREAM_UNREAD_TIMEOUT: long enough for the short streams left unread a moment here
    env = {**ENV, "STREAM_STORE": redis_server.url, "STREAM_UNREAD_TIMEOUT": "8"}
    a = ServerProcess(env)
    b = ServerProcess(env)
    try:
        a.wait_ready()
        b.wait_ready()
        yield a, b
    finally:
        a.stop()
        b.stop()


def test_resume_on_the_other_replica(replicas):
    a, b = replicas
    head = read_some(a, "x-1", SHORT, 4)
    done = wait_for(lambda: (s := lookup(b, "x-1")) and s["is_done"] and s, what="end on B")
    tail = resume(b, "x-1", len(head))
    assert tail.status_code == 200
    assert len(head) + len(tail.content) == done["total_bytes"]
    assert normalized(head + tail.content) == normalized(resume(a, "x-1", 0).content)
    assert tail.content.endswith(b"data: [DONE]\n\n")


def test_follow_live_on_the_other_replica_and_delete_there(replicas):
    a, b = replicas
    head = read_some(a, "x-2", LONG, 3)
    with requests.get(b.url("/v1/stream"), params={"conv_id": "x-2", "from": len(head)},
                      stream=True, timeout=60) as follower:
        chunks = follower.iter_content(chunk_size=None)
        live = next(chunks)  # bytes produced on A, read through Redis on B
        assert live.startswith(b"data: ")
        assert busy_slots(a) == 1
        assert requests.delete(b.url("/v1/stream"), params={"conv_id": "x-2"},
                               timeout=30).status_code == 204
        wait_for(lambda: busy_slots(a) == 0, 10, "A's slot freed by B's DELETE")
        rest = b"".join(chunks)  # B's reader ends once A's producer has stopped
    assert b"[DONE]" not in live + rest
    assert resume(a, "x-2", 0).status_code == 404
    assert resume(b, "x-2", 0).status_code == 404


def test_a_second_post_on_the_other_replica_replaces_the_first(replicas):
    a, b = replicas
    read_some(a, "x-3", LONG, 3)
    assert busy_slots(a) == 1
    second = requests.post(b.url("/v1/chat/completions"), json=SHORT,
                           headers={"X-Conversation-Id": "x-3"}, timeout=120).content
    wait_for(lambda: busy_slots(a) == 0, 10, "A's generation stopped by B's POST")
    assert resume(a, "x-3", 0).content == second  # A reads B's session through Redis


def test_redis_killed_and_restarted_mid_stream_fails_no_stream(replicas, redis_server):
    a, b = replicas
    body = {**LONG, "max_tokens": 600}
    got = b""
    with requests.post(a.url("/v1/chat/completions"), json=body,
                       headers={"X-Conversation-Id": "x-4"}, stream=True, timeout=120) as r:
        chunks = r.iter_content(chunk_size=None)
        while got.count(b"\n\n") < 5:
            got += next(chunks)
        redis_server.kill()
        while got.count(b"\n\n") < 60:  # the stream goes on while Redis is down
            got += next(chunks)
        redis_server.start()  # empty: it lost every session
        got += b"".join(chunks)
    assert got.endswith(b"data: [DONE]\n\n")
    assert len(normalized(got)) > 100
    # the owner rewrote its session into the new Redis: the other replica replays all of it
    replay = wait_for(lambda: (r := resume(b, "x-4", 0)).status_code == 200 and r.content, 30,
                      "the session back in Redis")
    assert replay == got
    assert "Redis (STREAM_STORE) failed" in a.logs()
    assert "Traceback" not in a.logs()


def test_a_reader_past_the_end_on_the_other_replica_ends_with_the_stream(replicas):
    """Security review round 2, H1: B follows A's live stream from past where it will end. When
    A's stream ends, B's reader ends too (it used to spin through Redis, thousands of commands
    a second, until the session's TTL, long after its client left), and past the end of a
    finished stream is the same 400 on both replicas."""
    a, b = replicas
    read_some(a, "x-5", {**LONG, "max_tokens": 120}, 2)  # A generates on, detached
    with requests.get(b.url("/v1/stream"), params={"conv_id": "x-5", "from": 10**9},
                      stream=True, timeout=60) as follower:
        assert follower.status_code == 200
        rest = b"".join(follower.iter_content(chunk_size=None))  # a read timeout if it spins
    assert rest == b""
    assert lookup(a, "x-5")["is_done"]
    for srv in (a, b):
        past = resume(srv, "x-5", 10**9)
        assert past.status_code == 400 and past.json()["error"]["param"] == "from"


def test_a_reader_on_the_other_replica_keeps_a_generation_going(replicas):
    """Security review round 2, M2, across replicas: a resumable generation nobody reads is
    stopped after STREAM_UNREAD_TIMEOUT (8 s here), but one read through Redis on another
    replica is not (its reader marks the session in Redis)."""
    a, b = replicas
    read_some(a, "x-6", {**LONG, "max_tokens": 2500}, 2)  # detached on A, read only on B
    whole = resume(b, "x-6", 0, timeout=300)  # follows live through Redis to the end
    assert whole.content.endswith(b"data: [DONE]\n\n")
    assert len(normalized(whole.content)) > 1000  # ran well past the unread timeout
    read_some(a, "x-7", {**LONG, "max_tokens": 3500}, 2)  # nobody reads this one
    wait_for(lambda: (s := lookup(a, "x-7")) and s["is_done"], 120, "x-7 stopped")
    assert b"[DONE]" not in resume(a, "x-7", 0).content
