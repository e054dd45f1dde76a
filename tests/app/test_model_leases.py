"""How long a request holds its model (app.core.models): the lease is released exactly once,
after the model's last use, whether a whole answer was rendered, a stream ended, its client hung
up, an error came before the first byte, or a resumable stream's producer ended or was stopped;
embeddings and rerank hold it for their call; Ollama's keep_alive reaches the lease; the
single-model server's OneModel. Over the fake Models of tests/support/models.py."""

from __future__ import annotations

import math

import gevent
import pytest

from app import plan_options
from app.core.models import ModelLease, OneModel
from app.core.service import Service
from app.engine.fake import FakeEngine
from app.settings import Settings
from tests.support.models import HI, B, two_models
from tests.support.server import wait_for

RERANK = {"model": B, "query": "q", "documents": ["a", "b"]}


@pytest.fixture
def setup():
    return two_models()


# ---- how long a request holds its model ---------------------------------------------------------

def test_a_whole_answer_releases_once_after_it_is_rendered(setup):
    client, models, engs = setup
    for _ in range(3):
        assert client.post("/v1/chat/completions", json={"model": B, "messages": HI}
                           ).status_code == 200
    assert models.opened == 3 and models.settled()


def test_a_stream_holds_its_model_until_its_last_byte():
    client, models, engs = two_models()
    engs[B].hold_after = 1
    resp = client.post("/v1/chat/completions", json={"model": B, "messages": HI, "stream": True},
                       buffered=False)
    frames = iter(resp.response)
    got = b""
    while b"beta" not in got:
        got += next(frames)
    assert models.live[B] == 1  # mid-stream: held
    engs[B].resume.set()
    got += b"".join(frames)
    assert got.endswith(b"data: [DONE]\n\n")
    assert models.settled()  # at the end of the frames, before the server closes them
    resp.close()
    assert models.released == 1


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"model": B, "messages": HI, "stream": True}),
    ("/v1/messages", {"model": B, "max_tokens": 50, "messages": HI, "stream": True}),
    ("/api/generate", {"model": B, "prompt": "hi"}),
])
def test_a_client_hanging_up_mid_stream_releases_once(path, body):
    client, models, engs = two_models()
    engs[B].hold_after = 1
    resp = client.post(path, json=body, buffered=False)
    frames = iter(resp.response)
    got = b""
    while b"beta" not in got:
        got += next(frames)
    assert models.live[B] == 1
    resp.close()  # the client hangs up
    assert engs[B].handles[0].cancelled  # the run is cancelled before its model is let go
    assert models.settled() and models.released == 1
    engs[B].resume.set()


def test_a_stream_never_read_releases_when_closed():
    client, models, _ = two_models()
    resp = client.post("/v1/chat/completions", json={"model": B, "messages": HI, "stream": True},
                       buffered=False)
    assert models.live[B] == 1
    resp.close()
    assert models.settled()


@pytest.mark.parametrize("stream", [False, True])
def test_an_error_before_the_first_byte_releases_once(setup, stream):
    client, models, engs = setup
    failing = {"model": B, "messages": [{"role": "user", "content": "FAIL_BEFORE"}],
               "stream": stream}
    assert client.post("/v1/chat/completions", json=failing).status_code == 500
    bad = {"model": B, "messages": HI, "temperature": "hot", "stream": stream}
    assert client.post("/v1/chat/completions", json=bad).status_code == 400  # in parsing
    engs[B].state.set("loading")
    resp = client.post("/v1/chat/completions", json={"model": B, "messages": HI,
                                                     "stream": stream})
    assert resp.status_code == 503  # in planning: the model not ready
    assert models.opened == 3 and models.settled()


def test_a_resumable_stream_holds_its_model_until_its_producer_ends():
    client, models, engs = two_models()
    engs[B].hold_after = 1
    resp = client.post("/v1/chat/completions", json={"model": B, "messages": HI, "stream": True},
                       headers={"X-Conversation-Id": "conv-b"}, buffered=False)
    first = next(iter(resp.response))
    assert first
    resp.close()  # this reader goes; the generation goes on for the next one
    assert models.live[B] == 1 and not engs[B].handles[0].cancelled
    engs[B].resume.set()
    wait_for(lambda: models.settled(), 10, "the producer's release", nap=gevent.sleep)
    assert models.released == 1
    replay = client.get("/v1/stream?conv_id=conv-b").get_data()
    assert replay.endswith(b"data: [DONE]\n\n") and b"beta" in replay


def test_a_stopped_resumable_stream_releases_once():
    client, models, engs = two_models()
    engs[B].hold_after = 1
    resp = client.post("/v1/chat/completions", json={"model": B, "messages": HI, "stream": True},
                       headers={"X-Conversation-Id": "conv-stop"}, buffered=False)
    next(iter(resp.response))
    resp.close()
    assert models.live[B] == 1
    assert client.delete("/v1/stream?conv_id=conv-stop").status_code == 204
    wait_for(lambda: models.settled(), 10, "the stopped producer's release", nap=gevent.sleep)
    assert models.released == 1 and engs[B].handles[0].cancelled
    engs[B].resume.set()


def test_embeddings_and_rerank_hold_their_model_for_the_call():
    client, models, engs = two_models()
    engs[B].embedder.hold = True  # type: ignore[attr-defined]
    job = gevent.spawn(client.post, "/v1/embeddings", json={"model": B, "input": "x"})
    wait_for(lambda: engs[B].embedder.requests, 10, "the embedding", nap=gevent.sleep)  # type: ignore[attr-defined]
    assert models.live[B] == 1
    engs[B].embedder.hold = False  # type: ignore[attr-defined]
    assert job.get(timeout=10).status_code == 200
    assert models.settled()
    client, models, engs = two_models(rerank=True)
    assert client.post("/v1/rerank", json=RERANK).status_code == 200
    bad = client.post("/v1/rerank", json={"model": B, "query": "q", "documents": []})
    assert bad.status_code == 400 and models.opened == 2 and models.settled()


# ---- Ollama's keep_alive ----------------------------------------------------------------------

@pytest.mark.parametrize(("value", "seconds"), [
    ("5m", 300.0), ("1h30m", 5400.0), ("0", 0.0), (0, 0.0), (30, 30.0), (2.5, 2.5),
    ("-1", math.inf), (-1, math.inf), ("-5m", math.inf), ("300", 300.0), ("", None),
])
def test_ollama_keep_alive_reaches_the_lease(setup, value, seconds):
    client, models, _ = setup
    for path, body in (("/api/chat", {"messages": HI}), ("/api/generate", {"prompt": "hi"}),
                       ("/api/embed", {"input": "x"})):
        resp = client.post(path, json={"model": B, "stream": False, "keep_alive": value, **body}
                           if path != "/api/embed" else {"model": B, "keep_alive": value,
                                                         **body})
        assert resp.status_code == 200, resp.json
    assert models.asked == [(B, seconds)] * 3


@pytest.mark.parametrize("value", ["abc", "1d", "5 m"])
def test_a_bad_ollama_keep_alive_is_a_400_in_ollama_shape(setup, value):
    client, models, _ = setup
    resp = client.post("/api/chat", json={"model": B, "messages": HI, "keep_alive": value})
    assert resp.status_code == 400 and isinstance(resp.json["error"], str)
    assert "keep_alive" in resp.json["error"]
    assert models.opened == 0


def test_other_apis_pass_no_keep_alive(setup):
    client, models, _ = setup
    client.post("/v1/chat/completions", json={"model": B, "messages": HI})
    assert models.asked == [(B, None)]


# ---- the single-model server ------------------------------------------------------------------

def test_one_model_leases_its_service_for_any_name():
    svc = Service(FakeEngine(), plan_options(Settings()), prepare_timeout=5)
    one = OneModel(svc)
    assert one.default_service is svc
    for name in (None, "fake-model", "anything", ""):
        with one.lease(name, keep_alive=0) as lease:
            assert lease.service is svc
        assert lease.released


def test_a_lease_lets_go_once():
    calls: list[int] = []
    lease = ModelLease(Service(FakeEngine(), plan_options(Settings()), prepare_timeout=5),
                       lambda: calls.append(1))
    with lease:
        pass
    lease.release()
    lease.release()
    assert calls == [1]
