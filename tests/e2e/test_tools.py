"""Tools on the real model, through real clients (LangChain, pydantic-ai).

The reply parsers (every format, cut at every character) are tested in tests/unit/test_replies.py; validation, tool_choice,
history and grammars in process in tests/app/test_tools.py."""

from __future__ import annotations

import json

import pytest

from tests.support.bodies import GOOD_TOOL
from tests.support.clients import langchain_streamed_call, pydantic_ai_streamed_sum
from tests.support.server import ServerProcess, running_server

# ---- end to end with real clients ------------------------------------------------------------


@pytest.fixture(scope="module")
def server(default_model) -> ServerProcess:
    with running_server({"PARALLEL": "2", "STREAM_HEARTBEAT_SECONDS": "0"}) as srv:
        yield srv


NAMED = {"type": "function", "function": {"name": "add_two_numbers"}}
ASK = [{"role": "user", "content": "What is 3 plus 4? Use the tool."}]


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


def test_langchain_bind_tools_streaming_merges_one_call(server):
    merged = langchain_streamed_call(server.url("/v1"), [GOOD_TOOL], "add_two_numbers")
    assert len(merged.tool_calls) == 1
    assert merged.tool_calls[0]["name"] == "add_two_numbers"  # not add_two_numbersadd_two_numbers
    assert set(merged.tool_calls[0]["args"]) == {"a", "b"}


def test_pydantic_ai_streamed_tool_call_output(server):
    _, names = pydantic_ai_streamed_sum(server.url("/v1"))
    # every streamed call carries the exact name (llama.cpp issue 13774: final_resultfinal_result)
    assert names == {"final_result"}
