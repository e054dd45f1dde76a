"""Gemma 4 end to end: a tiny GGUF of the family (random weights, the default tokenizer with
Gemma 4's special tokens as control tokens, Gemma 4's real chat template) behind a real server.
A forced call goes through the grammar in Gemma's own syntax and comes back a proper call on
every API that can force one; the conversation with that call and its result renders and is
answered on every API; a thought written in Gemma's channel comes back split from the answer.
In process, with Gemma's replies scripted: tests/app/test_gemma4.py."""

from __future__ import annotations

import json

import pytest
import requests

from tests.support.server import DATA, running_server
from tests.support.tiny_family import build_family

TEMPLATE = (DATA / "templates" / "google-gemma-4-31B-it.jinja").read_text()
TOKENS = ["<bos>", "<eos>", "<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>", "<|tool>",
          "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>',
          "<|image|>", "<|audio|>", "<|video|>"]
# every value bounded by the grammar (an enum, an integer): a random model finishes its call
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "enum": ["Paris", "London"]}, "days": {"type": "integer"}},
            "required": ["city", "days"]}}}
FN = TOOL["function"]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
MARKUP = ("<|tool_call>", "<tool_call|>", '<|"|>', "<|channel>", "<channel|>", "<turn|>", "<|turn>")


@pytest.fixture(scope="module")
def srv(default_model, tmp_path_factory):
    path = build_family(tmp_path_factory.mktemp("gemma4") / "tiny-gemma4.gguf", default_model,
                        TOKENS, TEMPLATE, eos="<eos>", bos="<bos>")
    with running_server({"MODEL": str(path), "PARALLEL": "2", "STREAM_HEARTBEAT_SECONDS": "0"}) as s:
        yield s


def post(srv, path: str, body: dict) -> dict:
    resp = requests.post(srv.url(path), json=body, timeout=120)
    assert resp.status_code == 200, resp.text[:500]
    return resp.json()


def well_formed(name: str, args: dict) -> None:
    assert name == "get_weather" and set(args) == {"city", "days"}, (name, args)
    assert args["city"] in ("Paris", "London") and isinstance(args["days"], int), args


def test_the_format_and_its_tokens_are_reported(srv):
    formats = requests.get(srv.url("/props"), timeout=10).json()["formats"]
    assert (formats["tool_format"], formats["thought_format"]) == ("gemma4", "channel")
    assert {"<|tool_call>", "<tool_call|>", '<|"|>', "<|channel>", "<channel|>"} <= set(formats["reads"])


def test_a_forced_call_on_chat_streamed_and_not_and_its_second_turn(srv):
    import openai

    sdk = openai.OpenAI(base_url=srv.url("/v1"), api_key="x", max_retries=0)
    kw = dict(model="m", messages=ASK, tools=[TOOL], tool_choice="required", temperature=0,
              max_tokens=200, parallel_tool_calls=False, extra_body={"cache_prompt": False})
    full = sdk.chat.completions.create(**kw)
    choice = full.choices[0]
    assert choice.finish_reason == "tool_calls" and not (choice.message.content or "").strip()
    (call,) = choice.message.tool_calls
    well_formed(call.function.name, json.loads(call.function.arguments))
    with sdk.chat.completions.stream(**kw) as stream:
        final = stream.get_final_completion()
    (streamed,) = final.choices[0].message.tool_calls
    assert (streamed.function.name, streamed.function.arguments) == (call.function.name,
                                                                     call.function.arguments)
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear"}'}]
    answer = sdk.chat.completions.create(model="m", messages=history, tools=[TOOL], max_tokens=8,
                                         temperature=0, tool_choice="none")
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert not any(m in (answer.choices[0].message.content or "") for m in MARKUP)


def test_parallel_calls_come_back_to_back(srv):
    """A random model under the parallel grammar writes call after call: each that finished
    is a proper call (the last one may be cut by max_tokens)."""
    choice = post(srv, "/v1/chat/completions", {"messages": ASK, "tools": [TOOL], "max_tokens": 200,
                                                "temperature": 0, "tool_choice": "required"})["choices"][0]
    calls = choice["message"]["tool_calls"]
    assert len(calls) >= 2 and len({c["id"] for c in calls}) == len(calls), choice
    for c in calls:
        well_formed(c["function"]["name"], json.loads(c["function"]["arguments"]))


def test_a_forced_call_on_responses_anthropic_gemini_and_a_vertex_envelope(srv):
    tools = [{"name": FN["name"], "description": FN["description"], "input_schema": FN["parameters"]}]
    out = post(srv, "/v1/responses", {"model": "m", "input": ASK[0]["content"], "temperature": 0,
                                      "max_output_tokens": 200, "tool_choice": "required",
                                      "parallel_tool_calls": False,
                                      "tools": [{"type": "function", **FN}]})["output"]
    (call,) = [o for o in out if o["type"] == "function_call"]
    well_formed(call["name"], json.loads(call["arguments"]))
    msg = post(srv, "/v1/messages", {"model": "m", "max_tokens": 200, "temperature": 0,
                                     "messages": ASK, "tools": tools, "tool_choice": {"type": "any", "disable_parallel_tool_use": True}})
    assert msg["stop_reason"] == "tool_use"
    (use,) = [b for b in msg["content"] if b["type"] == "tool_use"]
    well_formed(use["name"], use["input"])
    gem = post(srv, "/v1beta/models/m:generateContent", {
        "contents": [{"role": "user", "parts": [{"text": ASK[0]["content"]}]}],
        "tools": [{"functionDeclarations": [FN]}],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY"}},
        "generationConfig": {"maxOutputTokens": 200, "temperature": 0}})
    (part,) = [p for p in gem["candidates"][0]["content"]["parts"] if "functionCall" in p]
    well_formed(part["functionCall"]["name"], part["functionCall"]["args"])
    pred = post(srv, "/predict", {"instances": [{
        "@requestFormat": "chat", "messages": ASK, "tools": [TOOL], "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 200, "temperature": 0}]})["predictions"][0]
    (vcall,) = pred["choices"][0]["message"]["tool_calls"]
    well_formed(vcall["function"]["name"], json.loads(vcall["function"]["arguments"]))


def test_the_second_turn_renders_and_answers_on_every_api(srv):
    args = {"city": "Paris", "days": 2}
    tools = [{"name": FN["name"], "description": FN["description"], "input_schema": FN["parameters"]}]
    chat = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": FN["name"], "arguments": json.dumps(args)}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "user", "content": "And tomorrow?"}]
    small = {"max_tokens": 6, "temperature": 0}
    post(srv, "/v1/chat/completions", {"messages": chat, "tools": [TOOL], **small})
    post(srv, "/predict", {"instances": [{"@requestFormat": "chat", "messages": chat, "tools": [TOOL], **small}]})
    post(srv, "/v1/responses", {"model": "m", "max_output_tokens": 6, "temperature": 0,
                                "tools": [{"type": "function", **FN}], "input": [
        ASK[0], {"type": "function_call", "call_id": "call_1", "name": FN["name"], "arguments": json.dumps(args)},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"role": "user", "content": "And tomorrow?"}]})
    post(srv, "/v1/messages", {"model": "m", "tools": tools, **small, "messages": ASK + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": FN["name"], "input": args}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                                     {"type": "text", "text": "And tomorrow?"}]}]})
    post(srv, "/v1beta/models/m:generateContent", {
        "tools": [{"functionDeclarations": [FN]}], "generationConfig": {"maxOutputTokens": 6, "temperature": 0},
        "contents": [{"role": "user", "parts": [{"text": ASK[0]["content"]}]},
                     {"role": "model", "parts": [{"functionCall": {"name": FN["name"], "args": args}}]},
                     {"role": "user", "parts": [{"functionResponse": {"name": FN["name"],
                                                                      "response": {"sky": "clear"}}}]},
                     {"role": "user", "parts": [{"text": "And tomorrow?"}]}]})
    ollama = post(srv, "/api/chat", {"model": "m", "stream": False, "tools": [TOOL],
                                     "options": {"num_predict": 6, "temperature": 0}, "messages": ASK + [
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": FN["name"], "arguments": args}}]},
        {"role": "tool", "content": "sunny", "tool_name": FN["name"]},
        {"role": "user", "content": "And tomorrow?"}]})
    assert ollama["done"] is True


def test_a_thought_in_gemmas_channel_is_split_from_the_answer(srv):
    """The grammar has the random model write a thought in Gemma's channel (control tokens the
    engine keeps in the text) and an answer: the thought comes back apart, streamed or not."""
    body = {"messages": ASK, "max_tokens": 40, "temperature": 0, "grammar":
            'root ::= "<|channel>thought\\n" [a-z]{2,6} "<channel|>" [a-z]{2,6}'}
    msg = post(srv, "/v1/chat/completions", body)["choices"][0]["message"]
    assert msg["reasoning_content"].isalpha() and msg["content"].isalpha(), msg
    with requests.post(srv.url("/v1/chat/completions"), json={**body, "stream": True}, timeout=120,
                       stream=True) as resp:
        deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in resp.iter_lines(decode_unicode=True)
                  if line.startswith("data: {") and json.loads(line[6:])["choices"]]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == msg["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == msg["content"]


def test_the_reasoning_budget_ends_the_thought_with_gemmas_close(srv):
    """The budget injects <channel|> (Gemma's control token) into the sequence: the thought ends
    there and what follows is the answer (the request's own grammar never sees the injection,
    so the close the model writes later is a stray one, dropped)."""
    body = {"messages": ASK, "max_tokens": 80, "temperature": 0, "reasoning_budget": 2, "grammar":
            'root ::= "<|channel>thought\\n" [a-z]{40,50} "<channel|>" [a-z]{2,6}'}
    msg = post(srv, "/v1/chat/completions", body)["choices"][0]["message"]
    # unbudgeted, the thought would hold 40 letters or more and the answer 6 at most
    assert msg["reasoning_content"].isalpha() and len(msg["reasoning_content"]) < 40, msg
    assert msg["content"].isalpha() and len(msg["content"]) > 6, msg
