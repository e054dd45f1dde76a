"""Resumable streams, in process over the fake engine: opting in, replay from an offset, a
disconnect that the generation survives, stop, replacement, lookup, expiry, the ring's limit,
per-key isolation and the Vertex predict forms. End to end (real model, Redis, two replicas):
tests/e2e/test_streams.py."""

from __future__ import annotations

import json
import time

import gevent
import pytest

from app.engine.fake import FakeEngine
from tests.support.app import make_client
from tests.support.server import wait_for

CHAT = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
PREDICT = "/predict"


def post(client, conv: str | None, body=None, path="/v1/chat/completions", **kw):
    headers = {"X-Conversation-Id": conv} if conv is not None else {}
    headers.update(kw.pop("headers", {}))
    return client.post(path, json=body or CHAT, headers=headers, **kw)


def events(data: bytes) -> list[bytes]:
    return [e for e in data.split(b"\n\n") if e]


def texts(data: bytes) -> str:
    out = ""
    for ev in events(data):
        if ev.startswith(b"data: {"):
            obj = json.loads(ev[6:])
            for choice in obj.get("choices", []):
                out += (choice.get("delta") or {}).get("content") or ""
    return out


def get(client, conv: str, start: int | str = 0, **kw):
    return client.get(f"/v1/stream?conv_id={conv}&from={start}", **kw)


def wait_done(client, conv: str, limit: float = 10.0, **kw) -> dict:
    def done() -> dict | None:
        found = client.post("/v1/streams/lookup", json={"conversation_ids": [conv]}, **kw).json
        return found[0] if found and found[0]["is_done"] else None

    return wait_for(done, limit, f"end of stream {conv}", nap=gevent.sleep)  # let the producer run


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(reply=" ".join(f"word{i}" for i in range(40)))


@pytest.fixture
def client(engine):
    return make_client(engine)


def test_without_the_header_nothing_is_kept(client):
    resp = post(client, None)
    assert resp.status_code == 200 and b"[DONE]" in resp.data
    assert client.post("/v1/streams/lookup", json={"conversation_ids": ["x"]}).json == []
    assert client.get("/health").json["streams"]["sessions"] == 0


def test_replay_from_zero_and_from_an_event_boundary_equal_the_original(client):
    body = post(client, "conv-1").data
    assert body.endswith(b"data: [DONE]\n\n") and texts(body).startswith("word0 word1")
    assert get(client, "conv-1").data == body
    cut = body.index(b"\n\n", len(body) // 2) + 2  # resume after a whole event, as a client does
    resumed = get(client, "conv-1", cut)
    assert resumed.status_code == 200
    assert resumed.headers["Content-Type"].startswith("text/event-stream")
    assert resumed.data == body[cut:]
    assert client.get(f"/v1/stream/conv-1?from={cut}").data == body[cut:]  # the path form


def test_the_generation_survives_the_client_going_away(client, engine):
    engine.hold_after = 3
    resp = post(client, "gone", buffered=False)
    frames = iter(resp.response)
    got = b""
    while b"word1" not in got:
        got += next(frames)
    resp.close()  # the client hangs up mid-stream
    engine.resume.set()
    status = wait_done(client, "gone")
    assert not engine.handles[0].cancelled
    full = get(client, "gone").data
    assert full.startswith(got) and full.endswith(b"data: [DONE]\n\n")
    assert texts(full) == engine.reply
    assert status["total_bytes"] == len(full)


def test_a_reader_follows_live_bytes_to_the_end(client, engine):
    engine.hold_after = 2
    resp = post(client, "live", buffered=False)
    frames = iter(resp.response)
    first = next(frames)
    # resumed while the follower waits (the test client reads its first bytes in get())
    gevent.spawn_later(0.2, engine.resume.set)
    follower = get(client, "live", len(first), buffered=False)
    rest = b"".join(follower.response)
    assert rest.endswith(b"data: [DONE]\n\n")
    assert first + rest == get(client, "live").data
    resp.close()


def test_errors_of_the_routes(client):
    assert post(client, "c").status_code == 200
    assert get(client, "nope").status_code == 404
    assert get(client, "nope").json["error"]["code"] == "stream_not_found"
    assert get(client, "c", "abc").status_code == 400
    assert get(client, "c", "-1").status_code == 400
    assert get(client, "c", 10**9).status_code == 400  # past the end of a finished stream
    assert client.get("/v1/stream").status_code == 400  # no id
    for bad in ("a b", "x" * 129, "é", "a/b"):
        resp = post(client, bad)
        assert resp.status_code == 400, bad
        assert resp.json["error"]["param"] == "X-Conversation-Id"
    assert client.post("/v1/streams/lookup", json={"conversation_ids": "c"}).status_code == 400
    assert client.post("/v1/streams/lookup", json=[1]).status_code == 400


def test_non_streaming_requests_ignore_the_header(client):
    resp = post(client, "plain", body={**CHAT, "stream": False})
    assert resp.status_code == 200 and resp.json["choices"][0]["message"]["content"]
    assert client.post("/v1/streams/lookup", json={"conversation_ids": ["plain"]}).json == []


def test_a_request_that_fails_before_streaming_leaves_nothing(client):
    resp = post(client, "bad", body={**CHAT, "messages": []})
    assert resp.status_code == 400
    failed = post(client, "bad2", body={**CHAT, "messages": [
        {"role": "user", "content": "FAIL_BEFORE"}]})
    assert failed.status_code == 500
    assert get(client, "bad").status_code == 404 and get(client, "bad2").status_code == 404


def test_a_generation_that_fails_midway_ends_with_its_error_event(client):
    body = post(client, "mid", body={**CHAT, "messages": [
        {"role": "user", "content": "FAIL_AFTER"}]}).data
    assert b'"error"' in events(body)[-1] or b'"error"' in events(body)[-2]
    wait_done(client, "mid")
    assert get(client, "mid").data == body


def test_lookup(client, engine):
    engine.hold_after = 2
    resp = post(client, "look", buffered=False)
    next(iter(resp.response))
    before = time.time()
    live = client.post("/v1/streams/lookup",
                       json={"conversation_ids": ["look", "unknown", "look"]}).json
    assert [s["conversation_id"] for s in live] == ["look"]
    assert live[0]["is_done"] is False and live[0]["completed_at"] == 0
    assert live[0]["total_bytes"] > 0 and live[0]["started_at"] <= before + 1
    engine.resume.set()
    done = wait_done(client, "look")
    assert done["completed_at"] >= done["started_at"] > 0
    resp.close()


def test_delete_stops_the_generation_at_once(client, engine):
    engine.hold_after = 2
    resp = post(client, "del", buffered=False)
    frames = iter(resp.response)
    next(frames)
    assert client.delete("/v1/stream?conv_id=del").status_code == 204
    assert engine.handles[0].cancelled  # the slot is released before the 204
    assert get(client, "del").status_code == 404
    assert client.delete("/v1/stream?conv_id=del").status_code == 204  # idempotent
    assert client.delete("/v1/stream/never-was").status_code == 204
    rest = b"".join(frames)  # the POST's own reader ends; no [DONE]: it was stopped
    assert b"[DONE]" not in rest
    engine.resume.set()


def test_a_second_post_with_the_same_id_cancels_the_first(client, engine):
    engine.hold_after = 2
    first = post(client, "same", buffered=False)
    next(iter(first.response))
    engine.hold_after = None
    engine.resume.set()
    second = post(client, "same").data
    assert engine.handles[0].cancelled and not engine.handles[1].cancelled
    assert get(client, "same").data == second
    assert b"[DONE]" not in b"".join(first.response)


def test_finished_sessions_expire_after_the_ttl(engine):
    client = make_client(engine, stream_session_ttl=0.2)
    assert post(client, "ttl").status_code == 200
    wait_done(client, "ttl")
    assert get(client, "ttl").status_code == 200
    wait_for(lambda: get(client, "ttl").status_code != 200, 10, "expiry", nap=gevent.sleep)
    assert get(client, "ttl").status_code == 404
    assert client.get("/health").json["streams"]["sessions"] == 0


def test_lookup_finds_every_session_of_a_key_until_its_ttl(engine):
    """Security round 3: after 117 finished streams of one key the lookup found 30. Nothing
    caps how many sessions a key keeps: each is kept STREAM_SESSION_TTL seconds after it ends
    (300), then the lookup omits it and a replay is a 404. The reviewer's streams ran about
    10 s each, so only the last 300 s of them were still kept. Pinned without waiting: 117
    finished sessions are all found; once the first 87 ended more than the TTL ago (their end
    moved back), the lookup finds the other 30."""
    engine.reply = "a b c"
    client = make_client(engine, stream_max_live_per_key=1)
    ids = [f"many-{i}" for i in range(117)]
    for conv in ids:  # one after another, each read to its end
        assert post(client, conv).data.endswith(b"data: [DONE]\n\n")

    def found() -> list[str]:
        out = client.post("/v1/streams/lookup", json={"conversation_ids": ids}).json
        assert all(s["is_done"] for s in out)
        return [s["conversation_id"] for s in out]

    assert found() == ids
    hub = client.application.extensions["vertex_gguf_streams"]
    for session in hub._sessions.values():
        if session.conv_id in ids[:87]:
            session.done_monotonic -= hub.ttl + 1  # ended longer than the TTL ago
    assert found() == ids[87:]
    assert get(client, ids[0]).status_code == 404
    assert get(client, ids[-1]).status_code == 200


def test_an_offset_that_dropped_out_of_a_small_ring_is_400(engine):
    client = make_client(engine, stream_buffer_bytes=512)
    body = post(client, "ring").data  # a connected reader loses nothing: its pin keeps it
    assert len(body) > 2048 and texts(body) == engine.reply
    lost = get(client, "ring", 0)
    assert lost.status_code == 400 and lost.json["error"]["code"] == "stream_offset_lost"
    assert "offset lost" in lost.json["error"]["message"]
    tail = len(body) - 512
    assert get(client, "ring", tail).data == body[tail:]  # the newest 512 bytes are kept
    assert get(client, "ring", tail - 1).status_code == 400


def test_heartbeats_go_to_readers_not_into_the_session(engine):
    client = make_client(engine, stream_heartbeat_seconds=0.05)
    engine.hold_after = 2
    resp = post(client, "hb", buffered=False)
    frames = iter(resp.response)
    got = b""
    while b": ping" not in got:  # the POST's reader is quiet while the generation is held
        got += next(frames)
    engine.resume.set()
    got += b"".join(frames)
    replay = get(client, "hb").data
    assert b": ping" not in replay
    assert got.replace(b": ping\n\n", b"") == replay


def beat_of(path: str) -> bytes:
    return b'event: ping\ndata: {"type":"ping"}\n\n' if path == "/v1/messages" else b": ping\n\n"


@pytest.mark.parametrize("path,body,start,end", [
    ("/v1/messages", {"model": "m", "max_tokens": 50, "stream": True,
                      "messages": [{"role": "user", "content": "hi"}]},
     b"event: message_start", b"event: message_stop"),
    ("/v1/responses", {"input": "hi", "stream": True},
     b"event: response.created", b"event: response.completed"),
    ("/v1/completions", {"prompt": "hi", "stream": True}, b"data: {", b"data: [DONE]"),
], ids=["messages", "responses", "completions"])
def test_every_streaming_api_resumes(engine, path, body, start, end):
    client = make_client(engine, stream_heartbeat_seconds=0.05)
    engine.hold_after = 2
    resp = post(client, f"api-{path[4:]}", body=body, path=path, buffered=False)
    frames = iter(resp.response)
    got = b""
    while got.count(beat_of(path)) < 2:  # held: the reader's heartbeats come
        got += next(frames)
    resp.close()  # gone mid-stream, during the hold
    engine.resume.set()
    wait_done(client, f"api-{path[4:]}")
    data = get(client, f"api-{path[4:]}").data
    beat = beat_of(path)
    assert beat in got  # the held stream's reader had heartbeats...
    # ... the session has none (Messages sends one ping of its own after message_start)
    assert data.count(beat) == (1 if path == "/v1/messages" else 0)
    assert data.startswith(start) and end in data
    assert data.replace(beat, b"").startswith(got.replace(beat, b""))
    assert not engine.handles[0].cancelled


def test_request_timeout_ends_a_detached_generation(engine):
    engine.delay = 0.05
    client = make_client(engine, request_timeout=0.3)
    resp = post(client, "slow", buffered=False)
    next(iter(resp.response))
    resp.close()
    wait_done(client, "slow")
    assert b"timeout" in get(client, "slow").data


def test_keys_guard_the_routes_and_sessions_are_per_key(engine):
    client = make_client(engine, api_key="k1,k2")
    k1 = {"Authorization": "Bearer k1"}
    k2 = {"Authorization": "Bearer k2"}
    assert post(client, "mine").status_code == 401
    body = post(client, "mine", headers=k1).data
    assert get(client, "mine").status_code == 401
    assert client.delete("/v1/stream?conv_id=mine").status_code == 401
    assert client.post("/v1/streams/lookup", json={"conversation_ids": ["mine"]}).status_code == 401
    assert get(client, "mine", headers=k1).data == body
    assert get(client, "mine", headers=k2).status_code == 404  # another key never sees it
    assert client.post("/v1/streams/lookup", json={"conversation_ids": ["mine"]},
                       headers=k2).json == []
    client.delete("/v1/stream?conv_id=mine", headers=k2)
    assert get(client, "mine", headers=k1).status_code == 200
    other = post(client, "mine", headers=k2).data  # the same id under another key: its own
    assert get(client, "mine", headers=k1).data == body
    assert get(client, "mine", headers=k2).data == other


def test_vertex_predict_forms(client, engine):
    raw = post(client, "vx", path=PREDICT).data  # streamRawPredict with the header
    assert raw.endswith(b"data: [DONE]\n\n")
    resumed = client.post(PREDICT, json={"stream_resume": {"conversation_id": "vx", "from": 10}})
    assert resumed.status_code == 200 and resumed.data == raw[10:]
    as_text = client.post(PREDICT, json={"stream_resume": {"conversation_id": "vx", "from": "10"}})
    assert as_text.data == raw[10:]
    looked = client.post(PREDICT, json={"stream_lookup": {"conversation_ids": ["vx"]}}).json
    assert looked[0]["total_bytes"] == len(raw) and looked[0]["is_done"]
    # an envelope's streamed instance opts in the same way
    env = post(client, "vx-env", body={"instances": [CHAT]}, path=PREDICT).data
    assert get(client, "vx-env").data == env
    engine.hold_after = 2
    live = post(client, "vx-live", path=PREDICT, buffered=False)
    next(iter(live.response))
    stop = client.post(PREDICT, json={"stream_cancel": {"conversation_id": "vx-live"}})
    assert stop.status_code == 200 and stop.json == {"conversation_id": "vx-live",
                                                     "status": "stopped"}
    assert engine.handles[-1].cancelled
    engine.resume.set()
    assert client.post(PREDICT, json={"stream_resume": {"conversation_id": "vx-live"}}
                       ).status_code == 404
    for bad in ({"stream_resume": {"conversation_id": "vx", "from": 1.5}},
                {"stream_resume": {"from": 0}},
                {"stream_resume": "vx"},
                {"stream_cancel": {"conversation_id": "a b"}},
                {"stream_resume": {"conversation_id": "vx"}, "messages": []}):
        assert client.post(PREDICT, json=bad).status_code == 400, bad


def test_a_stream_with_no_reader_runs_past_its_ring(engine):
    """Nobody connected, the generation writes far more than the ring holds: it completes."""
    client = make_client(engine, stream_buffer_bytes=512)
    engine.hold_after = 2
    resp = post(client, "alone", buffered=False)
    next(iter(resp.response))
    resp.close()
    engine.resume.set()
    status = wait_done(client, "alone")
    assert status["total_bytes"] > 4 * 512 and not engine.handles[0].cancelled
    tail = get(client, "alone", status["total_bytes"] - 512).data
    assert len(tail) == 512 and tail.endswith(b"data: [DONE]\n\n")
    assert client.get("/health").json["streams"]["bytes"] <= 512 + 512 // 4


def test_a_stop_before_the_producer_ran_still_closes_the_run(client):
    """DELETE in the same loop turn as the POST: the producer greenlet never ran, and the
    run (the engine's slot) is closed all the same."""
    hub = client.application.extensions["vertex_gguf_streams"]

    class Frames:
        closed = False

        def __iter__(self):
            return self

        def __next__(self):
            raise AssertionError("never read")

        def close(self):
            self.closed = True

    frames = Frames()
    reader = hub.produce("early", "", frames, b": ping\n\n")
    hub.cancel("early", "")
    assert frames.closed
    reader.close()
    assert hub.live() == 0


# ---- per key: a cap on live generations, and none runs unread (security review round 2, M2) ----

K1 = {"Authorization": "Bearer k1"}
K2 = {"Authorization": "Bearer k2"}


def test_a_key_may_run_only_so_many_resumable_generations(engine):
    client = make_client(engine, api_key="k1,k2", stream_max_live_per_key=2,
                         stream_unread_timeout=0)
    engine.hold_after = 1  # every generation pauses after its first word: all stay live
    held = [post(client, f"c{i}", headers=K1, buffered=False) for i in range(2)]
    third = post(client, "c2", headers=K1)
    assert third.status_code == 429
    assert third.json["error"]["code"] == "too_many_streams"
    assert "STREAM_MAX_LIVE_PER_KEY=2" in third.json["error"]["message"]
    assert third.headers["Retry-After"]
    # another key is not held back by the first one's streams
    other = post(client, "c0", headers=K2, buffered=False)
    assert other.status_code == 200
    # a second POST with a live id replaces it: no new room needed
    again = post(client, "c1", headers=K1, buffered=False)
    assert again.status_code == 200
    # plain streams are not counted
    assert post(client, None, headers=K1, buffered=False).status_code == 200
    # one ended: room for one more
    assert client.delete("/v1/stream?conv_id=c0", headers=K1).status_code == 204
    assert post(client, "c3", headers=K1, buffered=False).status_code == 200
    engine.resume.set()
    for resp in (*held, other, again):
        resp.close()


ENDINGS = [  # (path, body, the API's last event): each stream read until that event only
    ("/v1/chat/completions", CHAT, b"data: [DONE]"),
    ("/v1/messages", {"model": "m", "max_tokens": 64, "stream": True,
                      "messages": [{"role": "user", "content": "hi"}]}, b"event: message_stop"),
    ("/v1/responses", {"input": "hi", "stream": True}, b"event: response.completed"),
]


@pytest.mark.parametrize("path, body, last", ENDINGS, ids=["chat", "messages", "responses"])
def test_a_stream_has_ended_before_its_last_event_goes_out(engine, monkeypatch, path, body,
                                                           last):
    """Security round 3: a key sending resumable streams one after another got 429
    too_many_streams from its own finished ones. A client that has read the last event starts
    the next stream at once; the session's end must be recorded before that event can reach
    it, whatever the run's teardown does after its last frame (here it yields to the hub, as
    any I/O there would). Five streams in a row at STREAM_MAX_LIVE_PER_KEY=1, each looked up
    and the next one started the moment its last event arrives, the rest unread."""
    from app.api import generation

    note = generation.note_run

    def yielding(run):  # the run's teardown yields to the hub after its last frame
        note(run)
        gevent.sleep(0.01)

    monkeypatch.setattr(generation, "note_run", yielding)
    client = make_client(engine, stream_max_live_per_key=1, stream_unread_timeout=0)
    held = []
    for i in range(5):
        resp = post(client, f"seq{i}", body, path, buffered=False)
        assert resp.status_code == 200, resp.json
        got = b""
        for chunk in resp.response:  # bounded: the stream ends
            got += chunk
            if last in got:
                break
        assert last in got
        status = client.post("/v1/streams/lookup", json={"conversation_ids": [f"seq{i}"]}).json
        assert status[0]["is_done"], status
        held.append(resp)  # the connection stays open, unread past its last event
    for resp in held:
        resp.close()


def test_a_generation_nobody_reads_is_stopped(engine):
    engine.delay = 0.02  # 40 words: about a second of generating
    client = make_client(engine, stream_unread_timeout=0.3)
    resp = post(client, "abandoned", buffered=False)
    next(iter(resp.response))
    resp.close()  # the client goes, and nobody comes back
    status = wait_done(client, "abandoned")
    assert engine.handles[-1].cancelled  # the generation was stopped, not run to its end
    assert b"[DONE]" not in get(client, "abandoned").data
    assert status["total_bytes"] < len(post(client, "whole").data)


def test_a_generation_with_a_reader_is_not_stopped(engine):
    engine.delay = 0.02
    client = make_client(engine, stream_unread_timeout=0.3)
    body = post(client, "read").data  # read to its end, however long that takes
    assert body.endswith(b"data: [DONE]\n\n") and not engine.handles[-1].cancelled
