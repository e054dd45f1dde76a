"""Thoughts (<think>...</think>) split from the answer, streamed and not."""

from __future__ import annotations

import json

import pytest
import requests

from app.engine.fake import FakeEngine
from app.formats.think import split, split_thought
from tests.conftest import make_client, running_server

REPLY = "<think>\nI should add 3 and 4.</think>\nThe answer is <b>7</b>."


def test_split_at_every_cut_is_a_prefix_of_the_whole():
    whole = split(REPLY)
    assert whole == ("\nI should add 3 and 4.", "\nThe answer is <b>7</b>.")
    for cut in range(len(REPLY) + 1):
        t = split_thought(REPLY[:cut])
        assert whole[0].startswith(t.reasoning or "") and whole[1].startswith(t.rest or "")
        assert "<think" not in (t.rest or "") and "</think" not in (t.reasoning or "")


def test_template_opened_thought_and_no_thought():
    assert split("still thinking</think>done", in_thought=True) == ("still thinking", "done")
    assert split("no tags <here") == (None, "no tags <here")
    assert split("  <think>unclosed") == ("unclosed", "")


def chat(client, **kw):
    return client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "3+4?"}], **kw})


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_parsed_thoughts_in_the_configured_field(field):
    client = make_client(FakeEngine(reply=REPLY), reasoning_format="parsed", reasoning_field=field)
    msg = chat(client).get_json()["choices"][0]["message"]
    assert msg[field].strip() == "I should add 3 and 4." and "<think>" not in msg["content"]
    text = chat(client, stream=True).get_data(as_text=True)
    deltas = [json.loads(b[6:])["choices"][0]["delta"] for b in text.split("\n\n") if b.startswith("data: {")]
    assert "".join(d.get(field) or "" for d in deltas) == msg[field]
    assert "".join(d.get("content") or "" for d in deltas) == msg["content"]
    assert text.endswith("data: [DONE]\n\n")


def test_inline_keeps_thoughts_in_the_content():
    client = make_client(FakeEngine(reply=REPLY), reasoning_format="inline")
    msg = chat(client).get_json()["choices"][0]["message"]
    assert msg["content"].startswith("<think>") and "reasoning_content" not in msg


@pytest.mark.e2e
def test_grammar_forced_thought_on_the_real_model(default_model):
    grammar = 'root ::= "<think>" [a-z ]{5,40} "</think>" [A-Za-z ]{3,30}'
    with running_server({"PARALLEL": "2", "REASONING_FORMAT": "parsed"}) as srv:
        body = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 60, "temperature": 0,
                "grammar": grammar}
        msg = requests.post(srv.url("/v1/chat/completions"), json=body, timeout=120).json()["choices"][0]["message"]
        assert msg["reasoning_content"] and "<think>" not in msg["content"] and msg["content"]
        r = requests.post(srv.url("/v1/chat/completions"), json={**body, "stream": True}, stream=True, timeout=120)
        deltas = [json.loads(ln[6:])["choices"][0]["delta"] for ln in r.iter_lines() if ln.startswith(b"data: {")]
        assert "".join(d.get("reasoning_content") or "" for d in deltas) == msg["reasoning_content"]
        assert "".join(d.get("content") or "" for d in deltas) == msg["content"]
        bad = requests.post(srv.url("/v1/chat/completions"), json={**body, "grammar": "root ::= ("}, timeout=30)
        assert bad.status_code == 400


THINKING_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
)


def stream_deltas(resp):
    for line in resp.iter_lines():
        if line.startswith(b"data: {"):
            obj = json.loads(line[6:])
            if obj["choices"]:
                yield obj["id"], obj["choices"][0]["delta"]


def test_control_endpoint_validation(client):
    assert client.post("/v1/chat/completions/control", json={"id": "chatcmpl-nope", "action": "reasoning_end"}).get_json() == {"success": False}
    r = client.post("/v1/chat/completions/control", json={"id": "x", "action": "explode"})
    assert r.status_code == 400 and r.get_json()["error"]["param"] == "action"


@pytest.mark.e2e
def test_budget_and_control_end_a_template_opened_thought(default_model):
    env = {"PARALLEL": "2", "CHAT_TEMPLATE": THINKING_TEMPLATE, "STREAM_HEARTBEAT_SECONDS": "0"}
    with running_server(env) as srv:
        ask = {"messages": [{"role": "user", "content": "Tell me about the sea."}], "temperature": 0}
        # without help the small model never closes the thought: all of it is reasoning
        plain = requests.post(srv.url("/v1/chat/completions"), json={**ask, "max_tokens": 20}, timeout=120).json()
        assert plain["choices"][0]["message"]["reasoning_content"] and not plain["choices"][0]["message"]["content"]
        # a budget of 8 thinking tokens ends it: the rest is the answer
        # (ignore_eos here and below: the answer after a closed thought is never empty by the
        # model's choice, which depends on where the thought was cut)
        msg = requests.post(srv.url("/v1/chat/completions"),
                            json={**ask, "max_tokens": 30, "reasoning_budget": 8, "ignore_eos": True},
                            timeout=120).json()["choices"][0]["message"]
        assert msg["reasoning_content"] and msg["content"]
        # reasoning control: end the thought mid-stream from another request
        body = {**ask, "max_tokens": 60, "stream": True, "reasoning_control": True, "ignore_eos": True}
        with requests.post(srv.url("/v1/chat/completions"), json=body, stream=True, timeout=120) as r:
            it = stream_deltas(r)
            kinds = []
            rid, delta = next(it)
            while not delta.get("reasoning_content"):
                rid, delta = next(it)
            ok = requests.post(srv.url("/v1/chat/completions/control"),
                               json={"id": rid, "action": "reasoning_end"}, timeout=10).json()
            assert ok == {"success": True}
            for _, d in it:
                kinds.append("content" if d.get("content") else "reasoning" if d.get("reasoning_content") else "")
        assert "content" in kinds
        assert "reasoning" not in kinds[kinds.index("content"):]
        again = requests.post(srv.url("/v1/chat/completions/control"), json={"id": rid, "action": "reasoning_end"}, timeout=10)
        assert again.json() == {"success": False}  # finished
