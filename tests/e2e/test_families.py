"""Model families end to end, one real server per family on its tiny GGUF (random weights, the
default tokenizer plus the family's control tokens, a template that writes the family's markers
as its real one does): the format is detected and said in /props, a forced call is parsed into
the same call on every API (Chat Completions whole and streamed, Responses, Anthropic Messages,
Gemini, Ollama, a Vertex envelope), the second turn with the call and its result renders in the
family's own form and answers, and a thought ended by the reasoning budget is split off.

The tiny model writes its family's call opener right after the generation prompt (and after a
thought's close): tests.support.tiny_family ``favour``. So Ollama's request, which cannot force
a call, gets one where tool_choice auto is held (a family that teaches no thoughts), and a
forced call comes before any thought. Its words mean nothing: nothing here reads them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest
import requests

from tests.support.server import DATA, VERTEX_HEALTH, VERTEX_PREDICT, ServerProcess, free_port
from tests.support.tiny_family import build_family

# an enum: a random model's free string could run on until max_tokens
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
          "required": ["city"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                         "parameters": PARAMS}}
ASK = "What is the weather in Paris?"
LIMIT = 60  # tokens: a forced call of this schema ends well within it


@dataclass(frozen=True)
class Family:
    format: str  # the tool-call format the template is read as
    thought: str | None  # the thought syntax (None: the template teaches none)
    template: str  # takes ``open_thought``: the generation prompt opens a thought (budget test)
    tokens: list[str]  # the family's control tokens
    eos: str
    favour: str  # the call opener the tiny model writes right after ...
    after: tuple[str, ...]  # ... these tokens, which end the generation prompts here
    shown: str  # how the history's call shows in the rendered prompt
    marker: str  # a control token the history's call is written with
    env: dict[str, str] = field(default_factory=dict)
    # a template that teaches thoughts leaves tool_choice auto unheld (a lazy grammar would
    # wake inside a thought), so only a thoughtless family's Ollama request is sure of a call
    held_under_auto: bool = False
    ask: str = ASK  # the question a forced call answers (a family's own switch may ride on it)


MAGISTRAL = Family(
    "magistral", "magistral",
    "{{ bos_token }}[SYSTEM_PROMPT]Think first:[THINK]thoughts[/THINK]answer[/SYSTEM_PROMPT]"
    "{% if tools %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "{% for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
    "{% elif m.role == 'assistant' %}{{ m.content }}{% for c in m.tool_calls or [] %}"
    "[TOOL_CALLS]{{ c.function.name }}[ARGS]{{ c.function.arguments|tojson }}{% endfor %}"
    "{{ eos_token }}{% elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]"
    "{% endif %}{% endfor %}{% if add_generation_prompt and open_thought %}[THINK]{% endif %}",
    ["<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]",
     "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[ARGS]",
     "[CALL_ID]", "[THINK]", "[/THINK]"],
    "</s>", "[TOOL_CALLS]", ("[/INST]", "[/TOOL_RESULTS]", "[/THINK]"),
    '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}</s>', "[TOOL_CALLS]")
LLAMA4 = Family(
    "pythonic", None,
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
    "{% if add_generation_prompt %}<|header_start|>assistant<|header_end|>\n\n{% endif %}",
    ["<|begin_of_text|>", "<|header_start|>", "<|header_end|>", "<|eot|>", "<|eom|>",
     "<|python_start|>", "<|python_end|>"],
    "<|eot|>", "<|python_start|>", ("ĊĊ",), '[get_weather(city="Paris")]<|eot|>',
    "<|header_start|>", held_under_auto=True)

GRANITE = Family(
    "granite", "granite",
    "{% if tools %}<|start_of_role|>system<|end_of_role|>When a tool is required, respond only with "
    "<|tool_call|> followed by a JSON list of tools used.<|end_of_text|>\n"
    "<|start_of_role|>available_tools<|end_of_role|>{{ tools|tojson }}<|end_of_text|>\n"
    "{% elif thinking %}<|start_of_role|>system<|end_of_role|>Write your thoughts between "
    "<think></think> and write your response between <response></response>.<|end_of_text|>\n"
    "{% endif %}{% for m in messages %}<|start_of_role|>{{ m.role }}<|end_of_role|>"
    "{{ m.content }}<|end_of_text|>\n{% endfor %}{% if add_generation_prompt %}"
    "<|start_of_role|>assistant<|end_of_role|>{% if open_thought %}<think>{% endif %}{% endif %}",
    ["<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "<|tool_call|>", "<think>",
     "</think>"],
    "<|end_of_text|>", "<|tool_call|>", ("<|end_of_role|>", "</think>"),
    '<|start_of_role|>assistant<|end_of_role|><|tool_call|>[{"name": "get_weather", '
    '"arguments": {"city": "Paris"}}]<|end_of_text|>', "<|tool_call|>")

NEMOTRON = Family(
    "nemotron", "nemotron", (DATA / "templates" / "NVIDIA-Nemotron-Nano-v2.jinja").read_text(),
    ["<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<TOOLCALL>", "</TOOLCALL>", "<think>",
     "</think>", "<AVAILABLE_TOOLS>", "</AVAILABLE_TOOLS>", "<TOOL_RESPONSE>", "</TOOL_RESPONSE>"],
    "<SPECIAL_12>", "<TOOLCALL>", ("</think>",),
    '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</TOOLCALL>', "<TOOLCALL>",
    ask=ASK + " /no_think")  # its template opens a thought unless told not to

SEED_OSS = Family(
    "seed_oss", "seed",
    "{% if tools %}<seed:bos>system\n{% for t in tools %}Function:\ndef {{ t.function.name }}("
    "{% for k, v in t.function.parameters.properties.items() %}{{ k }}: str{% endfor %}):\n"
    "{% endfor %}Use:\n<seed:tool_call>\n<function=example_function_name>\n"
    "<parameter=example_parameter_1>value_1</parameter>\n</function>\n</seed:tool_call>\n"
    "<seed:eos>{% endif %}{% for m in messages %}<seed:bos>{{ m.role }}\n"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<seed:tool_call>\n<function="
    "{{ c.function.name }}>\n{% for k, v in c.function.arguments.items() %}<parameter={{ k }}>"
    "{{ v }}</parameter>\n{% endfor %}</function>\n</seed:tool_call>{% endfor %}"
    "{% else %}{{ m.content }}{% endif %}<seed:eos>{% endfor %}{% if add_generation_prompt %}"
    "<seed:bos>assistant\n{% if open_thought %}<seed:think>{% endif %}{% endif %}",
    ["<seed:bos>", "<seed:eos>", "<seed:tool_call>", "</seed:tool_call>", "<seed:think>",
     "</seed:think>", "<seed:cot_budget_reflect>", "</seed:cot_budget_reflect>"],
    "<seed:eos>", "<seed:tool_call>", ("Ċ", "</seed:think>"),
    "<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n</function>\n"
    "</seed:tool_call><seed:eos>", "<seed:tool_call>")

FAMILIES = [MAGISTRAL, LLAMA4, GRANITE, NEMOTRON, SEED_OSS]


@pytest.fixture(scope="module", params=FAMILIES, ids=[f.format for f in FAMILIES])
def family(request, default_model, tmp_path_factory):
    fam: Family = request.param
    path = build_family(tmp_path_factory.mktemp(fam.format) / f"{fam.format}.gguf", default_model,
                        fam.tokens, fam.template, eos=fam.eos, favour=fam.favour,
                        after=fam.after)
    port = free_port()
    srv = ServerProcess({"MODEL": str(path), "PARALLEL": "2", "STREAM_HEARTBEAT_SECONDS": "0",
                         "AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(port),
                         "AIP_HEALTH_ROUTE": VERTEX_HEALTH, "AIP_PREDICT_ROUTE": VERTEX_PREDICT,
                         **fam.env})
    try:
        srv.wait_ready()
        yield fam, srv
    finally:
        srv.stop()


def post(srv: ServerProcess, path: str, body: dict[str, Any]) -> Any:
    resp = requests.post(srv.url(path), json=body, timeout=120)
    assert resp.status_code == 200, (path, resp.text[:500])
    return resp.json()


def checked(name: str, args: Any) -> dict[str, Any]:
    """A call to the tool, with arguments its schema holds (a JSON text or an object)."""
    assert name == "get_weather"
    value = json.loads(args) if isinstance(args, str) else args
    assert set(value) == {"city"} and value["city"] in ("Paris", "Oslo"), value
    return value


def test_props_name_the_format(family):
    fam, srv = family
    formats = requests.get(srv.url("/props"), timeout=10).json()["formats"]
    assert (formats["tool_format"], formats["thought_format"]) == (fam.format, fam.thought)
    assert (fam.favour in formats["reads"]) == (fam.favour in fam.template)


def test_a_forced_call_on_every_api(family):
    fam, srv = family
    chat = {"messages": [{"role": "user", "content": fam.ask}], "tools": [TOOL],
            "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": LIMIT,
            "temperature": 0}
    choice = post(srv, "/v1/chat/completions", chat)["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    args = checked(call["function"]["name"], call["function"]["arguments"])
    assert not (choice["message"]["content"] or "").strip()

    sdk = openai.OpenAI(base_url=srv.url("/v1"), api_key="x", max_retries=0)
    with sdk.chat.completions.stream(model="m", **chat) as stream:
        final = stream.get_final_completion()
    (streamed,) = final.choices[0].message.tool_calls
    assert json.loads(streamed.function.arguments) == args  # greedy: the same call

    resp = post(srv, "/v1/responses", {
        "input": fam.ask, "tool_choice": "required", "parallel_tool_calls": False,
        "max_output_tokens": LIMIT, "temperature": 0,
        "tools": [{"type": "function", "name": "get_weather", "parameters": PARAMS}]})
    (item,) = [o for o in resp["output"] if o["type"] == "function_call"]
    checked(item["name"], item["arguments"])

    msg = post(srv, "/v1/messages", {
        "model": "m", "max_tokens": LIMIT, "messages": [{"role": "user", "content": fam.ask}],
        "tools": [{"name": "get_weather", "description": "w", "input_schema": PARAMS}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True}, "temperature": 0})
    (use,) = [b for b in msg["content"] if b["type"] == "tool_use"]
    assert msg["stop_reason"] == "tool_use" and checked(use["name"], use["input"])

    gem = post(srv, "/v1beta/models/m:generateContent", {
        "contents": [{"role": "user", "parts": [{"text": fam.ask}]}],
        "tools": [{"functionDeclarations": [{"name": "get_weather", "description": "w",
                                             "parameters": {"type": "OBJECT", "properties": {
                                                 "city": {"type": "STRING", "enum": ["Paris", "Oslo"]}},
                                                 "required": ["city"]}}]}],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY"}},
        "generationConfig": {"maxOutputTokens": LIMIT, "temperature": 0}})
    (part,) = [p for p in gem["candidates"][0]["content"]["parts"] if "functionCall" in p]
    checked(part["functionCall"]["name"], part["functionCall"]["args"])

    # Ollama cannot force a call: the tiny model opens one, and the lazy grammar holds it
    if fam.held_under_auto:
        olla = post(srv, "/api/chat", {"model": "m", "stream": False, "tools": [TOOL],
                                       "messages": [{"role": "user", "content": fam.ask}],
                                       "options": {"temperature": 0, "num_predict": LIMIT}})
        calls = olla["message"].get("tool_calls") or []
        assert calls, olla
        checked(calls[0]["function"]["name"], calls[0]["function"]["arguments"])
        assert fam.favour not in olla["message"]["content"]

    pred = post(srv, VERTEX_PREDICT, {"instances": [chat]})["predictions"][0]
    (vcall,) = pred["choices"][0]["message"]["tool_calls"]
    assert checked(vcall["function"]["name"], vcall["function"]["arguments"]) == args


def second_turn() -> list[dict[str, Any]]:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
    return [{"role": "user", "content": ASK},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}]


def test_the_second_turn_renders_in_the_family_form_and_answers(family):
    fam, srv = family
    shown = post(srv, "/tokenize", {"messages": second_turn(), "tools": [TOOL],
                                    "return_token_strs": True})
    prompt = "".join(shown["token_strs"])
    assert fam.shown in prompt and "Sunny, 21 C" in prompt, prompt
    assert fam.marker in shown["token_strs"]  # the history's marker is the control token
    for body in ({"messages": second_turn(), "tools": [TOOL], "max_tokens": 8},
                 {"messages": second_turn(), "max_tokens": 8}):
        choice = post(srv, "/v1/chat/completions", body)["choices"][0]
        assert choice["finish_reason"] in ("stop", "length", "tool_calls")
    # the same turn in Anthropic's, Gemini's and Ollama's own shapes
    post(srv, "/v1/messages", {"model": "m", "max_tokens": 8, "tools": [
        {"name": "get_weather", "description": "w", "input_schema": PARAMS}], "messages": [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                           "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "Sunny, 21 C"}]}]})
    post(srv, "/v1beta/models/m:generateContent", {
        "generationConfig": {"maxOutputTokens": 8}, "contents": [
            {"role": "user", "parts": [{"text": ASK}]},
            {"role": "model", "parts": [{"functionCall": {"name": "get_weather",
                                                          "args": {"city": "Paris"}}}]},
            {"role": "user", "parts": [{"functionResponse": {
                "name": "get_weather", "response": {"result": "Sunny, 21 C"}}}]}]})
    post(srv, "/api/chat", {"model": "m", "stream": False, "tools": [TOOL],
                            "options": {"num_predict": 8}, "messages": [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "Sunny, 21 C", "tool_name": "get_weather"}]})


def test_a_thought_ended_by_the_budget_then_the_call(family):
    fam, srv = family
    if fam.thought is None:
        pytest.skip("the family writes no thoughts")
    body = {"messages": [{"role": "user", "content": ASK}], "tools": [TOOL],
            "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": LIMIT + 8,
            "temperature": 0, "reasoning_budget": 4, "chat_template_kwargs": {"open_thought": True}}
    msg = post(srv, "/v1/chat/completions", body)["choices"][0]["message"]
    assert msg["reasoning_content"] and len(msg.get("tool_calls") or []) == 1, msg
    (call,) = msg["tool_calls"]
    checked(call["function"]["name"], call["function"]["arguments"])
    assert not (msg["content"] or "").strip()
