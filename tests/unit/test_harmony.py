"""GPT-OSS (harmony): replies of the shapes llama.cpp's tests use, whole, cut at every character
and streamed; detection from the real template; the history its template expects over a second
and third turn; the reasoning effort; the grammars."""

from __future__ import annotations

import json
import random

import pytest

from app import formats, plan_options
from app.api.openai import chat_message
from app.api.openai.stream import chat_delta
from app.core.decode import ReplyStream
from app.core.events import Answer, Call
from app.core.input import ChatInput, ToolChoice, effort_for
from app.core.plan import plan_chat
from app.engine.types import ModelInfo
from app.formats.harmony import HARMONY, MARKUP
from app.formats.reply import Reply, parse_reply
from app.formats.spec import ReplySpec
from app.grammar import gate
from app.protocol.tools import validate_tools
from app.settings import Settings
from tests.support.bodies import ADD, WEATHER
from tests.support.sampling import grammar_sampler
from tests.support.server import DATA

REAL = (DATA / "templates" / "openai-gpt-oss-120b.jinja").read_text()
LIMITS = gate.Limits.from_settings(Settings())
HARMONY_FMT = formats.get("harmony")
EDIT = ('{"oldString": "if (part < railCount - 1) {", "newString": "if (part < 4) {", '
        '"replaceAll": false}')

# (reply, content, calls [(name, arguments)], reasoning): llama.cpp's tests/test-chat.cpp shapes
CASES = [
    ("<|channel|>final<|message|>Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", [], None),
    ("<|channel|>commentary<|message|>Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", [], None),
    ("<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>"
     "Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", [], "I'm\nthinking"),
    ("<|channel|>analysis<|message|>I'm\nthinking", "", [], "I'm\nthinking"),
    (' to=functions.special_function<|channel|>analysis<|message|>{"arg1": 1}', "",
     [("special_function", {"arg1": 1})], None),
    ('<|channel|>analysis to=functions.special_function<|message|>{"arg1": 1}', "",
     [("special_function", {"arg1": 1})], None),
    (' to=functions.special_function<|channel|>analysis <|constrain|>json<|message|>{"arg1": 1}', "",
     [("special_function", {"arg1": 1})], None),
    ('<|channel|>commentary to=functions.special_function<|message|>{"arg1": 1}', "",
     [("special_function", {"arg1": 1})], None),
    ("<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant to=functions.special_function"
     '<|channel|>analysis<|message|>{"arg1": 1}', "", [("special_function", {"arg1": 1})], "I'm\nthinking"),
    ("<|channel|>analysis<|message|>Thinking about edit...<|end|><|start|>assistant<|channel|>commentary "
     "to=functions.edit <|constrain|>json<|message|>" + EDIT, "", [("edit", json.loads(EDIT))],
     "Thinking about edit..."),
    ("<|channel|>analysis<|message|>I need to output the invoice details in JSON<|end|><|start|>assistant"
     '<|channel|>final <|constrain|>json<|message|>{"amount": 123.45, "date": "2025-12-03"}',
     '{"amount": 123.45, "date": "2025-12-03"}', [], "I need to output the invoice details in JSON"),
    # a built-in tool's call (the recipient in the role, then in the channel): neither content nor call
    ("<|channel|>analysis<|message|>I will execute python to say hello<|end|><|start|>assistant "
     "to=container.exec<|channel|>commentary<|message|>python3 -c 'print(\"hello\")'", "", [],
     "I will execute python to say hello"),
    ("<|channel|>analysis<|message|>I will execute python to say hello<|end|><|start|>assistant"
     '<|channel|>commentary to=python <|constrain|>code<|message|>print("hello")', "", [],
     "I will execute python to say hello"),
    # gpt-oss-20b's stray "<|channel|>commentary to=assistant", before the thought and before the answer
    ("<|channel|>commentary to=assistant<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant"
     "<|channel|>final<|message|>Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", [], "I'm\nthinking"),
    ("<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>commentary to=assistant"
     "<|channel|>final<|message|>Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", [], "I'm\nthinking"),
    # the forced grammar's form, with the ends llama.cpp would have kept out of the text
    ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
     "", [("get_weather", {"city": "Paris"})], None),
    ("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>"
     "<|start|>assistant<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant<|channel|>"
     'commentary to=functions.get_weather json<|message|>{"city": "Oslo"}', "Let me look.",
     [("get_weather", {"city": "Oslo"})], "a\nb"),
    ("<|channel|>final<|message|>1 < 2 and <b>bold</b><|return|>", "1 < 2 and <b>bold</b>", [], None),
    ("A model that wrote no header.", "A model that wrote no header.", [], None),
    ('{"answer": 42}', '{"answer": 42}', [], None),
]
IDS = [str(i) for i in range(len(CASES))]


def message(reply: Reply) -> tuple[dict, bool]:
    """The OpenAI message of a whole parse (complete calls only), and whether it made calls."""
    calls = [Call(c.id, c.name, c.arguments) for c in reply.calls if c.complete]
    return chat_message(Answer(reasoning=reply.reasoning, text=reply.content, calls=calls)), bool(calls)


def feed(rs: ReplyStream, text: str) -> list[dict]:
    return [d for ev in rs.feed(text) if (d := chat_delta(ev)) is not None]


def finish(rs: ReplyStream) -> list[dict]:
    return [d for ev in rs.finish() if (d := chat_delta(ev)) is not None]


def accumulate(deltas: list[dict]) -> dict:
    """What a client makes of the deltas: a name sent twice, or a first delta without its id,
    type and empty arguments, fails."""
    out: dict = {"reasoning": "", "content": "", "names": {}, "args": {}}
    for d in deltas:
        out["reasoning"] += d.get("reasoning_content", "")
        out["content"] += d.get("content") or ""
        for tc in d.get("tool_calls", []):
            i, fn = tc["index"], tc["function"]
            if "name" in fn:
                assert i not in out["names"] and i == len(out["names"])
                assert tc["type"] == "function" and tc["id"] and fn["arguments"] == ""
                out["names"][i] = fn["name"]
            else:
                assert set(tc) == {"index", "function"} and set(fn) == {"arguments"}
            out["args"][i] = out["args"].get(i, "") + fn["arguments"]
    return out


def spec(tools: bool = True, **kw) -> ReplySpec:
    return ReplySpec(HARMONY_FMT if tools else None, think=True, thought=HARMONY, **kw)


def calls_of(msg: dict) -> list:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls", [])]


@pytest.mark.parametrize("reply, content, calls, reasoning", CASES, ids=IDS)
def test_whole_parse(reply, content, calls, reasoning):
    msg, _ = message(parse_reply(reply, spec(), [], final=True))
    assert (msg["content"] or "") == content
    assert msg.get("reasoning_content") == reasoning
    assert calls_of(msg) == calls
    # without tools the same reply has the same thought and content, and no call
    bare, called = message(parse_reply(reply, spec(tools=False), [], final=True))
    assert (bare["content"] or "") == content and not called
    assert bare.get("reasoning_content") == reasoning


@pytest.mark.parametrize("reply, content, calls, reasoning", CASES, ids=IDS)
def test_streamed_at_every_cut_and_piece_by_piece(reply, content, calls, reasoning):
    whole, _ = message(parse_reply(reply, spec(), [], final=True))
    for cut in range(len(reply) + 1):
        rs = ReplyStream(spec())
        got = accumulate(feed(rs, reply[:cut]) + feed(rs, reply[cut:]) + finish(rs))
        assert got["content"] == (whole["content"] or "")
        assert got["reasoning"] == (whole.get("reasoning_content") or "")
        assert got["names"] == {i: c["function"]["name"] for i, c in enumerate(whole.get("tool_calls", []))}
        assert got["args"] == {i: c["function"]["arguments"] for i, c in enumerate(whole.get("tool_calls", []))}
    rs = ReplyStream(spec())
    deltas = [d for ch in reply for d in feed(rs, ch)] + finish(rs)
    for d in deltas:  # no marker, nor a piece of one, in any delta
        for text in (d.get("content", ""), d.get("reasoning_content", "")):
            assert not any(m[:2] in text and "<|" in text for m in MARKUP), d
            assert "to=functions" not in text, d
        for tc in d.get("tool_calls", []):
            assert tc["function"].get("name", calls[0][0] if calls else None) in {n for n, _ in calls}
    assert accumulate(deltas)["content"] == (whole["content"] or "")


def test_a_reply_cut_by_max_tokens_keeps_its_thought_and_no_half_call():
    reply = CASES[9][0]
    for cut in range(len(reply)):
        msg, called = message(parse_reply(reply[:cut], spec(), [], final=True))
        assert not called and (msg["content"] or "") in ("", "<")  # a cut "<|end|>"'s "<" is a word
        assert "<|" not in (msg.get("reasoning_content") or "")


def test_ids_and_names_are_given_once_and_the_arguments_grow_to_json():
    reply = CASES[9][0]
    ids: list[str] = []
    seen = []
    for k in range(len(reply) + 1):
        r = parse_reply(reply[:k], spec(), ids)
        if r.calls:
            seen.append((r.calls[0].id, r.calls[0].name, r.calls[0].arguments))
    assert len({(i, n) for i, n, _ in seen}) == 1 and seen[0][1] == "edit"
    assert all(b[2].startswith(a[2]) for a, b in zip(seen, seen[1:], strict=False))
    assert json.loads(seen[-1][2]) == json.loads(EDIT)


FRAGMENTS = ["<|channel|>", "analysis", "final", "commentary", "<|message|>", "<|end|>", "<|start|>",
             "assistant", " to=functions.", "f", " to=", "python", " <|constrain|>", "json", "<|call|>",
             '{"a": 1}', "{", "}", '"', "hi", " ", "\n", "<", "<|"]


def test_random_replies_only_ever_grow():
    rng = random.Random("harmony")
    for _ in range(300):
        kw = rng.choice([{}, {"in_thought": True}, {"inline": True}])
        s = spec(tools=rng.random() < 0.7, **kw)
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 16)))
        ids: list[str] = []
        states = [parse_reply(text[:k], s, ids) for k in range(len(text) + 1)]
        states.append(parse_reply(text, s, ids, final=True))
        for a, b in zip(states, states[1:], strict=False):
            assert (b.reasoning or "").startswith(a.reasoning or ""), text
            assert b.content.startswith(a.content), text
            assert len(b.calls) >= len(a.calls), text
            for x, y in zip(a.calls, b.calls, strict=False):
                assert x.name == y.name and y.arguments.startswith(x.arguments), text
        if not kw.get("inline"):
            assert not any(m in states[-1].content for m in MARKUP), text


def test_detected_from_the_real_template_and_not_from_others():
    assert formats.detect(REAL).name == "harmony"
    assert formats.detect_reasoning(REAL) is HARMONY
    for path in sorted((DATA / "templates").glob("*.jinja")):
        if path.name != "openai-gpt-oss-120b.jinja":
            assert formats.detect(path.read_text()).name != "harmony", path.name
            assert formats.detect_reasoning(path.read_text()) is not HARMONY, path.name
    summary = formats.summary(REAL, ("<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                                     "<|constrain|>", "<|call|>", "<|return|>"), "auto", "auto")
    assert summary["tool_format"] == summary["thought_format"] == "harmony"
    assert summary["drops"] == []


# ---- the prompt: history, tools, effort -------------------------------------------------------

INFO = ModelInfo(name="m", path="m.gguf", n_ctx=4096, n_ctx_train=4096, chat_template=REAL,
                 bos_token="<|startoftext|>", eos_token="<|return|>", created=0)
OPTS = plan_options(Settings())


def plan(messages, **kw):
    kw.setdefault("tools", tuple(validate_tools([ADD, WEATHER])))
    return plan_chat(INFO, ChatInput(messages=messages, **kw), OPTS)


def call(id_: str, name: str, args: dict) -> dict:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


TURNS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {"role": "assistant", "content": "", "reasoning_content": "Two cities: two calls.",
     "tool_calls": [call("c1", "get_weather", {"city": "Paris"}), call("c2", "get_weather", {"city": "Oslo"})]},
    {"role": "tool", "tool_call_id": "c2", "content": "snow"},
    {"role": "tool", "tool_call_id": "c1", "content": "sun"},
]


def test_a_second_turn_renders_each_call_then_its_result_and_the_pending_thought():
    prompt = plan(TURNS).generation.prompt
    assert "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools" in prompt
    assert "type add_two_numbers = (_: {\na: number,\nb: number,\n}) => any;" in prompt
    paris = ('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>'
             '{"city": "Paris"}<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary'
             '<|message|>"sun"<|end|>')
    oslo = ('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>'
            '{"city": "Oslo"}<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary'
            '<|message|>"snow"<|end|>')
    assert paris + oslo in prompt
    # the call still waits for its answer: its thought is rendered before it
    assert "<|start|>assistant<|channel|>analysis<|message|>Two cities: two calls.<|end|>" + paris in prompt
    assert prompt.endswith("<|start|>assistant")


def test_a_third_turn_drops_the_answered_thought_and_keeps_later_system_words():
    turns = [*TURNS, {"role": "assistant", "content": "Sun in Paris, snow in Oslo.",
                      "reasoning_content": "Report both."},
             {"role": "system", "content": "Answer in French."},
             {"role": "user", "content": "And 3 plus 4?"},
             {"role": "assistant", "content": "Let me add.", "tool_calls": [call("c3", "add_two_numbers",
                                                                                   {"a": 3, "b": 4})]},
             {"role": "tool", "tool_call_id": "c3", "content": "7"}]
    prompt = plan(turns).generation.prompt
    assert "Two cities" not in prompt and "Report both" not in prompt  # a final answer followed
    assert "<|start|>assistant<|channel|>final<|message|>Sun in Paris, snow in Oslo.<|end|>" in prompt
    assert "<|start|>user<|message|>Answer in French.<|end|><|start|>user<|message|>And 3 plus 4?" in prompt
    assert ("<|start|>assistant<|channel|>analysis<|message|>Let me add.<|end|><|start|>assistant "
            'to=functions.add_two_numbers<|channel|>commentary json<|message|>{"a": 3, "b": 4}<|call|>'
            '<|start|>functions.add_two_numbers to=assistant<|channel|>commentary<|message|>"7"<|end|>'
            "<|start|>assistant") in prompt


@pytest.mark.parametrize("kw, level", [
    ({}, "medium"),
    ({"effort": "low"}, "low"),
    ({"effort": "xhigh"}, "high"),
    ({"effort": "minimal"}, "low"),
    ({"thinking": False}, "low"),
    ({"reasoning_budget": 0}, "low"),  # Gemini's thinkingBudget 0
    ({"reasoning_budget": 2048}, "medium"),  # Anthropic's budget_tokens
    ({"reasoning_budget": 10000}, "high"),
    ({"effort": "high", "template_kwargs": {"reasoning_effort": "low"}}, "low"),  # the client's own
])
def test_the_effort_reaches_the_template(kw, level):
    prompt = plan([{"role": "user", "content": "Hi"}], tools=(), **kw).generation.prompt
    assert f"Reasoning: {level}\n" in prompt


def test_effort_for_a_budget():
    assert [effort_for(b) for b in (None, 0, 1, 63, 64, 300, 1024, 5000, 10**6)] == [
        None, "none", "minimal", "minimal", "minimal", "low", "medium", "high", "xhigh"]


# ---- grammars ----------------------------------------------------------------------------------

def test_required_grammar_is_harmonys_call_after_an_optional_thought(vocab):
    p = plan([{"role": "user", "content": "Hi"}], tool_choice=ToolChoice("required"))
    grammar = p.generation.params.grammar
    assert p.generation.params.grammar_takes_injection and not p.generation.params.grammar_triggers
    ok = ['<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}',
          "<|channel|>analysis<|message|>hmm < so<|end|><|start|>assistant<|channel|>commentary "
          'to=functions.add_two_numbers <|constrain|>json<|message|>{"a": 1, "b": 2}',
          # the reasoning budget's injected ending, then the call
          "<|channel|>analysis<|message|>hmm" + HARMONY.ending(True) + "<|channel|>commentary "
          'to=functions.add_two_numbers <|constrain|>json<|message|>{"a": 1, "b": 2}']
    bad = ['<|channel|>final<|message|>hi', '<|channel|>commentary to=functions.nope <|constrain|>json<|message|>{}',
           '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": 3}']
    for text, whole in [(t, True) for t in ok] + [(t, False) for t in bad]:
        s = grammar_sampler(vocab, grammar)
        try:
            fed = s.feed(text.encode())
            assert fed == whole and (not whole or s.allows(int(vocab.eog_ids[0]))), text
        finally:
            s.free()


def test_auto_grammar_is_lazy_from_the_recipient_in_either_place(vocab):
    p = plan([{"role": "user", "content": "Hi"}])
    params = p.generation.params
    assert params.grammar_triggers == (" to=functions.",)
    for text in [' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Rome"}',
                 ' to=functions.get_weather <|constrain|>json<|message|>{"city": "Rome"}',
                 ' to=functions.get_weather<|channel|>analysis <|constrain|>json<|message|>{"city": "Rome"}']:
        s = grammar_sampler(vocab, params.grammar, triggers=params.grammar_triggers)
        try:
            assert s.feed(text.encode()), text
            assert s.allows(int(vocab.eog_ids[0]))
        finally:
            s.free()


def test_an_answer_format_beside_tools_goes_on_the_final_channel(vocab):
    from app.core.input import OutputFormat

    p = plan([{"role": "user", "content": "Hi"}],
             output=OutputFormat("json_schema", {"type": "object", "properties": {"n": {"type": "integer"}},
                                                 "required": ["n"]}))
    s = grammar_sampler(vocab, p.generation.params.grammar)
    try:
        assert s.feed(b'<|channel|>final<|message|>{"n": 4}') and s.allows(int(vocab.eog_ids[0]))
    finally:
        s.free()
    r = parse_reply('<|channel|>final<|message|>{"n": 4}', p.reply, [], final=True)
    assert r.content == '{"n": 4}' and not r.calls


def test_ending_a_thought_opens_the_answer_or_leaves_room_for_a_call():
    assert HARMONY.ending(False) == "<|end|><|start|>assistant<|channel|>final<|message|>"
    assert HARMONY.ending(True) == "<|end|><|start|>assistant"
    text = "<|channel|>analysis<|message|>long" + HARMONY.ending(False) + "Done."
    r = parse_reply(text, spec(tools=False), [], final=True)
    assert (r.reasoning, r.content) == ("long", "Done.")
    assert HARMONY.split("<|channel|>analysis<|message|>long").open
