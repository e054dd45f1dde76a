"""LFM2 / LFM2.5: detection from the three templates, the reply scanner on llama.cpp's test
replies (whole, cut at every character, streamed), and the history a second and third turn
render in each template (the calls written into the text where the template renders only text,
by the template itself where it renders them)."""

from __future__ import annotations

import json

import pytest

from app import formats
from app.formats import chat_template
from app.formats.spec import ReplySpec
from tests.support.family_replies import (
    assert_only_grows,
    assert_random_replies_grow,
    assert_streams_as_whole,
    calls_of,
    whole,
)
from tests.support.server import DATA

TEMPLATES = {n: (DATA / "templates" / f"{n}.jinja").read_text()
             for n in ("LFM2-8B-A1B", "LFM2.5-Instruct", "LFM2.5-8B-A1B")}
FMT = formats.get("lfm2")
MARKUP = ("<|tool_call", "tool_call_end", "<think", "</think")
NAMES = frozenset({"special_function", "special_function_with_opt", "get_time", "toggle",
                   "set_config", "python", "empty_args"})

# (reply, content, calls, reasoning)
CASES = [
    ("Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", [], None),
    ("<|tool_call_start|>[special_function(arg1=1)]<|tool_call_end|>", "",
     [("special_function", {"arg1": 1})], None),
    ('<|tool_call_start|>[get_time(city="XYZCITY")]<|tool_call_end|>', "",
     [("get_time", {"city": "XYZCITY"})], None),
    ("<|tool_call_start|>[toggle(enabled=True)]<|tool_call_end|>", "", [("toggle", {"enabled": True})],
     None),
    ('<|tool_call_start|>[set_config(config={"enabled": True, "count": 3, "note": null})]'
     "<|tool_call_end|>", "", [("set_config", {"config": {"enabled": True, "count": 3, "note": None}})],
     None),
    ("<|tool_call_start|>[python(code=\"def hello():\\n    print('hey')\")]<|tool_call_end|>", "",
     [("python", {"code": "def hello():\n    print('hey')"})], None),
    ('Let me check the time.<|tool_call_start|>[get_time(city="Paris")]<|tool_call_end|>',
     "Let me check the time.", [("get_time", {"city": "Paris"})], None),
    ("<|tool_call_start|>[special_function(arg1=1), special_function_with_opt(arg1=1, arg2=2)]"
     "<|tool_call_end|>Checking.", "Checking.",
     [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})], None),
    ("<|tool_call_start|>[empty_args()]<|tool_call_end|>", "", [("empty_args", {})], None),
    ("Use this format: [link text](url). Example: [Wikipedia](https://www.wikipedia.org).",
     "Use this format: [link text](url). Example: [Wikipedia](https://www.wikipedia.org).", [], None),
    ('<think>Use [get_time(city="X")] maybe</think>\n<|tool_call_start|>[get_time(city="Paris")]'
     "<|tool_call_end|>", "", [("get_time", {"city": "Paris"})], 'Use [get_time(city="X")] maybe'),
    # llama.cpp's older LFM2 parser took a JSON list between the markers
    ('<|tool_call_start|>[{"name": "get_time", "arguments": {"city": "Paris"}, "id": "1"}]'
     "<|tool_call_end|>", "", [("get_time", {"city": "Paris"})], None),
]


def spec() -> ReplySpec:
    return ReplySpec(format=FMT, think=True, names=NAMES)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_detected_from_each_template(name):
    assert formats.detect(TEMPLATES[name]).name == "lfm2"


@pytest.mark.parametrize("reply, content, calls, reasoning", CASES)
def test_replies_whole_cut_and_streamed(reply, content, calls, reasoning):
    msg = whole(spec(), reply)
    assert (msg["content"] or "") == content
    assert calls_of(msg) == calls
    assert msg.get("reasoning_content") == reasoning
    assert_streams_as_whole(spec(), reply, MARKUP)
    assert_only_grows(spec(), reply)


def test_a_cut_call_streams_what_it_has():
    msg = whole(spec(), "<|tool_call_start|>[special_function(arg1=")
    assert "tool_calls" not in msg and not msg["content"]


HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Time in Paris and Oslo?"},
    {"role": "assistant", "content": None, "reasoning_content": "Two cities.", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {
            "name": "get_time", "arguments": json.dumps({"city": "Paris", "utc": True})}},
        {"id": "call_b", "type": "function", "function": {
            "name": "get_time", "arguments": json.dumps({"city": "Oslo", "utc": None})}}]},
    {"role": "tool", "tool_call_id": "call_a", "content": "10:00"},
    {"role": "tool", "tool_call_id": "call_b", "content": "10:00"},
    {"role": "assistant", "content": "Both 10:00."},
    {"role": "user", "content": "And Rome?"},
]
TOOLS = [{"type": "function", "function": {"name": "get_time", "description": "Time",
                                           "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("name, shown", [
    ("LFM2-8B-A1B", '<|im_start|>assistant\n<|tool_call_start|>[get_time(city="Paris", utc=True), '
                    'get_time(city="Oslo", utc=None)]<|tool_call_end|><|im_end|>\n'
                    "<|im_start|>tool\n<|tool_response_start|>10:00<|tool_response_end|><|im_end|>"),
    ("LFM2.5-Instruct", '<|im_start|>assistant\n<|tool_call_start|>[get_time(city="Paris", '
                        'utc=True), get_time(city="Oslo", utc=None)]<|tool_call_end|><|im_end|>\n'
                        "<|im_start|>tool\n10:00<|im_end|>"),
    ("LFM2.5-8B-A1B", "<|im_start|>assistant\n<|tool_call_start|>"
                      "[get_time(city='Paris', utc=True), get_time(city='Oslo', utc=None)]"
                      "<|tool_call_end|><|im_end|>\n<|im_start|>tool\n10:00<|im_end|>"),
])
def test_a_third_turn_renders_in_each_template(name, shown):
    template = TEMPLATES[name]
    fmt = formats.choose("auto", template)
    prompt = chat_template.render(template, fmt.history(HISTORY), extra={"tools": TOOLS},
                                  bos_token="<|startoftext|>")
    assert shown in prompt
    assert "<|im_start|>assistant\nBoth 10:00.<|im_end|>" in prompt
    assert "get_time" in prompt.split("<|im_start|>user")[0]  # the tools, in the system turn
    assert prompt.endswith("<|im_start|>assistant\n")


def test_a_thought_before_calls_still_answered_renders_in_lfm25():
    """Within the turn (no user turn since), LFM2.5-8B-A1B renders the thought from ``thinking``;
    a template that renders text only gets it written before the calls."""
    turn = HISTORY[:5]
    for name, shown in (("LFM2.5-8B-A1B", "<|im_start|>assistant\n<think>Two cities.</think>"
                                          "<|tool_call_start|>[get_time(city='Paris'"),
                        ("LFM2-8B-A1B", '<|im_start|>assistant\n<|tool_call_start|>[get_time(city="Paris"')):
        fmt = formats.choose("auto", TEMPLATES[name])
        assert shown in chat_template.render(TEMPLATES[name], fmt.history(turn),
                                             extra={"tools": TOOLS})


def test_random_replies_only_ever_grow():
    pieces = ["<|tool_call_start|>", "<|tool_call_end|>", "<think>", "</think>", "[", "]", "(", ")",
              "get_time", "city=", '"Paris"', "'Oslo'", ", ", "True", '{"name": "get_time", ',
              '"arguments": {}}', "hi ", "\\", "\n"]
    assert_random_replies_grow([spec(), ReplySpec(format=FMT)], pieces, "lfm2")
