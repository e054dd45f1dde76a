"""DeepSeek V3.1 and V3.2, Kimi K2, GLM 4.6 and MiniMax M2 end to end: one real server per family
on its tiny GGUF (random weights, the default tokenizer plus the family's control tokens, the
family's chat template). The format and thought syntax are said in /props, a forced call is read
as a proper call on every API that can force one (Chat Completions whole and streamed,
Responses, Anthropic Messages, Gemini, a Vertex envelope), and a conversation holding a call and
its result renders through every API's own history shape (Ollama's too) and answers.

The tiny model favours its family's call opener right after the generation prompt and after a
thought's end (tests.support.tiny_family ``favour``), and each request carries a small thought
budget in its API's own terms: a thought the template opens (MiniMax's, DeepSeek's when a
request turns thinking on) is ended by the budget's injected ``</think>``, and the call follows.
Its words mean nothing: nothing here reads them.
In process: tests/app/test_native_families.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
import requests

from tests.support.family_apis import histories, read, requests_for
from tests.support.family_templates import DEEPSEEK_TOKENS, DEEPSEEK_V31, KIMI_K2, KIMI_TOKENS
from tests.support.server import DATA, ServerProcess
from tests.support.tiny_family import build_family

TEMPLATES = DATA / "templates"
# an enum: a random model's free string could run on until max_tokens
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
          "required": ["city"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                         "parameters": PARAMS}}
LIMIT = 200  # tokens: a thought ended by its budget (Responses' least: 64) and the call
BUDGET = 6


@dataclass(frozen=True)
class Family:
    name: str
    format: str  # the tool-call format the template is read as
    thought: str | None  # the thought syntax it teaches
    template: str
    tokens: list[str]  # the family's control tokens
    eos: str
    favour: str  # the call's first token, which the tiny model writes right after ...
    after: tuple[str, ...]  # ... these: the generation prompt's last token, and a thought's end
    shown: str  # how the history's call shows in the rendered prompt


FAMILIES = [
    Family("deepseek-v3.1", "deepseek", "deepseek", DEEPSEEK_V31,
           [*DEEPSEEK_TOKENS, "<｜begin▁of▁sentence｜>", "<think>", "</think>"],
           "<｜end▁of▁sentence｜>", "<｜tool▁calls▁begin｜>", ("</think>",),
           '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>'),
    Family("deepseek-v3.2", "deepseek_dsml", "deepseek",
           (TEMPLATES / "deepseek-ai-DeepSeek-V3.2.jinja").read_text(),
           [*DEEPSEEK_TOKENS, "<｜begin▁of▁sentence｜>", "｜DSML｜", "<think>", "</think>"],
           "<｜end▁of▁sentence｜>", "<", ("</think>",),  # the block's tag is no token of its own
           '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>'),
    Family("kimi-k2", "kimi", "kimi", KIMI_K2, KIMI_TOKENS, "<|im_end|>",
           "<|tool_calls_section_begin|>", ("<|im_middle|>", "</think>"),
           '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}'),
    Family("glm-4.6", "glm", "think", (TEMPLATES / "GLM-4.6.jinja").read_text(),
           ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
            "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>",
            "</arg_key>", "<arg_value>", "</arg_value>", "<tool_response>", "</tool_response>",
            "/nothink"], "<|endoftext|>", "<tool_call>", ("<|assistant|>", "</think>"),
           "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>"),
    Family("minimax-m2", "minimax", "think", (TEMPLATES / "MiniMax-M2.jinja").read_text(),
           ["]~!b[", "]~b]", "[e~[", "<think>", "</think>", "<minimax:tool_call>",
            "</minimax:tool_call>"], "[e~[", "<minimax:tool_call>", ("</think>",),
           '<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n</invoke>'),
]


@pytest.fixture(scope="module", params=FAMILIES, ids=[f.name for f in FAMILIES])
def family(request, default_model, tmp_path_factory):
    fam: Family = request.param
    path = build_family(tmp_path_factory.mktemp(fam.format) / f"{fam.format}.gguf", default_model,
                        fam.tokens, fam.template, eos=fam.eos, favour=fam.favour, after=fam.after)
    srv = ServerProcess({"MODEL": str(path), "PARALLEL": "2", "STREAM_HEARTBEAT_SECONDS": "0"})
    try:
        srv.wait_ready()
        yield fam, srv
    finally:
        srv.stop()


def post(srv: ServerProcess, path: str, body: dict[str, Any]) -> Any:
    resp = requests.post(srv.url(path), json=body, timeout=120)
    assert resp.status_code == 200, (path, resp.text[:500])
    return resp.text if body.get("stream") else resp.json()


def asked(api: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with a small thought budget and one call at most, as ``api`` says them (a
    random model writes one call after another until max_tokens, and a streamed call cut
    there stays cut)."""
    body = json.loads(json.dumps(body))
    if api in ("chat", "chat_stream"):
        body.update(reasoning_budget=BUDGET, parallel_tool_calls=False)
    elif api == "vertex":
        body["instances"][0].update(reasoning_budget=BUDGET, parallel_tool_calls=False)
    elif api == "responses":
        body.update(reasoning={"effort": "minimal"}, parallel_tool_calls=False)
    elif api == "anthropic":
        body["thinking"] = {"type": "enabled", "budget_tokens": BUDGET}
        body["tool_choice"]["disable_parallel_tool_use"] = True
    elif api == "gemini":
        body["generationConfig"]["thinkingConfig"]["thinkingBudget"] = BUDGET
    return body


def test_props_name_the_format_and_thought_syntax(family):
    fam, srv = family
    formats = requests.get(srv.url("/props"), timeout=10).json()["formats"]
    assert (formats["tool_format"], formats["thought_format"]) == (fam.format, fam.thought)


def test_a_forced_call_on_every_api(family):
    fam, srv = family
    asks = requests_for(TOOL, [{"role": "user", "content": "Weather in Paris?"}], forced=True,
                        max_tokens=LIMIT)
    for api, (path, body) in asks.items():
        if api == "ollama":
            continue  # it cannot force a call: see the second turn
        calls, _ = read(api, post(srv, path, asked(api, body)))
        assert len(calls) == 1 if api != "gemini" else calls, api  # Gemini asks for no count
        for name, args in calls:
            assert name == "get_weather" and set(args) == {"city"}, (api, args)
            assert args["city"] in ("Paris", "Oslo"), (api, args)


def test_the_second_turn_renders_and_answers_on_every_api(family):
    fam, srv = family
    for api, (path, body) in histories(TOOL, ("get_weather", {"city": "Paris"}), 30).items():
        assert post(srv, path, body), api
    chat = dict(histories(TOOL, ("get_weather", {"city": "Paris"}))["chat"][1])
    chat.pop("max_tokens")
    tokens = post(srv, "/tokenize", {"model": "m", **chat})["tokens"]
    prompt = post(srv, "/detokenize", {"model": "m", "tokens": tokens})["prompt"]
    assert fam.shown in prompt and "sunny" in prompt, prompt[-800:]
