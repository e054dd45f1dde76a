"""Kimi K2 (Instruct, Thinking): replies of the shapes llama.cpp's tests use, whole, cut at every
character and streamed (a call opened inside a thought included); detection from the real
templates; the ``functions.NAME:IDX`` ids Kimi's own template writes back over a second and third
turn; the grammar writing what the template renders."""

from __future__ import annotations

import json

import pytest

from app import formats, plan_options
from app.core.input import ChatInput
from app.core.plan import plan_chat
from app.engine.types import ModelInfo
from app.formats.kimi import KIMI_THINK
from app.formats.spec import ReplySpec
from app.grammar import gate
from app.protocol.tools import validate_tools
from app.settings import Settings
from tests.support.family_replies import assert_only_grows, assert_streams_as_whole, calls_of, whole
from tests.support.family_templates import KIMI_K2
from tests.support.sampling import grammar_sampler
from tests.support.server import DATA

TEMPLATES = DATA / "templates"
INSTRUCT = (TEMPLATES / "Kimi-K2-Instruct.jinja").read_text()
THINKING = (TEMPLATES / "Kimi-K2-Thinking.jinja").read_text()
LIMITS = gate.Limits.from_settings(Settings())
OPTS = plan_options(Settings())
MARKUP = ("<|tool", "<think", "</think")

S, SE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CB, A, CE = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"


def kc(name: str, i: int, args: str, end: str = CE) -> str:
    return f"{CB}functions.{name}:{i}{A}{args}{end}"


THOUGHT = {"think": True, "thought": KIMI_THINK}
# (spec, reply, content, calls, reasoning)
CASES = [
    ({}, "Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", [], None),
    ({}, S + kc("special_function", 0, '{"arg1": 1}') + SE, "", [("special_function", {"arg1": 1})], None),
    (THOUGHT, "<think>I'm thinking about this</think>" + S + kc("special_function", 0, '{"arg1": 1}') + SE,
     "", [("special_function", {"arg1": 1})], "I'm thinking about this"),
    ({}, "Hello, world!\nWhat's up?" + S + kc("special_function", 0, '{"arg1": 1}') + SE,
     "Hello, world!\nWhat's up?", [("special_function", {"arg1": 1})], None),
    (THOUGHT, S + kc("special_function", 0, '{"arg1": 1}') + kc("special_function_with_opt", 1,
                                                                   '{"arg1": 1, "arg2": 2}') + SE,
     "", [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})], None),
    ({}, S + kc("python", 0, '{"code": "def hello():\\n    print(\\"Hello, world!\\")\\n\\nhello()"}') + SE,
     "", [("python", {"code": 'def hello():\n    print("Hello, world!")\n\nhello()'})], None),
    ({}, S + kc("empty_args", 0, "{}") + SE, "", [("empty_args", {})], None),
    ({}, S + kc("special_function", 0, '{"arg1": 1}') + kc("python", 1, '{"code": "print(1)"}')
     + kc("html", 2, '{"markup": "<p>test</p>"}') + SE, "",
     [("special_function", {"arg1": 1}), ("python", {"code": "print(1)"}), ("html", {"markup": "<p>test</p>"})],
     None),
    # calls opened inside the thought: the thought ends there (with or without the section and
    # the end markers, as llama.cpp's tests have it)
    (THOUGHT, "<think>I need to call two functions" + S + kc("special_function", 0, '{"arg1": 1}')
     + kc("python", 1, '{"code": "print(\'hey\')"}') + SE, "",
     [("special_function", {"arg1": 1}), ("python", {"code": "print('hey')"})], "I need to call two functions"),
    (THOUGHT, "<think>I need to call two functions" + kc("special_function", 0, '{"arg1": 1}', "")
     + kc("python", 1, '{"code": "print(\'hey\')"}', ""), "",
     [("special_function", {"arg1": 1}), ("python", {"code": "print('hey')"})], "I need to call two functions"),
    ({}, kc("execute_command", 0, '{"command": "ls -lah", "cwd": "/home/user", "timeout": 10}', ""), "",
     [("execute_command", {"command": "ls -lah", "cwd": "/home/user", "timeout": 10})], None),
    # a call whose arguments are not JSON does not count
    ({}, S + kc("f", 0, "not json") + SE, "", [], None),
]


@pytest.mark.parametrize("extra, reply, content, calls, reasoning", CASES,
                         ids=[str(i) for i in range(len(CASES))])
def test_replies_whole_cut_and_streamed(extra, reply, content, calls, reasoning):
    s = ReplySpec(formats.get("kimi"), **extra)
    msg = whole(s, reply)
    assert (msg["content"] or "") == content
    assert msg.get("reasoning_content") == reasoning
    assert calls_of(msg) == calls
    if calls:
        assert_streams_as_whole(s, reply, MARKUP)
    assert_only_grows(s, reply)


def test_a_reply_cut_by_max_tokens_keeps_its_complete_calls():
    reply = S + kc("a", 0, '{"x": 1}') + CB + "functions.b:1" + A + '{"y": '
    msg = whole(ReplySpec(formats.get("kimi")), reply)
    assert calls_of(msg) == [("a", {"x": 1})] and not msg["content"]


def test_detected_from_the_real_templates():
    for text in (INSTRUCT, THINKING, (TEMPLATES / "Kimi-K2-Thinking.jinja").read_text(), KIMI_K2):
        assert formats.detect(text).name == "kimi"
    assert formats.detect_reasoning(THINKING) is KIMI_THINK
    assert formats.detect_reasoning(KIMI_K2) is KIMI_THINK
    assert formats.detect_reasoning(INSTRUCT) is None  # Instruct does not think
    for path in sorted(TEMPLATES.glob("*.jinja")):
        if "kimi" not in path.name.lower():
            assert formats.detect(path.read_text()).name != "kimi", path.name
            assert formats.detect_reasoning(path.read_text()) is not KIMI_THINK, path.name


# ---- the history: Kimi's ids ----------------------------------------------------------------

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}}
TOOLS = tuple(validate_tools([WEATHER]))


def call(id_: str, city: str) -> dict:
    return {"id": id_, "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}


TURNS = [
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {"role": "assistant", "content": "", "reasoning_content": "Two cities.",
     "tool_calls": [call("cid-paris", "Paris"), call("cid-oslo", "Oslo")]},
    {"role": "tool", "tool_call_id": "cid-oslo", "content": "snow"},  # answered out of order
    {"role": "tool", "tool_call_id": "cid-paris", "content": "sun"},
    {"role": "assistant", "content": "Sun in Paris, snow in Oslo."},
    {"role": "user", "content": "And Rome?"},
    {"role": "assistant", "content": "", "tool_calls": [call("cid-rome", "Rome")]},
    {"role": "tool", "tool_call_id": "cid-rome", "content": "rain"},
]


def prompt(template: str, messages: list, **kw) -> str:
    info = ModelInfo(name="m", path="m.gguf", n_ctx=4096, n_ctx_train=4096, chat_template=template,
                     bos_token="", eos_token="<|im_end|>", created=0)
    kw.setdefault("tools", TOOLS)
    return plan_chat(info, ChatInput(messages=messages, **kw), OPTS).generation.prompt


def test_ids_are_kimis_own_and_each_result_points_at_its_call():
    p = prompt(KIMI_K2, TURNS)
    paris = kc("get_weather", 0, '{"city": "Paris"}')
    oslo = kc("get_weather", 1, '{"city": "Oslo"}')
    rome = kc("get_weather", 2, '{"city": "Rome"}')
    assert paris + oslo in p and rome in p, p
    assert "## Return of functions.get_weather:1\nsnow" in p
    assert "## Return of functions.get_weather:0\nsun" in p
    assert "## Return of functions.get_weather:2\nrain" in p
    assert not any(old in p for old in ("cid-paris", "cid-oslo", "cid-rome"))


def test_results_without_known_ids_go_to_the_earliest_unanswered_call():
    turns = [dict(m) for m in TURNS[:4]]
    turns[2]["tool_call_id"] = "unknown"
    del turns[3]["tool_call_id"]
    p = prompt(KIMI_K2, turns)
    assert "## Return of functions.get_weather:0\nsnow" in p
    assert "## Return of functions.get_weather:1\nsun" in p


def test_llama_cpps_copies_need_a_mutable_sandbox():
    """llama.cpp's copies of Kimi's templates count the ids in a list they append to, which the
    sandbox (transformers' too) refuses: Kimi's own templates take the ids as given."""
    with pytest.raises(Exception, match="unsafe"):
        prompt(INSTRUCT, TURNS[:4])


def test_the_thought_of_a_turn_is_passed_on():
    assert "<think>Two cities.</think>" in prompt(KIMI_K2, TURNS[:4])


def test_the_forced_call_grammar_writes_what_the_template_renders(vocab):
    fmt = formats.choose("auto", KIMI_K2)
    grammar = fmt.grammar(list(TOOLS), parallel=True, required=True, template=KIMI_K2,
                          limits=LIMITS)
    text = S + kc("get_weather", 3, '{"city": "Paris"}') + kc("get_weather", 4, '{"city": "Oslo"}') + SE
    s = grammar_sampler(vocab, grammar)
    try:
        assert s.feed(text.encode()) and s.allows(int(vocab.eog_ids[0]))
    finally:
        s.free()
