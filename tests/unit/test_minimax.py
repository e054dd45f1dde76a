"""MiniMax M2: replies of the shapes llama.cpp's tests use, whole, cut at every character and
streamed (the prompt opens the thought); detection from the real template; the history over a
second and third turn, the thoughts kept as its template wants; the grammar writing what the
template renders."""

from __future__ import annotations

import json

import pytest

from app import formats, plan_options
from app.core.input import ChatInput
from app.core.plan import plan_chat
from app.engine.types import ModelInfo
from app.formats.spec import ReplySpec
from app.grammar import gate
from app.protocol.tools import validate_tools
from app.settings import Settings
from tests.support.family_replies import assert_only_grows, assert_streams_as_whole, calls_of, whole
from tests.support.sampling import grammar_sampler
from tests.support.server import DATA

TEMPLATES = DATA / "templates"
M2 = (TEMPLATES / "MiniMax-M2.jinja").read_text()
LIMITS = gate.Limits.from_settings(Settings())
OPTS = plan_options(Settings())
MARKUP = ("<minimax", "</minimax", "<invoke", "<parameter", "<think", "</think")
B, E = "<minimax:tool_call>", "</minimax:tool_call>"


def invoke(name: str, *params: tuple[str, str]) -> str:
    body = "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in params)
    return f'<invoke name="{name}">\n{body}</invoke>\n'


STRINGS = {"get_time": frozenset({"city"}), "write": frozenset({"text", "path"})}
OPEN = {"think": True, "in_thought": True}
# (spec, reply, content, calls, reasoning)
CASES = [
    (OPEN, "\n</think>\n\nHello, world!\nWhat's up?", "Hello, world!\nWhat's up?", [], "\n"),
    (OPEN, "I'm\nthinking\n</think>\n\nHello, world!\nWhat's up?", "Hello, world!\nWhat's up?", [],
     "I'm\nthinking\n"),
    (OPEN, f"Let's call a tool:\n</think>\n\n{B}\n" + invoke("empty_args") + E, "",
     [("empty_args", {})], "Let's call a tool:\n"),
    (OPEN, f"\n</think>\n\n{B}\n" + invoke("special_function", ("arg1", "1")) + E, "",
     [("special_function", {"arg1": 1})], "\n"),
    # several invokes in one block, content before it, strings bare, others JSON
    ({}, f"Checking both.\n{B}\n" + invoke("get_time", ("city", "Paris"))
     + invoke("special_function_with_opt", ("arg1", "1"), ("arg2", '{"deep": [1, 2]}')) + E,
     "Checking both.", [("get_time", {"city": "Paris"}),
                        ("special_function_with_opt", {"arg1": 1, "arg2": {"deep": [1, 2]}})], None),
    # a string value as written: newlines, quotes, backslashes, markup that is not its end
    ({}, f"{B}\n" + invoke("write", ("path", "a.txt"), ("text", 'x < y\n"q" \\ </param </parameter')) + E,
     "", [("write", {"path": "a.txt", "text": 'x < y\n"q" \\ </param </parameter'})], None),
    ({}, "No tools: <invoke> is just a word.", "No tools: <invoke> is just a word.", [], None),
]


@pytest.mark.parametrize("extra, reply, content, calls, reasoning", CASES,
                         ids=[str(i) for i in range(len(CASES))])
def test_replies_whole_cut_and_streamed(extra, reply, content, calls, reasoning):
    s = ReplySpec(formats.get("minimax"), string_params=STRINGS, **extra)
    msg = whole(s, reply)
    assert (msg["content"] or "") == content
    assert msg.get("reasoning_content") == reasoning
    assert calls_of(msg) == calls
    if calls:
        assert_streams_as_whole(s, reply, MARKUP)
    assert_only_grows(s, reply)


def test_a_reply_cut_by_max_tokens_keeps_its_complete_calls():
    reply = f"{B}\n" + invoke("a", ("x", "1")) + '<invoke name="b">\n<parameter name="y">tex'
    msg = whole(ReplySpec(formats.get("minimax")), reply)
    assert calls_of(msg) == [("a", {"x": 1})] and not msg["content"]


def test_detected_from_the_real_template():
    assert formats.detect(M2).name == "minimax"
    assert formats.detect_reasoning(M2) is formats.THINK
    for path in sorted(TEMPLATES.glob("*.jinja")):
        if "MiniMax" not in path.name:
            assert formats.detect(path.read_text()).name != "minimax", path.name


# ---- the prompt: history and thoughts ---------------------------------------------------------

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                           "days": {"type": "integer"}},
                          "required": ["city"]}}}
TOOLS = tuple(validate_tools([WEATHER]))


def call(id_: str, args: dict) -> dict:
    return {"id": id_, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(args)}}


TURNS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {"role": "assistant", "content": "", "reasoning_content": "Two cities: two calls.",
     "tool_calls": [call("c1", {"city": "Paris"}), call("c2", {"city": "Oslo", "days": 2})]},
    {"role": "tool", "tool_call_id": "c1", "content": "sun"},
    {"role": "tool", "tool_call_id": "c2", "content": "snow"},
    {"role": "assistant", "content": "Sun in Paris, snow in Oslo.", "reasoning_content": "Easy."},
    {"role": "user", "content": "And Rome?"},
    {"role": "assistant", "content": "", "reasoning_content": "One more.",
     "tool_calls": [call("c3", {"city": "Rome"})]},
    {"role": "tool", "tool_call_id": "c3", "content": "rain"},
]


def prompt(messages: list, **kw) -> str:
    info = ModelInfo(name="m", path="m.gguf", n_ctx=4096, n_ctx_train=4096, chat_template=M2,
                     bos_token="", eos_token="[e~[", created=0)
    kw.setdefault("tools", TOOLS)
    return plan_chat(info, ChatInput(messages=messages, **kw), OPTS).generation.prompt


def test_second_and_third_turns_render_calls_results_and_the_thoughts_it_keeps():
    shown = ('<invoke name="get_weather">\n<parameter name="city">Oslo</parameter>\n'
             '<parameter name="days">2</parameter>\n</invoke>\n' + E)
    second = prompt(TURNS[:5])
    assert shown in second and "sun" in second and "snow" in second, second[-600:]
    assert "<think>\nTwo cities: two calls.\n</think>" in second  # the turn in progress
    assert second.endswith("]~b]ai\n<think>\n")
    third = prompt(TURNS)
    assert shown in third and "rain" in third and "<think>\nOne more.\n</think>" in third
    assert "Two cities" not in third and "Easy." not in third  # before the last user turn


def test_the_forced_call_grammar_writes_what_the_template_renders(vocab):
    grammar = formats.get("minimax").grammar(list(TOOLS), parallel=True, required=True,
                                             template=M2, limits=LIMITS)
    text = (f"{B}\n" + invoke("get_weather", ("city", "Paris"), ("days", "3"))
            + invoke("get_weather", ("city", "Oslo")) + E)
    s = grammar_sampler(vocab, grammar)
    try:
        assert s.feed(text.encode()) and s.allows(int(vocab.eog_ids[0]))
    finally:
        s.free()
