"""The engine behind a process boundary (app.engine.remote), in process: RemoteEngine talking over
a real socket to app.engine.child's Child serving the fake engine on a thread
(tests/support/fake_child.py). Every route works through it; a hang-up's cancel reaches the
engine; a death mid-stream ends that stream with an error in its API's shape, health answers,
and the next engine process serves; deaths past CRASH_LIMIT stop it for good, with the reason.
The real engine process is tests/e2e/test_engine_process.py."""

from __future__ import annotations

import json

import pytest

from app import create_app, engine_config
from app.settings import Settings
from tests.support.fake_child import remote_fake
from tests.support.server import wait_for

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}


@pytest.fixture
def remote():
    settings = Settings(embeddings="on")
    engine, launcher = remote_fake(engine_config(settings), embeds=True)
    engine.start()
    wait_for(lambda: engine.state.ready, 10, "a ready engine process")
    app = create_app(settings, engine=engine)
    app.testing = True
    yield engine, launcher, app.test_client()
    engine.shutdown(1.0)


def frames(resp) -> list[dict]:
    out = []
    for line in resp.get_data(as_text=True).splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def test_every_kind_of_call_goes_through_the_engine_process(remote):
    engine, launcher, client = remote
    whole = client.post("/v1/chat/completions", json=CHAT).get_json()
    assert whole["choices"][0]["message"]["content"].startswith("Hello from the fake engine")
    streamed = frames(client.post("/v1/chat/completions", json={**CHAT, "stream": True}))
    text = "".join(f["choices"][0]["delta"].get("content") or "" for f in streamed if f["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    two = client.post("/v1/chat/completions", json={**CHAT, "n": 2}).get_json()
    assert [c["index"] for c in two["choices"]] == [0, 1]
    emb = client.post("/v1/embeddings", json={"input": ["a", "b"]}).get_json()
    assert [len(d["embedding"]) for d in emb["data"]] == [16, 16]
    tok = client.post("/tokenize", json={"content": "hi", "with_pieces": True}).get_json()
    assert [t["piece"] for t in tok["tokens"]] == ["h", "i"]
    assert client.post("/detokenize", json={"tokens": [107, 108]}).get_json()["content"] == "hi"
    assert len(client.get("/slots").get_json()) == 8
    assert client.get("/props").get_json()["engine_process"] == launcher.children[0].pid
    health = client.get("/health").get_json()
    assert health["engine"]["process"] == {"pid": launcher.children[0].pid, "restarts": 0}
    assert health["embeddings"]["decodes"] == 1
    # what the engine fails before its first token: an error before the first byte
    resp = client.post("/v1/completions", json={"prompt": "FAIL_BEFORE", "max_tokens": 5})
    assert resp.status_code == 500
    assert resp.get_json()["error"]["message"] == "scripted failure before the first token"


def test_a_hang_up_cancels_the_generation_in_the_engine_process(remote):
    engine, launcher, client = remote
    fake = launcher.engines[-1]
    fake.hold_after = 2
    resp = client.post("/v1/chat/completions", json={**CHAT, "stream": True}, buffered=False)
    body = iter(resp.response)
    assert next(body)
    wait_for(lambda: fake.handles, 10, "the generation in the engine")
    resp.close()  # the client hangs up
    wait_for(lambda: fake.handles[-1].cancelled, 10, "the cancel in the engine process")
    fake.resume.set()


def test_a_death_mid_stream_ends_it_with_an_error_and_the_next_process_serves(remote):
    engine, launcher, client = remote
    launcher.engines[-1].hold_after = 2
    resp = client.post("/v1/chat/completions", json={**CHAT, "stream": True}, buffered=False)
    body = iter(resp.response)
    assert next(body)
    launcher.children[-1].die("SIGSEGV")
    rest = b"".join(body).decode()
    error = json.loads(next(line[6:] for line in rest.splitlines()
                            if line.startswith("data: {\"error\"")))["error"]
    assert error["code"] == "engine_error"
    assert "engine process 4242 died from SIGSEGV after the model was ready" in error["message"]
    assert rest.rstrip().endswith("data: [DONE]")
    assert client.get("/health").status_code in (200, 503)  # it answers, whatever the stage
    wait_for(lambda: engine.state.ready and len(launcher.children) == 2, 10, "a restart")
    again = client.post("/v1/chat/completions", json=CHAT)
    assert again.status_code == 200
    report = client.get("/health").get_json()["engine"]["process"]
    assert report["restarts"] == 1 and report["deaths"] == 1
    assert report["last_death"]["signal"] == "SIGSEGV" and report["last_death"]["in_flight"] == 1


def test_deaths_past_the_crash_limit_leave_it_failed_with_the_reason():
    fatal: list[str] = []
    engine, launcher = remote_fake(engine_config(Settings()), crash_limit=2, on_fatal=fatal.append)
    engine.start()
    try:
        for k in (1, 2):  # deaths with nothing in flight, after ready
            wait_for(lambda k=k: engine.state.ready and len(launcher.children) == k, 10,
                     f"engine process {k}")
            launcher.children[-1].die()
        wait_for(lambda: engine.state.stage == "failed", 10, "the engine failed for good")
        assert "2 engine process deaths with nothing in flight" in engine.state.error
        assert fatal == [engine.state.error] and len(launcher.children) == 2
    finally:
        engine.shutdown(1.0)


def test_a_model_that_cannot_load_is_fatal_as_in_process():
    """A load error (no crash) in the engine process: the state says it, on_fatal is called
    with it (under gunicorn: exit code 4), and no other engine process is started."""
    fatal: list[str] = []
    engine, launcher = remote_fake(engine_config(Settings()), on_fatal=fatal.append,
                                   fail="model /models/x.gguf: file not found")
    engine.start()
    try:
        wait_for(lambda: fatal, 10, "the load error")
        assert engine.state.stage == "failed"
        assert fatal == [engine.state.error] == ["model /models/x.gguf: file not found"]
        assert len(launcher.children) == 1 and launcher.children[0].exit_code == 4
        assert engine._guard.crashes == []  # a load error is no crash
    finally:
        engine.shutdown(1.0)
