"""Request fields that size native work, end to end: the real gunicorn worker and the real
model, under an address-space limit (RLIMIT_AS, as a container's memory limit), given each such
field at a hostile value on every API that takes it. Before the bound, Ollama's
``repeat_last_n`` of 2^31-1 made llama.cpp allocate an 8 GiB ring per choice: ``std::bad_alloc``,
``abort()``, the worker dead (three times, and the crash guard halted the server). Each request
must be served (or refused in its API's shape), the worker must be the same process afterwards,
and the fields must keep their meaning (a top_k past 32 bits is no top_k, not top_k 1)."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from tests.support.server import VERTEX_PREDICT, ServerProcess, free_port

LIMIT = 4 << 30  # the worker peaks near 1.2 GB of address space here; the ring asked 8 GiB
CTX = 1024
HI = [{"role": "user", "content": "hi"}]
GEMINI = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
BIG = 2**31 - 1


@pytest.fixture(scope="module")
def srv(default_model):
    port = free_port()
    s = ServerProcess({"PARALLEL": "2", "SLOTS_PER_REQUEST": "2", "CTX_SIZE": str(CTX),
                       "AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(port),
                       "AIP_PREDICT_ROUTE": VERTEX_PREDICT},
                      args=[str(LIMIT)], module="tests.support.rlimited")
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def worker_pid(srv: ServerProcess) -> int:
    children = Path(f"/proc/{srv.proc.pid}/task/{srv.proc.pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def ollama(srv: ServerProcess, options: dict, path: str = "/api/generate") -> requests.Response:
    body = {"model": "x", "stream": False, "options": {"num_predict": 4, **options}}
    body.update({"prompt": "Say hi"} if path == "/api/generate" else {"messages": HI})
    return requests.post(srv.url(path), json=body, timeout=120)


# (path, body): each served, whatever its sizing fields ask for
HOSTILE = [
    ("/api/generate", {"model": "x", "prompt": "hi", "stream": False,
                       "options": {"repeat_penalty": 1.1, "repeat_last_n": BIG, "num_predict": 2}}),
    ("/api/chat", {"model": "x", "messages": HI, "stream": False,
                   "options": {"repeat_penalty": 1.1, "repeat_last_n": 2**32 + BIG,
                               "num_predict": 2}}),
    ("/api/chat", {"model": "x", "messages": HI, "stream": False,
                   "options": {"repeat_penalty": 1.1, "repeat_last_n": 1e300, "num_predict": 2}}),
    ("/api/generate", {"model": "x", "prompt": "hi", "stream": False,
                       "options": {"top_k": 2**32 + 1, "seed": 1e30, "num_predict": 2}}),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 2, "top_k": BIG, "n": 2,
                              "repeat_penalty": 1.1, "frequency_penalty": 1}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "top_k": BIG, "logprobs": 20}),
    ("/v1/messages", {"model": "x", "max_tokens": 2, "messages": HI, "top_k": BIG}),
    ("/v1beta/models/x:generateContent",
     {**GEMINI, "generationConfig": {"topK": 2**40, "seed": 2**80, "maxOutputTokens": 2,
                                     "presencePenalty": 2}}),
    (VERTEX_PREDICT, {"instances": [
        {"model": "x", "messages": HI, "stream": False,
         "options": {"repeat_penalty": 1.1, "repeat_last_n": BIG, "num_predict": 2}}]}),
]


def test_hostile_sizes_leave_the_worker_standing(srv):
    pid = worker_pid(srv)
    for path, body in HOSTILE:
        resp = requests.post(srv.url(path), json=body, timeout=120)
        assert resp.status_code == 200, (path, resp.text[:300])
    bad = requests.post(srv.url("/api/generate"), json={
        "model": "x", "prompt": "hi", "options": {"repeat_last_n": -2}}, timeout=30)
    assert bad.status_code == 400 and "options.repeat_last_n" in bad.json()["error"]
    assert worker_pid(srv) == pid  # the same worker: none died and was replaced
    normal = requests.post(srv.url("/v1/chat/completions"), json={"messages": HI, "max_tokens": 4},
                           timeout=60)
    assert normal.status_code == 200 and normal.json()["choices"][0]["message"]["content"]


def test_a_top_k_past_32_bits_keeps_every_token(srv):
    """2^32+1 is no truncation at all (more than the vocabulary), as top_k 0 is: the same seeded
    reply, not the greedy one ctypes' 32-bit cut (top_k 1) used to give."""
    sampled = {"temperature": 1.5, "seed": 7, "num_predict": 16}
    off = ollama(srv, {**sampled, "top_k": 0})
    past = ollama(srv, {**sampled, "top_k": 2**32 + 1})
    assert off.status_code == past.status_code == 200
    assert past.json()["response"] == off.json()["response"]


def test_repeat_last_n_minus_one_is_the_whole_context(srv):
    """Ollama's -1 is the context (llama.cpp's sampler alone would read it as off)."""
    strong = {"temperature": 0, "repeat_penalty": 3.0, "num_predict": 24}
    prompt = {"messages": [{"role": "user", "content": "Repeat after me: la la la la la la"}]}
    replies = []
    for last_n in (-1, CTX, 0):
        body = {"model": "x", "stream": False, **prompt, "options": {**strong,
                                                                     "repeat_last_n": last_n}}
        resp = requests.post(srv.url("/api/chat"), json=body, timeout=60)
        assert resp.status_code == 200, resp.text
        replies.append(resp.json()["message"]["content"])
    whole, context, off = replies
    assert whole == context and whole != off
