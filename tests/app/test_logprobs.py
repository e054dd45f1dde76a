"""Log probabilities through the app over the fake engine (its scripted scores: app/engine/fake.py,
``fake_score``): the request fields and their 400s, what reaches the engine, the shapes on Chat
Completions, Completions and Responses, streamed and whole (and equal), n choices, the Vertex
predict forms, openai-python reading them, and large answers encoded off the hub. The real
model's values are checked in tests/e2e/test_logprobs.py."""

from __future__ import annotations

import json

import pytest

from app.api import base
from app.engine.fake import FakeEngine
from tests.support.app import make_client, sdk

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
WORDS = ["Hello ", "from ", "the "]  # the fake engine's first words


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def client(engine):
    return make_client(engine)


def post(client, path: str, body: dict, status: int = 200) -> dict:
    resp = client.post(path, json=body)
    assert resp.status_code == status, resp.get_data(as_text=True)
    return resp.get_json()


def events(client, path: str, body: dict) -> list[dict]:
    resp = client.post(path, json={**body, "stream": True})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    out = []
    for line in resp.get_data(as_text=True).splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


# ---- requests ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {**CHAT, "logprobs": 2}, "logprobs"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "logprobs": True}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "n_predict": 0, "logprobs": 1}, "n_predict"),
    ("/v1/completions", {"prompt": [1, 999], "echo": True}, "prompt"),
    ("/v1/responses", {"input": "x", "top_logprobs": 21}, "top_logprobs"),
])
def test_bad_requests_name_the_field(client, path, body, param):
    err = post(client, path, body, 400)["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"


def test_what_reaches_the_engine(client, engine):
    post(client, "/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 4})
    post(client, "/v1/chat/completions", {**CHAT, "logprobs": False})
    post(client, "/v1/completions", {"prompt": "a b", "logprobs": 3})
    post(client, "/v1/completions", {"prompt": "a b", "logprobs": 0, "echo": True, "max_tokens": 0})
    post(client, "/v1/completions", {"prompt": "a b", "echo": True})
    post(client, "/v1/responses", {"input": "x", "include": ["message.output_text.logprobs"]})
    post(client, "/v1/responses", {"input": "x", "top_logprobs": 5})
    post(client, "/v1/messages", {"model": "m", "max_tokens": 3,
                                   "messages": [{"role": "user", "content": "x"}]})
    got = [(r.params.logprobs, r.params.prompt_logprobs, r.params.max_tokens)
           for r in engine.requests]
    assert got == [(4, None, 3), (None, None, 3), (3, None, None), (0, 0, 0),
                   (None, None, None), (0, None, None), (5, None, None), (None, None, 3)]


# ---- chat --------------------------------------------------------------------------------------


def test_chat_logprobs_whole_and_streamed(client):
    body = {**CHAT, "logprobs": True, "top_logprobs": 2}
    whole = post(client, "/v1/chat/completions", body)["choices"][0]
    content = whole["logprobs"]["content"]
    assert whole["logprobs"]["refusal"] is None
    assert [e["token"] for e in content] == WORDS
    assert [e["logprob"] for e in content] == [-0.25, -0.5, -0.75]
    assert [e["bytes"] for e in content] == [list(w.encode()) for w in WORDS]
    # at odd positions the fake's runner-up is likelier than the token taken
    assert [t["token"] for t in content[1]["top_logprobs"]] == ["<unk>", "from "]
    assert all(len(e["top_logprobs"]) == 2 for e in content)
    chunks = [c["choices"][0] for c in events(client, "/v1/chat/completions", body)
              if c["choices"]]
    streamed = [e for c in chunks if c["logprobs"] for e in c["logprobs"]["content"]]
    assert streamed == content
    for c in chunks:  # every chunk with text carries its token's entry; the role chunk none
        if c["delta"].get("content"):
            assert [e["token"] for e in c["logprobs"]["content"]] == [c["delta"]["content"]]
    assert chunks[0]["logprobs"] is None
    plain = post(client, "/v1/chat/completions", CHAT)["choices"][0]
    assert plain["logprobs"] is None


def test_chat_end_token_rides_on_the_finish_chunk(client, engine):
    engine.reply = "Hi there"
    body = {**CHAT, "max_tokens": 9, "logprobs": True}
    whole = post(client, "/v1/chat/completions", body)["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in whole] == ["Hi ", "there", "</s>"]
    last = events(client, "/v1/chat/completions", body)[-1]["choices"][0]
    assert last["finish_reason"] == "stop"
    assert [e["token"] for e in last["logprobs"]["content"]] == ["</s>"]


def test_chat_n_choices_each_have_their_own(client):
    got = post(client, "/v1/chat/completions", {**CHAT, "n": 2, "logprobs": True})["choices"]
    assert [e["token"] for e in got[0]["logprobs"]["content"]] == WORDS
    assert [e["token"] for e in got[1]["logprobs"]["content"]] == ["Hello ", "Hello ", "from "]


def test_token_ids_instead_of_text(client):
    body = {**CHAT, "logprobs": True, "top_logprobs": 1, "return_tokens_as_token_ids": True}
    content = post(client, "/v1/chat/completions", body)["choices"][0]["logprobs"]["content"]
    assert content[0]["token"] == f"token_id:{3 + ord('H')}"
    assert content[1]["top_logprobs"][0]["token"] == "token_id:0"
    comp = post(client, "/v1/completions", {"prompt": "x", "max_tokens": 1, "logprobs": 0,
                                            "return_tokens_as_token_ids": True})
    assert comp["choices"][0]["logprobs"]["tokens"] == [f"token_id:{3 + ord('H')}"]


# ---- completions -------------------------------------------------------------------------------


def test_completion_legacy_object(client):
    got = post(client, "/v1/completions", {"prompt": "Say", "max_tokens": 3, "logprobs": 1})
    lp = got["choices"][0]["logprobs"]
    assert lp["tokens"] == WORDS and lp["token_logprobs"] == [-0.25, -0.5, -0.75]
    # the top 1, and the token itself when it is not the top
    assert lp["top_logprobs"] == [{"Hello ": -0.25}, {"<unk>": -0.125, "from ": -0.5},
                                  {"the ": -0.75}]
    assert lp["text_offset"] == [0, 6, 11]
    assert got["choices"][0]["text"] == "".join(WORDS)


def test_echo_scores_the_prompt_first(client):
    body = {"prompt": "Say it twice", "max_tokens": 2, "logprobs": 0, "echo": True}
    choice = post(client, "/v1/completions", body)["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"] == "Say it twice" + "Hello from "
    assert lp["tokens"] == ["Say ", "it ", "twice", "Hello ", "from "]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["text_offset"] == [0, 4, 7, 12, 18]
    for token, offset in zip(lp["tokens"], lp["text_offset"], strict=True):
        assert choice["text"][offset:].startswith(token)
    # streamed: the echo waits for the prompt's scores, then the same entries follow
    chunks = [c["choices"][0] for c in events(client, "/v1/completions", body) if c["choices"]]
    assert chunks[0]["text"] == "Say it twice"
    merged = {k: [v for c in chunks if c["logprobs"] for v in c["logprobs"][k]] for k in lp}
    assert merged == lp
    assert "".join(c["text"] for c in chunks) == choice["text"]


def test_echo_alone_and_of_token_prompts(client):
    ids = [3 + b for b in b"Hi!"]
    zero = post(client, "/v1/completions", {"prompt": ids, "max_tokens": 0, "echo": True,
                                            "logprobs": 0})
    choice = zero["choices"][0]
    assert choice["text"] == "Hi!" and choice["finish_reason"] == "length"
    assert zero["usage"]["completion_tokens"] == 0
    assert choice["logprobs"]["tokens"] == ["H", "i", "!"]
    assert choice["logprobs"]["text_offset"] == [0, 1, 2]
    # echo without logprobs: a token prompt echoes as its text too, streamed and not
    plain = post(client, "/v1/completions", {"prompt": ids, "max_tokens": 1, "echo": True})
    assert plain["choices"][0]["text"] == "Hi!Hello "
    assert plain["choices"][0]["logprobs"] is None
    first = events(client, "/v1/completions", {"prompt": ids, "max_tokens": 1, "echo": True})
    assert first[0]["choices"][0]["text"] == "Hi!"
    # control tokens are spelled out
    special = post(client, "/v1/completions", {"prompt": [1, *ids], "max_tokens": 0,
                                               "echo": True})
    assert special["choices"][0]["text"] == "<s>Hi!"


def test_echo_on_every_choice(client):
    got = post(client, "/v1/completions", {"prompt": "A B", "max_tokens": 1, "n": 2,
                                           "logprobs": 0, "echo": True})["choices"]
    assert [c["logprobs"]["tokens"] for c in got] == [["A ", "B", "Hello "]] * 2
    chunks = events(client, "/v1/completions", {"prompt": "A B", "max_tokens": 1, "n": 2,
                                                "logprobs": 0, "echo": True})
    echoed = [c["choices"][0]["index"] for c in chunks
              if c["choices"] and c["choices"][0]["text"] == "A B"]
    assert sorted(echoed) == [0, 1]


def test_the_sdk_reads_them(client):
    api = sdk(client)
    comp = api.completions.create(model="m", prompt="Say it", max_tokens=2, logprobs=1,
                                  echo=True)
    lp = comp.choices[0].logprobs
    assert lp.tokens[:2] == ["Say ", "it"] and lp.token_logprobs[0] is None
    assert lp.top_logprobs[2] == {"Hello ": -0.25}
    chat = api.chat.completions.create(model="m", messages=CHAT["messages"], max_tokens=2,
                                       logprobs=True, top_logprobs=1)
    assert [e.token for e in chat.choices[0].logprobs.content] == WORDS[:2]
    tokens = []
    with api.chat.completions.create(model="m", messages=CHAT["messages"], max_tokens=2,
                                     logprobs=True, stream=True) as stream:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].logprobs:
                tokens += [e.token for e in chunk.choices[0].logprobs.content]
    assert tokens == WORDS[:2]


# ---- responses ---------------------------------------------------------------------------------


def test_responses_output_text_logprobs(client):
    body = {"input": "Hi", "max_output_tokens": 3, "top_logprobs": 2,
            "include": ["message.output_text.logprobs"]}
    resp = post(client, "/v1/responses", body)
    part = resp["output"][0]["content"][0]
    assert [e["token"] for e in part["logprobs"]] == WORDS
    assert all(len(e["top_logprobs"]) == 2 for e in part["logprobs"])
    assert resp["top_logprobs"] == 2
    streamed = events(client, "/v1/responses", body)
    deltas = [ev for ev in streamed if ev["type"] == "response.output_text.delta"]
    assert [[e["token"] for e in ev["logprobs"]] for ev in deltas] == [[w] for w in WORDS]
    done = next(ev for ev in streamed if ev["type"] == "response.output_text.done")
    assert done["logprobs"] == part["logprobs"]
    assert streamed[-1]["response"]["output"][0]["content"][0]["logprobs"] == part["logprobs"]
    plain = post(client, "/v1/responses", {"input": "Hi", "max_output_tokens": 3})
    assert plain["output"][0]["content"][0]["logprobs"] == []


# ---- Vertex ------------------------------------------------------------------------------------


def test_vertex_forms_pass_them_through(client):
    env = post(client, "/predict", {"instances": [
        {"@requestFormat": "completions", "prompt": "A B", "max_tokens": 1, "logprobs": 0,
         "echo": True},
        {"@requestFormat": "chat", **CHAT, "logprobs": True},
    ]})["predictions"]
    assert env[0]["choices"][0]["logprobs"]["tokens"] == ["A ", "B", "Hello "]
    assert [e["token"] for e in env[1]["choices"][0]["logprobs"]["content"]] == WORDS
    raw = post(client, "/predict", {**CHAT, "logprobs": True})
    assert [e["token"] for e in raw["choices"][0]["logprobs"]["content"]] == WORDS


def test_answers_with_logprobs_are_encoded_off_the_hub(client, monkeypatch):
    encoded: list[dict] = []
    real = base.json_off_hub

    def spy(body):
        encoded.append(body)
        return real(body)

    monkeypatch.setattr(base, "json_off_hub", spy)
    post(client, "/v1/chat/completions", CHAT)
    assert encoded == []
    post(client, "/v1/chat/completions", {**CHAT, "logprobs": True})
    post(client, "/v1/completions", {"prompt": "x", "max_tokens": 1, "logprobs": 0})
    assert [next(iter(b["choices"][0]["logprobs"])) for b in encoded] == ["content", "tokens"]
