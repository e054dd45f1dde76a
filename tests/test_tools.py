"""Tools offered to the model: validation, tool_choice, history, grammars, and real clients.

The reply parsers (every format, cut at every character) are tested in test_replies.py."""

from __future__ import annotations

import json

import pytest

from tests.clients import langchain_streamed_call, pydantic_ai_streamed_sum
from tests.conftest import ServerProcess, running_server

GOOD_TOOL = {"type": "function", "function": {"name": "add_two_numbers", "description": "Add",
             "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                            "required": ["a", "b"]}}}
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


@pytest.fixture(scope="module")
def server(default_model) -> ServerProcess:
    with running_server({"PARALLEL": "2", "STREAM_HEARTBEAT_SECONDS": "0"}) as srv:
        yield srv


NAMED = {"type": "function", "function": {"name": "add_two_numbers"}}
ASK = [{"role": "user", "content": "What is 3 plus 4? Use the tool."}]


@pytest.mark.e2e
def test_forced_tool_call_streamed_and_not_with_the_openai_sdk(server):
    import openai

    sdk = openai.OpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0)
    full = sdk.chat.completions.create(model="m", messages=ASK, tools=[GOOD_TOOL], tool_choice=NAMED,
                                       temperature=0, max_tokens=60)
    choice = full.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "add_two_numbers" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    assert set(args) == {"a", "b"} and all(isinstance(v, int) for v in args.values())
    with sdk.chat.completions.stream(model="m", messages=ASK, tools=[GOOD_TOOL], tool_choice=NAMED,
                                     temperature=0, max_tokens=60) as stream:
        final = stream.get_final_completion()
    (scall,) = final.choices[0].message.tool_calls
    assert scall.function.name == "add_two_numbers"  # the SDK's accumulator: name not repeated
    assert scall.function.arguments == call.function.arguments
    assert final.choices[0].finish_reason == "tool_calls"


@pytest.mark.e2e
def test_langchain_bind_tools_streaming_merges_one_call(server):
    merged = langchain_streamed_call(server.url("/v1"), [GOOD_TOOL], "add_two_numbers")
    assert len(merged.tool_calls) == 1
    assert merged.tool_calls[0]["name"] == "add_two_numbers"  # not add_two_numbersadd_two_numbers
    assert set(merged.tool_calls[0]["args"]) == {"a", "b"}


@pytest.mark.e2e
def test_pydantic_ai_streamed_tool_call_output(server):
    _, names = pydantic_ai_streamed_sum(server.url("/v1"))
    # every streamed call carries the exact name (llama.cpp issue 13774: final_resultfinal_result)
    assert names == {"final_result"}
