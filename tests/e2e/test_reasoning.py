"""Thoughts (<think>...</think>) on the real model: budgets, control, templates that open a thought."""

from __future__ import annotations

import json

import requests

from tests.support.server import running_server
from tests.support.templates import THINKING_TEMPLATE


def chat(client, **kw):
    return client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "3+4?"}], **kw})


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


def stream_deltas(resp):
    for line in resp.iter_lines():
        if line.startswith(b"data: {"):
            obj = json.loads(line[6:])
            if obj["choices"]:
                yield obj["id"], obj["choices"][0]["delta"]


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
