"""DETERMINISTIC=on end to end, on the real default model through gunicorn: a greedy request and
a seeded sampled one give the same bytes as when decoded from nothing (``cache_prompt`` off)
when they run after their own cached prompt, beside seven other streams, after another
conversation's shared prefix cut at different places, and after their prompt was kept aside in
host RAM and copied back; each case several rounds over. That the streams really ran together
is read from the streams themselves (the others were still generating when the request ended),
and a copy back from /health's counters."""

from __future__ import annotations

import json

import pytest
import requests

from tests.support.long_prompts import story
from tests.support.server import ServerProcess, running_server

KEY = "key-det-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHUNK = 64
ROUNDS = 3
PROMPT = story(1) + " And then"
GREEDY = {"temperature": 0}
SEEDED = {"temperature": 1.0, "top_k": 40, "seed": 11}


@pytest.fixture(scope="module")
def srv(default_model) -> ServerProcess:
    env = {"DETERMINISTIC": "on", "PARALLEL": "8", "CTX_SIZE": "2048",
           "PREFILL_CHUNK": str(CHUNK), "PROMPT_CACHE_MIN_TOKENS": "64", "API_KEY": KEY}
    with running_server(env) as s:
        yield s


def _complete(srv: ServerProcess, prompt: str, sampling: dict, max_tokens: int = 32,
              cache: bool = True) -> tuple[str, int]:
    r = requests.post(srv.url("/v1/completions"), headers=AUTH, timeout=300,
                      json={"prompt": prompt, "max_tokens": max_tokens, "cache_prompt": cache,
                            **sampling})
    assert r.status_code == 200, r.text
    body = r.json()
    return body["choices"][0]["text"], body["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.fixture(scope="module")
def reference(srv) -> dict[str, str]:
    """Each request's reply decoded from nothing, and that it is not the same for both."""
    ref = {name: _complete(srv, PROMPT, s, cache=False)[0]
           for name, s in (("greedy", GREEDY), ("seeded", SEEDED))}
    assert ref["greedy"] and ref["seeded"] and ref["greedy"] != ref["seeded"]
    return ref


@pytest.mark.parametrize("name,sampling", [("greedy", GREEDY), ("seeded", SEEDED)])
def test_after_its_own_cached_prompt(srv, reference, name, sampling):
    for _ in range(ROUNDS):
        text, cached = _complete(srv, PROMPT, sampling)
        assert cached > 0 and cached % CHUNK == 0  # reused as far as it was cut alike
        assert text == reference[name]


def _stream(srv: ServerProcess, seed: int) -> requests.Response:
    r = requests.post(srv.url("/v1/completions"), headers=AUTH, stream=True, timeout=300,
                      json={"prompt": story(seed, 120), "max_tokens": 72, "temperature": 0,
                            "ignore_eos": True, "stream": True})  # never done before 72
    assert r.status_code == 200
    return r


def _events(r: requests.Response):
    for line in r.iter_lines():
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            yield json.loads(line[6:])


@pytest.mark.parametrize("name,sampling", [("greedy", GREEDY), ("seeded", SEEDED)])
def test_beside_seven_other_streams(srv, reference, name, sampling):
    for k in range(ROUNDS):
        others = [_stream(srv, 100 + 10 * k + i) for i in range(7)]
        events = [_events(r) for r in others]
        for ev in events:  # each other stream is generating
            next(ev)
        text, _ = _complete(srv, PROMPT, sampling, cache=bool(k % 2))
        assert text == reference[name]
        # the others were still generating when it ended: they ran beside it
        still = 0
        for ev in events:
            first = next(ev)
            still += first["choices"][0]["finish_reason"] is None
            for _ in ev:  # drain
                pass
        assert still == 7
        for r in others:
            r.close()


@pytest.mark.parametrize("name,sampling", [("greedy", GREEDY), ("seeded", SEEDED)])
def test_after_another_conversations_prefix_cut_anywhere(srv, reference, name, sampling):
    words = PROMPT.split(" ")
    for cut in (len(words) // 5, len(words) // 2, len(words) - 3):
        _complete(srv, " ".join(words[:cut]) + " but the lantern", GREEDY, max_tokens=4)
        text, cached = _complete(srv, PROMPT, sampling)
        assert cached % CHUNK == 0
        assert text == reference[name]


def _restored(srv: ServerProcess) -> int:
    health = requests.get(srv.url("/health"), headers=AUTH, timeout=30).json()
    return health["engine"]["prompt_cache"]["restored"]


def test_after_a_copy_back_from_the_prompt_cache(srv, reference):
    for k in range(ROUNDS):
        _complete(srv, PROMPT, GREEDY)
        # eight longer conversations, one at a time, take every slot (the one with the least
        # KV last): the prompt's is kept aside
        for i in range(8):
            _complete(srv, story(200 + 10 * k + i, 450), GREEDY, max_tokens=1)
        before = _restored(srv)
        text, cached = _complete(srv, PROMPT, GREEDY)
        assert _restored(srv) == before + 1 and cached > 0
        assert text == reference["greedy"]
