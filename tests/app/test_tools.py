"""Tools offered to the model: validation, tool_choice, history, grammars, and real clients.

The reply parsers (every format, cut at every character) are tested in test_replies.py."""

from __future__ import annotations

import pytest

from tests.support.bodies import GOOD_TOOL

CHAT = {"messages": [{"role": "user", "content": "add 1 and 2"}]}


@pytest.mark.parametrize("tool, param", [
    ({"type": "function", "function": {"name": "bad name!"}}, "tools.0.function.name"),
    ({"type": "function", "function": {"name": "trailing\n"}}, "tools.0.function.name"),
    ({"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}, "tools.0.function.parameters"),
    ({"type": "function", "function": {"name": "f", "parameters": [1]}}, "tools.0.function.parameters"),
    ("not a tool", "tools.0"),
])
def test_invalid_tool_is_400_naming_it(client, tool, param):
    resp = client.post("/v1/chat/completions", json={**CHAT, "tools": [tool]})
    assert resp.status_code == 400 and resp.get_json()["error"]["param"] == param


def test_tool_choice_rules(client, fake_engine):
    resp = client.post("/v1/chat/completions", json={**CHAT, "tools": [GOOD_TOOL],
                       "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    assert resp.status_code == 400 and resp.get_json()["error"]["param"] == "tool_choice"
    client.post("/v1/chat/completions", json={**CHAT, "tools": [GOOD_TOOL], "tool_choice": "none"})
    assert fake_engine.requests[-1].params.grammar is None
    client.post("/v1/chat/completions", json={**CHAT, "tools": [GOOD_TOOL], "tool_choice": "required"})
    req = fake_engine.requests[-1]
    assert "add_two_numbers" in req.params.grammar and "add_two_numbers" in req.prompt


def test_history_with_tool_calls_and_results_renders(client, fake_engine):
    history = [
        {"role": "user", "content": "add 1 and 2"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "add_two_numbers", "arguments": "{\"a\": 1, \"b\": 2}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
    ]
    assert client.post("/v1/chat/completions", json={"messages": history, "tools": [GOOD_TOOL]}).status_code == 200
    prompt = fake_engine.requests[-1].prompt
    assert '{"tool_calls": [{"name": "add_two_numbers", "arguments": {"a": 1, "b": 2}}]}' in prompt
    assert '"tool_call_id": "call_1", "result": "3"' in prompt


# ---- end to end with real clients ------------------------------------------------------------


