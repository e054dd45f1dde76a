"""IBM Granite 3.x: ``<|tool_call|>`` JSON lists and ``<think>`` / ``<response>`` thoughts, read
whole, cut at every character and streamed (llama.cpp's reply shapes); detection from the real
templates (Granite 4's are Hermes); the thinking switch; a 2nd/3rd turn's history."""

from __future__ import annotations

import json

import pytest

from app import formats
from app.formats import chat_template
from app.formats.spec import ReplySpec
from tests.support.reply_checks import check_reply, grows
from tests.support.server import DATA

TEMPLATES = DATA / "templates"
G33 = (TEMPLATES / "ibm-granite-granite-3.3-2B-Instruct.jinja").read_text()
G40 = (TEMPLATES / "ibm-granite-granite-4.0.jinja").read_text()
# Granite 3.0-3.2's way with calls and results, in short
G31 = (
    "{% if tools %}<|start_of_role|>available_tools<|end_of_role|>{{ tools|tojson }}"
    "<|end_of_text|>\n{% endif %}{% for m in messages %}"
    "{% if m.role == 'assistant' and m.tool_calls is defined %}"
    "<|start_of_role|>assistant<|end_of_role|><|tool_call|>"
    "{{ m.tool_calls|map(attribute='function')|list|tojson }}<|end_of_text|>\n"
    "{% elif m.role == 'tool' %}<|start_of_role|>tool_response<|end_of_role|>{{ m.content }}"
    "<|end_of_text|>\n{% else %}<|start_of_role|>{{ m.role }}<|end_of_role|>{{ m.content }}"
    "<|end_of_text|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start_of_role|>assistant<|end_of_role|>{% endif %}"
)
MARKUP = ("<|tool_call", "<think", "</think", "<response", "</response")
THOUGHT = formats.REASONING["granite"]
SPEC = ReplySpec(formats.get("granite"), think=True, thought=THOUGHT)


def test_detected_from_the_templates():
    assert formats.detect(G33).name == formats.detect(G31).name == "granite"
    assert formats.detect_reasoning(G33).name == "granite"
    assert formats.detect(G40).name == "hermes" and formats.detect_reasoning(G40) is None
    # MiniMax M2 wraps tool results in <response>: not Granite's answer
    minimax = "<think>{{ m.reasoning_content }}</think>{{- '\\n<response>' }}{{ m.content }}"
    assert formats.detect_reasoning(minimax).name != "granite"


@pytest.mark.parametrize("reply, content, calls, reasoning", [
    ('<|tool_call|>[{"name": "special_function", "arguments": {"arg1": 1}}]', "",
     [("special_function", {"arg1": 1})], None),
    ('<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
     '{"name": "get_time", "arguments": {"zone": "CET"}}]', "",
     [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})], None),
    ('<|tool_call|>{"name": "get_weather", "arguments": {"city": "Oslo"}}', "",
     [("get_weather", {"city": "Oslo"})], None),
    ("<think>I'm\nthinking</think>Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", [],
     "I'm\nthinking"),
    ("<think>I'm\nthinking</think><response>Hello, world!\nWhat's up?</response>",
     "Hello, world!\nWhat's up?", [], "I'm\nthinking"),
    ("<response>Just the answer.</response>", "Just the answer.", [], None),
    ('<think>Call it.</think><|tool_call|>[{"name": "f", "arguments": {}}]', "", [("f", {})],
     "Call it."),
    ("Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", [], None),
    ("<|tool_call|>not a list", "<|tool_call|>not a list", [], None),
])
def test_replies(reply, content, calls, reasoning):
    check_reply(SPEC, reply, content, calls, reasoning, MARKUP if calls or reasoning else ())


FRAGMENTS = ["<think>", "</think>", "<response>", "</response>", "<|tool_call|>", "[", "]", "{",
             "}", '{"name": "f", "arguments": {"a": 1}}', ", ", "hi ", "<", "</resp", '"', "\n"]


def test_random_replies_only_ever_grow():
    import random

    rng = random.Random("granite")
    for _ in range(300):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 12)))
        grows(SPEC, text)


def test_the_thinking_switch():
    assert THOUGHT.controls({}, None, None) == {}
    assert THOUGHT.controls({}, None, True) == {"thinking": True}
    assert THOUGHT.controls({}, "high", None) == {"thinking": True}
    assert THOUGHT.controls({}, "none", None) == {"thinking": False}
    assert THOUGHT.controls({"thinking": False}, "high", True) == {"thinking": False}
    on = chat_template.render(G33, [{"role": "user", "content": "hi"}], extra={"thinking": True})
    off = chat_template.render(G33, [{"role": "user", "content": "hi"}])
    assert "<think></think>" in on and "<response></response>" in on and "<think>" not in off


def history() -> list[dict]:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        {"role": "assistant", "content": "It is 18 C."},
        {"role": "user", "content": "And tomorrow?"},
    ]


@pytest.mark.parametrize("template", [G33, G31], ids=["granite-3.3", "granite-3.1"])
def test_history_renders_calls_and_results(template):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "w",
                                               "parameters": {"type": "object"}}}]
    prompt = chat_template.render(template, formats.detect(template).history(history()),
                                  extra={"tools": tools})
    assert ('<|start_of_role|>assistant<|end_of_role|><|tool_call|>[{"name": "get_weather", '
            '"arguments": {"city": "Paris"}}]<|end_of_text|>') in prompt
    assert "18 C<|end_of_text|>" in prompt and "And tomorrow?" in prompt
