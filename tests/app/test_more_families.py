"""Command R7B, Functionary v3.2, LFM2, Apertus and Phi-4-mini in process: each family's reply
(a thought where it has them, then a call in its own syntax) reads as the same call and thought
on every API, and a conversation with a call and its result renders through the family's
template from each API's own history shape. End to end: tests/e2e/test_more_families.py."""

from __future__ import annotations

from typing import Any

import pytest

from app.engine.fake import FakeEngine
from tests.support.app import make_client
from tests.support.bodies import WEATHER
from tests.support.family_apis import APIS, histories, read, requests_for, text_of
from tests.support.server import DATA

TEMPLATES = DATA / "templates"
CALL = ("get_weather", {"city": "Paris"})  # the call histories() holds, and the replies make


class Family:
    """A family's template, a reply in its syntax, and how its template shows the history."""

    def __init__(self, name: str, template: str, reply: str, thought: str | None,
                 shown: tuple[str, ...], answer: str = "It is sunny.", answered: str = "It is sunny.",
                 id: str = ""):
        self.name, self.template, self.reply, self.thought = name, template, reply, thought
        self.id = id or name
        self.shown = shown  # how the earlier call (and its result) show in the prompt
        self.answer = answer  # a plain answer in the family's syntax, and what it reads as
        self.answered = answered


FAMILIES = [
    Family("command_r7b", (TEMPLATES / "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja").read_text(),
           '<|START_THINKING|>I will look it up.<|END_THINKING|><|START_ACTION|>[\n    {"tool_call_id":'
           ' "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}}\n]<|END_ACTION|>',
           "I will look it up.",
           ('"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}',
            '<|START_TOOL_RESULT|>[\n    {\n        "tool_call_id": "0"'),
           "<|START_RESPONSE|>It is sunny.<|END_RESPONSE|>"),
    Family("functionary_v3_2", (TEMPLATES / "meetkai-functionary-medium-v3.2.jinja").read_text(),
           'all\nLet me look.>>>get_weather\n{"city": "Paris"}', None,
           ('>>>get_weather\n{"city": "Paris"}<|eot_id|>',), "all\nIt is sunny."),
    Family("lfm2", (TEMPLATES / "LFM2.5-8B-A1B.jinja").read_text(),
           '<think>I will look it up.</think><|tool_call_start|>[get_weather(city="Paris")]'
           "<|tool_call_end|>", "I will look it up.",
           ("<|im_start|>assistant\n<|tool_call_start|>[get_weather(city='Paris')]<|tool_call_end|>",),
           id="lfm2.5"),
    Family("lfm2", (TEMPLATES / "LFM2-8B-A1B.jinja").read_text(),
           'Looking.<|tool_call_start|>[get_weather(city="Paris")]<|tool_call_end|>', None,
           ('<|im_start|>assistant\n<|tool_call_start|>[get_weather(city="Paris")]<|tool_call_end|>',
            "<|tool_response_start|>"), id="lfm2"),
    *(Family("apertus", (TEMPLATES / f"{name}.jinja").read_text(),
             "<|inner_prefix|>I will look it up.<|inner_suffix|><|tools_prefix|>"
             '[{"get_weather": {"city": "Paris"}}]<|tools_suffix|>', "I will look it up.",
             ('<|tools_prefix|>[{"get_weather": {"city": "Paris"}}]<|tools_suffix|>[',),
             id=f"apertus-{name}")
      for name in ("Apertus-8B-Instruct", "swiss-ai-Apertus-8B-Instruct-2509")),
    Family("phi4", (TEMPLATES / "microsoft-Phi-4-mini-instruct.jinja").read_text(),
           '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|/tool_call|>', None,
           ('<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|/tool_call|>'
            "<|end|><|tool_response|>", '<|tool|>[{"name": "get_weather"'), id="phi4-microsoft"),
    Family("phi4", (TEMPLATES / "llama-cpp-microsoft-Phi-4-mini-instruct.jinja").read_text(),
           '<|tool_call|>{"name": "get_weather", "arguments": {"city": "Paris"}}<|/tool_call|>', None,
           ('<|tool_call|>{"name": "get_weather", "arguments": {"city": "Paris"}}<|/tool_call|>'
            "<|end|><|tool_response|>",), id="phi4-llama.cpp"),
]
IDS = [f.id for f in FAMILIES]


def poster(client):
    def post(path: str, body: dict[str, Any]) -> Any:
        resp = client.post(path, json=body)
        assert resp.status_code == 200, resp.get_data(as_text=True)
        return resp.get_data(as_text=True) if body.get("stream") else resp.get_json()
    return post


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_a_call_and_thought_read_the_same_on_every_api(family):
    engine = FakeEngine(reply=family.reply, n_ctx=8192, chat_template=family.template)
    client = make_client(engine)
    assert client.get("/props").get_json()["formats"]["tool_format"] == family.name
    post = poster(client)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    for api, (path, body) in requests_for(WEATHER, messages, forced=True).items():
        if api == "ollama":
            body = {**body, "think": True}
        calls, thought = read(api, post(path, body))
        assert calls == [CALL], api
        assert thought == family.thought, api
    assert set(APIS) == set(requests_for(WEATHER, messages, forced=True))


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_a_plain_answer_shows_no_markup(family):
    client = make_client(FakeEngine(reply=family.answer, n_ctx=8192, chat_template=family.template))
    post = poster(client)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    for api, (path, body) in requests_for(WEATHER, messages, forced=False).items():
        if api != "chat_stream":
            assert text_of(api, post(path, body)) == family.answered, api
    plain = client.post("/v1/chat/completions", json={"messages": messages}).get_json()
    assert plain["choices"][0]["message"]["content"] == family.answered  # no tools offered


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_the_second_turn_renders_from_every_api(family):
    engine = FakeEngine(reply=family.answer, n_ctx=8192,
                        chat_template=family.template)
    post = poster(make_client(engine))
    for api, (path, body) in histories(WEATHER, CALL).items():
        post(path, body)
        prompt = engine.requests[-1].prompt
        for shown in family.shown:
            assert shown in prompt, (api, shown, prompt[-600:])
        assert "sunny" in prompt and "And tomorrow?" in prompt, api
