"""Phi-4-mini: detection from Microsoft's template and llama.cpp's copy, the reply scanner on the
shapes the model writes (a listed call, objects without the list, a missing closing marker;
whole, cut at every character, streamed), and the history a second and third turn render
through each template (the tools in the system message's ``tools`` for Microsoft's)."""

from __future__ import annotations

import json

import pytest

from app import formats
from app.formats import chat_template
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
             for n in ("microsoft-Phi-4-mini-instruct", "llama-cpp-microsoft-Phi-4-mini-instruct")}
FMT = formats.get("phi4")
MARKUP = ("<|tool_call", "<|/tool_call", '"name"')
NAMES = frozenset({"get_weather", "calculate_sales_tax"})

# (reply, content, calls)
CASES = [
    ("Paris is sunny today.", "Paris is sunny today.", []),
    ('<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|/tool_call|>', "",
     [("get_weather", {"city": "Paris"})]),
    ('<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]', "",
     [("get_weather", {"city": "Paris"})]),
    ('<|tool_call|>{"name": "calculate_sales_tax", "arguments": {"amount": 30.45, "state": "IL"}}, '
     '{"name": "calculate_sales_tax", "arguments": {"amount": 52.33, "state": "CA"}}<|/tool_call|>', "",
     [("calculate_sales_tax", {"amount": 30.45, "state": "IL"}),
      ("calculate_sales_tax", {"amount": 52.33, "state": "CA"})]),
    ('Sure.<|tool_call|>{"name": "get_weather", "arguments": {"city": "Paris"}}<|/tool_call|>'
     '<|tool_call|>{"name": "get_weather", "arguments": {"city": "Oslo"}}<|/tool_call|>', "Sure.",
     [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})]),
    ("Use <|tool_call|>not json<|/tool_call|> like this.",
     "Use <|tool_call|>not json<|/tool_call|> like this.", []),
]


def spec() -> ReplySpec:
    return ReplySpec(format=FMT, names=NAMES)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_detected_from_both_templates(name):
    assert formats.detect(TEMPLATES[name]).name == "phi4"


@pytest.mark.parametrize("reply, content, calls", CASES)
def test_replies_whole_cut_and_streamed(reply, content, calls):
    msg = whole(spec(), reply)
    assert (msg["content"] or "") == content
    assert calls_of(msg) == calls
    assert_streams_as_whole(spec(), reply, MARKUP if calls else ())
    assert_only_grows(spec(), reply)


HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
    {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
    {"role": "assistant", "content": "Sunny."},
    {"role": "user", "content": "And Rome?"},
]
TOOLS = validate_tools([{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])


@pytest.mark.parametrize("name, shown", [
    ("microsoft-Phi-4-mini-instruct",
     ['<|system|>You are a helpful assistant with some tools.<|tool|>[{"name": "get_weather", '
      '"description": "Weather in a city", "parameters": ',
      '<|assistant|><|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
      "<|/tool_call|><|end|><|tool_response|>sunny<|end|><|assistant|>Sunny.<|end|>"]),
    ("llama-cpp-microsoft-Phi-4-mini-instruct",
     ['<|system|><|tool|>{"name": "get_weather", "description": "Weather in a city"',
      '<|assistant|><|tool_call|>{"name": "get_weather", "arguments": {"city": "Paris"}}'
      '<|/tool_call|><|end|><|tool_response|>"sunny"<|end|><|assistant|>Sunny.<|end|>']),
])
def test_a_third_turn_renders_in_each_template(name, shown):
    template = TEMPLATES[name]
    fmt = formats.choose("auto", template)
    messages, extra = fmt.offer(fmt.history(HISTORY), {}, TOOLS, False, lambda v: v)
    prompt = chat_template.render(template, messages, extra=extra)
    for part in shown:
        assert part in prompt
    assert prompt.endswith("<|user|>And Rome?<|end|><|assistant|>")


def test_a_system_message_of_the_clients_own_carries_the_tools():
    fmt = formats.choose("auto", TEMPLATES["microsoft-Phi-4-mini-instruct"])
    messages, _ = fmt.offer(fmt.history([{"role": "system", "content": "Be brief."}, *HISTORY[:1]]),
                            {}, TOOLS, False, lambda v: v)
    prompt = chat_template.render(TEMPLATES["microsoft-Phi-4-mini-instruct"], messages)
    assert prompt.startswith('<|system|>Be brief.<|tool|>[{"name": "get_weather"')


def test_random_replies_only_ever_grow():
    pieces = ["<|tool_call|>", "<|/tool_call|>", "[", "]", "{", "}", ", ", '"name": "get_weather"',
              '"arguments": {"city": "Paris"}', '{"name": "get_weather", "arguments": {}}', "hi ",
              '"', "\\", "\n"]
    assert_random_replies_grow([spec()], pieces, "phi4")
