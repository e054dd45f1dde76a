"""Pythonic call lists (Llama 4, Llama 3.2's and ToolACE's pythonic templates): replies read
whole, cut at every character and streamed, Python literals turned into JSON arguments; the
Llama 4 stock template's JSON calls; detection; a 2nd/3rd turn's history; the grammars held to
the schema (the stock template's JSON form beside tests/unit/test_forced_calls.py)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from app import formats
from app.formats import chat_template
from app.formats.reply import parse_reply
from app.formats.spec import ReplySpec, string_params
from app.grammar import gate
from app.protocol.tools import validate_tools
from app.settings import Settings
from tests.support.reply_checks import check_reply, grows, message
from tests.support.sampling import closers_of, grammar_sampler, sample_once, token_pieces
from tests.support.server import DATA

# Llama 4's stock template, in short: tools in the first user turn with a JSON instruction,
# earlier calls as JSON after <|python_start|>text<|python_end|>, a text that is not a string
# iterated as parts
STOCK = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m.role == 'user' and loop.first and tools %}<|header_start|>user<|header_end|>\n\n"
    "Given the following functions, please respond with a JSON for a function call. Respond in "
    'the format {"name": function name, "parameters": dictionary of argument name and its '
    "value}.{% for t in tools %}{{ t|tojson }}{% endfor %}{{ m.content }}<|eot|>"
    "{% elif m.tool_calls %}<|header_start|>assistant<|header_end|>\n\n<|python_start|>"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for c in m.content %}{{ c.text }}"
    "{% endfor %}{% endif %}<|python_end|>{% for c in m.tool_calls %}"
    '{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments|tojson }}}'
    "{% endfor %}<|eot|>{% elif m.role == 'tool' %}<|header_start|>ipython<|header_end|>\n\n"
    "{{ m.content }}<|eot|>{% else %}<|header_start|>{{ m.role }}<|header_end|>\n\n"
    "{{ m.content }}<|eot|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|header_start|>assistant<|header_end|>\n\n{% endif %}"
)
# vLLM's pythonic Llama 4 template, in short
PYTHONIC = (
    "{{ bos_token }}{% if tools %}<|header_start|>system<|header_end|>\n\nUse exact format: "
    "[func_name1(param1=value1, param2=value2), func_name2(...)]\n{{ tools|tojson }}<|eot|>"
    "{% endif %}{% for m in messages %}{% if m.tool_calls %}"
    "<|header_start|>assistant<|header_end|>\n\n{% if m.content is string %}{{ m.content }}"
    "{% endif %}[{% for c in m.tool_calls %}{{ c.function.name }}("
    "{% for k, v in c.function.arguments.items() %}{{ k }}={{ v|tojson }}"
    "{% if not loop.last %}, {% endif %}{% endfor %}){% if not loop.last %}, {% endif %}"
    "{% endfor %}]<|eot|>{% elif m.role == 'tool' %}<|header_start|>ipython<|header_end|>\n\n"
    "{{ m.content|tojson }}<|eot|>{% else %}<|header_start|>{{ m.role }}<|header_end|>\n\n"
    "{{ m.content }}<|eot|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|header_start|>assistant<|header_end|>\n\n{% endif %}"
)
MARKUP = ("<|python", "[get_weather(", "[get_time(", "[f(")
SPEC = ReplySpec(formats.get("pythonic"), names=frozenset({"get_weather", "get_time", "f"}))


def test_detected_from_the_templates():
    assert formats.detect(STOCK).name == formats.detect(PYTHONIC).name == "pythonic"
    llama32 = (DATA / "templates" / "meta-llama-Llama-3.2-3B-Instruct.jinja").read_text()
    assert formats.detect(llama32).name == "llama3"


@pytest.mark.parametrize("reply, content, calls", [
    ('[get_weather(city="San Francisco", metric="celsius")]', "",
     [("get_weather", {"city": "San Francisco", "metric": "celsius"})]),
    ("[get_weather(city='Paris'), get_time(zone=\"CET\", hours=24)]", "",
     [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET", "hours": 24})]),
    ("[f(a=[1, 2, {'k': True, \"n\": None}], b=None, c=-1.5e3, d='it\\'s', e=(1, 'x'), "
     "g=false, h={1: 'one'})]", "",
     [("f", {"a": [1, 2, {"k": True, "n": None}], "b": None, "c": -1500.0, "d": "it's",
             "e": [1, "x"], "g": False, "h": {"1": "one"}})]),
    ('<|python_start|>[get_weather(city="Paris")]<|python_end|>', "",
     [("get_weather", {"city": "Paris"})]),
    ('Let me check. [get_weather(city="Oslo")] Done.', "Let me check.  Done.",
     [("get_weather", {"city": "Oslo"})]),
    ("[f()]", "", [("f", {})]),
    ('[f(s="line\\nnext \\u00e9 \\x41 \\\\ \\" q", t="")]', "",
     [("f", {"s": 'line\nnext \u00e9 A \\ " q', "t": ""})]),
    # the stock template's JSON calls, after <|python_start|> or bare
    ('<|python_start|>{"name": "get_weather", "parameters": {"city": "Paris"}}<|python_end|>', "",
     [("get_weather", {"city": "Paris"})]),
    ('{"name": "get_weather", "parameters": {"city": "Rome"}}', "",
     [("get_weather", {"city": "Rome"})]),
    # prose that is no call
    ("See [1], [the docs](http://x) and [a(b)] or [x(y) ok.", "See [1], [the docs](http://x) and "
     "[a(b)] or [x(y) ok.", []),
    ('{"answer": 42}', '{"answer": 42}', []),
])
def test_replies(reply, content, calls):
    check_reply(SPEC, reply, content, calls, None, MARKUP if calls else ())


def test_a_cut_list_keeps_its_finished_calls_and_shows_no_markup():
    text = '[get_weather(city="Paris"), get_time(zone="CE'
    msg = message(parse_reply(text, SPEC, [], final=True))
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["get_weather"]
    assert not msg["content"]


@pytest.mark.parametrize("text", ["[f(a=1, a=2)", "[f(x)]", "[f(a=inf)]", "[f(a=1 b=2)]",
                                  "[f(a=[1, 2), g()]", "[f(a='x\ny')]"])
def test_malformed_lists_only_ever_grow(text):
    grows(SPEC, text)


FRAGMENTS = ['[', ']', '(', ')', 'f', 'get_weather', '=', 'a', ', ', '"', "'", '\\', 'x', '1',
             '-2.5', 'True', 'None', '{', '}', ':', ' ', '<|python_start|>', '<|python_end|>',
             'hi ', '\n', '{"name": "f", "parameters": {"a": 1}}']


def test_random_replies_only_ever_grow():
    import random

    rng = random.Random("pythonic")
    for _ in range(300):
        grows(SPEC, "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 16))))


def history() -> list[dict]:
    call = {"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 2})}}
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        {"role": "assistant", "content": "It is 18 C."},
        {"role": "user", "content": "And tomorrow?"},
    ]


@pytest.mark.parametrize("template, shown", [
    (STOCK, '<|python_start|><|python_end|>{"name": "get_weather", "parameters": '
     '{"city": "Paris", "days": 2}}<|eot|>'),
    (PYTHONIC, '[get_weather(city="Paris", days=2)]<|eot|>'),
])
def test_history_renders_calls_and_results(template, shown):
    fmt = formats.detect(template)
    prompt = chat_template.render(template, fmt.history(history()), bos_token="<|begin_of_text|>",
                                  extra={"tools": [{"type": "function", "function": {
                                      "name": "get_weather", "parameters": {"type": "object"}}}]})
    assert shown in prompt and "18 C" in prompt and "And tomorrow?" in prompt


def test_lazy_triggers_name_the_offered_tools():
    tools = validate_tools([TOOL])
    assert formats.get("pythonic").lazy_triggers(tools) == ("<|python_start|>", "[get_weather(")


# ---- the grammars -------------------------------------------------------------------------

LIMITS = gate.Limits.from_settings(Settings())
SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "units": {"enum": ["c", "f"]},
    "hourly": {"type": "boolean"}, "note": {"type": ["string", "null"]}},
    "required": ["days"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}


@pytest.mark.parametrize("template", [STOCK, PYTHONIC], ids=["stock-json", "pythonic"])
def test_forced_calls_follow_the_schema(vocab, template):
    fmt = formats.get("pythonic")
    tools = validate_tools([TOOL])
    text = fmt.grammar(tools, parallel=True, required=True, template=template, limits=LIMITS)
    gate.check(text, "tools", LIMITS)
    pieces = token_pieces(vocab)
    closers = closers_of(pieces, (b")", b"]", b"}", b",", b'"'))
    spec = ReplySpec(fmt, string_params={"get_weather": string_params(SCHEMA)},
                     names=frozenset({"get_weather"}))
    validator = jsonschema.Draft202012Validator(SCHEMA)
    finished = 0
    for seed in range(10):
        out = sample_once(vocab, pieces, closers, text, seed, 300)
        if out is None:
            continue
        finished += 1
        reply = parse_reply(out.decode("utf-8", "replace"), spec, [], final=True)
        assert reply.calls and all(c.complete and c.name == "get_weather" for c in reply.calls), out
        for call in reply.calls:
            args = json.loads(call.arguments)
            assert not list(validator.iter_errors(args)), (out, args)
    assert finished >= 3


@pytest.mark.parametrize("text, whole", [
    ('[get_weather(days=3)]', True),
    ('[get_weather(city="Oslo", days=3, hourly=True, note=None)]', True),
    ('[get_weather(days=3), get_weather(days=4, units="f")]', True),
    ('[get_weather(city="Oslo")', False),  # a required one missing: the call cannot close
    ('[get_weather(days=3, days=', False),  # written twice
    ('[get_weather(days=3, hourly=true', False),  # JSON's spelling: Python's is held
    ('[get_weather(units="f", days=', False),  # out of the schema's order
])
def test_the_pythonic_grammar_refuses_what_the_schema_does(vocab, text, whole):
    tools = validate_tools([TOOL])
    grammar = formats.get("pythonic").grammar(tools, parallel=True, required=True,
                                             template=PYTHONIC, limits=LIMITS)
    s = grammar_sampler(vocab, grammar)
    try:
        assert s.feed(text.encode()) == whole
        if whole:
            assert s.allows(int(vocab.eog_ids[0]))
    finally:
        s.free()

