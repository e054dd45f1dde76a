"""NVIDIA Nemotron Nano v2: ``<TOOLCALL>`` JSON lists after a ``<think>`` the prompt opened, read
whole, cut at every character and streamed (llama.cpp's reply shapes); detection from the real
template; the ``/think`` / ``/no_think`` switch; a 2nd/3rd turn's history."""

from __future__ import annotations

import json

import pytest

from app import formats
from app.formats import chat_template
from app.formats.spec import ReplySpec
from tests.support.reply_checks import check_reply, grows
from tests.support.server import DATA

REAL = (DATA / "templates" / "NVIDIA-Nemotron-Nano-v2.jinja").read_text()
MARKUP = ("<TOOLCALL", "</TOOLCALL", "<think", "</think")
THOUGHT = formats.REASONING["nemotron"]
OPENED = ReplySpec(formats.get("nemotron"), think=True, in_thought=True, thought=THOUGHT)
CLOSED = ReplySpec(formats.get("nemotron"), think=True, thought=THOUGHT)
CALL = '<TOOLCALL>[{"name": "special_function", "arguments": {"arg1": 1}}]</TOOLCALL>'


def test_detected_from_the_template():
    assert formats.detect(REAL).name == "nemotron"
    assert formats.detect_reasoning(REAL).name == "nemotron"
    smollm3 = ('{% if "/no_think" in system_message %}{% endif %}'
               "{{ '<|im_start|>assistant\\n' + '<think>\\n\\n</think>\\n' }}")
    assert formats.detect_reasoning(smollm3).name == "think"


@pytest.mark.parametrize("spec, reply, content, calls, reasoning", [
    (OPENED, "I'm\nthinking\n</think>\n" + CALL, "", [("special_function", {"arg1": 1})],
     "I'm\nthinking\n"),
    (OPENED, "I'm\nthinking\n</think>\n\n" + CALL + "\n", "", [("special_function", {"arg1": 1})],
     "I'm\nthinking\n"),
    (OPENED, "Hmm.</think>Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", [], "Hmm."),
    (CLOSED, 'Let me check.\n<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
     '{"name": "get_time", "arguments": {"zone": "CET"}}]</TOOLCALL>', "Let me check.",
     [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})], None),
    # arguments written as a string holding the JSON, as the template's instruction shows them
    (CLOSED, '<TOOLCALL>[{"name": "f", "arguments": "{\\"a\\": 1}"}]</TOOLCALL>', "",
     [("f", {"a": 1})], None),
    (CLOSED, '<TOOLCALL>[{"name": "f", "arguments": {}}]', "", [("f", {})], None),
    (OPENED, "maybe <TOOLCALL>[]</TOOLCALL> not", "", [], "maybe <TOOLCALL>[]</TOOLCALL> not"),
])
def test_replies(spec, reply, content, calls, reasoning):
    check_reply(spec, reply, content, calls, reasoning, MARKUP if calls or reasoning else ())


FRAGMENTS = ["<TOOLCALL>", "</TOOLCALL>", "</think>", "[", "]", "{", "}", ", ", "hi ", "<", '"',
             '{"name": "f", "arguments": {"a": 1}}', "</TOOL", "\n"]


@pytest.mark.parametrize("spec", [OPENED, CLOSED], ids=["opened", "closed"])
def test_random_replies_only_ever_grow(spec):
    import random

    rng = random.Random("nemotron")
    for _ in range(300):
        grows(spec, "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 12))))


def test_the_switch_ends_the_prompt_as_the_template_does():
    def prompt(text: str, thinking: bool | None) -> str:
        rendered = chat_template.render(REAL, [{"role": "user", "content": text}])
        return THOUGHT.finish_prompt(rendered, thinking)

    assert prompt("hi", None).endswith("<SPECIAL_11>Assistant\n<think>\n")
    assert THOUGHT.opened(prompt("hi", None)) and not THOUGHT.opened(prompt("hi", False))
    assert prompt("hi", False) == prompt("hi /no_think", None)
    assert prompt("hi /no_think", True) == prompt("hi", None)
    assert prompt("hi /no_think", None).endswith("<think></think>")


def test_history_renders_calls_and_results():
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "reasoning_content": "Use the tool.",
         "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        {"role": "assistant", "content": "It is 18 C."},
        {"role": "user", "content": "And tomorrow?"},
    ]
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "w",
                                               "parameters": {"type": "object"}}}]
    prompt = chat_template.render(REAL, formats.get("nemotron").history(messages),
                                  extra={"tools": tools})
    assert ('<SPECIAL_11>Assistant\n<TOOLCALL>[{"name": "get_weather", "arguments": '
            '{"city": "Paris"}}]</TOOLCALL>\n<SPECIAL_12>\n') in prompt
    assert "<TOOL_RESPONSE>[18 C]</TOOL_RESPONSE>" in prompt and "Be brief." in prompt
    assert "It is 18 C.\n<SPECIAL_12>" in prompt and prompt.endswith("<think>\n")
