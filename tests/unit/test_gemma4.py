"""Gemma 4: detection from its templates, its call syntax read into JSON (whole, cut at every
character, streamed), its thought channel, the history its templates read, the grammar that
forces its calls. Reply texts are the shapes llama.cpp's tests give its Gemma 4 parser."""

from __future__ import annotations

import json
import random

import pytest

from app import formats
from app.core.decode import ReplyStream
from app.formats import chat_template
from app.formats.gemma4 import CHANNEL_THOUGHT, Gemma4
from app.formats.gemma4_args import read_args, to_gemma
from app.formats.reply import parse_reply
from app.formats.spec import ReplySpec
from app.grammar import gate
from app.protocol.tools import validate_tools
from app.settings import Settings
from tests.support.reply_checks import check_reply, grows, message
from tests.support.sampling import grammar_sampler
from tests.support.server import DATA

TEMPLATES = DATA / "templates"
NEW, OLD = "google-gemma-4-31B-it", "google-gemma-4-31B-it-interleaved"  # gathers tool turns, or not
LIMITS = gate.Limits.from_settings(Settings())
Q = '<|"|>'
MARKUP = ("<|tool_call", "<tool_call|", "call:", Q, "<|channel", "<channel|", "<|tool_response")
# a Gemma 3 template (its real one, reduced): turns, no tools, no thoughts
GEMMA3 = ("{{ bos_token }}{% for m in messages %}{{ '<start_of_turn>' + ('model' if m['role'] == "
          "'assistant' else m['role']) + '\\n' + m['content'] | trim + '<end_of_turn>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}")


def spec(**kw) -> ReplySpec:
    return ReplySpec(formats.get("gemma4"), thought=CHANNEL_THOUGHT, **kw)


def call(name: str, args: str) -> str:
    return f"<|tool_call>call:{name}{args}<tool_call|>"


# (reply, think, content, calls [(name, arguments)], reasoning)
CASES = [
    ("Hello, world!", False, "Hello, world!", [], None),
    ("<|channel>thought\nI'm\nthinking<channel|>Hello, world!\nWhat's up?", True,
     "Hello, world!\nWhat's up?", [], "I'm\nthinking"),
    ("<|channel>thought<channel|>Hello, world!", True, "Hello, world!", [], ""),
    (call("get_time", f"{{city:{Q}London{Q}}}"), False, "", [("get_time", {"city": "London"})], None),
    (call("get_time", f"{{city:{Q}San Francisco{Q}}}"), False, "",
     [("get_time", {"city": "San Francisco"})], None),
    (call("empty_args", "{}"), False, "", [("empty_args", {})], None),
    ("Hello, world!\nWhat's up?" + call("get_time", f"{{city:{Q}Paris{Q}}}"), False,
     "Hello, world!\nWhat's up?", [("get_time", {"city": "Paris"})], None),
    ("<|channel>thought\nI'm\nthinking<channel|>" + call("get_time", f"{{city:{Q}Paris{Q}}}"), True,
     "", [("get_time", {"city": "Paris"})], "I'm\nthinking"),
    (call("get_time", f"{{city:{Q}London{Q}}}") + call("get_weather", f"{{city:{Q}Paris{Q}}}"), False,
     "", [("get_time", {"city": "London"}), ("get_weather", {"city": "Paris"})], None),
    (call("special_function", "{arg1:-7}"), False, "", [("special_function", {"arg1": -7})], None),
    (call("amount", "{orig:1.5e10}") + call("amount", "{orig:3.14}"), False, "",
     [("amount", {"orig": 1.5e10}), ("amount", {"orig": 3.14})], None),
    (call("toggle", "{enabled:true,off:false,value:null}"), False, "",
     [("toggle", {"enabled": True, "off": False, "value": None})], None),
    (call("todo_list", f"{{todos:[{Q}buy milk{Q},{Q}walk dog{Q}],none:[]}}"), False, "",
     [("todo_list", {"todos": ["buy milk", "walk dog"], "none": []})], None),
    (call("set_config", f"{{config:{{theme:{Q}dark{Q},count:3,deep:{{}}}}}}"), False, "",
     [("set_config", {"config": {"theme": "dark", "count": 3, "deep": {}}})], None),
    # a string holds anything but its delimiter: quotes, backslashes, braces, markup, newlines
    (call("write", f'{{text:{Q}say "hi" \\ {{a:1}} <b>\n\té \U0001d11e{Q}}}'), False, "",
     [("write", {"text": 'say "hi" \\ {a:1} <b>\n\té \U0001d11e'})], None),
    # what the model writes beside the grammar: spaces, a quoted key, a trailing comma, Python
    (call("f", f"{{ {Q}a b{Q} : 1 , c : True , d:None, }}"), False, "",
     [("f", {"a b": 1, "c": True, "d": None})], None),
    # llama.cpp's edge cases: empty channels at the end, a stray <channel|>, a doubled <|channel>
    ("<|channel>thought\n<channel|>Hello, world!\nWhat's up?<channel|>", True,
     "Hello, world!\nWhat's up?", [], ""),
    ("<|channel>thought\n<channel|>Hello, world!\nWhat's up?<|channel>thought\n<channel|>", True,
     "Hello, world!\nWhat's up?", [], ""),
    ("<|channel>thought\n<channel|>Hello, world!\nWhat's up?<|channel>thought\n<channel|><channel|>", True,
     "Hello, world!\nWhat's up?", [], ""),
    ("<|channel><|channel>thought\n<channel|>Hello, world!\nWhat's up?", True,
     "Hello, world!\nWhat's up?", [], ""),
    # a later channel is not the reply's thought: dropped
    ("<|channel>thought\nfirst<channel|>Hi <|channel>thought\nsecond<channel|>there.", True,
     "Hi there.", [], "first"),
    # markup that does not follow the syntax is text
    ("<|tool_call>nope", False, "<|tool_call>nope", [], None),
]
IDS = [f"gemma4-{i}" for i in range(len(CASES))]


def parsed(reply: str, think: bool, final: bool = True):
    return parse_reply(reply, spec(think=think), [], final=final)


@pytest.mark.parametrize("reply, think, content, calls, reasoning", CASES, ids=IDS)
def test_reply_whole_cut_at_every_character_and_streamed(reply, think, content, calls, reasoning):
    """The whole parse; two pieces cut anywhere and one character at a time give its deltas (id
    and name once, arguments concatenating to the final JSON); every prefix's parse extends the
    one before; no content delta carries Gemma's markup (unless the reply's text is markup)."""
    markup = () if any(m in content for m in MARKUP) else MARKUP
    check_reply(spec(think=think), reply, content, calls, reasoning, markup)


def test_a_call_cut_by_max_tokens_never_counts_and_shows_no_markup():
    reply = "Sure." + call("a", "{x:1}") + f"<|tool_call>call:b{{y:{Q}unfinished"
    msg = message(parsed(reply, False))
    assert msg["content"] == "Sure." and [c["function"]["name"] for c in msg["tool_calls"]] == ["a"]
    reply = parsed(reply, False)
    assert [c.complete for c in reply.calls] == [True, False]
    assert reply.calls[1].arguments == '{"y": "unfinished'


def test_the_thought_streams_and_a_call_inside_it_never_counts():
    reply = "<|channel>thought\nmaybe " + call("a", "{x:1}") + " no"
    r = parsed(reply, True, final=False)
    assert not r.calls and r.content == "" and r.reasoning.startswith("maybe <|tool_call>")


def test_arguments_written_by_the_template_read_back_as_the_values():
    rng = random.Random(4)
    words = ["", "a b", 'q"uote', "back\\slash", "{x:1}", "<b>", "line\nbreak", "é"]

    def value(depth: int):
        kind = rng.randrange(7 if depth < 3 else 5)
        return [lambda: rng.choice(words), lambda: rng.randint(-10**6, 10**6),
                lambda: rng.choice([True, False, None]), lambda: rng.random() * 1e3,
                lambda: -rng.random(),
                lambda: [value(depth + 1) for _ in range(rng.randrange(3))],
                lambda: {f"k{i}": value(depth + 1) for i in range(rng.randrange(3))}][kind]()

    for _ in range(200):
        args = {f"p{i}": value(0) for i in range(rng.randrange(4))}
        text = to_gemma(args)
        out, end = read_args(text, 0, final=True)
        assert end == len(text) and json.loads(out) == args, text


def test_arguments_that_are_not_gemmas_syntax():
    for bad in ("{a}", "{a:}", "{a:1]", "{:1}", "[1]", "{a:1 b:{c}}"):
        assert read_args(bad, 0, final=True)[1] == -1, bad
    assert read_args("{a:1", 0) == ('{"a": ', None)  # a number may still go on


# ---- detection ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [NEW, OLD])
def test_gemma4_templates_are_detected_with_their_thought_channel(name):
    template = (TEMPLATES / f"{name}.jinja").read_text()
    assert formats.detect(template).name == "gemma4"
    assert formats.detect_reasoning(template) is CHANNEL_THOUGHT


@pytest.mark.parametrize("template", [GEMMA3, (TEMPLATES / "google-gemma-2-2b-it.jinja").read_text()],
                         ids=["gemma3", "gemma2"])
def test_gemma_2_and_3_templates_have_no_tool_syntax(template):
    assert formats.detect(template).name == "generic"
    assert formats.detect_reasoning(template) is None


def test_markers_are_the_control_tokens_and_preserved():
    assert {"<|tool_call>", "<tool_call|>", Q, "<|channel>", "<channel|>"} <= set(formats.preserved_tokens())
    assert Gemma4.triggers == ("<|tool_call>",)


@pytest.mark.parametrize("thinking, effort, own, want", [
    (None, None, {}, {}),
    (True, None, {}, {"enable_thinking": True}),
    (False, None, {}, {"enable_thinking": False}),
    (None, "high", {}, {"enable_thinking": True}),
    (None, "none", {}, {"enable_thinking": False}),
    (False, None, {"enable_thinking": True}, {"enable_thinking": True}),  # the client's own wins
])
def test_thinking_is_enable_thinking(thinking, effort, own, want):
    assert CHANNEL_THOUGHT.controls(own, effort, thinking) == want


# ---- history -----------------------------------------------------------------------------------

ADD = {"type": "function", "function": {"name": "add", "description": "Add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"]}}}
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "3+4?"},
    {"role": "assistant", "content": None, "reasoning_content": "Use add.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 3, "b": 4}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "7"},
    {"role": "assistant", "content": "It is 7."},
    {"role": "user", "content": "And 5+6, and 1+1?"},
    {"role": "assistant", "content": None, "reasoning_content": "Twice.", "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a": 5, "b": 6}'}},
        {"id": "c3", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 1}}}]},
    {"role": "tool", "tool_call_id": "c3", "content": [{"type": "text", "text": "2"}]},
    {"role": "tool", "tool_call_id": "c2", "content": "11"},
]


def render(name: str, messages: list[dict], **extra) -> str:
    template = (TEMPLATES / f"{name}.jinja").read_text()
    return chat_template.render(template, formats.get("gemma4").history(messages),
                                bos_token="<bos>", add_generation_prompt=True,
                                extra={"tools": [ADD], **extra})


@pytest.mark.parametrize("name", [NEW, OLD])
def test_second_and_third_turns_render_calls_results_and_answers(name):
    second = render(name, HISTORY[:5] + [{"role": "user", "content": "More?"}])
    assert ("<|turn>model\n<|tool_call>call:add{a:3,b:4}<tool_call|><|tool_response>response:add"
            "{value:<|\"|>7<|\"|>}<tool_response|>It is 7.<turn|>\n<|turn>user\nMore?<turn|>\n"
            "<|turn>model\n") in second
    assert "<|turn>tool" not in second and "Use add." not in second  # an earlier turn's thought
    third = render(name, HISTORY)
    assert third.count("<|turn>model\n") == 2 and "<|turn>tool" not in third
    tail = third[third.rindex("<|turn>model\n"):]
    assert tail.startswith("<|turn>model\n")
    assert ("<|tool_call>call:add{a:5,b:6}<tool_call|><|tool_call>call:add{a:1,b:1}<tool_call|>"
            "<|tool_response>response:add{value:<|\"|>2<|\"|>}<tool_response|>"
            "<|tool_response>response:add{value:<|\"|>11<|\"|>}<tool_response|>") in tail


def test_the_history_renders_as_the_later_template_renders_tool_turns_itself():
    from app.formats.base import ToolFormat

    template = (TEMPLATES / f"{NEW}.jinja").read_text()
    own = chat_template.render(template, ToolFormat.history(formats.get("gemma4"), HISTORY),
                               bos_token="<bos>", extra={"tools": [ADD]})
    assert render(NEW, HISTORY) == own
    assert "<|channel>thought\nTwice.\n<channel|>" in own  # this turn's thought, after the last user


@pytest.mark.parametrize("name", [NEW, OLD])
def test_a_json_object_result_renders_as_gemmas_response_object(name):
    messages = HISTORY[1:3] + [{"role": "tool", "tool_call_id": "c1",
                                "content": '{"sum": 7, "note": "exact", "parts": [3, 4]}'}]
    prompt = render(name, messages)
    assert ('<|tool_response>response:add{note:<|"|>exact<|"|>,parts:[3,4],sum:7}<tool_response|>'
            in prompt)
    bad = render(name, HISTORY[1:3] + [{"role": "tool", "tool_call_id": "c1", "content": "{oops"}])
    assert '<|tool_response>response:add{value:<|"|>{oops<|"|>}<tool_response|>' in bad


def test_a_turn_that_spoke_before_its_calls_gets_the_models_cue_again():
    messages = [{"role": "user", "content": "3+4?"},
                {"role": "assistant", "content": "Let me add.", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "7"}]
    prompt = render(NEW, messages)
    assert prompt.endswith("<tool_response|>Let me add.<turn|>\n")
    assert CHANNEL_THOUGHT.finish_prompt(prompt, None).endswith("<turn|>\n<|turn>model\n")
    assert CHANNEL_THOUGHT.finish_prompt("x<tool_response|>", None) == "x<tool_response|>"


def test_thinking_switch_reaches_the_template():
    on = render(NEW, HISTORY[:2], **CHANNEL_THOUGHT.controls({}, None, True))
    off = render(NEW, HISTORY[:2], **CHANNEL_THOUGHT.controls({}, None, False))
    assert on.startswith("<bos><|turn>system\n<|think|>") and on.endswith("<|turn>model\n")
    assert "<|think|>" not in off and off.endswith("<|turn>model\n<|channel>thought\n<channel|>")


# ---- the forced call's grammar -----------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"},
    "Units": {"enum": ["c", "f"]}, "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}},
    "where": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
        "lat": {"type": "number"}}, "required": ["lat"]}]}},
    "required": ["city", "days"], "$defs": {"Tag": {"type": "string", "enum": ["x", "y z"]}}}
TOOLS = validate_tools([{"type": "function", "function": {"name": "weather", "parameters": SCHEMA}},
                        {"type": "function", "function": {"name": "now", "parameters": {
                            "type": "object", "properties": {}}}}])


def grammar(parallel: bool = False) -> str:
    text = formats.get("gemma4").grammar(TOOLS, parallel=parallel, required=True, limits=LIMITS)
    gate.check(text, "tools", LIMITS)
    return text


@pytest.mark.parametrize("text, whole", [
    (call("weather", f"{{city:{Q}Paris{Q},days:3}}"), True),
    # keys in the template's order (sorted, case-insensitively), optional ones as they come
    (call("weather", f"{{city:{Q}a{Q},days:-2,tags:[{Q}y z{Q},{Q}x{Q}],Units:{Q}f{Q},where:null}}"), True),
    (call("weather", f"{{city:{Q}a{Q},days:0,where:{{lat:1.5e3}}}}"), True),
    (call("now", "{}"), True),
    (call("weather", f"{{city:{Q}Paris{Q}}}"), False),  # a required key missing
    (call("weather", f"{{city:{Q}a{Q},city:"), False),  # a key twice
    (call("weather", f"{{city:{Q}a{Q},days:{Q}"), False),  # a value of the wrong type
    (call("weather", f"{{city:{Q}a{Q},days:1,country:"), False),  # a key the schema lacks
    (call("weather", f"{{city:{Q}a{Q},days:1,Units:{Q}k"), False),  # not in the enum
    (call("now", "{x:1}"), False),
])
def test_the_forced_call_grammar_holds_the_schema(vocab, text, whole):
    s = grammar_sampler(vocab, grammar())
    try:
        assert s.feed(text.encode()) == whole
        if whole:
            assert s.allows(int(vocab.eog_ids[0]))
            r = parsed(text, False)
            assert len(r.calls) == 1 and r.calls[0].complete
    finally:
        s.free()


def test_parallel_calls_come_back_to_back(vocab):
    s = grammar_sampler(vocab, grammar(parallel=True))
    try:
        assert s.feed((call("now", "{}") + call("weather", f"{{city:{Q}a{Q},days:1}}")).encode())
        assert s.allows(int(vocab.eog_ids[0]))
    finally:
        s.free()


def test_a_thought_may_come_before_the_forced_call(vocab):
    text = formats.get("gemma4").grammar(TOOLS, parallel=False, required=True, lead="think",
                                         limits=LIMITS, thought=CHANNEL_THOUGHT)
    s = grammar_sampler(vocab, text)
    try:
        assert s.feed(("<|channel>thought\nhmm<channel|>" + call("now", "{}")).encode())
    finally:
        s.free()


def test_schemas_over_the_limits_are_refused():
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(5000)}}
    many = validate_tools([{"type": "function", "function": {"name": "w", "parameters": wide}}])
    with pytest.raises(gate.GrammarTooComplex):
        formats.get("gemma4").grammar(many, parallel=False, limits=LIMITS)


FRAGMENTS = ["<|tool_call>", "call:", "f", "{", "}", "[", "]", ":", ",", Q, Q + "ab", "a", "1", "-", ".", " ",
             "\n", "<tool_call|>", "<|channel>", "thought", "<channel|>", "<", "|", "hi", "true",
             '"', "\\", "<|tool", "<chan", "None"]


def test_random_replies_only_ever_grow():
    """Seeded random replies of Gemma's pieces: at every cut the parse extends the previous one
    (reasoning, content, calls, names, arguments), ending at the final parse."""
    rng = random.Random("gemma4")
    specs = [{}, {"think": True}, {"think": True, "in_thought": True}, {"think": True, "inline": True}]
    for _ in range(400):
        s = spec(**rng.choice(specs))
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 16)))
        grows(s, text)
        whole = parse_reply(text, s, [], final=True)
        for c in whole.calls:
            if c.complete:
                json.loads(c.arguments)
        # streamed in random pieces (the scans resumed from one parse to the next)
        rs, i = ReplyStream(s), 0
        while i < len(text):
            step = rng.randint(1, 6)
            rs.feed(text[i:i + step])
            i += step
        rs.finish()
        streamed = rs.result()
        assert (streamed.content, streamed.reasoning) == (whole.content, whole.reasoning), text
        assert [(c.name, c.arguments) for c in streamed.calls] == [
            (c.name, c.arguments) for c in whole.calls], text
