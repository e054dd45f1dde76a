"""Replies parsed into reasoning, content and tool calls, per format, cut at every character."""

from __future__ import annotations

import json

import pytest

from app import formats
from app.api.openai import chat_message
from app.api.openai.stream import chat_delta
from app.core.decode import ReplyStream
from app.core.events import Answer, Call, ChoiceEnd, Usage, fold
from app.formats.reply import Reply, parse_reply
from app.formats.spec import ReplySpec
from tests.support.server import DATA

TEMPLATES = DATA / "templates"
MARKUP = ("<tool_call", "</tool_call", "<function", "<parameter", "[TOOL_CALLS", "[ARGS", "python_tag",
          '{"name"', "<think", "</think")

# (format, spec extras, reply, expected content, expected calls [(name, arguments as JSON)], reasoning)
CASES = [
    ("hermes", {}, 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\\"is", "unit": "c"}}\n'
     '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": [2, {"c": "}"}]}}\n</tool_call>',
     "Let me check.", [("get_weather", {"city": 'Par"is', "unit": "c"}), ("add", {"a": 1, "b": [2, {"c": "}"}]})], None),
    ("hermes", {"think": True}, '<think>\nMaybe <tool_call>{"name": "add", "arguments": {}}</tool_call> no.\n</think>\n\n'
     '<tool_call>{"arguments": {"a": 1}, "name": "add"}</tool_call>\nDone.',
     "Done.", [("add", {"a": 1})], '\nMaybe <tool_call>{"name": "add", "arguments": {}}</tool_call> no.\n'),
    ("hermes", {}, '<tool_call>{"name": "add", "arguments": {"a": 1}}}</tool_call> then <tool_call>{"name": "b", '
     '"arguments": {}}\nafter', "then \nafter", [("add", {"a": 1}), ("b", {})], None),
    ("hermes", {}, "No tools needed: 1 < 2 and <b>bold</b>.", "No tools needed: 1 < 2 and <b>bold</b>.", [], None),
    ("hermes", {}, "<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", [], None),
    ("qwen3_coder", {"string_params": {"search": frozenset({"query"})}},
     'I will search.\n<tool_call>\n<function=search>\n<parameter=query>\nwhat is <b>\n"x"\n</parameter>\n'
     '<parameter=limit>\n5\n</parameter>\n<parameter=opts>\n{"deep": true}\n</parameter>\n</function>\n</tool_call>',
     "I will search.", [("search", {"query": 'what is <b>\n"x"', "limit": 5, "opts": {"deep": True}})], None),
    ("qwen3_coder", {}, "<function=now>\n</function>", "", [("now", {})], None),
    # a string value streamed as written (escaped piece by piece): escapes, astral characters,
    # a near-miss of the closing tag, newlines at both ends
    ("qwen3_coder", {"string_params": {"write": frozenset({"text"})}},
     '<tool_call>\n<function=write>\n<parameter=text>\n\nline \\ back "q" \u00e9 \U0001d11e </para not end\n\n'
     "</parameter>\n</function>\n</tool_call>", "",
     [("write", {"text": '\nline \\ back "q" \u00e9 \U0001d11e </para not end\n'})], None),
    ("qwen3_coder", {}, "<tool_call>\n<function=now>\n</function>\n<function=later>\n<parameter=x>\n1\n"
     "</parameter>\n</function>\n</tool_call>\nok", "ok", [("now", {}), ("later", {"x": 1})], None),
    ("llama3", {}, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
     "", [("get_weather", {"city": "Paris"})], None),
    ("llama3", {}, '{"type": "function", "name": "add", "parameters": {"a": 1, "b": 2}}; '
     '{"name": "get_weather", "parameters": {"city": "Oslo"}}',
     "", [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Oslo"})], None),
    ("llama3", {}, '{"answer": 42}', '{"answer": 42}', [], None),
    ("llama3", {}, "Hello {there}", "Hello {there}", [], None),
    ("mistral", {}, '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "abc123def"}, '
     '{"name": "get_weather", "arguments": {"city": "Rome"}}]',
     "", [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Rome"})], None),
    ("mistral", {}, 'Sure.[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}[TOOL_CALLS]get_weather[CALL_ID]abc123def[ARGS]'
     '{"city": "Paris"}', "Sure.", [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Paris"})], None),
    ("generic", {}, '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": {"c": "x\\"}y"}}}, '
     '{ "name" : "get_weather" , "arguments" : { "city": "Paris \\u00e9" } }]}',
     "", [("add", {"a": 1, "b": {"c": 'x"}y'}}), ("get_weather", {"city": "Paris é"})], None),
    ("generic", {}, '{"response": "Hel\\u00e9lo \\"quoted\\" \\\\ done"}', 'Helélo "quoted" \\ done', [], None),
    ("generic", {}, '{"response": "ok \\ud83d\\ude00 \\udc00"}', "ok \U0001F600 \ufffd", [], None),
    ("qwen3_coder", {}, "Hi <function=get_weather\n>", "Hi <function=get_weather\n>", [], None),
    ("hermes", {}, '<tool_call>{"name": "add", "name": "b", "arguments": {"x": 1}, "parameters": {"y": 2}}</tool_call>',
     "", [("add", {"x": 1})], None),
    ("hermes", {}, '<tool_call>{"name": "add", "arguments": {"a": 1} "x"}</tool_call>', "", [("add", {"a": 1})], None),
    ("llama3", {"names": frozenset({"get_weather"})}, '{"type": "object", "properties": {"a": 1}}',
     '{"type": "object", "properties": {"a": 1}}', [], None),
    ("llama3", {"names": frozenset({"get_weather"})}, '{"name": "John Smith", "age": 30}',
     '{"name": "John Smith", "age": 30}', [], None),
    (None, {"think": True, "in_thought": True}, "about <tool_call>{\"name\": \"x\"}</tool_call></think>The answer.",
     "The answer.", [], 'about <tool_call>{"name": "x"}</tool_call>'),
]
IDS = [f"{c[0]}-{i}" for i, c in enumerate(CASES)]


def spec_of(tool_format: str | None, **kw) -> ReplySpec:
    """How to read a reply in the format called ``tool_format`` (None: no tools)."""
    return ReplySpec(formats.get(tool_format) if tool_format else None, **kw)


def format_name(template: str | None) -> str:
    return formats.detect(template).name


def message(reply: Reply) -> tuple[dict, bool]:
    """The OpenAI message of a whole parse (complete calls only), and whether it made calls."""
    calls = [Call(c.id, c.name, c.arguments) for c in reply.calls if c.complete]
    return chat_message(Answer(reasoning=reply.reasoning, text=reply.content, calls=calls)), bool(calls)


def feed(rs: ReplyStream, text: str) -> list[dict]:
    """The OpenAI deltas of the events a piece of text produces."""
    return [d for ev in rs.feed(text) if (d := chat_delta(ev)) is not None]


def finish(rs: ReplyStream) -> list[dict]:
    return [d for ev in rs.finish() if (d := chat_delta(ev)) is not None]


def accumulate(deltas):
    out = {"reasoning": "", "content": "", "names": {}, "args": {}}
    for d in deltas:
        out["reasoning"] += d.get("reasoning_content", "")
        out["content"] += d.get("content", "")
        for tc in d.get("tool_calls", []):
            i, fn = tc["index"], tc["function"]
            if "name" in fn:
                assert i not in out["names"], "name sent twice"
                assert i == len(out["names"]), "indexes start at 0 and increase"
                assert tc["type"] == "function" and tc["id"] and fn["arguments"] == ""
                out["names"][i] = fn["name"]
            else:
                assert set(tc) == {"index", "function"} and set(fn) == {"arguments"}
            out["args"][i] = out["args"].get(i, "") + fn["arguments"]
    return out


@pytest.mark.parametrize("fmt, extra, reply, content, calls, reasoning", CASES, ids=IDS)
def test_whole_parse(fmt, extra, reply, content, calls, reasoning):
    msg, called = message(parse_reply(reply, spec_of(fmt, **extra), [], final=True))
    assert msg["content"] == (content or (None if calls else ""))
    assert msg.get("reasoning_content") == reasoning
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls", [])]
    assert got == calls and called == bool(calls)


@pytest.mark.parametrize("fmt, extra, reply, content, calls, reasoning", CASES, ids=IDS)
def test_streamed_deltas_equal_the_whole_parse_at_every_cut(fmt, extra, reply, content, calls, reasoning):
    spec = spec_of(fmt, **extra)
    whole, _ = message(parse_reply(reply, spec, [], final=True))
    for cut in range(len(reply) + 1):
        rs = ReplyStream(spec)
        got = accumulate(feed(rs, reply[:cut]) + feed(rs, reply[cut:]) + finish(rs))
        assert got["content"] == (whole["content"] or "")
        assert got["reasoning"] == (whole.get("reasoning_content") or "")
        assert got["names"] == {i: c["function"]["name"] for i, c in enumerate(whole.get("tool_calls", []))}
        assert got["args"] == {i: c["function"]["arguments"] for i, c in enumerate(whole.get("tool_calls", []))}
    # one character at a time: names only ever complete, content never shows markup
    rs = ReplyStream(spec)
    deltas = [d for ch in reply for d in feed(rs, ch)] + finish(rs)
    names = {n for n, _ in calls}
    for d in deltas:
        for tc in d.get("tool_calls", []):
            assert tc["function"].get("name", next(iter(names), None)) in names
        if calls or reasoning:
            assert not any(m in d.get("content", "") for m in MARKUP), d
    assert accumulate(deltas)["content"] == (whole["content"] or "")


@pytest.mark.parametrize("fmt, reply, content, names", [
    ("hermes", '<tool_call>{"name": "add", "arguments": nul}</tool_call>', "", []),
    ("mistral", "[TOOL_CALLS]add[ARGS]hello world", "", []),
    ("mistral", '[TOOL_CALLS]add[CALL_ID]x text [TOOL_CALLS]foo[ARGS]{"z": 1}', "[TOOL_CALLS]add[CALL_ID]x text",
     ["foo"]),
])
def test_malformed_calls_never_count(fmt, reply, content, names):
    """Arguments that are not JSON, or markup that does not follow the format, make no call."""
    msg, _ = message(parse_reply(reply, spec_of(fmt), [], final=True))
    assert [c["function"]["name"] for c in msg.get("tool_calls", [])] == names
    assert (msg["content"] or "") == content


def test_cut_reply_keeps_what_parsed_cleanly():
    reply = CASES[0][2]
    cut = reply[: reply.index('"add"') + 12]
    msg, called = message(parse_reply(cut, spec_of("hermes"), [], final=True))
    assert called and [c["function"]["name"] for c in msg["tool_calls"]] == ["get_weather"]
    assert msg["content"] == "Let me check."


def test_unclosed_thought_never_calls():
    reply = '<think>I could call <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    msg, called = message(parse_reply(reply, spec_of("hermes", think=True), [], final=True))
    assert not called and msg["content"] == "" and "<tool_call>" in msg["reasoning_content"]


def test_inline_thought_stays_in_the_content():
    reply = "<think>hmm</think>\nYes."
    msg, _ = message(parse_reply(reply, spec_of(None, think=True, inline=True), [], final=True))
    assert msg["content"] == "<think>hmm</think>Yes." and "reasoning_content" not in msg


def test_mistral_ids_are_nine_alphanumerics():
    ids: list[str] = []
    parse_reply('[TOOL_CALLS]add[ARGS]{"a": 1}', spec_of("mistral"), ids, final=True)
    assert len(ids) == 1 and len(ids[0]) == 9 and ids[0].isalnum()


@pytest.mark.parametrize("name, fmt", [
    ("Qwen-Qwen2.5-7B-Instruct", "hermes"),
    ("Qwen-Qwen3-0.6B", "hermes"),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "hermes"),
    ("Qwen3-Coder", "qwen3_coder"),
    ("meta-llama-Llama-3.1-8B-Instruct", "llama3"),
    ("meta-llama-Llama-3.2-3B-Instruct", "llama3"),
    ("mistralai-Mistral-Nemo-Instruct-2407", "mistral"),
    ("Mistral-Small-3.2-24B-Instruct-2506", "mistral"),
    ("unsloth-mistral-Devstral-Small-2507", "mistral"),
])
def test_format_detected_from_real_templates(name, fmt):
    assert format_name((TEMPLATES / f"{name}.jinja").read_text()) == fmt


def test_templates_without_tools_are_generic():
    from app.formats.chat_template import CHATML

    assert format_name(CHATML) == format_name(None) == "generic"


FRAGMENTS = {
    "hermes": ['<tool_call>', '</tool_call>', '{"name": "a", "arguments": {"x": 1}}', '{"name": "b"', ', "arguments": ',
               '{"k": "v}"}', '}', '{', '"', '\\', '\\u00e9', 'hi', ' ', '\n', '<', '<tool', ',', ':', '1'],
    "qwen3_coder": ['<tool_call>', '</tool_call>', '<function=', 'f', '>', '\n', '<parameter=', 's', '</parameter>',
                    '</function>', 'hi', ' ', '<', '5', '{"a": 1}', '"', '</para', '\\'],
    "llama3": ['<|python_tag|>', '{"name": "a", "parameters": {"x": 1}}', '{', '}', '"name"', '"type"', ': ', '"a"',
               ', ', '"parameters"', ';', ' ', 'hi', '"', '\\', '[', ']', '\n', '1'],
    "mistral": ['[TOOL_CALLS]', '[ARGS]', '[CALL_ID]', 'add', 'abc123def', '{"a": 1}', '{', '}', '[', ']', '"', ' ',
                'hi', '{"name": "a", "arguments": {}}', ',', '\\', '\n'],
    "generic": ['{', '}', '"response"', '"tool_calls"', ': ', '[', ']', '"', 'hi', '\\', '\\u00e9', '\\ud83d',
                '{"name": "a", "arguments": {"x": 1}}', ',', ' ', '"name"', '"arguments"', '1'],
}
THOUGHTS = ['<think>', '</think>', 'hmm ']


@pytest.mark.parametrize("fmt", sorted(FRAGMENTS))
def test_random_replies_only_ever_grow(fmt):
    """Seeded random replies built from each format's pieces: at every cut the parse extends the
    previous one (reasoning, content, calls, names, arguments), ending at the final parse."""
    import random

    rng = random.Random(fmt)
    specs = [{}, {"think": True}, {"think": True, "in_thought": True}, {"think": True, "inline": True}]
    for _ in range(250):
        spec = spec_of(fmt, **rng.choice(specs))
        text = "".join(rng.choice(FRAGMENTS[fmt] + THOUGHTS) for _ in range(rng.randint(1, 14)))
        ids: list[str] = []
        states = [parse_reply(text[:k], spec, ids) for k in range(len(text) + 1)]
        states.append(parse_reply(text, spec, ids, final=True))
        for a, b in zip(states, states[1:], strict=False):
            assert (b.reasoning or "").startswith(a.reasoning or ""), text
            assert b.content.startswith(a.content), text
            assert len(b.calls) >= len(a.calls), text
            for x, y in zip(a.calls, b.calls, strict=False):
                assert x.name == y.name and y.arguments.startswith(x.arguments), text


@pytest.mark.parametrize("fmt, extra, reply, content, calls, reasoning", CASES, ids=IDS)
def test_the_fold_of_the_events_is_the_whole_parse_at_every_cut(fmt, extra, reply, content, calls, reasoning):
    """What a non-streamed answer holds (the fold) is what the final parse says, wherever the
    text was cut into pieces."""
    spec = spec_of(fmt, **extra)
    whole, _ = message(parse_reply(reply, spec, [], final=True))
    for cut in range(0, len(reply) + 1, 3):
        rs = ReplyStream(spec)
        events = rs.feed(reply[:cut]) + rs.feed(reply[cut:]) + rs.finish()
        events += [ChoiceEnd("stop", 1, cut_calls=rs.cut_calls()), Usage(1, 1)]
        got = chat_message(fold(events, 1).answers[0])
        for msg in (got, whole):  # ids are drawn at random per parse
            for call in msg.get("tool_calls", []):
                call["id"] = "x"
        assert got == whole
