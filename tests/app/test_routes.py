"""Routing, envelopes and error mapping over the fake engine (fast tier)."""

from __future__ import annotations

import json

import pytest

from app.engine.fake import FakeEngine
from tests.support.app import make_client

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
REPLY = "Hello from the fake engine. It speaks in short words."


def assert_openai_error(resp, status: int, param: str | None = None):
    assert resp.status_code == status, resp.get_data(as_text=True)
    body = resp.get_json()
    assert set(body) == {"error", "request_id"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    if param is not None:
        assert err["param"] == param
    return err


def sse_events(resp) -> list[str]:
    text = resp.get_data(as_text=True)
    assert text.endswith("\n\n")
    return [block for block in text.split("\n\n") if block]


# ---- OpenAI routes ---------------------------------------------------------------------------


def test_chat_completion(client):
    resp = client.post("/v1/chat/completions", json=CHAT)
    assert resp.status_code == 200
    body = resp.get_json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["model"] == "fake-model"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": REPLY}
    assert body["choices"][0]["finish_reason"] == "stop"
    # the reply's words and its end-of-generation token (counted, as OpenAI and vLLM count it)
    assert body["usage"]["completion_tokens"] == len(REPLY.split()) + 1
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + len(REPLY.split()) + 1


def test_chat_prompt_is_rendered_from_the_template(client, fake_engine):
    client.post("/v1/chat/completions", json={"messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]})
    prompt = fake_engine.requests[-1].prompt
    assert prompt == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_sampling_parameters_reach_the_engine(client, fake_engine):
    client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3, "temperature": 0.2,
                "top_p": 0.9, "top_k": 7, "min_p": 0.1, "seed": 42, "stop": "x",
                "presence_penalty": 0.5, "frequency_penalty": 0.25, "repeat_penalty": 1.1})
    p = fake_engine.requests[-1].params
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p, p.seed, p.stop) == (
        3, 0.2, 0.9, 7, 0.1, 42, ("x",))
    assert (p.presence_penalty, p.frequency_penalty, p.repeat_penalty) == (0.5, 0.25, 1.1)


def test_max_tokens_gives_length(client):
    body = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2}).get_json()
    assert body["choices"][0]["message"]["content"] == "Hello from "
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 2


def test_max_completion_tokens_is_honoured(client, fake_engine):
    client.post("/v1/chat/completions", json={**CHAT, "max_completion_tokens": 4})
    assert fake_engine.requests[-1].params.max_tokens == 4


def test_stop_string_is_cut(client):
    body = client.post("/v1/chat/completions", json={**CHAT, "stop": ["engine."]}).get_json()
    assert body["choices"][0]["message"]["content"] == "Hello from the fake "
    assert body["choices"][0]["finish_reason"] == "stop"


def test_completion(client):
    resp = client.post("/v1/completions", json={"prompt": "Once upon", "max_tokens": 3})
    body = resp.get_json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "Hello from the "
    assert body["usage"]["prompt_tokens"] == 2


def test_completion_with_token_ids_and_echo(client, fake_engine):
    client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 1})
    assert fake_engine.requests[-1].prompt == (1, 2, 3)
    body = client.post("/v1/completions", json={"prompt": "Say:", "echo": True, "max_tokens": 1}).get_json()
    assert body["choices"][0]["text"] == "Say:Hello "


def test_models(client):
    body = client.get("/v1/models").get_json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["fake-model"]
    assert client.get("/v1/models/fake-model").get_json()["id"] == "fake-model"
    assert_openai_error(client.get("/v1/models/other"), 404)


# ---- errors ----------------------------------------------------------------------------------


def test_invalid_json_is_400(client):
    resp = client.post("/v1/chat/completions", data=b"{not json", content_type="application/json")
    assert "not valid JSON" in assert_openai_error(resp, 400)["message"]


@pytest.mark.parametrize(
    "body, param",
    [
        ({**CHAT, "temperature": 5}, "temperature"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({}, "messages"),
        ({**CHAT, "max_tokens": 0}, "max_tokens"),
        ({**CHAT, "n": 17}, "n"),
        ({**CHAT, "logprobs": 1}, "logprobs"),  # chat's is a boolean (completions' a count)
        ({**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({**CHAT, "stop": ["a"] * 17}, "stop"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages.0.content.0.image_url"),
    ],
)
def test_validation_errors_name_the_field(client, body, param):
    assert_openai_error(client.post("/v1/chat/completions", json=body), 400, param)


def test_body_that_is_not_an_object_is_400(client):
    assert_openai_error(client.post("/v1/chat/completions", json=[1, 2]), 400)


def test_informational_fields_are_accepted_and_nulls_dropped(client):
    resp = client.post("/v1/chat/completions", json={
        **CHAT, "store": False, "metadata": {"a": "1"}, "user": "u-1", "service_tier": "auto",
        "prompt_cache_key": "k", "safety_identifier": "s", "stream_options": None,
        "parallel_tool_calls": True, "some_vendor_field": None, "reasoning_effort": None})
    assert resp.status_code == 200, resp.get_json()


@pytest.mark.parametrize("field,value,hint", [
    ("functions", [], "tools"),
    ("web_search_options", {}, "web search"),
    ("mirostat", 2, "not supported"),
    ("some_vendor_field", 1, "docs/api.md, Request fields"),
    ("store", True, ""),
    ("top_logprobs", 2, "needs logprobs: true"),
    ("n_probs", 2, "use logprobs"),
])
def test_fields_this_server_does_not_do_are_400_not_ignored(client, field, value, hint):
    resp = client.post("/v1/chat/completions", json={**CHAT, field: value})
    assert_openai_error(resp, 400, field)
    assert hint in resp.get_json()["error"]["message"]


def test_unknown_route_and_method(client):
    assert_openai_error(client.get("/nope"), 404)
    assert_openai_error(client.get("/v1/chat/completions"), 405)


def test_body_over_limit_is_413(fake_engine):
    client = make_client(fake_engine, max_body_bytes=2048)
    big = {"messages": [{"role": "user", "content": "x" * 4096}]}
    assert_openai_error(client.post("/v1/chat/completions", json=big), 413)
    assert_openai_error(client.post("/predict", json={"instances": [big]}), 413)


def test_queue_full_is_429():
    engine = FakeEngine(capacity=0)
    resp = make_client(engine).post("/v1/chat/completions", json=CHAT)
    assert_openai_error(resp, 429)
    assert resp.headers["Retry-After"]


def test_loading_is_503_everywhere():
    engine = FakeEngine(ready=False)
    engine.state.set("loading", progress=0.25)
    client = make_client(engine)
    health = client.get("/health")
    assert health.status_code == 503
    assert health.get_json()["stage"] == "loading"
    assert health.get_json()["progress"] == 0.25
    for path, body in (("/v1/chat/completions", CHAT), ("/predict", {"instances": [CHAT]}),
                       ("/v1/completions", {"prompt": "x"})):
        err = assert_openai_error(client.post(path, json=body), 503)
        assert err["code"] == "model_loading"
    assert_openai_error(client.get("/v1/models"), 503)


def test_unexpected_error_is_500_without_internals(fake_engine, monkeypatch):
    def boom(request):
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(fake_engine, "submit", boom)
    resp = make_client(fake_engine).post("/v1/chat/completions", json=CHAT)
    err = assert_openai_error(resp, 500)
    assert "secret" not in resp.get_data(as_text=True)
    assert "Traceback" not in resp.get_data(as_text=True)
    assert err["message"] == "internal server error"


def test_engine_failure_before_first_token(client):
    resp = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "FAIL_BEFORE"}]})
    assert_openai_error(resp, 500)
    resp = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "FAIL_BEFORE"}], "stream": True})
    assert resp.headers["Content-Type"].startswith("application/json")
    assert_openai_error(resp, 500)


# ---- health ----------------------------------------------------------------------------------


def test_health_ready(client):
    resp = client.get("/health")
    assert resp.status_code == 200
    assert resp.get_json()["status"] == "ok"
    assert resp.get_json()["model"] == "fake-model"


def test_vertex_routes_with_colons_work_verbatim(fake_engine):
    client = make_client(
        fake_engine,
        health_route="/v1/endpoints/123/deployedModels/456",
        predict_route="/v1/endpoints/123/deployedModels/456:predict",
    )
    assert client.get("/v1/endpoints/123/deployedModels/456").status_code == 200
    assert client.get("/health").status_code == 200
    resp = client.post("/v1/endpoints/123/deployedModels/456:predict", json={"instances": [CHAT]})
    assert resp.status_code == 200
    assert len(resp.get_json()["predictions"]) == 1
    assert client.post("/v1/endpoints/123/deployedModels/456:rawPredict", json=CHAT).status_code == 404


# ---- Vertex predict --------------------------------------------------------------------------


def test_envelope_chat_prompt_mixed_and_failing_instance(client):
    resp = client.post("/predict", json={
        "instances": [
            CHAT,
            {"prompt": "a b c", "max_tokens": 1},
            {"messages": [{"role": "user", "content": "hi"}], "temperature": 9},
            {"neither": True},
            "not an object",
            {"@requestFormat": "completions", "prompt": "q"},
        ],
        "parameters": {"max_tokens": 2},
    })
    assert resp.status_code == 200
    preds = resp.get_json()["predictions"]
    assert len(preds) == 6
    assert preds[0]["object"] == "chat.completion"
    assert preds[0]["choices"][0]["message"]["content"] == "Hello from "  # parameters applied
    assert preds[1]["object"] == "text_completion"
    assert preds[1]["choices"][0]["text"] == "Hello "  # instance key wins
    assert preds[2]["error"]["param"] == "temperature"
    assert preds[3]["error"]["type"] == "invalid_request_error"
    assert "JSON object" in preds[4]["error"]["message"]
    assert preds[5]["object"] == "text_completion"


def test_envelope_request_format_selects_explicitly(client, fake_engine):
    body = {"instances": [{"@requestFormat": "/v1/chat/completions", "messages": [{"role": "user", "content": "x"}]}]}
    pred = client.post("/predict", json=body).get_json()["predictions"][0]
    assert pred["object"] == "chat.completion"
    # the format decides, not the keys: a completions instance with messages is refused, not guessed
    body = {"instances": [{"@requestFormat": "completions", "prompt": "p", "messages": [{"role": "user", "content": "x"}]}]}
    pred = client.post("/predict", json=body).get_json()["predictions"][0]
    assert pred["error"]["param"] == "messages"
    pred = client.post("/predict", json={"instances": [{"@requestFormat": "classify", "input": "x"}]}).get_json()["predictions"][0]
    assert "@requestFormat" in pred["error"]["message"]


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"instances": []}, "empty"),
        ({"instances": {"a": 1}}, "list"),
        ({"instances": [CHAT] * 65}, "at most 64"),
        ({"instances": [CHAT], "parameters": [1]}, "parameters"),
        ({"foo": "bar"}, "expected a chat request"),
    ],
)
def test_bad_envelopes_are_400(client, body, needle):
    err = assert_openai_error(client.post("/predict", json=body), 400)
    assert needle in err["message"]


def test_instance_cap_is_a_setting(fake_engine):
    client = make_client(fake_engine, max_instances=2)
    assert client.post("/predict", json={"instances": [CHAT] * 2}).status_code == 200
    assert_openai_error(client.post("/predict", json={"instances": [CHAT] * 3}), 400)


def test_raw_predict_bodies_are_served_like_v1(client):
    chat = client.post("/predict", json=CHAT).get_json()
    assert chat["object"] == "chat.completion"
    comp = client.post("/predict", json={"prompt": "hello", "max_tokens": 1}).get_json()
    assert comp["object"] == "text_completion"
    assert client.post("/predict", json={"@requestFormat": "chatCompletions", **CHAT}).status_code == 200


def test_stream_raw_predict_streams(client):
    resp = client.post("/predict", json={**CHAT, "stream": True})
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(resp)
    assert events[-1] == "data: [DONE]"
    text = "".join(json.loads(e[6:])["choices"][0]["delta"].get("content") or "" for e in events[:-1])
    assert text == REPLY


def test_envelope_streams_only_one_instance(client):
    resp = client.post("/predict", json={"instances": [{**CHAT, "stream": True}]})
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    assert sse_events(resp)[-1] == "data: [DONE]"
    err = assert_openai_error(
        client.post("/predict", json={"instances": [CHAT, CHAT], "parameters": {"stream": True}}), 400
    )
    assert "exactly one instance" in err["message"]


def test_envelope_queue_full_fills_slots_not_the_request():
    engine = FakeEngine(capacity=1, delay=0.01)
    resp = make_client(engine).post("/predict", json={"instances": [CHAT, CHAT, CHAT]})
    preds = resp.get_json()["predictions"]
    assert resp.status_code == 200
    assert sum("error" in p for p in preds) >= 1
    assert any(p.get("error", {}).get("code") == "queue_full" for p in preds)
    assert any("choices" in p for p in preds)


def test_n_choices_non_streaming(client):
    body = client.post("/v1/chat/completions", json={**CHAT, "n": 3, "max_tokens": 2}).get_json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["message"]["content"] for c in body["choices"]] == ["Hello from ", "Hello Hello ", "Hello Hello "]
    assert body["usage"]["completion_tokens"] == 6


def test_n_choices_streaming_with_per_choice_indexes(client):
    text = client.post("/v1/completions", json={"prompt": "x", "n": 2, "max_tokens": 2, "stream": True,
                       "stream_options": {"include_usage": True}}).get_data(as_text=True)
    events = [json.loads(b[6:]) for b in text.split("\n\n") if b.startswith("data: {")]
    per: dict[int, str] = {}
    finishes = {}
    for e in events[:-1]:
        for ch in e["choices"]:
            per[ch["index"]] = per.get(ch["index"], "") + ch["text"]
            if ch["finish_reason"]:
                finishes[ch["index"]] = ch["finish_reason"]
    assert per == {0: "Hello from ", 1: "Hello Hello "}
    assert finishes == {0: "length", 1: "length"}
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 4
    assert text.endswith("data: [DONE]\n\n") and text.count("[DONE]") == 1
    chat = client.post("/v1/chat/completions", json={**CHAT, "n": 2, "stream": True}).get_data(as_text=True)
    roles = [json.loads(b[6:])["choices"][0]["index"] for b in chat.split("\n\n") if '"role"' in b]
    assert roles == [0, 1]


def test_health_is_503_when_the_engine_is_stuck(client, fake_engine):
    body = client.get("/health").get_json()
    assert body["status"] == "ok" and "engine" in body
    fake_engine.stall = "one engine step has been running for 75 s"
    resp = client.get("/health")
    assert resp.status_code == 503
    assert resp.get_json()["status"] == "stalled" and "75 s" in resp.get_json()["reason"]
    fake_engine.stall = None
    assert client.get("/health").status_code == 200


def test_shutdown_drain_refuses_new_work_with_503(client, fake_engine):
    fake_engine.drain()
    resp = client.post("/v1/chat/completions", json=CHAT)
    assert_openai_error(resp, 503)
    assert resp.get_json()["error"]["code"] == "shutting_down"
