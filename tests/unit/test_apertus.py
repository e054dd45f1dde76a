"""Apertus: detection from both templates (Swiss AI's and llama.cpp's copy), the reply scanner
on llama.cpp's test replies (whole, cut at every character, streamed), the thinking switch, and
the history a second and third turn render through each template."""

from __future__ import annotations

import json

import pytest

from app import formats
from app.formats import chat_template
from app.formats.apertus import APERTUS_THOUGHT
from app.formats.spec import ReplySpec
from app.protocol.tools import validate_tools
from tests.support.family_replies import (
    assert_only_grows,
    assert_random_replies_grow,
    assert_streams_as_whole,
    calls_of,
    whole,
)
from tests.support.server import DATA

TEMPLATES = {n: (DATA / "templates" / f"{n}.jinja").read_text()
             for n in ("Apertus-8B-Instruct", "swiss-ai-Apertus-8B-Instruct-2509")}
FMT = formats.get("apertus")
MARKUP = ("<|tools_", "<|inner_", "special_function")
NAMES = frozenset({"special_function", "special_function_with_opt"})

# (reply, content, calls, reasoning)
CASES = [
    ("Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", [], None),
    ('<|tools_prefix|>[{"special_function": {"arg1": 1}}]<|tools_suffix|>', "",
     [("special_function", {"arg1": 1})], None),
    ('<|inner_prefix|>I\'m\nthinking<|inner_suffix|>Let me call.<|tools_prefix|>[{"special_function":'
     ' {"arg1": 1}}, {"special_function_with_opt": {"arg1": 1, "arg2": "]}<|tools_suffix|>"}}]'
     "<|tools_suffix|>", "Let me call.",
     [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": "]}<|tools_suffix|>"})],
     "I'm\nthinking"),
    ('<|inner_prefix|>maybe <|tools_prefix|>[{"x": {}}]<|tools_suffix|><|inner_suffix|>No call.',
     "No call.", [], 'maybe <|tools_prefix|>[{"x": {}}]<|tools_suffix|>'),
    ('before<|tools_prefix|>[{"special_function": {}}]<|tools_suffix|>after', "beforeafter",
     [("special_function", {})], None),
]


def spec() -> ReplySpec:
    return ReplySpec(format=FMT, think=True, thought=APERTUS_THOUGHT, names=NAMES)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_detected_from_both_templates(name):
    assert formats.detect(TEMPLATES[name]).name == "apertus"
    assert formats.detect_reasoning(TEMPLATES[name]) is APERTUS_THOUGHT


@pytest.mark.parametrize("reply, content, calls, reasoning", CASES)
def test_replies_whole_cut_and_streamed(reply, content, calls, reasoning):
    msg = whole(spec(), reply)
    assert (msg["content"] or "") == content
    assert calls_of(msg) == calls
    assert msg.get("reasoning_content") == reasoning
    assert_streams_as_whole(spec(), reply, MARKUP[:2])
    assert_only_grows(spec(), reply)


def test_a_call_that_is_not_a_name_keyed_object_never_counts():
    msg = whole(spec(), '<|tools_prefix|>[{"special_function": 3}]<|tools_suffix|>')
    assert "tool_calls" not in msg


@pytest.mark.parametrize("thinking, effort, said", [
    (None, None, "enabled"), (True, None, "enabled"), (False, None, "disabled"),
    (None, "none", "disabled"), (None, "low", "enabled")])
def test_the_thinking_switch(thinking, effort, said):
    extra = APERTUS_THOUGHT.controls({}, effort, thinking)
    for template in TEMPLATES.values():
        prompt = chat_template.render(template, [{"role": "user", "content": "hi"}], extra=extra)
        assert f"Deliberation: {said}" in prompt


HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}},
        {"id": "call_b", "type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Oslo"}}}]},
    {"role": "tool", "tool_call_id": "call_a", "content": '{"sky": "sunny"}'},
    {"role": "tool", "tool_call_id": "call_b", "content": '{"sky": "rain"}'},
    {"role": "assistant", "content": "Sunny in Paris, rain in Oslo."},
    {"role": "user", "content": "And Rome?"},
]
TOOLS = validate_tools([{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_a_third_turn_renders_in_each_template(name):
    template = TEMPLATES[name]
    fmt = formats.choose("auto", template)
    messages, extra = fmt.offer(fmt.history(HISTORY), {}, TOOLS, False, lambda v: v)
    prompt = chat_template.render(template, messages, extra=extra)
    assert "// Weather in a city\ntype get_weather = (_: {\ncity?: string\n}) => any;" in prompt
    assert ('<|assistant_start|><|tools_prefix|>[{"get_weather": {"city": "Paris"}}, '
            '{"get_weather": {"city": "Oslo"}}]<|tools_suffix|>[{"sky": "sunny"}, {"sky": "rain"}]'
            "Sunny in Paris, rain in Oslo.<|assistant_end|>") in prompt
    assert prompt.endswith("<|user_start|>And Rome?<|user_end|><|assistant_start|>")


def test_random_replies_only_ever_grow():
    pieces = ["<|tools_prefix|>", "<|tools_suffix|>", "<|inner_prefix|>", "<|inner_suffix|>", "[",
              "]", "{", "}", ", ", '"special_function": ', '{"arg1": 1}', '"', "hi ", ":", "\\"]
    assert_random_replies_grow([spec(), ReplySpec(format=FMT, names=NAMES)], pieces, "apertus")
