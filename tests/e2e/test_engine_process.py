"""End to end, the engine in a process of its own (ENGINE_PROCESS=on) with the real default model
through a real gunicorn, beside the same server with the engine in process: the same answers
byte for byte (whole, streamed, n choices, embeddings, tokens), a hang-up freeing its slot in
the engine process, no web stack in that process, health saying stalled while it is stopped
(SIGSTOP), and the engine process killed mid-stream
with SIGKILL and SIGSEGV: the stream ends with its error event, health answers throughout, and
the next request is served by a new engine process."""

from __future__ import annotations

import json
import os
import signal

import pytest
import requests

from app import engine_config
from app.base.state import LoadState
from app.engine.remote import RemoteEngine
from app.settings import Settings
from tests.support.server import running_server, wait_for

ENV = {"PARALLEL": "4", "EMBEDDINGS": "on", "STREAM_HEARTBEAT_SECONDS": "0", "CTX_SIZE": "2048"}
ASKS = ["What is the capital of France?", "Write a haiku about the sea.", "Count to five."]
# what the web process runs on, none of which the engine needs (llama-cpp-python's own package
# brings jinja2 and diskcache: the engine's, not the web stack's)
WEB_STACK = ("flask", "gevent", "greenlet", "werkzeug", "gunicorn", "pydantic",
             "pydantic_settings", "prometheus_client", "google", "redis", "PIL", "httpx",
             "requests")


@pytest.fixture(scope="module")
def proc_srv(default_model):
    with running_server({**ENV, "ENGINE_PROCESS": "on"}) as server:
        yield server


@pytest.fixture(scope="module")
def same_srv(default_model):
    """The same server with the engine in its own web process (ENGINE_PROCESS=off)."""
    with running_server({**ENV, "ENGINE_PROCESS": "off"}) as server:
        yield server


def chat(srv, content: str, **extra) -> requests.Response:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 40,
            "temperature": 0, **extra}
    return requests.post(srv.url("/v1/chat/completions"), json=body, timeout=120,
                         stream=bool(extra.get("stream")))


def deltas(resp: requests.Response) -> list[tuple]:
    """Each chunk's choices as (index, role, content, finish_reason): what a client reads."""
    out = []
    for line in resp.iter_lines(decode_unicode=True):
        if line.startswith("data: ") and line != "data: [DONE]":
            for c in json.loads(line[6:])["choices"]:
                d = c["delta"]
                out.append((c["index"], d.get("role"), d.get("content"), c["finish_reason"]))
    return out


def answer(body: dict) -> tuple:
    return ([(c["message"]["content"], c["finish_reason"]) for c in body["choices"]],
            body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"])


def child_pid(srv) -> int:
    pid = requests.get(srv.url("/props"), timeout=10).json()["engine_process"]
    assert isinstance(pid, int) and not isinstance(pid, bool)
    return pid


def test_answers_equal_the_in_process_servers_byte_for_byte(proc_srv, same_srv):
    for ask in ASKS:
        whole = [answer(chat(s, ask).json()) for s in (proc_srv, same_srv)]
        assert whole[0] == whole[1]
        streamed = [deltas(chat(s, ask, stream=True)) for s in (proc_srv, same_srv)]
        assert streamed[0] == streamed[1] and len(streamed[0]) > 3
        assert "".join(c for _, _, c, _ in streamed[0] if c) == whole[0][0][0][0]


def test_n_choices_share_the_prompt_in_the_engine_process(proc_srv, same_srv):
    single = answer(chat(proc_srv, ASKS[0]).json())[0][0]
    two = chat(proc_srv, ASKS[0], n=2).json()  # SLOTS_PER_REQUEST: half of PARALLEL
    assert answer(two)[0] == [single] * 2
    assert answer(two) == answer(chat(same_srv, ASKS[0], n=2).json())
    indexes = {i for i, _, _, _ in deltas(chat(proc_srv, ASKS[0], n=2, stream=True))}
    assert indexes == {0, 1}


def test_embeddings_and_tokens_equal_the_in_process_servers(proc_srv, same_srv):
    body = {"input": ["a sentence to embed", "another one"]}
    vecs = [[d["embedding"] for d in requests.post(s.url("/v1/embeddings"), json=body,
                                                      timeout=60).json()["data"]]
            for s in (proc_srv, same_srv)]
    assert vecs[0] == vecs[1] and len(vecs[0][0]) == 576
    text = {"content": "Hello, world! Grüße 世界 🙂", "with_pieces": True}
    toks = [requests.post(s.url("/tokenize"), json=text, timeout=10).json()
            for s in (proc_srv, same_srv)]
    assert toks[0] == toks[1]
    ids = [t["id"] for t in toks[0]["tokens"]]
    back = requests.post(proc_srv.url("/detokenize"), json={"tokens": ids}, timeout=10).json()
    assert back["content"] == text["content"]
    assert requests.get(same_srv.url("/props"), timeout=10).json()["engine_process"] is False
    assert child_pid(proc_srv) not in (proc_srv.proc.pid, os.getpid())
    rows = requests.get(proc_srv.url("/slots"), timeout=10).json()
    assert len(rows) == 4 and {r["n_ctx"] for r in rows} == {2048}


def test_a_hang_up_frees_the_slot_in_the_engine_process(proc_srv):
    resp = chat(proc_srv, ASKS[1], stream=True, max_tokens=1500, ignore_eos=True)
    lines = resp.iter_lines(decode_unicode=True)
    seen = [line for _, line in zip(range(6), lines, strict=False)]
    assert any(line.startswith("data: {") for line in seen)
    busy = [r for r in requests.get(proc_srv.url("/slots"), timeout=10).json()
            if r["is_processing"]]
    assert busy  # still generating when the client leaves
    resp.close()
    wait_for(lambda: not any(r["is_processing"] for r in requests.get(
        proc_srv.url("/slots"), timeout=10).json()), 30, "the slot freed")


def test_the_engine_process_loads_no_web_stack(default_model):
    """A real engine process, started from this (non-gevent) process: what it imported."""
    settings = Settings(model=str(default_model), parallel=1, ctx_size=512, threads=2)
    engine = RemoteEngine(engine_config(settings), LoadState(), lambda state: str(default_model))
    engine.start()
    try:
        wait_for(lambda: engine.state.stage in ("ready", "failed"), 120, "the model loaded")
        assert engine.state.ready, engine.state.error
        modules = engine._call("modules")
    finally:
        engine.shutdown()
    assert "llama_cpp" in modules and "numpy" in modules and "app.engine.llama_engine" in modules
    assert [m for m in modules if m.split(".")[0] in WEB_STACK] == []
    assert not any(m.startswith(("app.api", "app.edge", "app.core", "app.base.bridge"))
                   for m in modules)


def test_an_engine_process_that_stops_answering_makes_health_say_stalled(proc_srv):
    """A stuck engine process (stopped with SIGSTOP here) cannot stall the web process: health
    answers 503 stalled, naming it, and 200 once it answers again."""
    pid = child_pid(proc_srv)
    os.kill(pid, signal.SIGSTOP)
    try:
        # a status it answered just before may serve a health check for another 50 ms
        def stalled() -> dict | None:
            health = requests.get(proc_srv.url("/health"), timeout=10)
            return health.json() if health.status_code == 503 else None

        body = wait_for(stalled, 30, "health 503")
        assert body["status"] == "stalled" and "engine process has not answered" in body["reason"]
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: requests.get(proc_srv.url("/health"), timeout=10).status_code == 200, 30,
             "health 200 again")


@pytest.mark.parametrize(("sig", "said"), [(signal.SIGKILL, "was killed (SIGKILL"),
                                           (signal.SIGSEGV, "died from SIGSEGV")])
def test_an_engine_process_killed_mid_stream(proc_srv, sig, said):
    before = child_pid(proc_srv)
    resp = chat(proc_srv, ASKS[1], stream=True, max_tokens=1500, ignore_eos=True)
    lines = resp.iter_lines(decode_unicode=True)
    assert next(line for line in lines if line.startswith("data: {"))  # it is streaming
    os.kill(before, sig)
    rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    error = json.loads(rest[-2][6:])["error"]
    assert error["code"] == "engine_error"
    assert f"engine process {before} {said}" in error["message"]
    assert "after the model was ready, with 1 request in flight" in error["message"]
    health = requests.get(proc_srv.url("/health"), timeout=10)  # the web process answers
    assert health.status_code in (200, 503)
    wait_for(lambda: requests.get(proc_srv.url("/health"), timeout=10).status_code == 200, 120,
             "a new engine process ready")
    again = chat(proc_srv, ASKS[0])
    assert again.status_code == 200 and again.json()["choices"][0]["message"]["content"]
    assert child_pid(proc_srv) != before
    report = requests.get(proc_srv.url("/health"), timeout=10).json()["engine"]["process"]
    assert report["last_death"]["signal"] == sig.name and report["restarts"] >= 1
