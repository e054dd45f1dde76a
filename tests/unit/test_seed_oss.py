"""ByteDance Seed-OSS: ``<seed:tool_call>`` XML calls and ``<seed:think>`` thoughts, read whole,
cut at every character and streamed (llama.cpp's reply shapes); detection from the real template;
its thinking budget; a 2nd/3rd turn's history; string enums held by the grammar."""

from __future__ import annotations

import json

import pytest

from app import formats
from app.formats import chat_template
from app.formats.spec import ReplySpec, string_params
from app.grammar import gate
from app.protocol.tools import validate_tools
from app.settings import Settings
from tests.support.reply_checks import check_reply, grows
from tests.support.sampling import grammar_sampler
from tests.support.server import DATA

REAL = (DATA / "templates" / "ByteDance-Seed-OSS.jinja").read_text()
MARKUP = ("<seed:", "</seed:", "<function", "<parameter", "</parameter", "</function")
THOUGHT = formats.REASONING["seed"]
EDIT = {"type": "object", "properties": {"filename": {"type": "string"},
                                         "oldString": {"type": "string"},
                                         "newString": {"type": "string"}}}
TODO = {"type": "object", "properties": {"todos": {"type": "array"}}}
SPEC = ReplySpec(formats.get("seed_oss"), think=True, thought=THOUGHT,
                 string_params={"edit": string_params(EDIT), "todo_list": string_params(TODO)})


def test_detected_from_the_template():
    assert formats.detect(REAL).name == "seed_oss" and formats.detect_reasoning(REAL).name == "seed"
    qwen = (DATA / "templates" / "Qwen3-Coder.jinja").read_text()
    assert formats.detect(qwen).name == "qwen3_coder"


def call(fn: str, *params: tuple[str, str]) -> str:
    body = "".join(f"<parameter={k}>{v}</parameter>\n" for k, v in params)
    return f"<seed:tool_call>\n<function={fn}>\n{body}</function>\n</seed:tool_call>"


@pytest.mark.parametrize("reply, content, calls, reasoning", [
    ("<seed:think>I'm thinking about the answer</seed:think>\nHello, world!", "Hello, world!", [],
     "I'm thinking about the answer"),
    (call("special_function", ("arg1", "1")), "", [("special_function", {"arg1": 1})], None),
    (call("special_function", ("arg1", "1")) + "\n"
     + call("special_function_with_opt", ("arg1", "1"), ("arg2", "2")), "",
     [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})],
     None),
    (call("todo_list", ("todos", '[{"item": "Check stuff", "selected": false}, '
                                  '{"item": "Prepare stuff", "selected": true}]')), "",
     [("todo_list", {"todos": [{"item": "Check stuff", "selected": False},
                               {"item": "Prepare stuff", "selected": True}]})], None),
    # a string keeps its own newlines and quotes
    (call("edit", ("filename", "foo.cpp"),
          ("oldString", 'def foo(arg = "14"):\n    return arg + "bar"\n'),
          ("newString", 'def foo(arg = "15"):\n    pass\n')), "",
     [("edit", {"filename": "foo.cpp", "oldString": 'def foo(arg = "14"):\n    return arg + "bar"\n',
                "newString": 'def foo(arg = "15"):\n    pass\n'})], None),
    ("<seed:think>Edit it.</seed:think>\nSure." + call("edit", ("filename", "\n2\n")), "Sure.",
     [("edit", {"filename": "\n2\n"})], "Edit it."),
])
def test_replies(reply, content, calls, reasoning):
    check_reply(SPEC, reply, content, calls, reasoning, MARKUP if calls or reasoning else ())


FRAGMENTS = ["<seed:tool_call>", "</seed:tool_call>", "<function=", "edit", ">", "\n",
             "<parameter=", "filename", "</parameter>", "</function>", "<seed:think>",
             "</seed:think>", "hi ", "<", "1", '"', "</para"]


def test_random_replies_only_ever_grow():
    import random

    rng = random.Random("seed")
    for _ in range(300):
        grows(SPEC, "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 14))))


def test_the_thinking_budget():
    assert THOUGHT.controls({}, None, None) == {}
    assert THOUGHT.controls({}, None, False) == THOUGHT.controls({}, "none", None) == {
        "thinking_budget": 0}
    assert THOUGHT.budgeted({}, 512) == {"thinking_budget": 512}
    assert THOUGHT.budgeted({"thinking_budget": 64}, 512) == {"thinking_budget": 64}
    user = [{"role": "user", "content": "hi"}]
    off = chat_template.render(REAL, user, extra={"thinking_budget": 0})
    assert off.endswith("</seed:cot_budget_reflect>\n</seed:think>")
    assert not THOUGHT.opened(off)
    assert "thinking budget, which is 512" in chat_template.render(REAL, user, extra={
        "thinking_budget": 512})
    assert "budget" not in chat_template.render(REAL, user)


def test_history_renders_calls_thoughts_and_results():
    args = {"city": "Paris", "days": 2, "hourly": True, "opts": {"a": [1]}}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "reasoning_content": "Use the tool.",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "get_weather", "arguments": json.dumps(args)}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
        {"role": "assistant", "content": "It is 18 C.", "reasoning_content": "Say it."},
        {"role": "user", "content": "And tomorrow?"},
    ]
    fmt = formats.get("seed_oss")
    tools = validate_tools([{"type": "function", "function": {  # a tool with no properties
        "name": "get_weather", "description": "w", "parameters": {"type": "object"}}}])
    history, extra = fmt.offer(fmt.history(messages), {}, tools, False, lambda v: v)
    prompt = chat_template.render(REAL, history, extra=extra)
    assert "def get_weather():" in prompt
    assert ("<seed:bos>assistant\n<seed:think>Use the tool.</seed:think>\n<seed:tool_call>\n"
            "<function=get_weather>\n<parameter=city>Paris</parameter>\n<parameter=days>2"
            "</parameter>\n<parameter=hourly>true</parameter>\n<parameter=opts>"
            '{"a": [1]}</parameter>\n</function>\n</seed:tool_call><seed:eos>') in prompt
    assert "<seed:bos>tool\n18 C<seed:eos>" in prompt
    assert "<seed:think>Say it.</seed:think>\nIt is 18 C.<seed:eos>" in prompt


LIMITS = gate.Limits.from_settings(Settings())
UNITS = {"type": "object", "properties": {"units": {"type": "string", "enum": ["c", "f"]},
                                          "note": {"type": "string"}}, "required": ["units"]}


@pytest.mark.parametrize("name, text, whole", [
    ("seed_oss", "<seed:tool_call>\n<function=w>\n<parameter=units>f</parameter>\n</function>\n"
     "</seed:tool_call>", True),
    ("seed_oss", "<seed:tool_call>\n<function=w>\n<parameter=units>kelvin", False),
    ("seed_oss", "<seed:tool_call>\n<function=w>\n<parameter=units>c</parameter>\n"
     "<parameter=note>any\ntext</parameter>\n</function>\n</seed:tool_call>", True),
    ("qwen3_coder", "<tool_call>\n<function=w>\n<parameter=units>\nc\n</parameter>\n"
     "</function>\n</tool_call>", True),
    ("qwen3_coder", "<tool_call>\n<function=w>\n<parameter=units>\nkelvin", False),
])
def test_a_string_enum_is_held_to_its_values(vocab, name, text, whole):
    tools = validate_tools([{"type": "function", "function": {"name": "w", "parameters": UNITS}}])
    grammar = formats.get(name).grammar(tools, parallel=False, required=True, limits=LIMITS)
    s = grammar_sampler(vocab, grammar)
    try:
        assert s.feed(text.encode()) == whole
        if whole:
            assert s.allows(int(vocab.eog_ids[0]))
    finally:
        s.free()
