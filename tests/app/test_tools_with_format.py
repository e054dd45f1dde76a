"""Tools beside a JSON output format (issue 27, item 4): Chat Completions' ``tools`` +
``response_format``, Responses' ``tools`` + ``text.format``, Messages' ``tools`` +
``output_config.format``. What each tool_choice does with the format is read off the grammar the
fake engine was given: auto holds both (the text to the format, the calls to the tools), a
forced choice (required / any, a named tool) only the calls, none only the format. A raw
``grammar`` beside tools stays a 400."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from pydantic import BaseModel

from app.engine.fake import FakeEngine
from tests.support.app import make_client, sdk
from tests.support.server import DATA

# distinctive names, so the grammar shows which schema it holds
SCHEMA = {"type": "object", "properties": {"verdict_zq": {"type": "string"}},
          "required": ["verdict_zq"], "additionalProperties": False}
PARAMS = {"type": "object", "properties": {"city_zq": {"type": "string"}}, "required": ["city_zq"]}
ANSWER = '{"verdict_zq": "sunny"}'
HERMES = (DATA / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city_zq": "Paris"}}\n</tool_call>'
GENERIC_CALL = '{"tool_calls": [{"name": "get_weather", "arguments": {"city_zq": "Paris"}}]}'


def chat_body(choice: str) -> dict[str, Any]:
    tool_choice: Any = {"named": {"type": "function", "function": {"name": "get_weather"}}}.get(choice, choice)
    return {"messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}],
            "tool_choice": tool_choice,
            "response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": SCHEMA}}}


def responses_body(choice: str) -> dict[str, Any]:
    tool_choice: Any = {"named": {"type": "function", "name": "get_weather"}}.get(choice, choice)
    return {"input": "Weather in Paris?",
            "tools": [{"type": "function", "name": "get_weather", "parameters": PARAMS}],
            "tool_choice": tool_choice,
            "text": {"format": {"type": "json_schema", "name": "v", "schema": SCHEMA}}}


def messages_body(choice: str) -> dict[str, Any]:
    tool_choice = {"auto": {"type": "auto"}, "required": {"type": "any"}, "none": {"type": "none"},
                   "named": {"type": "tool", "name": "get_weather"}}[choice]
    return {"max_tokens": 64, "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [{"name": "get_weather", "input_schema": PARAMS}],
            "tool_choice": tool_choice,
            "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}


APIS = {"chat": ("/v1/chat/completions", chat_body),
        "responses": ("/v1/responses", responses_body),
        "messages": ("/v1/messages", messages_body)}
CHOICES = ["auto", "required", "named", "none"]


def post(api: str, choice: str, template: str | None = None, reply: str = ANSWER,
         **extra: Any) -> tuple[Any, FakeEngine]:
    engine = FakeEngine(reply=reply, n_ctx=4096, chat_template=template)
    path, body = APIS[api]
    resp = make_client(engine).post(path, json={**body(choice), **extra})
    return resp, engine


@pytest.mark.parametrize("template", [None, HERMES], ids=["generic", "hermes"])
@pytest.mark.parametrize("choice", CHOICES)
@pytest.mark.parametrize("api", list(APIS))
def test_each_tool_choice_with_a_json_schema_format_plans_the_right_grammar(api, choice, template):
    resp, engine = post(api, choice, template)
    assert resp.status_code == 200, resp.get_json()
    params = engine.requests[-1].params
    grammar = params.grammar or ""
    assert params.grammar_triggers == ()  # never lazy: each grammar holds the whole reply
    if choice == "none":  # the format alone; the tools are not offered at all
        assert "verdict_zq" in grammar and "city_zq" not in grammar
        assert "get_weather" not in engine.requests[-1].prompt
    elif choice == "auto":  # one grammar, both branches
        assert "verdict_zq" in grammar and "city_zq" in grammar and "get_weather" in grammar
        if template is HERMES:
            assert "reply ::= o-root | calls" in grammar and "<tool_call>" in grammar
        else:
            assert "tool_calls" in grammar and "response" in grammar
    else:  # forced: the call grammar alone, no trace of the format's schema
        assert "city_zq" in grammar and "get_weather" in grammar
        assert "verdict_zq" not in grammar and "o-root" not in grammar
        assert "response" not in grammar or template is HERMES


def test_auto_without_a_format_is_still_lazy():
    engine = FakeEngine(n_ctx=4096, chat_template=HERMES)
    body = chat_body("auto")
    del body["response_format"]
    assert make_client(engine).post("/v1/chat/completions", json=body).status_code == 200
    params = engine.requests[-1].params
    assert params.grammar_triggers == ("<tool_call>",) and "verdict_zq" not in params.grammar


def test_json_object_beside_tools_under_auto_holds_any_object_or_the_calls():
    resp, engine = post("chat", "auto", HERMES, response_format={"type": "json_object"})
    assert resp.status_code == 200
    grammar = engine.requests[-1].params.grammar
    assert "reply ::= o-root | calls" in grammar and "city_zq" in grammar


@pytest.mark.parametrize("template, call", [(None, GENERIC_CALL), (HERMES, HERMES_CALL)],
                         ids=["generic", "hermes"])
def test_under_auto_the_reply_is_the_answer_or_a_call(template, call):
    answer = ANSWER if template is HERMES else '{"response": ' + ANSWER + "}"
    resp, _ = post("chat", "auto", template, reply=answer)
    message = resp.get_json()["choices"][0]["message"]
    assert json.loads(message["content"]) == json.loads(ANSWER) and not message.get("tool_calls")
    resp, _ = post("chat", "auto", template, reply=call)
    choice = resp.get_json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"city_zq": "Paris"}


def test_the_generic_forms_answer_streams_as_the_formats_json():
    reply = '{"response": {"verdict_zq": "sunny and warm"}}'
    resp, _ = post("chat", "auto", reply=reply, stream=True)
    assert resp.status_code == 200
    deltas = [json.loads(b[6:])["choices"][0]["delta"] for b in resp.get_data(as_text=True).split("\n\n")
              if b.startswith("data: {") and json.loads(b[6:])["choices"]]
    text = "".join(d.get("content") or "" for d in deltas)
    assert json.loads(text) == {"verdict_zq": "sunny and warm"}


@pytest.mark.parametrize("api", list(APIS))
def test_the_responses_and_messages_answers_carry_the_formats_json(api):
    resp, _ = post(api, "auto", HERMES)
    assert resp.status_code == 200
    data = resp.get_json()
    if api == "responses":
        text = data["output"][-1]["content"][0]["text"]
    elif api == "messages":
        text = data["content"][0]["text"]
    else:
        text = data["choices"][0]["message"]["content"]
    assert json.loads(text) == json.loads(ANSWER)


@pytest.mark.parametrize("choice", CHOICES[:3])
def test_a_raw_grammar_beside_tools_is_still_a_400(choice):
    body = chat_body(choice)
    del body["response_format"]
    resp = make_client(FakeEngine()).post("/v1/chat/completions", json={**body, "grammar": 'root ::= "x"'})
    assert resp.status_code == 400
    err = resp.get_json()["error"]
    assert err["param"] == "grammar" and "tools cannot be combined with a grammar" in err["message"]


def test_a_raw_grammar_beside_a_format_is_still_a_400():
    resp, _ = post("chat", "none", grammar='root ::= "x"')
    assert resp.status_code == 400


def test_a_bad_schema_is_a_400_under_a_forced_choice_too():
    body = chat_body("required")
    body["response_format"]["json_schema"]["schema"] = {"type": "object", "properties": 3}
    resp = make_client(FakeEngine()).post("/v1/chat/completions", json=body)
    assert resp.status_code == 400


# ---- instructor, in process -------------------------------------------------------------------

try:
    import instructor
except ImportError:  # .ci/run installs it (see there why not from pyproject's test extras)
    if os.environ.get("CI_REQUIRE_ALL"):
        raise
    instructor = None
needs_instructor = pytest.mark.skipif(instructor is None, reason="instructor is not installed")


class UserInfo(BaseModel):
    name: str
    age: int


class Recording:
    """The Flask test client, with the JSON bodies it was sent kept."""

    def __init__(self, client):
        self.client, self.bodies = client, []

    def open(self, *args, **kwargs):
        self.bodies.append(json.loads(kwargs["data"]))
        return self.client.open(*args, **kwargs)


USER_CALL = '{"tool_calls": [{"name": "UserInfo", "arguments": {"name": "Ann", "age": 31}}]}'


@needs_instructor
def test_instructor_tools_mode_on_chat_completions():
    engine = FakeEngine(reply=USER_CALL, n_ctx=4096)
    http = Recording(make_client(engine))
    client = instructor.from_openai(sdk(http), mode=instructor.Mode.TOOLS)
    user = client.chat.completions.create(model="fake-model", response_model=UserInfo, max_retries=0,
                                          messages=[{"role": "user", "content": "Ann is 31."}])
    assert isinstance(user, UserInfo) and user.model_dump() == {"name": "Ann", "age": 31}
    assert "age" in engine.requests[-1].params.grammar


@needs_instructor
def test_instructor_responses_tools_mode():
    engine = FakeEngine(reply=USER_CALL, n_ctx=4096)
    http = Recording(make_client(engine))
    client = instructor.from_openai(sdk(http), mode=instructor.Mode.RESPONSES_TOOLS)
    user = client.responses.create(model="fake-model", response_model=UserInfo, max_retries=0,
                                   input=[{"role": "user", "content": "Ann is 31."}])
    assert isinstance(user, UserInfo) and user.model_dump() == {"name": "Ann", "age": 31}
    assert "age" in engine.requests[-1].params.grammar
    sent = http.bodies[-1]  # what made the 400 before: a forced tool beside text.format
    assert sent["tool_choice"]["name"] == "UserInfo" and sent["text"]["format"]["type"] == "json_schema"


def test_tools_too_big_for_a_grammar_under_auto_leave_the_format_holding_the_reply():
    """The gate refuses the combined grammar (the tool's 30 properties, over a limit of 20): the
    format still holds the text the request asked for, and no call is held (nor lazily armed)."""
    wide = {"type": "object", "properties": {f"field_zq{i}": {"type": "string"} for i in range(30)}}
    body = chat_body("auto")
    body["tools"] = [{"type": "function", "function": {"name": "get_weather", "parameters": wide}}]
    engine = FakeEngine(reply=ANSWER, n_ctx=4096)
    resp = make_client(engine, grammar_max_properties=20).post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.get_json()
    params = engine.requests[-1].params
    assert "verdict_zq" in params.grammar and "field_zq" not in params.grammar
    assert params.grammar_triggers == () and params.grammar_param.startswith("response_format")
    assert json.loads(resp.get_json()["choices"][0]["message"]["content"]) == json.loads(ANSWER)
    small = make_client(FakeEngine(reply=ANSWER, n_ctx=4096), grammar_max_properties=20)
    alone = {**body, "response_format": {"type": "json_schema", "json_schema": {
        "name": "w", "schema": wide}}, "tools": chat_body("auto")["tools"]}
    assert small.post("/v1/chat/completions", json=alone).status_code == 400  # the gate is on
