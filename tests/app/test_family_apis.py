"""Families in process (the fake engine answers in the family's own syntax): every API gives the
same call and thought in its own shape (Chat Completions whole and streamed, Responses,
Anthropic Messages, Gemini, Ollama), and a request's thinking switch and effort reach the
family's template. End to end on tiny models: tests/e2e/test_families.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.engine.fake import FakeEngine
from tests.support.app import make_client
from tests.support.server import DATA

TEMPLATES = DATA / "templates"
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                         "parameters": PARAMS}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
MAGISTRAL_SMALL = (
    "{{ bos_token }}[SYSTEM_PROMPT]Think first:[THINK]thoughts[/THINK]answer[/SYSTEM_PROMPT]"
    "{% for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
    "{% else %}{{ m.content }}{% endif %}{% endfor %}"
)
LLAMA4 = (
    "{% if tools %}Use exact format: [func_name1(param1=value1)]{% endif %}"
    "{% for m in messages %}<|header_start|>{{ m.role }}<|header_end|>\n\n{{ m.content }}<|eot|>"
    "{% endfor %}<|header_start|>assistant<|header_end|>\n\n"
)
# (template, the reply, its thought)
FAMILIES = {
    "magistral": ((TEMPLATES / "mistralai-Ministral-3-14B-Reasoning-2512.jinja").read_text(),
                  '[THINK]It needs the tool.[/THINK][TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
                  "It needs the tool."),
    "magistral-small": (MAGISTRAL_SMALL,
                        '[THINK]It needs the tool.[/THINK][TOOL_CALLS]get_weather[ARGS]'
                        '{"city": "Paris"}', "It needs the tool."),
    "pythonic": (LLAMA4, '<|python_start|>[get_weather(city="Paris")]<|python_end|>', None),
    "granite": ((TEMPLATES / "ibm-granite-granite-3.3-2B-Instruct.jinja").read_text(),
                '<think>It needs the tool.</think><|tool_call|>[{"name": "get_weather", '
                '"arguments": {"city": "Paris"}}]', "It needs the tool."),
    # the template opens the thought: the reply starts inside it
    "nemotron": ((TEMPLATES / "NVIDIA-Nemotron-Nano-v2.jinja").read_text(),
                 'It needs the tool.\n</think>\n<TOOLCALL>[{"name": "get_weather", "arguments": '
                 '{"city": "Paris"}}]</TOOLCALL>', "It needs the tool.\n"),
    "seed_oss": ((TEMPLATES / "ByteDance-Seed-OSS.jinja").read_text(),
                 "<seed:think>It needs the tool.</seed:think>\n<seed:tool_call>\n"
                 "<function=get_weather>\n<parameter=city>Paris</parameter>\n</function>\n"
                 "</seed:tool_call>", "It needs the tool."),
}


def client_for(name: str) -> Any:
    template, reply, _ = FAMILIES[name]
    return make_client(FakeEngine(reply=reply, n_ctx=4096, chat_template=template))


def sse(text: str) -> list[dict[str, Any]]:
    return [json.loads(b[6:]) for b in text.split("\n\n") if b.startswith("data: {")]


@pytest.mark.parametrize("name", FAMILIES)
def test_every_api_gives_the_call_and_the_thought(name):
    client = client_for(name)
    thought = FAMILIES[name][2]
    chat = {"messages": ASK, "tools": [TOOL]}
    msg = client.post("/v1/chat/completions", json=chat).get_json()["choices"][0]["message"]
    (call,) = msg["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == (
        "get_weather", {"city": "Paris"})
    assert msg.get("reasoning_content") == thought and not msg["content"]
    deltas = [c["choices"][0]["delta"] for c in sse(client.post(
        "/v1/chat/completions", json={**chat, "stream": True}).get_data(as_text=True))
        if c.get("choices")]
    assert "".join(tc["function"]["arguments"] for d in deltas
                   for tc in d.get("tool_calls", [])) == call["function"]["arguments"]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == (thought or "")
    assert not "".join(d.get("content") or "" for d in deltas)

    out = client.post("/v1/responses", json={
        "input": "Weather in Paris?", "tools": [{"type": "function", "name": "get_weather",
                                                 "parameters": PARAMS}]}).get_json()["output"]
    (fc,) = [o for o in out if o["type"] == "function_call"]
    assert json.loads(fc["arguments"]) == {"city": "Paris"}
    said = [c["text"] for o in out if o["type"] == "reasoning" for c in o["content"]]
    assert said == ([thought] if thought else [])

    msg = client.post("/v1/messages", json={
        "model": "m", "max_tokens": 64, "messages": ASK,
        "tools": [{"name": "get_weather", "input_schema": PARAMS}]}).get_json()
    kinds = [b["type"] for b in msg["content"]]
    assert kinds == (["thinking", "tool_use"] if thought else ["tool_use"]), msg
    assert msg["content"][-1]["input"] == {"city": "Paris"} and msg["stop_reason"] == "tool_use"

    gem = client.post("/v1beta/models/m:generateContent", json={
        "contents": [{"role": "user", "parts": [{"text": "Weather in Paris?"}]}],
        "tools": [{"functionDeclarations": [{"name": "get_weather", "parameters": PARAMS}]}],
        "generationConfig": {"thinkingConfig": {"includeThoughts": True}}}).get_json()
    parts = gem["candidates"][0]["content"]["parts"]
    assert [p["functionCall"] for p in parts if "functionCall" in p][0]["args"] == {"city": "Paris"}
    assert [p["text"] for p in parts if p.get("thought")] == ([thought] if thought else [])

    olla = client.post("/api/chat", json={"model": "m", "stream": False, "messages": ASK,
                                          "tools": [TOOL]}).get_json()["message"]
    assert olla["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert olla.get("thinking") == thought and not olla["content"]


def prompt_of(client: Any, engine_requests: list, body: dict[str, Any],
              path: str = "/v1/chat/completions") -> str:
    resp = client.post(path, json=body)
    assert resp.status_code == 200, resp.get_json()
    return engine_requests[-1].prompt


def test_granite_thinks_when_asked_on_any_api():
    engine = FakeEngine(reply="<response>Hi.</response>", n_ctx=4096,
                        chat_template=FAMILIES["granite"][0])
    client = make_client(engine)
    asked = "Write your thoughts between <think></think>"
    assert asked not in prompt_of(client, engine.requests, {"messages": ASK})
    assert asked in prompt_of(client, engine.requests, {"messages": ASK,
                                                        "reasoning_effort": "low"})
    assert asked not in prompt_of(client, engine.requests, {"messages": ASK,
                                                            "reasoning_effort": "none"})
    assert asked in prompt_of(client, engine.requests, {
        "model": "m", "max_tokens": 64, "messages": ASK,
        "thinking": {"type": "enabled", "budget_tokens": 1024}}, "/v1/messages")
    assert asked in prompt_of(client, engine.requests, {"model": "m", "messages": ASK,
                                                        "stream": False, "think": True},
                              "/api/chat")
    answer = client.post("/v1/chat/completions", json={"messages": ASK}).get_json()
    assert answer["choices"][0]["message"]["content"] == "Hi."


def test_nemotron_thinks_unless_told_not_to_on_any_api():
    engine = FakeEngine(reply="Hi.", n_ctx=4096, chat_template=FAMILIES["nemotron"][0])
    client = make_client(engine)
    assert prompt_of(client, engine.requests, {"messages": ASK}).endswith("<think>\n")
    off = [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi /no_think"}]}),
        ("/v1/messages", {"model": "m", "max_tokens": 64, "messages": ASK,
                          "thinking": {"type": "disabled"}}),
        ("/v1beta/models/m:generateContent", {
            "contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
            "generationConfig": {"thinkingConfig": {"thinkingBudget": 0}}}),
        ("/api/chat", {"model": "m", "messages": ASK, "stream": False, "think": False}),
    ]
    for path, body in off:
        assert prompt_of(client, engine.requests, body, path).endswith("<think></think>"), path
    # thought off, the reply is all answer
    answer = client.post("/api/chat", json=off[-1][1]).get_json()["message"]
    assert answer["content"] == "Hi." and not answer.get("thinking")
    back_on = {"model": "m", "max_tokens": 64, "thinking": {"type": "enabled", "budget_tokens": 64},
               "messages": [{"role": "user", "content": "Hi /no_think"}]}
    assert prompt_of(client, engine.requests, back_on, "/v1/messages").endswith("<think>\n")


def test_seed_oss_reads_the_thought_budget_from_any_api():
    engine = FakeEngine(reply="Hi.", n_ctx=4096, chat_template=FAMILIES["seed_oss"][0])
    client = make_client(engine)
    budget = "thinking budget, which is {}."
    assert "thinking budget" not in prompt_of(client, engine.requests, {"messages": ASK})
    assert budget.format(256) in prompt_of(client, engine.requests, {
        "messages": ASK, "reasoning_effort": "low"})
    assert budget.format(777) in prompt_of(client, engine.requests, {
        "messages": ASK, "reasoning_budget": 777})
    assert budget.format(2048) in prompt_of(client, engine.requests, {
        "model": "m", "max_tokens": 4096, "messages": ASK,
        "thinking": {"type": "enabled", "budget_tokens": 2048}}, "/v1/messages")
    off = "your thinking budget is 0"
    for path, body in [
        ("/v1/chat/completions", {"messages": ASK, "reasoning_effort": "none"}),
        ("/v1/messages", {"model": "m", "max_tokens": 64, "messages": ASK,
                          "thinking": {"type": "disabled"}}),
        ("/v1beta/models/m:generateContent", {
            "contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
            "generationConfig": {"thinkingConfig": {"thinkingBudget": 0}}}),
        ("/api/chat", {"model": "m", "messages": ASK, "stream": False, "think": False}),
    ]:
        prompt = prompt_of(client, engine.requests, body, path)
        assert off in prompt and prompt.endswith("</seed:think>"), path
    mine = {"messages": ASK, "reasoning_effort": "low",
            "chat_template_kwargs": {"thinking_budget": 512}}
    assert budget.format(512) in prompt_of(client, engine.requests, mine)


def test_pythonic_wakes_the_lazy_grammar_at_an_offered_tools_name():
    engine = FakeEngine(reply="Sure.", n_ctx=4096, chat_template=LLAMA4)
    client = make_client(engine)
    assert client.post("/v1/chat/completions", json={"messages": ASK, "tools": [TOOL]}
                       ).status_code == 200
    params = engine.requests[-1].params
    assert params.grammar and set(params.grammar_triggers) == {"<|python_start|>",
                                                                "[get_weather("}
