"""Tools through the models' own templates and native call formats, in process with real
templates. End to end on the real model: tests/e2e/test_native_tools.py."""

from __future__ import annotations

import json

import pytest

from app import formats
from app.engine.fake import FakeEngine
from app.formats.gbnf import hoist_defs
from app.protocol import tools
from tests.support.app import make_client
from tests.support.bodies import ADD, WEATHER
from tests.support.server import DATA

TEMPLATES = DATA / "templates"
HISTORY = [
    {"role": "user", "content": "What is 1 plus 2?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0", "type": "function", "function": {
        "name": "add_two_numbers", "arguments": json.dumps({"a": 1, "b": 2})}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "3"},
    {"role": "assistant", "content": "3"},
    {"role": "user", "content": "What is 3 plus 4?"},
]
# (template, format, how the history's call shows in the prompt, a reply in the native format)
NATIVE = [
    ("Qwen-Qwen2.5-7B-Instruct", "hermes", '"arguments": {"a": 1, "b": 2}',
     '<tool_call>\n{"name": "add_two_numbers", "arguments": {"a": 3, "b": 4}}\n</tool_call>'),
    ("Qwen-Qwen3-0.6B", "hermes", '"arguments": {"a": 1, "b": 2}',
     '<think>\nI need the <tool_call> tool.\n</think>\n\n<tool_call>\n{"name": "add_two_numbers", '
     '"arguments": {"a": 3, "b": 4}}\n</tool_call>'),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "hermes", '"arguments": {"a": 1, "b": 2}',
     '<tool_call>\n{"arguments": {"a": 3, "b": 4}, "name": "add_two_numbers"}\n</tool_call>'),
    ("Qwen3-Coder", "qwen3_coder", "<parameter=a>\n1\n</parameter>",
     "<tool_call>\n<function=add_two_numbers>\n<parameter=a>\n3\n</parameter>\n<parameter=b>\n4\n"
     "</parameter>\n</function>\n</tool_call>"),
    ("meta-llama-Llama-3.1-8B-Instruct", "llama3", '"parameters": {"a": 1, "b": 2}',
     '<|python_tag|>{"name": "add_two_numbers", "parameters": {"a": 3, "b": 4}}'),
    ("meta-llama-Llama-3.2-3B-Instruct", "llama3", '"parameters": {"a": 1, "b": 2}',
     '{"name": "add_two_numbers", "parameters": {"a": 3, "b": 4}}'),
    ("mistralai-Mistral-Nemo-Instruct-2407", "mistral", '"arguments": {"a": 1, "b": 2}',
     '[TOOL_CALLS][{"name": "add_two_numbers", "arguments": {"a": 3, "b": 4}}]'),
    ("Mistral-Small-3.2-24B-Instruct-2506", "mistral", '[ARGS]{"a": 1, "b": 2}',
     '[TOOL_CALLS]add_two_numbers[ARGS]{"a": 3, "b": 4}'),
    ("unsloth-mistral-Devstral-Small-2507", "mistral", '[ARGS]{"a": 1, "b": 2}',
     '[TOOL_CALLS]add_two_numbers[ARGS]{"a": 3, "b": 4}'),
]
IDS = [n[0] for n in NATIVE]


def sse_deltas(text):
    return [json.loads(b[6:])["choices"][0]["delta"] for b in text.split("\n\n") if b.startswith("data: {")]


@pytest.mark.parametrize("name, fmt, shown, reply", NATIVE, ids=IDS)
def test_template_renders_tools_and_history_and_the_native_reply_parses(name, fmt, shown, reply):
    engine = FakeEngine(reply=reply, n_ctx=4096, chat_template=(TEMPLATES / f"{name}.jinja").read_text())
    client = make_client(engine)
    body = {"messages": HISTORY, "tools": [ADD, WEATHER]}
    resp = client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.get_json()
    prompt = engine.requests[-1].prompt
    assert "get_weather" in prompt and "Weather in a city" in prompt  # the tools, in the template's words
    assert shown in prompt  # the earlier call, arguments as an object
    choice = resp.get_json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "add_two_numbers" and json.loads(call["function"]["arguments"]) == {"a": 3, "b": 4}
    if fmt == "mistral":
        assert len(call["id"]) == 9 and call["id"].isalnum()
    deltas = sse_deltas(client.post("/v1/chat/completions", json={**body, "stream": True}).get_data(as_text=True))
    streamed = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert [tc["function"]["name"] for tc in streamed if "name" in tc["function"]] == ["add_two_numbers"]
    assert "".join(tc["function"]["arguments"] for tc in streamed) == call["function"]["arguments"]
    assert not "".join(d.get("content") or "" for d in deltas).strip()


@pytest.mark.parametrize("name, fmt, shown, reply", NATIVE, ids=IDS)
def test_grammar_per_tool_choice(name, fmt, shown, reply):
    engine = FakeEngine(reply=reply, n_ctx=4096, chat_template=(TEMPLATES / f"{name}.jinja").read_text())
    client = make_client(engine)
    body = {"messages": HISTORY, "tools": [ADD, WEATHER]}
    client.post("/v1/chat/completions", json={**body, "tool_choice": "required"})
    params = engine.requests[-1].params
    marker = {"hermes": "<tool_call>", "qwen3_coder": "<function=", "llama3": '\\"parameters\\"',
              "mistral": "[TOOL_CALLS]"}[fmt]
    assert marker in params.grammar and "get_weather" in params.grammar and not params.grammar_triggers
    client.post("/v1/chat/completions", json={**body, "tool_choice": "auto"})
    params = engine.requests[-1].params
    if "<think>" in engine.info.chat_template:  # a thinking model may write anything first
        assert params.grammar is None
    else:
        assert params.grammar_triggers == formats.get(fmt).triggers
    client.post("/v1/chat/completions", json={**body, "tool_choice": "none"})
    assert engine.requests[-1].params.grammar is None and "get_weather" not in engine.requests[-1].prompt


def test_vertex_envelope_with_tools_shares_parameters():
    name, _, _, reply = NATIVE[0]
    engine = FakeEngine(reply=reply, n_ctx=4096, chat_template=(TEMPLATES / f"{name}.jinja").read_text())
    resp = make_client(engine).post("/predict", json={
        "instances": [{"messages": HISTORY}, {"messages": HISTORY[:1]}],
        "parameters": {"tools": [ADD], "tool_choice": "required"},
    })
    preds = resp.get_json()["predictions"]
    assert resp.status_code == 200 and len(preds) == 2
    for p in preds:
        assert p["choices"][0]["finish_reason"] == "tool_calls"
        assert p["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "add_two_numbers"
    assert all(r.params.grammar and "<tool_call>" in r.params.grammar for r in engine.requests)


def test_tool_format_setting_overrides_the_template():
    engine = FakeEngine(reply='<tool_call>{"name": "add_two_numbers", "arguments": {}}</tool_call>')
    client = make_client(engine, tool_format="hermes")  # the fake model's template knows no tools
    msg = client.post("/v1/chat/completions", json={"messages": HISTORY, "tools": [ADD]}).get_json()
    assert msg["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "add_two_numbers"
    generic = make_client(FakeEngine(reply='{"response": "7"}'))
    assert generic.post("/v1/chat/completions", json={"messages": HISTORY, "tools": [ADD]}).get_json()[
        "choices"][0]["message"]["content"] == "7"


# ---- end to end: the real model, held to each native format by the grammar ------------------


NESTED = {"type": "function", "function": {"name": "order", "parameters": {
    "$defs": {"Item": {"type": "object", "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                       "required": ["sku", "qty"]}},
    "type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}},
    "required": ["items"]}}}
OTHER_ITEM = {"type": "function", "function": {"name": "ship", "parameters": {
    "definitions": {"Item": {"type": "object", "properties": {"to": {"type": "string"}}}},
    "type": "object", "properties": {"item": {"$ref": "#/definitions/Item"}}}}}


@pytest.mark.parametrize("name", ["Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct",
                                  "mistralai-Mistral-Nemo-Instruct-2407", "Mistral-Small-3.2-24B-Instruct-2506", None])
def test_nested_schemas_with_defs_are_held_by_the_grammar(name):
    """pydantic writes nested models as $defs + $ref: they still resolve inside a call schema,
    and two tools defining the same name differently keep their own."""
    template = (TEMPLATES / f"{name}.jinja").read_text() if name else None
    engine = FakeEngine(reply="{}", n_ctx=4096, chat_template=template)
    client = make_client(engine)
    for choice in ("required", "auto"):
        resp = client.post("/v1/chat/completions", json={"messages": HISTORY[:1], "tools": [NESTED, OTHER_ITEM],
                                                          "tool_choice": choice})
        assert resp.status_code == 200, resp.get_json()
    grammar = engine.requests[-2].params.grammar
    assert "sku" in grammar and '\\"to\\"' in grammar


def test_hoisted_defs_rename_clashes():
    params, defs = hoist_defs(tools.validate_tools([NESTED, OTHER_ITEM]))
    assert set(defs) == {"Item", "Item_1"}
    assert params[0]["properties"]["items"]["items"] == {"$ref": "#/$defs/Item"}
    assert params[1]["properties"]["item"] == {"$ref": "#/$defs/Item_1"}
