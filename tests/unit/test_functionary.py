"""Functionary v3.2: detection from its template, the reply scanner on llama.cpp's test replies
(whole, cut at every character, streamed), raw python code, the grammar under auto (text for
``all`` cannot hold ``>>>``; calls after it), and the history a second and third turn render."""

from __future__ import annotations

import json

import pytest

from app import formats
from app.formats import chat_template
from app.formats.spec import ReplySpec, string_params
from app.grammar import gate
from app.protocol.tools import validate_tools
from app.settings import Settings
from tests.support.family_replies import (
    assert_only_grows,
    assert_random_replies_grow,
    assert_streams_as_whole,
    calls_of,
    whole,
)
from tests.support.sampling import grammar_sampler
from tests.support.server import DATA

TEMPLATE = (DATA / "templates" / "meetkai-functionary-medium-v3.2.jinja").read_text()
FMT = formats.get("functionary_v3_2")
MARKUP = (">>>", "all\n")
PY = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}
NAMES = frozenset({"special_function", "special_function_with_opt", "python"})

# (reply, content, calls)
CASES = [
    ("all\nHello, world!\nWhat's up?", "Hello, world!\nWhat's up?", []),
    ('special_function\n{"arg1": 1}', "", [("special_function", {"arg1": 1})]),
    ('all\nLet me check > and >> too.>>>special_function\n{"arg1": 1}>>>special_function_with_opt\n'
     '{"arg1": 1, "arg2": "a>>>b"}', "Let me check > and >> too.",
     [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": "a>>>b"})]),
    ("python\n# This is a program:\nprint('hey \"there\"')\n", "",
     [("python", {"code": "# This is a program:\nprint('hey \"there\"')"})]),
    ('python\n{"code": "print(1)"}', "", [("python", {"code": "print(1)"})]),
    ("python\nx = 1 >> 2\n>>>all\nDone.", "Done.", [("python", {"code": "x = 1 >> 2"})]),
    ("Hello there, no recipient", "Hello there, no recipient", []),
    ("special_function\nsorry, words", "sorry, words", []),
]


def spec(**kw) -> ReplySpec:
    return ReplySpec(format=FMT, names=NAMES, string_params={"python": string_params(PY)}, **kw)


def test_detected_from_its_template():
    assert formats.detect(TEMPLATE).name == "functionary_v3_2"
    assert formats.detect_reasoning(TEMPLATE) is None


@pytest.mark.parametrize("reply, content, calls", CASES)
def test_replies_whole_cut_and_streamed(reply, content, calls):
    msg = whole(spec(), reply)
    assert (msg["content"] or "") == content
    assert calls_of(msg) == calls
    assert_streams_as_whole(spec(), reply, MARKUP if calls else (">>>",))
    assert_only_grows(spec(), reply)


def test_without_tools_the_recipient_is_dropped_and_no_call_counts():
    bare = ReplySpec(format=FMT)
    assert whole(bare, "all\nHi>>>all\n there")["content"] == "Hi there"
    msg = whole(bare, 'special_function\n{"arg1": 1}')
    assert "tool_calls" not in msg and not msg["content"]


def test_arguments_that_are_not_json_never_count():
    msg = whole(spec(), 'special_function\n{"arg1": oops}>>>all\nok')
    assert "tool_calls" not in msg and msg["content"] == "ok"


LIMITS = gate.Limits.from_settings(Settings())
TOOLS = validate_tools([
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "python", "parameters": PY}}])


@pytest.mark.parametrize("required, parallel, text, ok", [
    (True, False, 'get_weather\n{"city": "Paris"}', True),
    (True, False, "python\nprint(1)", True),
    (True, False, "all\nHello", False),
    (True, False, 'get_weather\n{"city": "Paris"}>>>get_weather\n{"city": "Oslo"}', False),
    (True, True, 'get_weather\n{"city": "Paris"}>>>get_weather\n{"city": "Oslo"}', True),
    (False, False, "all\nHello > there >> you", True),
    (False, False, "all\nHello >>>get_weather\n{\"city\": \"Paris\"}", True),
    (False, False, "all\nHello >>>all\n", False),
    (False, False, 'get_weather\n{"town": "Paris"}', False),
])
def test_the_grammar(vocab, required, parallel, text, ok):
    grammar = FMT.grammar(TOOLS, parallel=parallel, required=required, limits=LIMITS)
    gate.check(grammar, "tools", LIMITS)
    s = grammar_sampler(vocab, grammar)
    try:
        fed = s.feed(text.encode())
        assert (fed and s.allows(int(vocab.eog_ids[0]))) == ok
    finally:
        s.free()


HISTORY = [
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}},
        {"id": "call_b", "type": "function", "function": {
            "name": "python", "arguments": {"code": "print('Oslo')"}}}]},
    {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_b", "content": "Oslo"},
    {"role": "assistant", "content": "Sunny."},
    {"role": "user", "content": "And Rome?"},
]


def test_a_third_turn_renders_calls_as_the_model_wrote_them():
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                               "parameters": {"type": "object"}}}]
    prompt = chat_template.render(TEMPLATE, FMT.history(HISTORY), extra={"tools": tools})
    assert ('<|start_header_id|>assistant<|end_header_id|>\n\n>>>all\nChecking.>>>get_weather\n'
            '{"city": "Paris"}>>>python\nprint(\'Oslo\')<|eot_id|>') in prompt
    assert "<|start_header_id|>tool<|end_header_id|>\n\nsunny<|eot_id|>" in prompt
    assert ">>>all\nSunny.<|eot_id|>" in prompt
    assert prompt.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n>>>")


def test_random_replies_only_ever_grow():
    pieces = ["all\n", ">>>", ">", "python\n", "special_function\n", '{"arg1": 1}', "{", "}", '"',
              "print(1)", " ", "\n", "hi", "all", "special_function"]
    assert_random_replies_grow([spec(), ReplySpec(format=FMT)], pieces, "functionary")
