"""DeepSeek V3 / V3.1, the R1 distills and V3.2 / V4 (DSML): replies of the shapes llama.cpp's
tests use, whole, cut at every character and streamed; detection from the real templates; the
history each template expects over a second and third turn; the ``thinking`` switch; the
grammars writing what the templates render."""

from __future__ import annotations

import json

import pytest

from app import formats, plan_options
from app.core.input import ChatInput
from app.core.plan import plan_chat
from app.engine.types import ModelInfo
from app.formats.deepseek import DEEPSEEK_THINK
from app.formats.spec import ReplySpec
from app.grammar import gate
from app.protocol.tools import validate_tools
from app.settings import Settings
from tests.support.family_replies import assert_only_grows, assert_streams_as_whole, calls_of, whole
from tests.support.family_templates import DEEPSEEK_V31
from tests.support.sampling import grammar_sampler
from tests.support.server import DATA

TEMPLATES = DATA / "templates"
V31 = (TEMPLATES / "deepseek-ai-DeepSeek-V3.1.jinja").read_text()  # llama.cpp's: tojson
V32 = (TEMPLATES / "deepseek-ai-DeepSeek-V3.2.jinja").read_text()
V4 = (TEMPLATES / "deepseek-ai-DeepSeek-V4.jinja").read_text()
R1_QWEN = (TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja").read_text()
R1_LLAMA = (TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja").read_text()
LIMITS = gate.Limits.from_settings(Settings())
OPTS = plan_options(Settings())
MARKUP = ("<｜tool", "｜DSML｜", "<think", "</think", "tool▁")

B, E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CB, CE, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
FC, EFC = "<｜DSML｜function_calls>", "</｜DSML｜function_calls>"


def dsml(name: str, *params: tuple[str, str, str]) -> str:
    body = "".join(f'<｜DSML｜parameter name="{k}" string="{s}">{v}</｜DSML｜parameter>\n'
                   for k, s, v in params)
    return f'<｜DSML｜invoke name="{name}">\n{body}</｜DSML｜invoke>\n'


SPECS = {
    "off": {},  # thinking off: the prompt closed the thought
    "open": {"think": True, "in_thought": True, "thought": DEEPSEEK_THINK},
}
# (format, spec, reply, content, calls, reasoning)
CASES = [
    ("deepseek", "off", f'{B}{CB}get_time{SEP}{{"city": "XYZCITY"}}{CE}{E}', "",
     [("get_time", {"city": "XYZCITY"})], None),
    ("deepseek", "open", f'REASONING</think>{B}{CB}get_time{SEP}{{"city": "Tokyo"}}{CE}{E}', "",
     [("get_time", {"city": "Tokyo"})], "REASONING"),
    ("deepseek", "open", f'REASONING</think>CONTENT{B}{CB}get_time{SEP}{{"city": "Paris"}}{CE}'
     f'{CB}get_weather{SEP}{{"city": "Paris"}}{CE}{E}', "CONTENT",
     [("get_time", {"city": "Paris"}), ("get_weather", {"city": "Paris"})], "REASONING"),
    ("deepseek", "open", "REASONING</think>\nCONTENT", "CONTENT", [], "REASONING"),
    ("deepseek", "off", "CONTENT", "CONTENT", [], None),
    # R1's form: the type, the name on its line, a fenced block (closed on its line or not)
    ("deepseek", "open", f'</think>{B}{CB}function{SEP}special_function\n```json\n{{"arg1": 1}}```'
     f"{CE}{E}", "", [("special_function", {"arg1": 1})], ""),
    ("deepseek", "off", f'{B}{CB}function{SEP}special_function\n```json\n{{"arg1": 1}}\n```{CE}\n'
     f'{CB}function{SEP}python\n```json\n{{"code": "print(\\"<tool_call>\\")"}}\n```{CE}{E}after',
     "after", [("special_function", {"arg1": 1}), ("python", {"code": 'print("<tool_call>")'})],
     None),
    # a call written without its section, then text
    ("deepseek", "off", f'Sure.{CB}get_time{SEP}{{"city": "Rome"}}{CE} Done.', "Sure. Done.",
     [("get_time", {"city": "Rome"})], None),
    # V3.2 (DSML): strings bare, others JSON, as string="..." says
    ("deepseek_dsml", "open", f'Let me check the time</think>\n\n{FC}\n'
     + dsml("get_time", ("city", "true", "Tokyo")) + EFC, "",
     [("get_time", {"city": "Tokyo"})], "Let me check the time"),
    ("deepseek_dsml", "off", f"{FC}\n" + dsml("special_function", ("arg1", "false", "1")) + EFC, "",
     [("special_function", {"arg1": 1})], None),
    ("deepseek_dsml", "open", f"Calling both</think>\n\n{FC}\n"
     + dsml("get_time", ("city", "true", "Paris")) + dsml("get_weather", ("city", "true", "Paris"))
     + EFC, "", [("get_time", {"city": "Paris"}), ("get_weather", {"city": "Paris"})],
     "Calling both"),
    ("deepseek_dsml", "open", f"Thinking about it</think>Let me call the function.\n\n{FC}\n"
     + dsml("special_function", ("arg1", "false", "1")) + EFC, "Let me call the function.",
     [("special_function", {"arg1": 1})], "Thinking about it"),
    ("deepseek_dsml", "off", f"{FC}\n" + dsml("magic_int", ("ref", "false", "-14"),
                                              ("name", "true", "foo bar"))
     + dsml("amount", ("orig", "false", "3.14")) + dsml("toggle", ("enabled", "false", "true"))
     + dsml("todo_list", ("todos", "false", '["buy milk","walk dog"]'))
     + dsml("set_config", ("config", "false", '{"theme":"dark","level":2}')) + EFC, "",
     [("magic_int", {"ref": -14, "name": "foo bar"}), ("amount", {"orig": 3.14}),
      ("toggle", {"enabled": True}), ("todo_list", {"todos": ["buy milk", "walk dog"]}),
      ("set_config", {"config": {"theme": "dark", "level": 2}})], None),
    # a string written as is: quotes, backslashes, newlines, markup that is not the closing tag
    ("deepseek_dsml", "off", f"{FC}\n" + dsml("edit", ("code", "true",
                                                      'if a < b:\n    print("x\\y")</para')) + EFC,
     "", [("edit", {"code": 'if a < b:\n    print("x\\y")</para'})], None),
    # the thought left open: the call block ends it (V3.2 and V4 may do so)
    ("deepseek_dsml", "open", f"I will call it\n\n{FC}\n" + dsml("get_time", ("city", "true", "Oslo"))
     + EFC, "", [("get_time", {"city": "Oslo"})], "I will call it\n\n"),
    # V4 names the block tool_calls
    ("deepseek_dsml", "open", "</think><｜DSML｜tool_calls>\n" + dsml("get_time", ("city", "true", "Oslo"))
     + "</｜DSML｜tool_calls>", "", [("get_time", {"city": "Oslo"})], ""),
]
IDS = [f"{c[0]}-{i}" for i, c in enumerate(CASES)]


def spec(fmt: str, kind: str) -> ReplySpec:
    return ReplySpec(formats.get(fmt), **SPECS[kind])


@pytest.mark.parametrize("fmt, kind, reply, content, calls, reasoning", CASES, ids=IDS)
def test_replies_whole_cut_and_streamed(fmt, kind, reply, content, calls, reasoning):
    s = spec(fmt, kind)
    msg = whole(s, reply)
    assert (msg["content"] or "") == content
    assert msg.get("reasoning_content") == (reasoning or None) or (reasoning == "" and
                                                                   not msg.get("reasoning_content"))
    assert calls_of(msg) == calls
    assert_streams_as_whole(s, reply, MARKUP)
    assert_only_grows(s, reply)


def test_a_reply_cut_by_max_tokens_keeps_its_complete_calls():
    reply = f'{B}{CB}get_time{SEP}{{"city": "Paris"}}{CE}{CB}get_weather{SEP}{{"ci'
    msg = whole(spec("deepseek", "off"), reply)
    assert calls_of(msg) == [("get_time", {"city": "Paris"})] and not msg["content"]
    cut = f"{FC}\n" + dsml("a", ("x", "false", "1")) + '<｜DSML｜invoke name="b">\n<｜DSML｜param'
    msg = whole(spec("deepseek_dsml", "off"), cut)
    assert calls_of(msg) == [("a", {"x": 1})] and not msg["content"]


def test_detected_from_the_real_templates():
    for name, fmt in [("deepseek-ai-DeepSeek-V3.1", "deepseek"), ("deepseek-ai-DeepSeek-V3.2", "deepseek_dsml"),
                      ("deepseek-ai-DeepSeek-V4", "deepseek_dsml"),
                      ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "deepseek"),
                      ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "deepseek")]:
        text = (TEMPLATES / f"{name}.jinja").read_text()
        assert formats.detect(text).name == fmt, name
    assert formats.detect(DEEPSEEK_V31).name == "deepseek"
    # V3.x switch thinking with their own variable; the R1 distills simply open <think>
    assert formats.detect_reasoning(V31) is DEEPSEEK_THINK
    assert formats.detect_reasoning(V32) is DEEPSEEK_THINK
    assert formats.detect_reasoning(DEEPSEEK_V31) is DEEPSEEK_THINK
    assert formats.detect_reasoning(R1_QWEN) is formats.THINK
    for path in sorted(TEMPLATES.glob("*.jinja")):
        if "deepseek" not in path.name.lower():
            assert not formats.detect(path.read_text()).name.startswith("deepseek"), path.name
            assert formats.detect_reasoning(path.read_text()) is not DEEPSEEK_THINK, path.name


# ---- the prompt: history, tools, thinking -----------------------------------------------------

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
    {"role": "assistant", "content": "", "tool_calls": [call("c1", {"city": "Paris"}),
                                                        call("c2", {"city": "Oslo", "days": 2})]},
    {"role": "tool", "tool_call_id": "c1", "content": "sun"},
    {"role": "tool", "tool_call_id": "c2", "content": "snow"},
    {"role": "assistant", "content": "Sun in Paris, snow in Oslo."},
    {"role": "user", "content": "And Rome?"},
    {"role": "assistant", "content": "", "tool_calls": [call("c3", {"city": "Rome"})]},
    {"role": "tool", "tool_call_id": "c3", "content": "rain"},
]


def prompt(template: str, messages: list, **kw) -> str:
    info = ModelInfo(name="m", path="m.gguf", n_ctx=4096, n_ctx_train=4096, chat_template=template,
                     bos_token="<｜begin▁of▁sentence｜>", eos_token="<｜end▁of▁sentence｜>", created=0)
    kw.setdefault("tools", TOOLS)
    return plan_chat(info, ChatInput(messages=messages, **kw), OPTS).generation.prompt


@pytest.mark.parametrize("template, shown", [
    (V31, f'{CB}get_weather{SEP}{{"city": "Oslo", "days": 2}}{CE}'),  # tojson: an object
    (DEEPSEEK_V31, f'{CB}get_weather{SEP}{{"city": "Oslo", "days": 2}}{CE}'),  # joined as text
    (R1_QWEN, f'{CB}function{SEP}get_weather\n```json\n{{"city": "Oslo", "days": 2}}\n```{CE}'),
    (R1_LLAMA, f'{CB}function{SEP}get_weather\n```json\n{{"city": "Oslo", "days": 2}}\n```{CE}'),
    (V32, '<｜DSML｜parameter name="city" string="true">Oslo</｜DSML｜parameter>\n'
          '<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>'),
])
def test_second_and_third_turns_render_the_calls_and_results(template, shown):
    second = prompt(template, TURNS[:5])
    assert shown in second and "sun" in second and "snow" in second, second[-600:]
    third = prompt(template, TURNS)
    assert shown in third and "rain" in third and "Rome" in third, third[-600:]
    assert "Sun in Paris, snow in Oslo." in third


def test_the_tools_go_where_each_template_reads_them():
    # DeepSeek's own templates never render tools: the model card's system prompt lists them
    for template in (DEEPSEEK_V31, V31, R1_QWEN):
        p = prompt(template, TURNS[:2])
        assert "get_weather" in p and "Weather in a city" in p and "Be brief." in p, template[:80]
        assert p.index("Be brief.") < p.index("get_weather")
    assert f"{B}{CB}tool_call_name{SEP}" in prompt(DEEPSEEK_V31, TURNS[:2])
    assert f"{CB}function{SEP}function_name\n```json" in prompt(R1_QWEN, TURNS[:2])
    # V3.2 renders them itself, once
    p = prompt(V32, TURNS[:2])
    assert p.count('"name": "get_weather"') == 1 and "tool_call_name" not in p


def test_the_thinking_switch():
    user = [{"role": "user", "content": "hi"}]
    for template in (V31, DEEPSEEK_V31, V32):
        assert prompt(template, user, thinking=True).endswith("<think>")
        assert prompt(template, user, effort="high").endswith("<think>")
        assert prompt(template, user, effort="none").endswith("</think>")
        assert prompt(template, user, thinking=False).endswith("</think>")
        assert prompt(template, user).endswith("</think>")  # off unless asked
        # the client's own template variables win
        assert prompt(template, user, thinking=True,
                      template_kwargs={"thinking": False}).endswith("</think>")
    info = ModelInfo(name="m", path="m.gguf", n_ctx=4096, n_ctx_train=4096, chat_template=V31,
                     bos_token="", eos_token="", created=0)
    plan = plan_chat(info, ChatInput(messages=user, tools=TOOLS, thinking=True), OPTS)
    assert plan.reply is not None and plan.reply.in_thought and plan.reply.thought is DEEPSEEK_THINK


@pytest.mark.parametrize("template, text", [
    (DEEPSEEK_V31, f'{B}{CB}get_weather{SEP}{{"city": "Paris"}}{CE}{E}'),
    (R1_QWEN, f'{B}{CB}function{SEP}get_weather\n```json\n{{"city": "Paris"}}\n```{CE}{E}'),
    (V32, f'{FC}\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">'
          f"Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n{EFC}"),
    (V4, '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" '
         'string="true">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>'),
])
def test_the_forced_call_grammar_writes_what_the_template_renders(vocab, template, text):
    fmt = formats.choose("auto", template)
    grammar = fmt.grammar(list(TOOLS), parallel=True, required=True, template=template, limits=LIMITS)
    s = grammar_sampler(vocab, grammar)
    try:
        assert s.feed(text.encode()) and s.allows(int(vocab.eog_ids[0]))
    finally:
        s.free()
