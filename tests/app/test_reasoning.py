"""Thoughts (<think>...</think>) split from the answer, streamed and not."""

from __future__ import annotations

import json

import pytest

from app.engine.fake import FakeEngine
from app.formats.think import split, split_thought
from tests.support.app import make_client

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


def test_control_endpoint_validation(client):
    assert client.post("/v1/chat/completions/control", json={"id": "chatcmpl-nope", "action": "reasoning_end"}).get_json() == {"success": False}
    r = client.post("/v1/chat/completions/control", json={"id": "x", "action": "explode"})
    assert r.status_code == 400 and r.get_json()["error"]["param"] == "action"


