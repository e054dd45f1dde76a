"""The Anthropic Messages API over the fake engine (fast tier): validation, the message object,
stop reasons, tools, thinking, the stream (golden transcripts), errors, count_tokens, the Vertex
predict route, and the official anthropic SDK in process."""

from __future__ import annotations

import json
import os

import pytest

from app.api import anthropic as anthropic_api
from app.api.anthropic import Messages
from app.api.anthropic import stream as anthropic_stream
from app.api.anthropic.parsing import MessagesRequest, chat_input, parse, template_messages
from app.api.anthropic.stream import tool_id
from app.engine.fake import FakeEngine
from app.formats import THINK
from tests.support.app import make_client
from tests.support.server import DATA

GOLDEN = DATA / "golden"
TEMPLATES = DATA / "templates"
REPLY = "Hello from the fake engine. It speaks in short words."
MSG = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
ADD = {"name": "add", "description": "Add two integers", "input_schema": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"]}}
WEATHER = {"name": "get_weather", "description": "Weather in a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL_REPLY = '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}'


@pytest.fixture
def fixed_ids(monkeypatch):
    """Deterministic message and tool ids (golden transcripts)."""
    monkeypatch.setattr(anthropic_api, "message_id", lambda: "msg_1")
    monkeypatch.setattr(anthropic_stream, "tool_id", lambda call_id: "toolu_1")


def assert_error(resp, status: int, kind: str, needle: str | None = None) -> str:
    assert resp.status_code == status, resp.get_data(as_text=True)
    assert resp.headers["Content-Type"].startswith("application/json")
    body = resp.get_json()
    assert set(body) == {"type", "error", "request_id"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == kind, body
    if needle is not None:
        assert needle in body["error"]["message"], body
    return body["error"]["message"]


def sse(text: str) -> list[tuple[str, dict]]:
    """(event name, data) per SSE event; every event is named and its type is its name."""
    assert text.endswith("\n\n")
    out = []
    for block in text.split("\n\n"):
        if not block:
            continue
        name_line, data_line = block.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: "), block
        name, data = name_line[7:], json.loads(data_line[6:])
        assert data["type"] == name
        out.append((name, data))
    return out


def check_stream_order(events: list[tuple[str, dict]]) -> None:
    """What the SDK's accumulator needs: message_start first, blocks started in index order
    and each stopped before the next starts, deltas only for the open block."""
    assert events[0][0] == "message_start"
    assert events[0][1]["message"]["content"] == []
    open_index, next_index = None, 0
    for name, data in events[1:]:
        if name == "content_block_start":
            assert open_index is None and data["index"] == next_index
            open_index, next_index = data["index"], next_index + 1
        elif name == "content_block_delta":
            assert data["index"] == open_index
        elif name == "content_block_stop":
            assert data["index"] == open_index
            open_index = None
        elif name in ("message_delta", "message_stop", "error"):
            assert open_index is None or name == "error"
    assert "[DONE]" not in json.dumps(events)


# ---- the message object ---------------------------------------------------------------------


def test_message(client):
    resp = client.post("/v1/messages", json=MSG, headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
    assert resp.status_code == 200
    body = resp.get_json()
    assert body["id"].startswith("msg_")
    assert {k: v for k, v in body.items() if k != "id"} == {
        "type": "message", "role": "assistant", "content": [{"type": "text", "text": REPLY}],
        "model": "fake-model", "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 11, "cache_read_input_tokens": 0},  # + EOG
    }


def test_system_and_blocks_reach_the_template(client, fake_engine):
    client.post("/v1/messages", json={**MSG, "system": [{"type": "text", "text": "be brief"},
                                                       {"type": "text", "text": "and kind", "cache_control": {"type": "ephemeral"}}],
                                      "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})
    assert fake_engine.requests[-1].prompt == (
        "<|im_start|>system\nbe brief\n\nand kind<|im_end|>\n<|im_start|>user\na\n\nb<|im_end|>\n"
        "<|im_start|>assistant\n")


def test_sampling_parameters_reach_the_engine(client, fake_engine):
    client.post("/v1/messages", json={**MSG, "max_tokens": 3, "temperature": 0.2, "top_p": 0.9, "top_k": 7,
                                      "stop_sequences": ["x", ""], "metadata": {"user_id": "u"},
                                      "service_tier": "auto", "anthropic_version": "vertex-2023-10-16"})
    p = fake_engine.requests[-1].params
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.stop) == (3, 0.2, 0.9, 7, ("x",))
    assert fake_engine.requests[-1].n == 1


def test_max_tokens_gives_max_tokens(client):
    body = client.post("/v1/messages", json={**MSG, "max_tokens": 2}).get_json()
    assert body["stop_reason"] == "max_tokens" and body["stop_sequence"] is None
    assert body["content"] == [{"type": "text", "text": "Hello from "}]
    assert body["usage"]["output_tokens"] == 2


def test_stop_sequence_is_reported(client):
    body = client.post("/v1/messages", json={**MSG, "stop_sequences": ["engine", "fake"]}).get_json()
    assert body["content"] == [{"type": "text", "text": "Hello from the "}]
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", "fake")
    events = sse(client.post("/v1/messages", json={**MSG, "stream": True, "stop_sequences": ["fake"]}).get_data(as_text=True))
    delta = [d for n, d in events if n == "message_delta"][0]
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "fake"}


# ---- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize("patch, needle", [
    ({"max_tokens": None}, "max_tokens: field required"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": 1.5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"stream": "yes"}, "stream"),
    ({"messages": []}, "messages"),
    ({"n": 2}, "n: this server does not support this field"),
    ({"container": "c"}, "container: this server does not support"),
    ({"stop_sequences": ["s"] * 17}, "stop_sequences"),
    ({"system": [{"type": "image", "source": {}}]}, "system.0.type"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user"}]}, "messages.0.content: field required"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages.0.name"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}]},
     "messages.0.content.0.source.data: field required"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url",
                                                                           "url": "https://x/y.png"}}]}]},
     "no vision projector"),  # the fake model reads text only (URLs: tests/e2e/test_vision.py)
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "'document'"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "add", "input": {}}]}]},
     "is not allowed here"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "bogus": 1}]}]},
     "messages.0.content.0.bogus"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                  "content": [{"type": "image", "source": {}}]}]}]},
     "messages.0.content.0.content.0.source.type: must be 'base64' or 'url'"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "tool_use_id: field required"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "add", "input": [1]}]}, {"role": "user", "content": "x"}]},
     "messages.1.content.0.input"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "add", "input": {}}]}]}, "holds text only"),
    ({"tools": [{"name": "add"}]}, "tools.0.input_schema: field required"),
    ({"tools": [{"name": "bad name", "input_schema": {"type": "object"}}]}, "tools.0.name"),
    ({"tools": [{"name": "x", "input_schema": {"type": "array"}}]}, "tools.0.input_schema"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tool"),
    ({"tools": [ADD, ADD]}, "unique"),
    ({"tools": [ADD], "tool_choice": {"type": "tool"}}, "tool_choice"),
    ({"tools": [ADD], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
    ({"tools": [ADD], "tool_choice": {"type": "required"}}, "tool_choice.type"),
    ({"thinking": {"type": "enabled"}}, "budget_tokens is required"),
    ({"thinking": {"type": "sometimes"}}, "thinking.type"),
    ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
    ({"thinking": {"type": "adaptive", "display": "loud"}}, "thinking.display"),
])
def test_validation_errors_are_400_in_anthropic_shape(client, patch, needle):
    body = {**MSG, **patch}
    body = {k: v for k, v in body.items() if v is not None}
    assert_error(client.post("/v1/messages", json=body), 400, "invalid_request_error", needle)


def test_unknown_fields_set_to_null_are_dropped(client):
    assert client.post("/v1/messages", json={**MSG, "container": None, "cache_control": {"type": "ephemeral"}}).status_code == 200


def test_body_errors_are_anthropic_shaped(fake_engine):
    client = make_client(fake_engine, max_body_bytes=2048)
    assert_error(client.post("/v1/messages", data="{", content_type="application/json"), 400, "invalid_request_error")
    assert_error(client.post("/v1/messages", data="{}", content_type="text/plain"), 415, "invalid_request_error")
    big = {**MSG, "messages": [{"role": "user", "content": "x" * 4096}]}
    assert_error(client.post("/v1/messages", json=big), 413, "request_too_large")
    assert_error(client.post("/v1/messages", json=[1]), 400, "invalid_request_error", "JSON object")


def test_context_overflow_is_400():
    client = make_client(FakeEngine(n_ctx=8))
    body = {**MSG, "messages": [{"role": "user", "content": "one two three four five six seven"}]}
    assert_error(client.post("/v1/messages", json=body), 400, "invalid_request_error")
    assert_error(client.post("/v1/messages", json={**body, "stream": True}), 400, "invalid_request_error")


# ---- errors before the first byte and mid-stream --------------------------------------------


def test_queue_full_is_429_rate_limit_error():
    client = make_client(FakeEngine(capacity=0))
    for body in (MSG, {**MSG, "stream": True}):
        resp = client.post("/v1/messages", json=body)
        assert_error(resp, 429, "rate_limit_error")
        assert resp.headers["Retry-After"]


def test_loading_is_503_overloaded_error():
    engine = FakeEngine(ready=False)
    engine.state.set("loading", progress=0.5)
    client = make_client(engine)
    assert_error(client.post("/v1/messages", json=MSG), 503, "overloaded_error", "loading")
    assert_error(client.post("/v1/messages", json={**MSG, "stream": True}), 503, "overloaded_error")
    assert_error(client.post("/v1/messages/count_tokens", json=MSG), 503, "overloaded_error")


def test_failure_before_the_first_token_is_500_api_error(client):
    body = {**MSG, "messages": [{"role": "user", "content": "FAIL_BEFORE"}]}
    assert_error(client.post("/v1/messages", json=body), 500, "api_error")
    assert_error(client.post("/v1/messages", json={**body, "stream": True}), 500, "api_error")


def test_unexpected_error_is_500_without_internals(fake_engine, monkeypatch):
    def boom(request):
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(fake_engine, "submit", boom)
    resp = make_client(fake_engine).post("/v1/messages", json=MSG)
    assert assert_error(resp, 500, "api_error") == "internal server error"
    assert "secret" not in resp.get_data(as_text=True)


def test_generation_timeout_is_504_timeout_error():
    client = make_client(FakeEngine(delay=0.05), request_timeout=0.01)
    assert_error(client.post("/v1/messages", json=MSG), 504, "timeout_error")


def test_error_mid_stream_is_an_error_event(client):
    body = {**MSG, "stream": True, "messages": [{"role": "user", "content": "FAIL_AFTER"}]}
    resp = client.post("/v1/messages", json=body)
    assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    events = sse(resp.get_data(as_text=True))
    check_stream_order(events)
    assert events[-1] == ("error", {"type": "error", "error": {"type": "api_error", "message": "scripted failure mid-stream"}})
    assert "message_stop" not in [n for n, _ in events]


def test_heartbeats_are_ping_events():
    client = make_client(FakeEngine(reply="a b", delay=0.3), stream_heartbeat_seconds=0.05)
    events = sse(client.post("/v1/messages", json={**MSG, "stream": True}).get_data(as_text=True))
    assert events[1] == ("ping", {"type": "ping"})  # one right after message_start
    assert [n for n, _ in events].count("ping") >= 2  # and while the words take their time
    check_stream_order([e for e in events if e[0] != "ping"])


# ---- the stream ------------------------------------------------------------------------------

GOLDEN_CASES = {
    # name: (engine reply, settings, request patch)
    "anthropic_text": ("Hello there, friend.", {}, {}),
    "anthropic_thinking": ("<think>Easy one.</think>Hello there.", {"reasoning_format": "parsed"}, {}),
    "anthropic_tool_use": (CALL_REPLY, {}, {"tools": [ADD], "tool_choice": {"type": "any"}}),
    "anthropic_max_tokens": ("one two three four", {}, {"max_tokens": 2}),
    "anthropic_error": ("one two", {}, {"messages": [{"role": "user", "content": "FAIL_AFTER"}]}),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_transcripts(name, fixed_ids):
    reply, settings, patch = GOLDEN_CASES[name]
    client = make_client(FakeEngine(reply=reply), stream_heartbeat_seconds=0, **settings)
    resp = client.post("/v1/messages", json={**MSG, "stream": True, **patch})
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    got = resp.get_data(as_text=True)
    path = GOLDEN / f"{name}.sse"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(got)
    assert got == path.read_text(), f"{name} differs from {path}"
    check_stream_order(sse(got))


@pytest.mark.parametrize("name", sorted(set(GOLDEN_CASES) - {"anthropic_error"}))
def test_stream_and_message_agree(name, fixed_ids):
    """Accumulating the stream the way the SDK does gives the non-streamed message."""
    reply, settings, patch = GOLDEN_CASES[name]
    client = make_client(FakeEngine(reply=reply), **settings)
    whole = client.post("/v1/messages", json={**MSG, **patch}).get_json()
    events = sse(client.post("/v1/messages", json={**MSG, "stream": True, **patch}).get_data(as_text=True))
    msg = dict(events[0][1]["message"])
    blocks: list[dict] = []
    json_parts: dict[int, str] = {}
    for name_, data in events[1:]:
        if name_ == "content_block_start":
            blocks.append(dict(data["content_block"]))
        elif name_ == "content_block_delta":
            d, b = data["delta"], blocks[data["index"]]
            if d["type"] == "text_delta":
                b["text"] += d["text"]
            elif d["type"] == "thinking_delta":
                b["thinking"] += d["thinking"]
            elif d["type"] == "signature_delta":
                b["signature"] = d["signature"]
            else:
                json_parts[data["index"]] = json_parts.get(data["index"], "") + d["partial_json"]
        elif name_ == "message_delta":
            msg.update(data["delta"])
            msg["usage"] = data["usage"]
    for i, text in json_parts.items():
        blocks[i]["input"] = json.loads(text)
    msg["content"] = blocks
    assert msg == whole


# ---- tools -----------------------------------------------------------------------------------


def test_tool_use_round_trip():
    engine = FakeEngine(reply=CALL_REPLY)
    client = make_client(engine)
    body = {**MSG, "messages": [{"role": "user", "content": "What is 1 plus 2?"}], "tools": [ADD, WEATHER]}
    msg = client.post("/v1/messages", json={**body, "tool_choice": {"type": "any"}}).get_json()
    assert msg["stop_reason"] == "tool_use"
    (call,) = msg["content"]
    assert call["type"] == "tool_use" and call["id"].startswith("toolu_")
    assert (call["name"], call["input"]) == ("add", {"a": 1, "b": 2})
    follow = {**body, "messages": body["messages"] + [
        {"role": "assistant", "content": msg["content"]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "3"},
                                     {"type": "text", "text": "And 3 plus 4?"}]},
    ]}
    assert client.post("/v1/messages", json=follow).status_code == 200
    prompt = engine.requests[-1].prompt
    assert '"arguments": {"a": 1, "b": 2}' in prompt  # the call, in the generic form
    assert call["id"] in prompt  # the result names the call by the id the client got
    assert prompt.index("Tool result") < prompt.index("And 3 plus 4?")


def test_tool_result_error_and_blocks_reach_the_tool_message():
    req = parse(MessagesRequest, {**MSG, "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Use the tool.", "signature": "sig"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Let me add.", "citations": None},
            {"type": "tool_use", "id": "toolu_9", "name": "add", "input": {"a": 1}, "caller": {"type": "direct"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_9", "is_error": True,
             "content": [{"type": "text", "text": "missing b"}]},
            {"type": "tool_result", "tool_use_id": "toolu_8"}]},
    ]})
    assert template_messages(req)[0] == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "Let me add.", "reasoning_content": "Use the tool.",
         "tool_calls": [{"id": "toolu_9", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "toolu_9", "content": "Error: missing b"},
        {"role": "tool", "tool_call_id": "toolu_8", "content": ""},
    ]


@pytest.mark.parametrize("choice, mode, name, parallel", [
    (None, "auto", None, True),
    ({"type": "auto"}, "auto", None, True),
    ({"type": "any"}, "required", None, True),
    ({"type": "any", "disable_parallel_tool_use": True}, "required", None, False),
    ({"type": "tool", "name": "add"}, "named", "add", True),
    ({"type": "none"}, "none", None, True),
])
def test_tool_choice_maps_to_the_core(choice, mode, name, parallel):
    inp = chat_input(parse(MessagesRequest, {**MSG, "tools": [ADD], "tool_choice": choice}), 128, 1 << 20)
    assert (inp.tool_choice.mode, inp.tool_choice.name, inp.parallel_tool_calls) == (mode, name, parallel)
    assert inp.tools[0].parameters == ADD["input_schema"]


def test_tool_choice_in_a_native_template():
    template = (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    engine = FakeEngine(reply='<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
                        n_ctx=4096, chat_template=template)
    client = make_client(engine)
    body = {**MSG, "tools": [ADD, WEATHER]}
    msg = client.post("/v1/messages", json={**body, "tool_choice": {"type": "tool", "name": "get_weather"}}).get_json()
    assert msg["content"][0]["input"] == {"city": "Paris"} and msg["stop_reason"] == "tool_use"
    grammar = engine.requests[-1].params.grammar
    assert '\\"get_weather\\"' in grammar and '\\"add\\"' not in grammar  # only the named tool
    client.post("/v1/messages", json={**body, "tool_choice": {"type": "any"}})
    assert '\\"add\\"' in engine.requests[-1].params.grammar
    client.post("/v1/messages", json={**body, "tool_choice": {"type": "none"}})
    assert engine.requests[-1].params.grammar is None and "get_weather" not in engine.requests[-1].prompt


def test_tool_ids_are_toolu():
    assert tool_id("call_abc") == "toolu_abc"
    assert tool_id("Ab3dE5gH9") == "Ab3dE5gH9"  # Mistral's own form stays


# ---- thinking and structured output ---------------------------------------------------------


def test_thinking_config_maps_to_budget_and_template_kwargs():
    inp = chat_input(parse(MessagesRequest, {**MSG, "thinking": {"type": "enabled", "budget_tokens": 16}}), 8, 1 << 20)
    assert inp.reasoning_budget == 16 and inp.thinking is True
    # off: the thought syntax turns it into its template's switch (enable_thinking: false)
    inp = chat_input(parse(MessagesRequest, {**MSG, "thinking": {"type": "disabled"}}), 8, 1 << 20)
    assert inp.reasoning_budget is None and inp.thinking is False
    assert THINK.controls({}, inp.effort, inp.thinking) == {"enable_thinking": False}
    inp = chat_input(parse(MessagesRequest, {**MSG, "thinking": {"type": "adaptive"}}), 8, 1 << 20)
    assert inp.reasoning_budget is None and inp.template_kwargs == {}


def test_thinking_disabled_reaches_a_thinking_template():
    template = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
    engine = FakeEngine(reply="Hi.", n_ctx=4096, chat_template=template)
    client = make_client(engine)
    client.post("/v1/messages", json={**MSG, "thinking": {"type": "disabled"}})
    assert engine.requests[-1].prompt.endswith("<think>\n\n</think>\n\n")
    client.post("/v1/messages", json={**MSG, "thinking": {"type": "enabled", "budget_tokens": 100}})
    assert not engine.requests[-1].prompt.endswith("</think>\n\n")


def test_output_config_json_schema_is_a_grammar(client, fake_engine):
    fmt = {"type": "json_schema", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}
    assert client.post("/v1/messages", json={**MSG, "output_config": {"format": fmt}}).status_code == 200
    params = fake_engine.requests[-1].params
    assert params.grammar and params.grammar_param == "output_config.format.schema"


# ---- count_tokens ----------------------------------------------------------------------------


def test_count_tokens_matches_the_prompt(client):
    body = {**MSG, "system": "be brief", "tools": [ADD]}
    counted = client.post("/v1/messages/count_tokens", json={k: v for k, v in body.items() if k != "max_tokens"})
    assert counted.status_code == 200 and set(counted.get_json()) == {"input_tokens"}
    used = client.post("/v1/messages", json=body).get_json()["usage"]
    assert counted.get_json()["input_tokens"] == used["input_tokens"] + used["cache_read_input_tokens"]
    plain = client.post("/v1/messages/count_tokens", json={"model": "m", "messages": MSG["messages"]}).get_json()
    assert plain["input_tokens"] < counted.get_json()["input_tokens"]  # the tools are in the prompt


def test_count_tokens_validates_like_messages(client):
    assert_error(client.post("/v1/messages/count_tokens", json={"model": "m"}), 400, "invalid_request_error", "messages")
    bad = {"model": "m", "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}
    assert_error(client.post("/v1/messages/count_tokens", json=bad), 400, "invalid_request_error", "base64")


# ---- Vertex predict --------------------------------------------------------------------------

VERTEX_CLAUDE = {"anthropic_version": "vertex-2023-10-16", "max_tokens": 8,
                 "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("body, expected", [
    (VERTEX_CLAUDE, True),
    ({"messages": [], "system": "s"}, True),
    ({"messages": [], "stop_sequences": ["x"]}, True),
    ({"messages": [], "thinking": {"type": "enabled"}}, True),
    ({"messages": [], "tools": [ADD]}, True),
    ({"messages": [], "tool_choice": {"type": "any"}}, True),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]}, True),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}, False),  # both APIs' body: chat
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "stop": ["x"]}, False),
    ({"messages": [], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"}, False),
    ({"messages": [], "tool_choice": {"type": "function", "function": {"name": "f"}}}, False),
    ({"messages": "not a list"}, False),
    ({"prompt": "x", "system": "s"}, False),
])
def test_looks_like(client, body, expected):
    assert Messages.looks_like(None, body) is expected  # type: ignore[arg-type]


def test_predict_envelope_with_request_format(client):
    msg = {"messages": MSG["messages"]}
    resp = client.post("/predict", json={"instances": [
        {"@requestFormat": "messages", **msg},
        {"@requestFormat": "anthropic", **msg, "temperature": 5},
        {"@requestFormat": "/v1/messages", **msg, "max_tokens": 1},
        VERTEX_CLAUDE,
        {"messages": [{"role": "user", "content": "hi"}]},
    ], "parameters": {"max_tokens": 2}})
    assert resp.status_code == 200
    preds = resp.get_json()["predictions"]
    assert preds[0]["type"] == "message" and preds[0]["content"][0]["text"] == "Hello from "
    assert preds[1]["type"] == "error" and "temperature" in preds[1]["error"]["message"]
    assert preds[2]["usage"]["output_tokens"] == 1
    assert preds[3]["type"] == "message" and preds[3]["usage"]["output_tokens"] == 8  # instance wins
    assert preds[4]["object"] == "chat.completion"


def test_raw_predict_bodies(client):
    msg = client.post("/predict", json=VERTEX_CLAUDE).get_json()
    assert msg["type"] == "message" and msg["stop_reason"] == "max_tokens"
    chat = client.post("/predict", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).get_json()
    assert chat["object"] == "chat.completion"
    bad = client.post("/predict", json={**VERTEX_CLAUDE, "temperature": 2})
    assert_error(bad, 400, "invalid_request_error", "temperature")
    resp = client.post("/predict", json={**VERTEX_CLAUDE, "stream": True})
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events = sse(resp.get_data(as_text=True))
    check_stream_order(events)
    assert events[-1][0] == "message_stop"
    env = client.post("/predict", json={"instances": [{**VERTEX_CLAUDE, "stream": True}]})
    assert sse(env.get_data(as_text=True))[-1][0] == "message_stop"


# ---- the official SDK, in process -----------------------------------------------------------


@pytest.fixture
def sdk(fake_engine):
    anthropic = pytest.importorskip("anthropic")
    try:  # the SDK's own HTTP client: httpx2 since anthropic 2.x, httpx before
        import httpx2
    except ImportError:
        import httpx as httpx2

    from app import create_app
    from app.settings import Settings

    app = create_app(Settings(), engine=fake_engine)
    http = httpx2.Client(transport=httpx2.WSGITransport(app=app), base_url="http://sdk.test")
    client = anthropic.Anthropic(base_url="http://sdk.test", api_key="x", http_client=http, max_retries=0)
    yield client
    http.close()


def test_sdk_create_stream_count_and_errors(sdk):
    import anthropic

    msg = sdk.messages.create(model="m", max_tokens=32, messages=[{"role": "user", "content": "hi"}])
    assert msg.content[0].text == REPLY and msg.stop_reason == "end_turn"
    with sdk.messages.stream(model="m", max_tokens=3, messages=[{"role": "user", "content": "hi"}]) as stream:
        assert "".join(stream.text_stream) == "Hello from the "
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 3
    counted = sdk.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}])
    assert counted.input_tokens == msg.usage.input_tokens + msg.usage.cache_read_input_tokens
    with pytest.raises(anthropic.BadRequestError) as bad:
        sdk.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}],
                            extra_body={"temperature": 3})
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    failing = sdk.messages.stream(model="m", max_tokens=8, messages=[{"role": "user", "content": "FAIL_AFTER"}])
    with pytest.raises(anthropic.APIStatusError) as mid, failing as s:
        list(s.text_stream)
    assert mid.value.body == {"type": "error", "error": {"type": "api_error", "message": "scripted failure mid-stream"}}


def test_sdk_tool_use_stream(fake_engine, sdk):
    fake_engine.reply = CALL_REPLY
    with sdk.messages.stream(model="m", max_tokens=64, tools=[ADD], tool_choice={"type": "any"},
                             messages=[{"role": "user", "content": "What is 1 plus 2?"}]) as stream:
        final = stream.get_final_message()
    (call,) = final.content
    assert (call.type, call.name, call.input, final.stop_reason) == ("tool_use", "add", {"a": 1, "b": 2}, "tool_use")
    fake_engine.reply = "3."
    answer = sdk.messages.create(model="m", max_tokens=64, tools=[ADD], messages=[
        {"role": "user", "content": "What is 1 plus 2?"},
        {"role": "assistant", "content": final.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "3"}]},
    ])
    assert answer.stop_reason == "end_turn"
    assert call.id in fake_engine.requests[-1].prompt


def test_unknown_route_and_wrong_method_under_messages_answer_in_its_shape(client):
    missing = client.post("/v1/messages/batches", json={})
    assert missing.status_code == 404
    assert missing.get_json()["type"] == "error"
    assert missing.get_json()["error"]["type"] == "not_found_error"
    wrong = client.get("/v1/messages")
    assert wrong.status_code == 405
    assert wrong.get_json()["type"] == "error"
    # outside any API's paths: OpenAI's shape, as before
    assert "error" in client.get("/v1/nothing").get_json()
    assert "type" not in client.get("/v1/nothing").get_json()
