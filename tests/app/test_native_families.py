"""DeepSeek (V3.1, R1, V3.2), Kimi K2, GLM 4.6 / 4.7 and MiniMax M2 in process: each family's
reply (a thought where its template thinks, then a call in its own syntax) reads as the same
call and thought on every API, and a conversation with a call and its result renders through the
family's template from each API's own history shape. End to end: tests/e2e/test_native_families.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from app.engine.fake import FakeEngine
from tests.support.app import make_client
from tests.support.bodies import WEATHER
from tests.support.family_apis import APIS, histories, read, requests_for
from tests.support.family_templates import DEEPSEEK_V31, KIMI_K2
from tests.support.server import DATA

TEMPLATES = DATA / "templates"
CALL = ("get_weather", {"city": "Paris"})  # the call histories() holds, and the replies make
THOUGHT = "I will look it up."


@dataclass(frozen=True)
class Family:
    name: str  # the tool-call format its template is read as
    template: str
    reply: str
    thought: str | None
    shown: tuple[str, ...]  # how the earlier call, and where its result, show in the prompt


DS = ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
      "<｜tool▁calls▁end｜>")
FAMILIES = [
    Family("deepseek", DEEPSEEK_V31,
           f'{DS[0]}{DS[1]}get_weather{DS[2]}{{"city": "Paris"}}{DS[3]}{DS[4]}', None,
           (f'{DS[1]}get_weather{DS[2]}{{"city": "Paris"}}{DS[3]}',
            "<｜tool▁output▁begin｜>")),
    Family("deepseek", (TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja").read_text(),
           f'{THOUGHT}</think>{DS[0]}{DS[1]}function{DS[2]}get_weather\n```json\n{{"city": "Paris"}}'
           f"\n```{DS[3]}{DS[4]}", THOUGHT,
           (f'{DS[1]}function{DS[2]}get_weather\n```json\n{{"city": "Paris"}}\n```{DS[3]}',
            "<｜tool▁output▁begin｜>")),
    Family("deepseek_dsml", (TEMPLATES / "deepseek-ai-DeepSeek-V3.2.jinja").read_text(),
           '\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter '
           'name="city" string="true">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
           "</｜DSML｜function_calls>", None,
           ('<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>',
            "<function_results>\n<result>")),
    Family("kimi", KIMI_K2,
           f"<think>{THOUGHT}</think><|tool_calls_section_begin|><|tool_call_begin|>"
           'functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
           "<|tool_calls_section_end|>", THOUGHT,
           ('<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}',
            "## Return of functions.get_weather:0\n")),
    Family("glm", (TEMPLATES / "GLM-4.6.jinja").read_text(),
           f"\n<think>{THOUGHT}</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
           "<arg_value>Paris</arg_value>\n</tool_call>", THOUGHT,
           ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>",
            "<|observation|>\n<tool_response>\n")),
    Family("glm", (TEMPLATES / "GLM-4.7-Flash.jinja").read_text(),
           f"{THOUGHT}</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris"
           "</arg_value></tool_call>", THOUGHT,
           ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
            "<|observation|><tool_response>")),
    Family("minimax", (TEMPLATES / "MiniMax-M2.jinja").read_text(),
           f'{THOUGHT}\n</think>\n\n<minimax:tool_call>\n<invoke name="get_weather">\n'
           '<parameter name="city">Paris</parameter>\n</invoke>\n</minimax:tool_call>', THOUGHT + "\n",
           ('<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n</invoke>',
            "]~b]tool\n<response>")),
]
IDS = ["deepseek-v3.1", "deepseek-r1", "deepseek-v3.2", "kimi-k2", "glm-4.6", "glm-4.7", "minimax-m2"]


def poster(client):
    def post(path: str, body: dict[str, Any]) -> Any:
        resp = client.post(path, json=body)
        assert resp.status_code == 200, resp.get_data(as_text=True)
        return resp.get_data(as_text=True) if body.get("stream") else resp.get_json()
    return post


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_a_call_and_thought_read_the_same_on_every_api(family):
    client = make_client(FakeEngine(reply=family.reply, n_ctx=8192, chat_template=family.template))
    assert client.get("/props").get_json()["formats"]["tool_format"] == family.name
    post = poster(client)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    asks = requests_for(WEATHER, messages, forced=True)
    assert set(asks) == set(APIS)
    for api, (path, body) in asks.items():
        if api == "ollama" and family.thought:  # a template that thinks anyway: show it
            body = {**body, "think": True}
        calls, thought = read(api, post(path, body))
        assert calls == [CALL], api
        assert thought == family.thought, api


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_the_second_turn_renders_from_every_api(family):
    engine = FakeEngine(reply="It is sunny.", n_ctx=8192, chat_template=family.template)
    post = poster(make_client(engine))
    for api, (path, body) in histories(WEATHER, CALL).items():
        post(path, body)
        prompt = engine.requests[-1].prompt
        for shown in family.shown:
            assert shown in prompt, (api, shown, prompt[-600:])
        assert "sunny" in prompt and "And tomorrow?" in prompt, api
