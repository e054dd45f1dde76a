"""The OpenAI Responses API over the fake engine: requests, response objects, the event
stream (checked against openai-python's own types and its stream accumulator), the store behind
previous_response_id and GET, input_tokens, and the Vertex predict route."""

from __future__ import annotations

import itertools
import json
import re
import time
from typing import Any

import pytest
from openai import NotFoundError
from openai.types.responses import Response
from pydantic import BaseModel

from app.api.responses import Responses
from app.api.responses import stream as responses_stream
from app.api.responses.parsing import input_messages
from app.core.input import EFFORT_BUDGET
from app.engine.fake import FakeEngine
from tests.support.app import make_client, sdk
from tests.support.responses import check_stream, sse_events
from tests.support.server import DATA

GOLDEN = DATA / "golden"
REPLY = "Hello from the fake engine. It speaks in short words."
TOOLS = [{
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]},
}]
CALL_REPLY = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
THINK_REPLY = "<think>Two and two. Four.</think>The answer is 4."


# a 1x1 PNG
PNG_B64 = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC")


def api_of(client) -> Responses:
    view = client.application.view_functions["responses.responses:/v1/responses"]
    return view.__self__


def post(client, body: dict[str, Any], path: str = "/v1/responses"):
    return client.post(path, json=body)


def prompt_of(engine: FakeEngine) -> str:
    return engine.requests[-1].prompt


# ---- the event stream ---------------------------------------------------------------------------


def final_response(datas: list[dict[str, Any]]) -> Response:
    return Response.model_validate(datas[-1]["response"])


# ---- the official SDK, in process ---------------------------------------------------------------


# ---- whole responses ------------------------------------------------------------------------------


def test_a_response_is_an_openai_response_object():
    engine = FakeEngine()
    client = make_client(engine)
    resp = post(client, {"model": "anything", "input": "hi", "instructions": "Be brief.",
                         "metadata": {"k": "v"}, "user": "u1", "temperature": 0.5})
    assert resp.status_code == 200
    body = resp.get_json()
    r = Response.model_validate(body)
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert r.output_text == REPLY
    assert r.model == "fake-model"
    msg = r.output[0]
    assert msg.type == "message" and msg.id.startswith("msg_") and msg.status == "completed"
    assert body["output"][0]["content"][0] == {"type": "output_text", "text": REPLY,
                                               "annotations": [], "logprobs": []}
    assert r.usage.output_tokens == 11  # ten words and the end-of-generation token
    assert r.usage.total_tokens == r.usage.input_tokens + 11
    assert r.usage.input_tokens_details.cached_tokens == 0
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert (r.instructions, r.metadata, r.user, r.temperature) == ("Be brief.", {"k": "v"}, "u1", 0.5)
    assert (r.error, r.incomplete_details, r.truncation, r.store) == (None, None, "disabled", True)
    assert body["text"] == {"format": {"type": "text"}} and body["tool_choice"] == "auto"
    assert prompt_of(engine).index("Be brief.") < prompt_of(engine).index("hi")


def test_max_output_tokens_makes_an_incomplete_response():
    client = make_client(FakeEngine())
    body = post(client, {"input": "hi", "max_output_tokens": 3}).get_json()
    r = Response.model_validate(body)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text == "Hello from the " and r.output[0].status == "incomplete"
    assert r.max_output_tokens == 3 and r.usage.output_tokens == 3
    datas = check_stream(post(client, {"input": "hi", "max_output_tokens": 3, "stream": True})
                         .get_data(as_text=True))
    assert datas[-1]["type"] == "response.incomplete"
    final = final_response(datas)
    assert final.status == "incomplete" and final.output_text == "Hello from the "


def test_function_calls_and_their_outputs():
    engine = FakeEngine(reply=CALL_REPLY)
    client = make_client(engine)
    body = post(client, {"input": "Weather in Paris?", "tools": TOOLS,
                         "tool_choice": "required"}).get_json()
    r = Response.model_validate(body)
    call = r.output[0]
    assert call.type == "function_call" and call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert (call.name, json.loads(call.arguments), call.status) == ("get_weather", {"city": "Paris"}, "completed")
    assert len(r.output) == 1 and r.status == "completed"
    assert body["tools"] == [{**TOOLS[0], "strict": True}] and body["tool_choice"] == "required"
    # the round trip with the items sent back whole (no store)
    items = [{"role": "user", "content": "Weather in Paris?"}, body["output"][0],
             {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}]
    assert post(client, {"input": items, "tools": TOOLS, "store": False}).status_code == 200
    prompt = prompt_of(engine)
    assert '"get_weather"' in prompt and "sunny, 21 C" in prompt
    assert prompt.index('{"tool_calls"') < prompt.index("sunny, 21 C")
    # the same through previous_response_id
    follow = {"previous_response_id": r.id, "tools": TOOLS,
              "input": [{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}]}
    assert post(client, follow).status_code == 200
    assert prompt_of(engine) == prompt


def test_a_named_tool_choice_and_no_tool_choice():
    client = make_client(FakeEngine(reply=CALL_REPLY))
    named = {"type": "function", "name": "get_weather"}
    body = post(client, {"input": "x", "tools": TOOLS, "tool_choice": named}).get_json()
    assert body["tool_choice"] == named and body["output"][0]["name"] == "get_weather"
    body = post(client, {"input": "x", "tools": TOOLS, "tool_choice": "none"}).get_json()
    assert body["output"][0]["type"] == "message"


def test_structured_output_follows_text_format():
    engine = FakeEngine(reply='{"city": "Paris", "days": 3}')
    client = make_client(engine)
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
              "required": ["city", "days"], "additionalProperties": False}
    fmt = {"type": "json_schema", "name": "trip", "schema": schema, "strict": True}
    body = post(client, {"input": "plan", "text": {"format": fmt}}).get_json()
    assert Response.model_validate(body).text.format.type == "json_schema"
    assert body["text"] == {"format": fmt}
    assert json.loads(body["output"][0]["content"][0]["text"]) == {"city": "Paris", "days": 3}
    assert engine.requests[-1].params.grammar  # held to the schema by a grammar
    assert engine.requests[-1].params.grammar_param == "text.format.schema"
    body = post(client, {"input": "x", "text": {"format": {"type": "json_object"}}}).get_json()
    assert body["text"] == {"format": {"type": "json_object"}}

    class Trip(BaseModel):
        city: str
        days: int

    parsed = sdk(client).responses.parse(model="m", input="plan", text_format=Trip)
    assert parsed.output_parsed == Trip(city="Paris", days=3)


def test_reasoning_is_an_item_before_the_message():
    engine = FakeEngine(reply=THINK_REPLY)
    client = make_client(engine, reasoning_format="parsed")
    body = post(client, {"input": "2+2?", "reasoning": {"effort": "high", "summary": "auto"}}).get_json()
    r = Response.model_validate(body)
    rs, msg = r.output
    assert rs.type == "reasoning" and rs.id.startswith("rs_") and rs.summary == []
    assert [c.text for c in rs.content] == ["Two and two. Four."]
    assert msg.type == "message" and r.output_text == "The answer is 4."
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
    assert body["reasoning"] == {"effort": "high", "summary": "auto"}
    datas = check_stream(post(client, {"input": "2+2?", "stream": True}).get_data(as_text=True))
    kinds = [d["type"] for d in datas]
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    final = final_response(datas)
    assert [i.type for i in final.output] == ["reasoning", "message"]
    assert "".join(d["delta"] for d in datas if d["type"] == "response.reasoning_text.delta") == "Two and two. Four."


@pytest.mark.parametrize("effort, budget", sorted(EFFORT_BUDGET.items()))
def test_effort_is_a_reasoning_budget(effort, budget):
    api = api_of(make_client(FakeEngine()))
    inp, _ = api.parse({"input": "x", "reasoning": {"effort": effort}}, api.facts())
    assert inp.reasoning_budget == budget
    assert api.parse({"input": "x"}, api.facts())[0].reasoning_budget is None


def test_effort_none_ends_the_thought_at_once():
    engine = FakeEngine(reply=THINK_REPLY)
    client = make_client(engine, reasoning_format="parsed")
    post(client, {"input": "x", "reasoning": {"effort": "none"}})
    assert engine.handles[-1].injected == ["</think>"]
    post(client, {"input": "x", "reasoning": {"effort": "high"}})
    assert engine.handles[-1].injected == []


# ---- input items ----------------------------------------------------------------------------------


def test_input_items_become_chat_messages():
    items = [
        {"role": "developer", "content": "Rules."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                        {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "hmm"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Let me look.", "annotations": [], "logprobs": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}",
         "status": "completed"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": '{"x": 1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "two"}]},
        {"role": "system", "content": "More rules."},
        {"role": "user", "content": "ok?"},
    ]
    assert input_messages(items) == [
        {"role": "system", "content": "Rules."},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "Let me look.", "reasoning_content": "hmm", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": '{"x": 1}'}},
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
        {"role": "system", "content": "More rules."},
        {"role": "user", "content": "ok?"},
    ]
    assert input_messages("hi") == [{"role": "user", "content": "hi"}]


BAD = {
    "missing input": ({}, "input"),
    "empty input": ({"input": []}, "input"),
    "unknown field": ({"input": "x", "frobnicate": 1}, "frobnicate"),
    "conversation": ({"input": "x", "conversation": "conv_1"}, "conversation"),
    "stream not a bool": ({"input": "x", "stream": "yes"}, "stream"),
    "max_output_tokens 0": ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    "temperature": ({"input": "x", "temperature": 3}, "temperature"),
    "truncation auto": ({"input": "x", "truncation": "auto"}, "truncation"),
    "background": ({"input": "x", "background": True}, "background"),
    "top_logprobs over 20": ({"input": "x", "top_logprobs": 21}, "top_logprobs"),
    "unknown include": ({"input": "x", "include": ["everything"]}, "include"),
    "metadata": ({"input": "x", "metadata": {str(i): "v" for i in range(17)}}, "metadata"),
    "verbosity": ({"input": "x", "text": {"verbosity": "loud"}}, "text.verbosity"),
    "effort": ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    "unknown tool type": ({"input": "x", "tools": [{"type": "frobnicator"}]}, "tools.0.type"),
    "nested tool": ({"input": "x", "tools": [{"type": "function", "function": {"name": "f"}}]},
                    "tools.0.function"),
    "bad tool name": ({"input": "x", "tools": [{"type": "function", "name": "a b"}]}, "tools.0.name"),
    "tool params": ({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": []}]},
                    "tools.0.parameters"),
    "required, no tools": ({"input": "x", "tool_choice": "required"}, "tool_choice"),
    "hosted tool_choice": ({"input": "x", "tools": TOOLS, "tool_choice": {"type": "web_search"}},
                           "tool_choice"),
    "named tool missing": ({"input": "x", "tools": TOOLS,
                            "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    "format type": ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format.type"),
    "format schema": ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}},
                      "text.format.schema"),
    "format name": ({"input": "x", "text": {"format": {"type": "json_schema", "name": "a b",
                                                       "schema": {}}}}, "text.format.name"),
    "image part": ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
                   "input.0.content.0.image_url"),
    "file item": ({"input": [{"type": "input_file", "file_id": "f"}]}, "input.0"),
    "item_reference": ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0.type"),
    "tool role": ({"input": [{"role": "tool", "content": "x"}]}, "input.0.role"),
    "item not an object": ({"input": ["hi"]}, "input.0"),
    "arguments not a string": ({"input": [{"type": "function_call", "call_id": "c", "name": "f",
                                           "arguments": {}}]}, "input.0.arguments"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_requests_are_400s_naming_the_field(case):
    body, param = BAD[case]
    resp = post(make_client(FakeEngine()), body)
    assert resp.status_code == 400, resp.get_json()
    err = resp.get_json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    assert err["message"]


def test_an_image_to_a_model_without_a_projector_is_a_400_naming_the_part():
    body = {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "what is this?"},
        {"type": "input_image", "image_url": "data:image/png;base64," + PNG_B64}]}]}
    resp = post(make_client(FakeEngine()), body)
    err = resp.get_json()["error"]
    assert resp.status_code == 400 and "no vision projector" in err["message"]
    assert err["param"] == "input.0.content.1.image_url"


def test_null_unknown_fields_are_dropped_and_known_extras_accepted():
    client = make_client(FakeEngine())
    body = {"input": "x", "frobnicate": None, "include": ["reasoning.encrypted_content"],
            "truncation": "disabled", "parallel_tool_calls": False, "service_tier": "auto",
            "store": True, "stream_options": None, "background": False, "top_logprobs": 0,
            "prompt_cache_key": "k", "safety_identifier": "s", "max_tool_calls": 3,
            "text": {"format": {"type": "text"}, "verbosity": "medium"}}
    resp = post(client, body)
    assert resp.status_code == 200, resp.get_json()
    assert resp.get_json()["parallel_tool_calls"] is False


def test_bad_schema_is_a_400_before_the_first_byte():
    bad = {"type": "json_schema", "name": "n", "schema": {"type": "object", "properties": 5}}
    resp = post(make_client(FakeEngine()), {"input": "x", "stream": True, "text": {"format": bad}})
    assert resp.status_code == 400 and resp.get_json()["error"]["param"].startswith("text.format")


# ---- the stream ----------------------------------------------------------------------------------


def normalised(text: str) -> str:
    """Times and the core's call ids as fixed values (response and item ids are made fixed
    by the test itself)."""
    text = re.sub(r'"(created_at|completed_at)":\d+', r'"\1":1700000000', text)
    return re.sub(r'"call_[0-9a-f]{8,}"', '"call_0"', text)


@pytest.fixture
def fixed_ids(monkeypatch):
    counter = itertools.count()
    monkeypatch.setattr(responses_stream, "_token", lambda: f"{next(counter):04d}")


GOLDEN_CASES = {
    "responses_text": (REPLY, {}, {"input": "hi", "instructions": "Be brief.", "max_output_tokens": 4}),
    "responses_reasoning": (THINK_REPLY, {"reasoning_format": "parsed"}, {"input": "2+2?"}),
    "responses_function_call": (CALL_REPLY, {}, {"input": "Weather?", "tools": TOOLS,
                                                 "tool_choice": "required"}),
    "responses_error": (REPLY, {}, {"input": "FAIL_AFTER"}),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_transcripts(name, fixed_ids):
    reply, settings, body = GOLDEN_CASES[name]
    client = make_client(FakeEngine(reply=reply), stream_heartbeat_seconds=0, **settings)
    resp = post(client, {**body, "stream": True})
    assert resp.status_code == 200 and resp.mimetype == "text/event-stream"
    got = normalised(resp.get_data(as_text=True))
    check_stream(got)
    path = GOLDEN / f"{name}.sse"
    assert got == path.read_text(), f"{name} differs from {path}"


def test_the_stream_and_the_whole_answer_agree():
    for reply, settings, body in GOLDEN_CASES.values():
        if "FAIL" in body["input"]:
            continue
        client = make_client(FakeEngine(reply=reply), **settings)
        whole = post(client, body).get_json()
        final = check_stream(post(client, {**body, "stream": True}).get_data(as_text=True))[-1]["response"]
        strip = re.compile(r'"(id|call_id|created_at|completed_at)": ?"?[\w-]+"?')
        assert strip.sub("", json.dumps(final)) == strip.sub("", json.dumps(whole))


def test_an_error_mid_stream_is_an_error_event_then_response_failed():
    client = make_client(FakeEngine())
    datas = check_stream(post(client, {"input": "FAIL_AFTER", "stream": True}).get_data(as_text=True))
    err, failed = datas[-2], datas[-1]
    assert err["type"] == "error" and err["code"] == "engine_error" and err["message"]
    assert failed["type"] == "response.failed"
    r = Response.model_validate(failed["response"])
    assert r.status == "failed" and r.error.code == "server_error"
    assert r.output[0].status == "incomplete" and r.output_text == "Hello "


def test_an_error_before_the_first_byte_is_an_http_error():
    resp = post(make_client(FakeEngine()), {"input": "FAIL_BEFORE", "stream": True})
    assert resp.status_code == 500 and resp.mimetype == "application/json"
    assert resp.get_json()["error"]["code"] == "engine_error"
    resp = post(make_client(FakeEngine(n_ctx=8)), {"input": "a b c d e f g h i j", "stream": True})
    assert resp.status_code == 400 and resp.get_json()["error"]["code"] == "context_length_exceeded"


def test_heartbeats_are_sse_comments():
    client = make_client(FakeEngine(reply="a b", delay=0.3), stream_heartbeat_seconds=0.05)
    text = post(client, {"input": "x", "stream": True}).get_data(as_text=True)
    assert ": ping\n\n" in text
    assert final_response(check_stream(text)).output_text == "a b"


def test_a_client_that_goes_away_cancels_the_generation():
    engine = FakeEngine(delay=0.05)
    client = make_client(engine)
    resp = client.post("/v1/responses", json={"input": "x", "stream": True}, buffered=False)
    next(iter(resp.response))
    resp.close()
    deadline = time.monotonic() + 2
    while not engine.handles[-1].cancelled and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.handles[-1].cancelled


def test_the_official_sdk_reads_the_stream():
    client = make_client(FakeEngine(reply=THINK_REPLY), reasoning_format="parsed")
    oa = sdk(client)
    with oa.responses.stream(model="m", input="2+2?") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "The answer is 4."
    created = oa.responses.create(model="m", input="2+2?", stream=True)
    kinds = [e.type for e in created]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    calls = make_client(FakeEngine(reply=CALL_REPLY))
    with sdk(calls).responses.stream(model="m", input="x", tools=TOOLS, tool_choice="required") as stream:
        final = stream.get_final_response()
    assert final.output[0].type == "function_call" and json.loads(final.output[0].arguments) == {"city": "Paris"}


# ---- the store -----------------------------------------------------------------------------------


def test_previous_response_id_continues_the_conversation():
    engine = FakeEngine()
    client = make_client(engine)
    first = post(client, {"input": "My name is Ada.", "instructions": "FIRST-RULES"}).get_json()
    second = post(client, {"input": "What is my name?", "previous_response_id": first["id"],
                           "instructions": "SECOND-RULES"}).get_json()
    assert second["previous_response_id"] == first["id"]
    prompt = prompt_of(engine)
    assert "FIRST-RULES" not in prompt  # instructions are not carried over
    order = [prompt.index(s) for s in ("SECOND-RULES", "My name is Ada.", REPLY, "What is my name?")]
    assert order == sorted(order)
    third = post(client, {"input": "And again?", "previous_response_id": second["id"]}).get_json()
    assert third["status"] == "completed"
    prompt = prompt_of(engine)
    assert prompt.count(REPLY) == 2 and "SECOND-RULES" not in prompt
    assert prompt.index("What is my name?") < prompt.index("And again?")


def test_stored_responses_can_be_retrieved_and_deleted():
    client = make_client(FakeEngine())
    body = post(client, {"input": "hi"}).get_json()
    got = client.get(f"/v1/responses/{body['id']}")
    assert got.status_code == 200 and got.get_json() == body
    streamed = final_response(check_stream(post(client, {"input": "hi", "stream": True}).get_data(as_text=True)))
    assert client.get(f"/v1/responses/{streamed.id}").get_json()["id"] == streamed.id
    oa = sdk(client)
    assert oa.responses.retrieve(body["id"]).output_text == REPLY
    assert client.delete(f"/v1/responses/{body['id']}").get_json() == {
        "id": body["id"], "object": "response", "deleted": True}
    with pytest.raises(NotFoundError):
        oa.responses.retrieve(body["id"])
    assert client.get(f"/v1/responses/{body['id']}?stream=true").status_code == 400


def test_unknown_ids_are_404s_in_openais_shape():
    client = make_client(FakeEngine())
    resp = client.get("/v1/responses/resp_nope")
    assert resp.status_code == 404
    assert resp.get_json()["error"]["type"] == "invalid_request_error"
    resp = post(client, {"input": "x", "previous_response_id": "resp_nope"})
    assert resp.status_code == 404
    assert resp.get_json()["error"] == {
        "message": "Previous response with id 'resp_nope' not found.",
        "type": "invalid_request_error", "param": "previous_response_id",
        "code": "previous_response_not_found"}
    stream = post(client, {"input": "x", "previous_response_id": "resp_nope", "stream": True})
    assert stream.status_code == 404 and stream.mimetype == "application/json"
    assert client.delete("/v1/responses/resp_nope").status_code == 404


def test_store_false_is_not_kept():
    client = make_client(FakeEngine())
    body = post(client, {"input": "hi", "store": False}).get_json()
    assert body["store"] is False
    assert client.get(f"/v1/responses/{body['id']}").status_code == 404
    streamed = final_response(check_stream(
        post(client, {"input": "hi", "store": False, "stream": True}).get_data(as_text=True)))
    assert client.get(f"/v1/responses/{streamed.id}").status_code == 404


def test_the_store_keeps_the_newest_up_to_its_size():
    client = make_client(FakeEngine(), responses_store_size=2)
    ids = [post(client, {"input": f"q{i}"}).get_json()["id"] for i in range(3)]
    assert [client.get(f"/v1/responses/{i}").status_code for i in ids] == [404, 200, 200]
    assert len(api_of(client).store) == 2


def test_stored_responses_expire_after_the_ttl():
    client = make_client(FakeEngine(), responses_store_ttl=10)
    now = [1000.0]
    api_of(client).store.clock = lambda: now[0]
    rid = post(client, {"input": "hi"}).get_json()["id"]
    now[0] += 9.5
    assert client.get(f"/v1/responses/{rid}").status_code == 200
    now[0] += 1
    assert client.get(f"/v1/responses/{rid}").status_code == 404
    resp = post(client, {"input": "x", "previous_response_id": rid})
    assert resp.status_code == 404 and resp.get_json()["error"]["param"] == "previous_response_id"


def test_a_store_of_size_zero_keeps_nothing():
    client = make_client(FakeEngine(), responses_store_size=0)
    body = post(client, {"input": "hi"}).get_json()
    assert body["store"] is False
    assert client.get(f"/v1/responses/{body['id']}").status_code == 404


# ---- input_tokens and predict ----------------------------------------------------------------------


def test_input_tokens_counts_the_prompt_as_a_run_would():
    client = make_client(FakeEngine(reply=CALL_REPLY))
    body = {"input": "How is the weather in Paris today?", "instructions": "Be brief.", "tools": TOOLS}
    counted = client.post("/v1/responses/input_tokens", json=body)
    assert counted.status_code == 200
    used = post(client, body).get_json()["usage"]["input_tokens"]
    assert counted.get_json() == {"object": "response.input_tokens", "input_tokens": used}
    assert sdk(client).responses.input_tokens.count(model="m", input="hi").input_tokens > 0
    bad = client.post("/v1/responses/input_tokens", json={"input": "x", "tools": [{"type": "frobnicator"}]})
    assert bad.status_code == 400 and bad.get_json()["error"]["param"] == "tools.0.type"


def test_predict_serves_responses_bodies():
    client = make_client(FakeEngine())
    env = client.post("/predict", json={"instances": [
        {"@requestFormat": "responses", "input": "a"},
        {"@requestFormat": "/v1/responses", "input": "b", "store": False},
        {"input": "c"},
        {"@requestFormat": "responses", "input": "d", "bogus": 1},
    ]}).get_json()["predictions"]
    assert [p.get("object") for p in env[:3]] == ["response"] * 3
    for p in env[:3]:
        Response.model_validate(p)
    assert env[3]["error"]["param"] == "bogus"
    raw = client.post("/predict", json={"input": "hi", "max_output_tokens": 2}).get_json()
    assert raw["object"] == "response" and raw["status"] == "incomplete"
    stream = client.post("/predict", json={"input": "hi", "stream": True}).get_data(as_text=True)
    assert final_response(check_stream(stream)).output_text == REPLY
    one = client.post("/predict", json={"instances": [{"@requestFormat": "responses", "input": "hi",
                                                       "stream": True}]}).get_data(as_text=True)
    assert final_response(check_stream(one)).output_text == REPLY
    bad = client.post("/predict", json={"input": "hi", "tools": [{"type": "frobnicator"}]})
    assert bad.status_code == 400 and bad.get_json()["error"]["param"] == "tools.0.type"


def thinking_stream(client, **kw) -> tuple[Any, str]:
    """A streamed response open to reasoning control, read until its thought is under way:
    (the response, its id)."""
    resp = client.post("/v1/responses", json={"input": "x", "stream": True,
                                              "reasoning_control": True}, buffered=False, **kw)
    seen: list[dict[str, Any]] = []
    for chunk in itertools.islice(resp.response, 50):
        seen += [d for _, d in sse_events(chunk.decode())]
        if any(d["type"] == "response.reasoning_text.delta" for d in seen):
            break
    return resp, seen[0]["response"]["id"]


def test_reasoning_control_ends_a_thought_on_request():
    engine = FakeEngine(reply=THINK_REPLY, delay=0.05)
    client = make_client(engine, reasoning_format="parsed", stream_heartbeat_seconds=0)
    resp, rid = thinking_stream(client)
    ok = client.post("/v1/chat/completions/control", json={"id": rid, "action": "reasoning_end"})
    assert ok.get_json() == {"success": True}
    assert engine.handles[-1].injected == ["</think>"]
    resp.close()
    nope = client.post("/v1/chat/completions/control", json={"id": "resp_nope", "action": "reasoning_end"})
    assert nope.get_json() == {"success": False}


def test_reasoning_control_of_another_keys_run_does_nothing():
    """Security review round 2, I1: the run id alone used to be enough to end any key's
    thought; another key now gets what an unknown id gets."""
    engine = FakeEngine(reply=THINK_REPLY, delay=0.05)
    client = make_client(engine, reasoning_format="parsed", stream_heartbeat_seconds=0,
                         api_key="key-a,key-b")
    resp, rid = thinking_stream(client, headers=A_KEY)
    body = {"id": rid, "action": "reasoning_end"}
    other = client.post("/v1/chat/completions/control", json=body, headers=B_KEY)
    assert other.get_json() == {"success": False}
    assert engine.handles[-1].injected == []
    mine = client.post("/v1/chat/completions/control", json=body, headers=A_KEY)
    assert mine.get_json() == {"success": True}
    assert engine.handles[-1].injected == ["</think>"]
    resp.close()


def test_routes_this_server_does_not_have_are_404s():
    client = make_client(FakeEngine())
    rid = post(client, {"input": "hi"}).get_json()["id"]
    assert client.get(f"/v1/responses/{rid}/input_items").status_code == 404
    assert client.post(f"/v1/responses/{rid}/cancel", json={}).status_code == 404
    assert client.get("/v1/responses/input_tokens").status_code == 404


# ---- the store is per API key (security review round 2, H2) ----------------------------------

A_KEY = {"Authorization": "Bearer key-a"}
B_KEY = {"x-api-key": "key-b"}


def test_another_keys_response_is_the_same_404_as_an_unknown_one():
    client = make_client(FakeEngine(), api_key="key-a,key-b")
    rid = client.post("/v1/responses", json={"input": "my pin is 1234"},
                      headers=A_KEY).get_json()["id"]
    unknown = client.get("/v1/responses/resp_unknown", headers=B_KEY)
    got = client.get(f"/v1/responses/{rid}", headers=B_KEY)
    assert got.status_code == 404
    assert got.get_json()["error"] == {**unknown.get_json()["error"],
                                       "message": got.get_json()["error"]["message"]}
    cont = client.post("/v1/responses", json={"input": "repeat it", "previous_response_id": rid},
                       headers=B_KEY)
    assert cont.status_code == 404
    assert cont.get_json()["error"]["code"] == "previous_response_not_found"
    count = client.post("/v1/responses/input_tokens",
                        json={"input": "x", "previous_response_id": rid}, headers=B_KEY)
    assert count.status_code == 404
    assert client.delete(f"/v1/responses/{rid}", headers=B_KEY).status_code == 404
    # the owner still has it, and may continue and delete it
    assert client.get(f"/v1/responses/{rid}", headers=A_KEY).status_code == 200
    assert client.post("/v1/responses", json={"input": "again", "previous_response_id": rid},
                       headers=A_KEY).status_code == 200
    assert client.delete(f"/v1/responses/{rid}", headers=A_KEY).status_code == 200
    assert client.get(f"/v1/responses/{rid}", headers=A_KEY).status_code == 404


def test_one_key_filling_the_store_evicts_only_its_own():
    client = make_client(FakeEngine(), api_key="key-a,key-b", responses_store_size=4)
    mine = [client.post("/v1/responses", json={"input": f"a{i}"}, headers=A_KEY).get_json()["id"]
            for i in range(2)]
    theirs = [client.post("/v1/responses", json={"input": f"b{i}"},
                          headers=B_KEY).get_json()["id"] for i in range(20)]
    assert [client.get(f"/v1/responses/{r}", headers=A_KEY).status_code for r in mine] == \
        [200, 200]
    # B keeps its newest within what is left: the store's bound holds
    kept = [r for r in theirs if client.get(f"/v1/responses/{r}", headers=B_KEY).status_code == 200]
    assert kept == theirs[-2:]
    assert len(api_of(client).store) == 4


def test_a_full_store_evicts_from_the_key_holding_the_most():
    from app.api.responses.store import ResponseStore

    store = ResponseStore(size=4, ttl=60)
    for i in range(3):
        store.put("big", f"b{i}", {}, [])
    store.put("small", "s0", {}, [])
    store.put("small", "s1", {}, [])  # over the bound: "big" holds the most, its oldest goes
    assert store.get("big", "b0") is None and store.get("big", "b1") is not None
    assert store.get("small", "s0") is not None and len(store) == 4
    store.put("small", "s2", {}, [])  # a tie: the writer's own oldest goes
    assert store.get("small", "s0") is None and store.get("big", "b1") is not None


def test_the_store_is_bounded_in_bytes_too():
    """security3 L2: twenty responses echoing megabytes of tools fit RESPONSES_STORE_SIZE's
    count but not its bytes: the store keeps what its byte budget holds, evicting from the key
    holding the most bytes, and keeps no response larger than the whole budget."""
    from app.api.responses.store import ResponseStore, json_size

    big = {"tools": ["x" * 100_000]}
    store = ResponseStore(size=100, ttl=60, max_bytes=350_000)
    for i in range(20):
        store.put("a", f"a{i}", big, [])
    assert len(store) == 3 and store.get("a", "a19") is not None
    assert store.get("a", "a16") is None
    store.put("b", "b0", {"note": "x" * 60_000}, [{"role": "user", "content": "hi"}])
    assert store.get("b", "b0") is not None and len(store) == 3  # "a" gave up its oldest
    assert store.get("a", "a17") is None and store.get("a", "a18") is not None
    store.put("b", "huge", {"tools": ["x" * 400_000]}, [])
    assert store.get("b", "huge") is None and store.get("b", "b0") is not None
    assert store.delete("b", "b0") and store.delete("a", "a19")
    assert store.delete("a", "a18") and len(store) == 0
    assert json_size(big, []) > 100_000


def test_responses_store_bytes_reaches_the_store(fake_engine):
    client = make_client(fake_engine, RESPONSES_STORE_BYTES="4096")
    store = api_of(client).store
    assert store.max_bytes == 4096
    for i in range(5):
        r = client.post("/v1/responses", json={"model": "m", "input": f"hi {i}",
                                               "instructions": "y" * 1500})
        assert r.status_code == 200
    assert 0 < len(store) < 5
