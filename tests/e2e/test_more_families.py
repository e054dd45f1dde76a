"""Command R7B, Functionary v3.2, LFM2, Apertus and Phi-4-mini end to end: one real server per
family on its tiny GGUF (random weights, the default tokenizer plus the family's control tokens,
the family's chat template). The format is detected and said in /props, a forced call is read
as a proper call on every API that can force one (Chat Completions whole and streamed,
Responses, Anthropic Messages, Gemini, a Vertex envelope), and a conversation holding a call and
its result renders through every API's own history shape (Ollama's too) and answers.

The tiny model favours its family's call opener right after the generation prompt
(tests.support.tiny_family ``favour``), so a forced call comes before any thought. Its words
mean nothing: nothing here reads them. In process: tests/app/test_more_families.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import requests

from tests.support.family_apis import histories, read, requests_for
from tests.support.server import DATA, ServerProcess
from tests.support.tiny_family import build_family

TEMPLATES = DATA / "templates"
# an enum: a random model's free string could run on until max_tokens
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
          "required": ["city"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                         "parameters": PARAMS}}
LIMIT = 80  # tokens: a forced call of this schema ends well within it


@dataclass(frozen=True)
class Family:
    format: str  # the tool-call format the template is read as
    thought: str | None  # the thought syntax the template teaches
    template: str
    tokens: list[str]  # the family's control tokens
    eos: str
    favour: str | None  # the call opener the tiny model writes right after ...
    after: tuple[str, ...]  # ... these tokens, which end the generation prompts here
    shown: str  # how the history's call shows in the rendered prompt
    env: dict[str, str] = field(default_factory=dict)


COMMAND_R7B = Family(
    "command_r7b", "command_r7b",
    (TEMPLATES / "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja").read_text(),
    ["<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|SYSTEM_TOKEN|>", "<|USER_TOKEN|>",
     "<|CHATBOT_TOKEN|>", "<|START_THINKING|>", "<|END_THINKING|>", "<|START_ACTION|>",
     "<|END_ACTION|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TOOL_RESULT|>",
     "<|END_TOOL_RESULT|>"],
    "<|END_OF_TURN_TOKEN|>", "<|START_ACTION|>", ("<|CHATBOT_TOKEN|>", "<|END_THINKING|>"),
    '"tool_name": "get_weather", "parameters": {"city": "Paris"}')

# no control token opens a call (the recipient line is text), and no thought comes first
FUNCTIONARY = Family(
    "functionary_v3_2", None, (TEMPLATES / "meetkai-functionary-medium-v3.2.jinja").read_text(),
    ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], "<|eot_id|>", None, (),
    '>>>get_weather\n{"city": "Paris"}')

# LFM2's first template: the history writes the calls into the text, as the model wrote them
LFM2 = Family(
    "lfm2", None, (TEMPLATES / "LFM2-8B-A1B.jinja").read_text(),
    ["<|startoftext|>", "<|im_start|>", "<|im_end|>", "<|tool_call_start|>", "<|tool_call_end|>",
     "<|tool_list_start|>", "<|tool_list_end|>", "<|tool_response_start|>",
     "<|tool_response_end|>"], "<|im_end|>", None, (), '[get_weather(city="Paris")]')

APERTUS = Family(
    "apertus", "apertus", (TEMPLATES / "Apertus-8B-Instruct.jinja").read_text(),
    ["<|system_start|>", "<|system_end|>", "<|developer_start|>", "<|developer_end|>",
     "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>",
     "<|inner_prefix|>", "<|inner_suffix|>", "<|tools_prefix|>", "<|tools_suffix|>"],
    "<|assistant_end|>", "<|tools_prefix|>", ("<|assistant_start|>", "<|inner_suffix|>"),
    '[{"get_weather": {"city": "Paris"}}]')

# Microsoft's template: the tools go into the system message, the calls into the text
PHI4 = Family(
    "phi4", None, (TEMPLATES / "microsoft-Phi-4-mini-instruct.jinja").read_text(),
    ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>", "<|/tool|>", "<|tool_call|>",
     "<|/tool_call|>", "<|tool_response|>"], "<|end|>", "<|tool_call|>", ("<|assistant|>",),
    '[{"name": "get_weather", "arguments": {"city": "Paris"}}]')

FAMILIES = [COMMAND_R7B, FUNCTIONARY, LFM2, APERTUS, PHI4]


@pytest.fixture(scope="module", params=FAMILIES, ids=[f.format for f in FAMILIES])
def family(request, default_model, tmp_path_factory):
    fam: Family = request.param
    path = build_family(tmp_path_factory.mktemp(fam.format) / f"{fam.format}.gguf", default_model,
                        fam.tokens, fam.template, eos=fam.eos, favour=fam.favour, after=fam.after)
    srv = ServerProcess({"MODEL": str(path), "PARALLEL": "2", "STREAM_HEARTBEAT_SECONDS": "0",
                         **fam.env})
    try:
        srv.wait_ready()
        yield fam, srv
    finally:
        srv.stop()


def post(srv: ServerProcess, path: str, body: dict[str, Any]) -> Any:
    resp = requests.post(srv.url(path), json=body, timeout=120)
    assert resp.status_code == 200, (path, resp.text[:500])
    return resp.text if body.get("stream") else resp.json()


def test_props_name_the_format(family):
    fam, srv = family
    formats = requests.get(srv.url("/props"), timeout=10).json()["formats"]
    assert (formats["tool_format"], formats["thought_format"]) == (fam.format, fam.thought)
    if fam.favour and fam.favour in fam.template:  # the control tokens the template names, read or dropped
        assert fam.favour in formats["reads"]


def test_a_forced_call_on_every_api(family):
    fam, srv = family
    asks = requests_for(TOOL, [{"role": "user", "content": "Weather in Paris?"}], forced=True,
                        max_tokens=LIMIT)
    for api, (path, body) in asks.items():
        if api == "ollama":
            continue  # it cannot force a call: see the second turn
        calls, _ = read(api, post(srv, path, body))
        assert len(calls) >= 1, api
        for name, args in calls:
            assert name == "get_weather" and set(args) == {"city"}, (api, args)
            assert args["city"] in ("Paris", "Oslo"), (api, args)


def test_the_second_turn_renders_and_answers_on_every_api(family):
    """The tiny model opens a call again after the result (its favourite token): whatever it
    says, the request with the call and its result renders and answers."""
    fam, srv = family
    for api, (path, body) in histories(TOOL, ("get_weather", {"city": "Paris"}), 16).items():
        assert post(srv, path, body), api
    chat = histories(TOOL, ("get_weather", {"city": "Paris"}))["chat"][1]
    chat = {k: v for k, v in chat.items() if k != "max_tokens"}
    tokens = post(srv, "/tokenize", {"model": "m", **chat})["tokens"]
    prompt = post(srv, "/detokenize", {"model": "m", "tokens": tokens})["prompt"]
    assert fam.shown in prompt and "sunny" in prompt, prompt[-800:]


@pytest.fixture(scope="module")
def moe(default_model, tmp_path_factory):
    """Cohere2 MoE's template, whose generation prompt opens the thought (the tiny model opens
    its call right after the thought's close, as a real one does)."""
    path = build_family(tmp_path_factory.mktemp("moe") / "cohere2moe.gguf", default_model,
                        [*COMMAND_R7B.tokens, "<|START_TEXT|>", "<|END_TEXT|>"],
                        (TEMPLATES / "Cohere2MoE.jinja").read_text(), eos=COMMAND_R7B.eos,
                        favour="<|START_ACTION|>", after=("<|END_THINKING|>",))
    srv = ServerProcess({"MODEL": str(path), "PARALLEL": "1"})
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def test_a_thought_the_prompt_opened_ended_by_the_budget_then_the_call(moe):
    """The budget injects <|END_THINKING|>: the thought is split off and the forced call
    follows in the family's syntax, streamed or not."""
    body = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [TOOL],
            "tool_choice": "required", "max_tokens": LIMIT, "temperature": 0,
            "reasoning_budget": 4}
    for stream in (False, True):
        answer = post(moe, "/v1/chat/completions", {**body, "stream": stream})
        calls, thought = read("chat_stream" if stream else "chat", answer)
        assert thought and calls and all(name == "get_weather" for name, _ in calls), answer
