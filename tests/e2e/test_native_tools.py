"""Tools through the models' own templates and native call formats, end to end on the real model
with those templates (grammar-held calls). In process: tests/app/test_native_tools.py."""

from __future__ import annotations

import json

import pytest

from tests.support.bodies import ADD, WEATHER
from tests.support.clients import langchain_streamed_call, pydantic_ai_streamed_sum
from tests.support.server import DATA, running_server

TEMPLATES = DATA / "templates"
# (template, format, how the history's call shows in the prompt, a reply in the native format)


# ---- end to end: the real model, held to each native format by the grammar ------------------

E2E = ["Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B", "Qwen3-Coder", "meta-llama-Llama-3.2-3B-Instruct",
       "mistralai-Mistral-Nemo-Instruct-2407", "unsloth-mistral-Devstral-Small-2507"]


@pytest.fixture(scope="module", params=E2E)
def native_server(request, default_model):
    env = {"PARALLEL": "2", "STREAM_HEARTBEAT_SECONDS": "0", "CHAT_TEMPLATE": str(TEMPLATES / f"{request.param}.jinja")}
    with running_server(env) as srv:
        yield srv


def test_forced_call_in_the_native_format_streamed_and_not(native_server):
    import openai

    sdk = openai.OpenAI(base_url=native_server.url("/v1"), api_key="x", max_retries=0)
    kw = dict(model="m", messages=[{"role": "user", "content": "What is 3 plus 4? Use the tool."}],
              tools=[ADD, WEATHER], tool_choice={"type": "function", "function": {"name": "add_two_numbers"}},
              temperature=0, max_tokens=80, extra_body={"cache_prompt": False})
    full = sdk.chat.completions.create(**kw)
    (call,) = full.choices[0].message.tool_calls
    assert full.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "add_two_numbers"
    args = json.loads(call.function.arguments)
    assert set(args) <= {"a", "b"} and all(isinstance(v, int) for v in args.values())
    with sdk.chat.completions.stream(**kw) as stream:
        final = stream.get_final_completion()
    (scall,) = final.choices[0].message.tool_calls
    assert scall.function.name == "add_two_numbers" and scall.function.arguments == call.function.arguments
    assert final.choices[0].finish_reason == "tool_calls"


def test_auto_call_is_held_to_the_schema_once_started(default_model):
    """Under tool_choice auto the model writes freely; once it opens <tool_call> the lazy grammar
    holds it to the schema. The few-shot history shows calls without ``unit``, the schema requires
    it: only the grammar can put it there."""
    schema = json.loads(json.dumps(ADD))
    schema["function"]["parameters"]["properties"]["unit"] = {"type": "string", "enum": ["apples"]}
    schema["function"]["parameters"]["required"].append("unit")
    history = []
    for i, (a, b) in enumerate([(1, 2), (5, 6), (2, 9)]):
        history += [{"role": "user", "content": f"What is {a} plus {b}?"},
                    {"role": "assistant", "content": None, "tool_calls": [{"id": f"call_{i}", "type": "function",
                     "function": {"name": "add_two_numbers", "arguments": json.dumps({"a": a, "b": b})}}]},
                    {"role": "tool", "tool_call_id": f"call_{i}", "content": str(a + b)},
                    {"role": "assistant", "content": str(a + b)}]
    history.append({"role": "user", "content": "What is 3 plus 4?"})
    env = {"PARALLEL": "1", "CHAT_TEMPLATE": str(TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja")}
    import requests

    with running_server(env) as srv:
        body = {"messages": history, "tools": [schema], "temperature": 0, "max_tokens": 60}
        choice = requests.post(srv.url("/v1/chat/completions"), json=body, timeout=60).json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        (call,) = choice["message"]["tool_calls"]
        assert json.loads(call["function"]["arguments"])["unit"] == "apples"


def test_required_call_after_a_thought_ended_by_the_budget(default_model, tmp_path):
    """A template that opens <think>: the grammar lets the thought run, the budget closes it
    (the injected </think> moves the grammar on too), and the call follows in the native form."""
    import requests

    qwen = (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    thinking = qwen.replace("{{- '<|im_start|>assistant\\n' }}\n{%- endif %}",
                            "{{- '<|im_start|>assistant\\n<think>\\n' }}\n{%- endif %}")
    assert thinking != qwen
    path = tmp_path / "thinking.jinja"
    path.write_text(thinking)
    with running_server({"PARALLEL": "1", "CHAT_TEMPLATE": str(path)}) as srv:
        body = {"messages": [{"role": "user", "content": "What is 3 plus 4?"}], "tools": [ADD],
                "tool_choice": "required", "temperature": 0, "max_tokens": 80, "reasoning_budget": 6}
        choice = requests.post(srv.url("/v1/chat/completions"), json=body, timeout=60).json()["choices"][0]
        msg = choice["message"]
        assert msg["reasoning_content"] and choice["finish_reason"] == "tool_calls", choice
        (call,) = msg["tool_calls"]
        assert call["function"]["name"] == "add_two_numbers"
        assert set(json.loads(call["function"]["arguments"])) == {"a", "b"}


def test_langchain_bind_tools_streaming_in_the_native_format(native_server):
    merged = langchain_streamed_call(native_server.url("/v1"), [ADD, WEATHER], "add_two_numbers")
    assert [c["name"] for c in merged.tool_calls] == ["add_two_numbers"]  # merged once, name exact
    assert set(merged.tool_calls[0]["args"]) <= {"a", "b"}
    assert not (merged.content or "").strip()


def test_pydantic_ai_streamed_output_tool_in_the_native_format(native_server):
    _, names = pydantic_ai_streamed_sum(native_server.url("/v1"))
    assert names == {"final_result"}


