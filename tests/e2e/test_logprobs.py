"""End to end with the real default model: log probabilities on Completions (the legacy object,
echo of text and token prompts, max_tokens 0), Chat Completions and Responses, streamed and not,
checked against an independent computation (tests/support/reference.py) on the very tokens the
server reports (vLLM's return_tokens_as_token_ids); the prompt-scoring limit; a long prompt
scored in several steps beside a running stream; and the official SDK parsing them.
The in-process tier (fake engine) is tests/app/test_logprobs.py."""

from __future__ import annotations

import json
import threading

import openai
import pytest
import requests

from tests.support.reference import ids
from tests.support.server import running_server

TOL = 1e-3  # the bound; on this CPU the two computations agree to ~1e-7
PROMPT = "The capital of France is"
LIMIT = 400  # PROMPT_LOGPROBS_MAX_TOKENS of this server: more than one step's scoring rows


@pytest.fixture(scope="module")
def srv(default_model):
    # flash attention off: scores that do not depend on the batch (tests/support/reference.py)
    with running_server({"PARALLEL": "2", "FLASH_ATTN": "off",
                         "PROMPT_LOGPROBS_MAX_TOKENS": str(LIMIT)}) as server:
        yield server


def post(srv, path: str, body: dict, status: int = 200) -> dict:
    resp = requests.post(srv.url(path), json=body, timeout=120)
    assert resp.status_code == status, resp.text
    return resp.json()


def sse(srv, path: str, body: dict) -> list[dict]:
    resp = requests.post(srv.url(path), json={**body, "stream": True}, stream=True, timeout=120)
    assert resp.status_code == 200, resp.text
    out = []
    for line in resp.iter_lines():
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def tokenize(srv, text: str) -> list[int]:
    return post(srv, "/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]


def close(a: float | None, b: float | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and abs(a - b) <= TOL)


def test_completion_with_echo_matches_an_independent_computation(srv, reference):
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "echo": True, "logprobs": 3,
            "return_tokens_as_token_ids": True}
    choice = post(srv, "/v1/completions", body)["choices"][0]
    lp = choice["logprobs"]
    toks = ids(lp["tokens"])
    prompt = tokenize(srv, PROMPT)
    assert toks[: len(prompt)] == prompt and len(toks) == len(prompt) + 8
    rows = reference.rows(toks, len(prompt))
    expected = reference.token_logprobs(toks, len(prompt))
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    for i in range(1, len(toks)):
        assert close(lp["token_logprobs"][i], expected[i]), (i, lp["token_logprobs"][i], expected[i])
        top = lp["top_logprobs"][i]  # the 3 likeliest, and the token itself
        best3 = sorted(range(rows.shape[1]), key=lambda t: -rows[i - 1, t])[:3]
        assert set(ids(list(top))) == set(best3) | {toks[i]}
        for name, value in top.items():
            assert close(value, float(rows[i - 1, ids([name])[0]]))
    for i in range(len(prompt), len(toks)):  # greedy: each generated token is the argmax
        assert toks[i] == int(rows[i - 1].argmax())
    assert choice["finish_reason"] == "length"


def test_text_offsets_point_into_the_echoed_text(srv):
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "echo": True, "logprobs": 0,
            "stop": ["\n\n"]}
    choice = post(srv, "/v1/completions", body)["choices"][0]
    text, lp = choice["text"], choice["logprobs"]
    assert text.startswith(PROMPT)
    spans = zip(lp["tokens"], lp["text_offset"], strict=True)
    for token, offset in spans:
        if offset < len(text):
            assert text[offset:].startswith(token), (token, offset, text)
    assert lp["text_offset"] == sorted(lp["text_offset"])
    # the harness' own rule (lm-eval's gguf model): the first token at or past the context
    first = next(i for i, off in enumerate(lp["text_offset"]) if off >= len(PROMPT))
    assert lp["tokens"][first].strip() and lp["text_offset"][first] == len(PROMPT)


def test_a_token_prompt_scored_alone(srv, reference):
    prompt = tokenize(srv, PROMPT)
    body = {"prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 1}
    got = post(srv, "/v1/completions", body)
    choice = got["choices"][0]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    assert got["usage"]["completion_tokens"] == 0 and got["usage"]["prompt_tokens"] == len(prompt)
    expected = reference.token_logprobs(prompt)
    assert len(choice["logprobs"]["token_logprobs"]) == len(prompt)
    assert all(close(a, b) for a, b in zip(choice["logprobs"]["token_logprobs"], expected,
                                           strict=True))
    # the same prompt as text scores the same
    text = post(srv, "/v1/completions", {**body, "prompt": PROMPT})["choices"][0]["logprobs"]
    assert text["token_logprobs"] == choice["logprobs"]["token_logprobs"]
    assert text["text_offset"] == choice["logprobs"]["text_offset"]
    # max_tokens 0 without echo generates nothing at all: refused
    err = post(srv, "/v1/completions", {"prompt": PROMPT, "max_tokens": 0}, 400)["error"]
    assert err["param"] == "max_tokens" and "echo" in err["message"]


def test_a_long_prompt_is_scored_in_steps_beside_a_stream(srv, reference):
    """A 300-token prompt takes several engine steps to score (a step scores at most 85
    positions of this 49k vocabulary) while a stream runs beside it; both finish whole, and the
    scores are right at every position, a prefix cached by an earlier request included. (Scored
    in the stream's batch, positions past the first chunk came out up to 0.28 off: the scored
    chunk is decoded alone.)"""
    text = " ".join(f"item {i} is {i * 7 % 13}." for i in range(40))
    prompt = tokenize(srv, text)
    assert 280 <= len(prompt) <= LIMIT
    post(srv, "/v1/completions", {"prompt": prompt, "max_tokens": 1})  # caches the prefix
    streamed: list[dict] = []
    runner = threading.Thread(target=lambda: streamed.extend(sse(srv, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Count to fifty."}], "max_tokens": 48,
        "ignore_eos": True})))
    runner.start()
    got = post(srv, "/v1/completions", {"prompt": prompt, "max_tokens": 0, "echo": True,
                                        "logprobs": 0})
    runner.join(120)
    assert not runner.is_alive()
    assert streamed[-1]["choices"][0]["finish_reason"] == "length"
    assert sum(1 for c in streamed if c["choices"] and c["choices"][0]["delta"].get("content")) > 1
    expected = reference.token_logprobs(prompt)
    lps = got["choices"][0]["logprobs"]["token_logprobs"]
    assert len(lps) == len(prompt) and all(close(a, b) for a, b in zip(lps, expected, strict=True))
    assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # computed afresh


def test_prompts_over_the_scoring_limit_are_refused(srv):
    prompt = [28] * (LIMIT + 1)
    err = post(srv, "/v1/completions", {"prompt": prompt, "max_tokens": 0, "echo": True,
                                        "logprobs": 0}, 400)["error"]
    assert err["param"] == "echo" and "PROMPT_LOGPROBS_MAX_TOKENS" in err["message"]
    assert err["type"] == "invalid_request_error"
    # the same prompt without scoring is served
    ok = post(srv, "/v1/completions", {"prompt": prompt, "max_tokens": 1, "echo": True})
    assert ok["choices"][0]["logprobs"] is None


def test_streamed_completion_carries_what_the_answer_has(srv):
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "echo": True, "logprobs": 2}
    whole = post(srv, "/v1/completions", body)["choices"][0]
    chunks = [c["choices"][0] for c in sse(srv, "/v1/completions", body) if c["choices"]]
    assert "".join(c["text"] for c in chunks) == whole["text"]
    merged: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                               "text_offset": []}
    for c in chunks:
        for key in merged:
            merged[key] += (c["logprobs"] or {}).get(key, [])
    assert merged == whole["logprobs"]


def test_chat_logprobs_match_an_independent_computation(srv, reference):
    messages = [{"role": "user", "content": "Name a colour."}]
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, "logprobs": True,
            "top_logprobs": 2, "return_tokens_as_token_ids": True}
    got = post(srv, "/v1/chat/completions", body)
    content = got["choices"][0]["logprobs"]["content"]
    assert len(content) == got["usage"]["completion_tokens"]
    prompt = post(srv, "/tokenize", {"messages": messages})["tokens"]
    toks = prompt + ids([e["token"] for e in content])
    rows = reference.rows(toks, len(prompt))
    for k, entry in enumerate(content):
        i = len(prompt) + k
        assert close(entry["logprob"], float(rows[i - 1, toks[i]]))
        assert [ids([t["token"]])[0] for t in entry["top_logprobs"]] == \
            sorted(range(rows.shape[1]), key=lambda t: -rows[i - 1, t])[:2]
        assert entry["top_logprobs"][0]["logprob"] >= entry["top_logprobs"][1]["logprob"]
    # without ids: the tokens' bytes spell the answer (and the end token after it, if any)
    plain = post(srv, "/v1/chat/completions", {**body, "return_tokens_as_token_ids": False})
    text = plain["choices"][0]["message"]["content"]
    spelled = b"".join(bytes(e["bytes"]) for e in plain["choices"][0]["logprobs"]["content"])
    assert spelled.decode().startswith(text)
    # streamed: the chunks' entries are the answer's
    chunks = sse(srv, "/v1/chat/completions", {**body, "return_tokens_as_token_ids": False})
    streamed = [e for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
                for e in c["choices"][0]["logprobs"]["content"]]
    assert streamed == plain["choices"][0]["logprobs"]["content"]


def test_responses_output_text_logprobs(srv):
    body = {"input": "Name a colour.", "max_output_tokens": 8, "temperature": 0,
            "include": ["message.output_text.logprobs"], "top_logprobs": 1}
    resp = post(srv, "/v1/responses", body)
    part = resp["output"][-1]["content"][0]
    assert len(part["logprobs"]) == resp["usage"]["output_tokens"]
    assert b"".join(bytes(e["bytes"]) for e in part["logprobs"]).decode().startswith(part["text"])
    assert all(len(e["top_logprobs"]) == 1 for e in part["logprobs"])
    resp2 = requests.post(srv.url("/v1/responses"), json={**body, "stream": True}, stream=True,
                          timeout=120)
    events = [json.loads(line[6:]) for line in resp2.iter_lines() if line.startswith(b"data: ")]
    deltas = [e for ev in events if ev["type"] == "response.output_text.delta"
              for e in ev["logprobs"]]
    done = next(ev for ev in events if ev["type"] == "response.output_text.done")
    final = events[-1]["response"]["output"][-1]["content"][0]["logprobs"]
    assert done["logprobs"] == final == part["logprobs"]
    assert deltas == final[: len(deltas)] and len(deltas) >= len(final) - 1  # the end token


def test_the_openai_sdk_reads_them(srv):
    client = openai.OpenAI(base_url=srv.url("/v1"), api_key="none", max_retries=0)
    comp = client.completions.create(model="m", prompt=PROMPT, max_tokens=3, echo=True,
                                     logprobs=2, temperature=0)
    lp = comp.choices[0].logprobs
    assert lp.token_logprobs[0] is None and len(lp.tokens) == len(lp.text_offset)
    assert all(len(t) <= 3 for t in lp.top_logprobs[1:])
    chat = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, logprobs=True,
        top_logprobs=3, temperature=0)
    content = chat.choices[0].logprobs.content
    assert content and all(len(e.top_logprobs) == 3 for e in content)
    assert content[0].token == content[0].top_logprobs[0].token  # greedy took the likeliest
