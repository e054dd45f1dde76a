"""Gemma 4 in process, through its real template: its reply (a thought channel, then a call in
Gemma's argument syntax) reads as the same call and thought on every API, a conversation with a
call and its result renders from each API's own history shape, and each API's thinking switch
reaches the template's ``enable_thinking``. End to end: tests/e2e/test_gemma4.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.engine.fake import FakeEngine
from tests.support.app import make_client
from tests.support.server import DATA

TEMPLATE = (DATA / "templates" / "google-gemma-4-31B-it.jinja").read_text()
Q = '<|"|>'
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"},
            "opts": {"type": "object", "properties": {"hourly": {"type": "boolean"}}}},
            "required": ["city"]}}}
FN = TOOL["function"]
ARGS = {"city": 'Paris "15e"', "days": 3, "opts": {"hourly": True}}
CALL = f"<|tool_call>call:get_weather{{city:{Q}Paris \"15e\"{Q},days:3,opts:{{hourly:true}}}}<tool_call|>"
THOUGHT = "The user wants\nthe weather."
REPLY = f"<|channel>thought\n{THOUGHT}<channel|>{CALL}"
ASK = "Weather in Paris?"


def requests_for(forced: bool) -> dict[str, tuple[str, dict[str, Any]]]:
    """(path, body) per API asking ASK with TOOL, a call forced where the API can force one
    (Ollama cannot), thoughts asked for."""
    chat = {"model": "m", "messages": [{"role": "user", "content": ASK}], "tools": [TOOL],
            "max_tokens": 200, **({"tool_choice": "required"} if forced else {})}
    return {
        "chat": ("/v1/chat/completions", chat),
        "chat_stream": ("/v1/chat/completions", {**chat, "stream": True}),
        "responses": ("/v1/responses", {
            "model": "m", "input": ASK, "max_output_tokens": 200,
            "tools": [{"type": "function", **FN}],
            **({"tool_choice": "required"} if forced else {})}),
        "anthropic": ("/v1/messages", {
            "model": "m", "max_tokens": 200, "messages": [{"role": "user", "content": ASK}],
            "tools": [{"name": FN["name"], "description": FN["description"],
                       "input_schema": FN["parameters"]}],
            **({"tool_choice": {"type": "any"}} if forced else {})}),
        "gemini": ("/v1beta/models/m:generateContent", {
            "contents": [{"role": "user", "parts": [{"text": ASK}]}],
            "tools": [{"functionDeclarations": [FN]}],
            "generationConfig": {"maxOutputTokens": 200, "thinkingConfig": {"includeThoughts": True}},
            **({"toolConfig": {"functionCallingConfig": {"mode": "ANY"}}} if forced else {})}),
        "ollama": ("/api/chat", {"model": "m", "messages": chat["messages"], "tools": [TOOL],
                                 "stream": False, "think": True}),
        "vertex": ("/predict", {"instances": [{"@requestFormat": "chat", **chat}]}),
    }


def read(api: str, answer: Any) -> tuple[list[tuple[str, Any]], str | None, str]:
    """(the calls as (name, arguments), the thought, the text) of ``api``'s answer."""
    if api == "chat_stream":
        names: dict[int, str] = {}
        args: dict[int, str] = {}
        thought, text = [], []
        for block in answer.split("\n\n"):
            if block.startswith("data: {") and (choices := json.loads(block[6:])["choices"]):
                delta = choices[0]["delta"]
                thought.append(delta.get("reasoning_content") or "")
                text.append(delta.get("content") or "")
                for tc in delta.get("tool_calls") or []:
                    if "name" in tc["function"]:
                        assert tc["index"] not in names, "a call's name sent twice"
                        names[tc["index"]] = tc["function"]["name"]
                    args[tc["index"]] = args.get(tc["index"], "") + tc["function"]["arguments"]
        calls = [(names[i], json.loads(args[i])) for i in sorted(names)]
        return calls, "".join(thought) or None, "".join(text)
    if api in ("chat", "vertex"):
        msg = (answer if api == "chat" else answer["predictions"][0])["choices"][0]["message"]
        return ([(c["function"]["name"], json.loads(c["function"]["arguments"]))
                 for c in msg.get("tool_calls") or []], msg.get("reasoning_content"),
                msg["content"] or "")
    if api == "responses":
        out = answer["output"]
        return ([(o["name"], json.loads(o["arguments"])) for o in out if o["type"] == "function_call"],
                "".join(c["text"] for o in out if o["type"] == "reasoning" for c in o["content"]) or None,
                "".join(c.get("text", "") for o in out if o["type"] == "message" for c in o["content"]))
    if api == "anthropic":
        blocks = answer["content"]
        return ([(b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"],
                "".join(b["thinking"] for b in blocks if b["type"] == "thinking") or None,
                "".join(b["text"] for b in blocks if b["type"] == "text"))
    if api == "gemini":
        parts = answer["candidates"][0]["content"]["parts"]
        return ([(p["functionCall"]["name"], p["functionCall"].get("args", {}))
                 for p in parts if "functionCall" in p],
                "".join(p["text"] for p in parts if p.get("thought")) or None,
                "".join(p.get("text", "") for p in parts if not p.get("thought")))
    msg = answer["message"]  # ollama
    return ([(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls") or []],
            msg.get("thinking"), msg["content"])


def poster(client):
    def post(path: str, body: dict[str, Any]) -> Any:
        resp = client.post(path, json=body)
        assert resp.status_code == 200, resp.get_data(as_text=True)
        return resp.get_data(as_text=True) if body.get("stream") else resp.get_json()
    return post


@pytest.mark.parametrize("forced", [True, False], ids=["forced", "auto"])
def test_a_thought_and_a_call_read_the_same_on_every_api(forced):
    engine = FakeEngine(reply=REPLY, n_ctx=8192, chat_template=TEMPLATE)
    client = make_client(engine)
    props = client.get("/props").get_json()["formats"]
    assert props["tool_format"] == "gemma4", props
    post = poster(client)
    for api, (path, body) in requests_for(forced).items():
        calls, thought, text = read(api, post(path, body))
        assert calls == [("get_weather", ARGS)], api
        assert thought == THOUGHT and not text.strip(), (api, thought, text)
        prompt = engine.requests[-1].prompt
        assert "<|tool>declaration:get_weather{" in prompt, api  # the tools, in Gemma's words
        grammar = engine.requests[-1].params.grammar
        if forced and api != "ollama":  # the call in Gemma's syntax, after an optional thought
            assert '"<|tool_call>call:"' in grammar and '"<|channel>thought"' in grammar, api
        else:  # auto: lazy, held from <|tool_call> on, which no thought writes
            params = engine.requests[-1].params
            assert '"<|tool_call>call:"' in grammar and '"<|channel>thought"' not in grammar, api
            assert params.grammar_triggers == ("<|tool_call>",), api


def test_a_plain_answer_shows_no_markup_on_every_api():
    engine = FakeEngine(reply="It is sunny.<|channel>thought\n<channel|><channel|>", n_ctx=8192,
                        chat_template=TEMPLATE)
    post = poster(make_client(engine))
    for api, (path, body) in requests_for(False).items():
        calls, thought, text = read(api, post(path, body))
        assert (calls, text) == ([], "It is sunny."), (api, text)
        assert not thought, api


def histories() -> dict[str, tuple[str, dict[str, Any]]]:
    """One conversation (a call to TOOL, its result "sunny", a new question) in each API's
    own shape."""
    args = json.dumps(ARGS)
    chat = [{"role": "user", "content": ASK},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "user", "content": "And tomorrow?"}]
    return {
        "chat": ("/v1/chat/completions", {"messages": chat, "tools": [TOOL]}),
        "responses": ("/v1/responses", {"model": "m", "tools": [{"type": "function", **FN}], "input": [
            {"role": "user", "content": ASK},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": args},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"role": "user", "content": "And tomorrow?"}]}),
        "anthropic": ("/v1/messages", {"model": "m", "max_tokens": 50, "messages": [
            {"role": "user", "content": ASK},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": ARGS}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                                         {"type": "text", "text": "And tomorrow?"}]}],
            "tools": [{"name": FN["name"], "description": FN["description"],
                       "input_schema": FN["parameters"]}]}),
        "gemini": ("/v1beta/models/m:generateContent", {"tools": [{"functionDeclarations": [FN]}], "contents": [
            {"role": "user", "parts": [{"text": ASK}]},
            {"role": "model", "parts": [{"functionCall": {"name": "get_weather", "args": ARGS}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "get_weather",
                                                             "response": {"result": "sunny"}}}]},
            {"role": "user", "parts": [{"text": "And tomorrow?"}]}]}),
        "ollama": ("/api/chat", {"model": "m", "stream": False, "tools": [TOOL], "messages": [
            {"role": "user", "content": ASK},
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "get_weather", "arguments": ARGS}}]},
            {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
            {"role": "user", "content": "And tomorrow?"}]}),
        "vertex": ("/predict", {"instances": [{"@requestFormat": "chat", "messages": chat, "tools": [TOOL]}]}),
    }


def test_the_second_turn_renders_from_every_api():
    engine = FakeEngine(reply="It is sunny.", n_ctx=8192, chat_template=TEMPLATE)
    post = poster(make_client(engine))
    for api, (path, body) in histories().items():
        post(path, body)
        prompt = engine.requests[-1].prompt
        # Gemini's result is an object: Gemma's own response object; the others' text a value
        result = f"result:{Q}sunny{Q}" if api == "gemini" else f"value:{Q}sunny{Q}"
        assert f"{CALL}<|tool_response>response:get_weather{{{result}}}<tool_response|>" in prompt, (
            api, prompt)
        assert "<|turn>tool" not in prompt, api
        assert prompt.endswith("<|turn>user\nAnd tomorrow?<turn|>\n<|turn>model\n"
                               "<|channel>thought\n<channel|>"), (api, prompt[-200:])


@pytest.mark.parametrize("path, body, on", [
    ("/v1/chat/completions", {"reasoning_effort": "high"}, True),
    ("/v1/chat/completions", {"reasoning_effort": "none"}, False),
    ("/v1/chat/completions", {"chat_template_kwargs": {"enable_thinking": True}}, True),
    ("/v1/chat/completions", {}, False),
    ("/v1/responses", {"reasoning": {"effort": "low"}}, True),
    ("/v1/messages", {"thinking": {"type": "enabled", "budget_tokens": 1024}}, True),
    ("/v1/messages", {"thinking": {"type": "disabled"}}, False),
    ("/v1beta/models/m:generateContent", {"generationConfig": {"thinkingConfig": {"thinkingBudget": 0}}}, False),
    ("/api/chat", {"think": True}, True),
    ("/api/chat", {"think": False}, False),
])
def test_each_apis_thinking_switch_is_enable_thinking(path, body, on):
    engine = FakeEngine(reply="Hi.", n_ctx=8192, chat_template=TEMPLATE)
    base = {
        "/v1/chat/completions": {"messages": [{"role": "user", "content": ASK}]},
        "/v1/responses": {"model": "m", "input": ASK},
        "/v1/messages": {"model": "m", "max_tokens": 2048, "messages": [{"role": "user", "content": ASK}]},
        "/v1beta/models/m:generateContent": {"contents": [{"role": "user", "parts": [{"text": ASK}]}]},
        "/api/chat": {"model": "m", "stream": False, "messages": [{"role": "user", "content": ASK}]},
    }[path]
    poster(make_client(engine))(path, {**base, **body})
    prompt = engine.requests[-1].prompt
    assert ("<|think|>" in prompt) == on
    assert prompt.endswith("<|turn>model\n" if on else "<|turn>model\n<|channel>thought\n<channel|>")


def test_a_turn_that_spoke_and_called_is_followed_by_the_models_cue():
    """The template closes a turn that said something besides its calls and results, and then
    writes no cue: the model's turn is opened again (as llama.cpp does)."""
    engine = FakeEngine(reply="Sunny.", n_ctx=8192, chat_template=TEMPLATE)
    messages = [{"role": "user", "content": ASK},
                {"role": "assistant", "content": "Let me look.", "tool_calls": [{"id": "c1", "type": "function",
                 "function": {"name": "get_weather", "arguments": json.dumps(ARGS)}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    poster(make_client(engine))("/v1/chat/completions", {"messages": messages, "tools": [TOOL]})
    assert engine.requests[-1].prompt.endswith("<tool_response|>Let me look.<turn|>\n<|turn>model\n")
