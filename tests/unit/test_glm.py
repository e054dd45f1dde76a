"""GLM 4.5 / 4.6 / 4.7: replies of the shapes llama.cpp's tests use, whole, cut at every character
and streamed; detection from the real templates (before Hermes, whose ``<tool_call>`` they
share); the history over a second and third turn; ``enable_thinking`` (4.6's ``/nothink``); the
grammar writing what each template renders."""

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
GLM46 = (TEMPLATES / "GLM-4.6.jinja").read_text()
GLM47 = (TEMPLATES / "GLM-4.7-Flash.jinja").read_text()
LIMITS = gate.Limits.from_settings(Settings())
OPTS = plan_options(Settings())
MARKUP = ("<tool_call", "<arg_", "</arg_", "<think", "</think")


def glm(name: str, *pairs: tuple[str, str], nl: str = "") -> str:
    body = "".join(f"<arg_key>{k}</arg_key>{nl}<arg_value>{v}</arg_value>{nl}" for k, v in pairs)
    return f"<tool_call>{name}{nl}{body}</tool_call>"


STRINGS = {"magic_int": frozenset({"name"}), "edit": frozenset({"code"}),
           "get_time": frozenset({"city"})}
OPEN = {"think": True, "in_thought": True}
# (spec, reply, content, calls, reasoning)
CASES = [
    ({}, glm("special_function", ("arg1", "1"), nl="\n"), "", [("special_function", {"arg1": 1})], None),
    ({}, "Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", [], None),
    (OPEN, "I'm\nthinking</think>Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", [], "I'm\nthinking"),
    ({}, glm("special_function", ("arg1", "1")), "", [("special_function", {"arg1": 1})], None),
    (OPEN, "I'm\nthinking</think>" + glm("special_function", ("arg1", "1")), "",
     [("special_function", {"arg1": 1})], "I'm\nthinking"),
    ({}, glm("special_function", ("arg1", "1")) + glm("special_function_with_opt", ("arg1", "1"), ("arg2", "2")),
     "", [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})], None),
    # a tool without arguments: <tool_call>name</tool_call>
    (OPEN, "Let me read the diff content.</think><tool_call>read_file_diff_md</tool_call>", "",
     [("read_file_diff_md", {})], "Let me read the diff content."),
    ({"think": True}, "\n<think>Checking.</think>\nPreparing updates." + "\n"
     + glm("magic_int", ("ref", "42"), ("name", "上海"), nl="\n") + "\n"
     + glm("set_config", ("config", '{"source": "spark", "options": {"strict": true}}'), nl="\n") + "\n"
     + glm("nested_args", ("tags", '["alpha", "测试"]')) + glm("empty_args"),
     "Preparing updates.",
     [("magic_int", {"ref": 42, "name": "上海"}),
      ("set_config", {"config": {"source": "spark", "options": {"strict": True}}}),
      ("nested_args", {"tags": ["alpha", "测试"]}), ("empty_args", {})], "Checking."),
    # a string typed as such stays text even when it reads as JSON; quotes, newlines, markup
    ({}, glm("get_time", ("city", "42")) + glm("edit", ("code", 'a < b\n  "q" \\ </arg_val')),
     "", [("get_time", {"city": "42"}), ("edit", {"code": 'a < b\n  "q" \\ </arg_val'})], None),
    # Hermes' JSON inside <tool_call> is not GLM's: it stays text
    ({}, '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
     '<tool_call>{"name": "f", "arguments": {}}</tool_call>', [], None),
]


@pytest.mark.parametrize("extra, reply, content, calls, reasoning", CASES,
                         ids=[str(i) for i in range(len(CASES))])
def test_replies_whole_cut_and_streamed(extra, reply, content, calls, reasoning):
    s = ReplySpec(formats.get("glm"), string_params=STRINGS, **extra)
    msg = whole(s, reply)
    assert (msg["content"] or "") == content
    assert msg.get("reasoning_content") == reasoning
    assert calls_of(msg) == calls
    if calls:
        assert_streams_as_whole(s, reply, MARKUP)
    assert_only_grows(s, reply)


def test_a_reply_cut_by_max_tokens_keeps_its_complete_calls():
    reply = glm("a", ("x", "1")) + "<tool_call>b<arg_key>y</arg_key><arg_value>2"
    msg = whole(ReplySpec(formats.get("glm")), reply)
    assert calls_of(msg) == [("a", {"x": 1})] and not msg["content"]


def test_detected_from_the_real_templates_before_hermes():
    for text in (GLM46, GLM47):
        assert formats.detect(text).name == "glm"
        assert formats.detect_reasoning(text) is formats.THINK
    assert formats.choose("auto", GLM47).compact and not formats.choose("auto", GLM46).compact
    for path in sorted(TEMPLATES.glob("*.jinja")):
        if "GLM" not in path.name:
            assert formats.detect(path.read_text()).name != "glm", path.name


# ---- the prompt: history, thinking ------------------------------------------------------------

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
    {"role": "assistant", "content": "", "reasoning_content": "Two cities.",
     "tool_calls": [call("c1", {"city": "Paris"}), call("c2", {"city": "Oslo", "days": 2})]},
    {"role": "tool", "tool_call_id": "c1", "content": "sun"},
    {"role": "tool", "tool_call_id": "c2", "content": "snow"},
    {"role": "assistant", "content": "Sun in Paris, snow in Oslo."},
    {"role": "user", "content": "And Rome?"},
    {"role": "assistant", "content": "", "tool_calls": [call("c3", {"city": "Rome"})]},
    {"role": "tool", "tool_call_id": "c3", "content": "rain"},
]


def prompt(template: str, messages: list, **kw) -> str:
    info = ModelInfo(name="m", path="m.gguf", n_ctx=4096, n_ctx_train=4096, chat_template=template,
                     bos_token="", eos_token="<|endoftext|>", created=0)
    kw.setdefault("tools", TOOLS)
    return plan_chat(info, ChatInput(messages=messages, **kw), OPTS).generation.prompt


@pytest.mark.parametrize("template, shown", [
    (GLM46, glm("get_weather", ("city", "Oslo"), ("days", "2"), nl="\n")),
    (GLM47, glm("get_weather", ("city", "Oslo"), ("days", "2"))),
])
def test_second_and_third_turns_render_the_calls_and_results(template, shown):
    second = prompt(template, TURNS[:5])
    assert shown in second and "sun" in second and "snow" in second, second[-600:]
    assert "<think>Two cities.</think>" in second  # the turn in progress keeps its thought
    third = prompt(template, TURNS)
    assert shown in third and "rain" in third and "Sun in Paris, snow in Oslo." in third
    assert "Two cities." not in third  # an earlier turn's thought is dropped by the template


def test_enable_thinking_off():
    user = [{"role": "user", "content": "hi"}]
    assert prompt(GLM46, user, thinking=False).endswith("hi/nothink<|assistant|>\n<think></think>")
    assert prompt(GLM46, user).endswith("hi<|assistant|>")  # the model opens its thought itself
    assert prompt(GLM47, user).endswith("<|assistant|><think>")
    assert prompt(GLM47, user, thinking=False).endswith("<|assistant|></think>")


@pytest.mark.parametrize("template, text", [
    (GLM46, glm("get_weather", ("city", "Paris"), ("days", "3"), nl="\n") + "\n"
     + glm("get_weather", ("city", "Oslo"), nl="\n")),
    (GLM47, glm("get_weather", ("city", "Paris")) + glm("get_weather", ("city", "Oslo"), ("days", "1"))),
])
def test_the_forced_call_grammar_writes_what_the_template_renders(vocab, template, text):
    fmt = formats.choose("auto", template)
    grammar = fmt.grammar(list(TOOLS), parallel=True, required=True, template=template, limits=LIMITS)
    s = grammar_sampler(vocab, grammar)
    try:
        assert s.feed(text.encode()) and s.allows(int(vocab.eog_ids[0]))
    finally:
        s.free()
