"""Server-side bounds on generation length (DEFAULT_MAX_TOKENS, MAX_TOKENS_LIMIT), over the fake
engine (fast tier): the default applied to a request that names no limit, whatever its API; a
request over the limit refused with a 400 in its API's own error shape, naming its own field
and the setting; both shown in /props and /v1/models. The fake's reply is ten words, one token
each."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from app import plan_options
from app.core.plan import PlanOptions, bounded
from app.engine.fake import FakeEngine
from app.engine.types import SamplingParams
from app.process import cli
from app.settings import Settings, max_tokens_bounds
from tests.support.app import make_client

MSGS = [{"role": "user", "content": "hi"}]
WORDS = 10  # the fake engine's reply, in tokens


def bounded_client(**settings: Any) -> tuple[FakeEngine, Any]:
    engine = FakeEngine()
    return engine, make_client(engine, **settings)


# ---- settings ----------------------------------------------------------------------------------


def test_settings_default_to_no_bounds():
    s = Settings()
    assert (s.default_max_tokens, s.max_tokens_limit) == (0, 0)
    assert max_tokens_bounds(s) == (None, None)


def test_settings_read_env_and_resolve(monkeypatch):
    monkeypatch.setenv("DEFAULT_MAX_TOKENS", "256")
    monkeypatch.setenv("MAX_TOKENS_LIMIT", "1024")
    assert max_tokens_bounds(Settings()) == (256, 1024)
    # a limit alone bounds a request naming none too
    assert max_tokens_bounds(Settings(default_max_tokens=0, max_tokens_limit=64)) == (64, 64)
    assert max_tokens_bounds(Settings(default_max_tokens=64, max_tokens_limit=0)) == (64, None)


def test_a_default_over_the_limit_is_a_settings_error():
    with pytest.raises(ValidationError, match="DEFAULT_MAX_TOKENS .100. is larger than "
                                              "MAX_TOKENS_LIMIT .50."):
        Settings(default_max_tokens=100, max_tokens_limit=50)
    Settings(default_max_tokens=50, max_tokens_limit=50)  # equal is fine
    with pytest.raises(ValidationError):
        Settings(default_max_tokens=-1)


def test_the_cli_names_the_rule():
    with pytest.raises(SystemExit) as exc:
        cli.load_settings(["--default-max-tokens", "9", "--max-tokens-limit", "8"])
    assert "invalid settings" in str(exc.value) and "MAX_TOKENS_LIMIT (8)" in str(exc.value)


def test_bounded_is_the_one_rule():
    opts = _opts(max_tokens_default=5, max_tokens_limit=7)
    assert bounded(SamplingParams(), opts).max_tokens_default == 5
    assert bounded(SamplingParams(max_tokens=7), opts).max_tokens == 7
    with pytest.raises(Exception, match="max_output_tokens is 8: .* at most 7 .*MAX_TOKENS_LIMIT"):
        bounded(SamplingParams(max_tokens=8, max_tokens_param="max_output_tokens"), opts)
    none = _opts(max_tokens_default=None, max_tokens_limit=0)
    assert bounded(SamplingParams(max_tokens=10**6), none).max_tokens == 10**6
    assert bounded(SamplingParams(), none).max_tokens_default is None


def _opts(**kw: Any) -> PlanOptions:
    return replace(plan_options(Settings()), **kw)


# ---- the default, applied to every API ---------------------------------------------------------


@pytest.mark.parametrize("path, body, usage", [
    ("/v1/chat/completions", {"messages": MSGS}, ("completion_tokens", "finish_reason")),
    ("/v1/completions", {"prompt": "hi"}, ("completion_tokens", "finish_reason")),
    ("/v1/responses", {"input": "hi"}, ("output_tokens", None)),
])
def test_the_default_applies_when_no_limit_is_named(path, body, usage):
    engine, client = bounded_client(default_max_tokens=3)
    resp = client.post(path, json=body)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    out = resp.get_json()
    assert out["usage"][usage[0]] == 3
    assert engine.requests[-1].params.max_tokens is None
    assert engine.requests[-1].params.max_tokens_default == 3
    if usage[1]:
        assert out["choices"][0][usage[1]] == "length"
    else:
        assert out["status"] == "incomplete"
        assert out["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_named_limit_wins_over_the_default():
    engine, client = bounded_client(default_max_tokens=3, max_tokens_limit=8)
    out = client.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 5}).get_json()
    assert out["usage"]["completion_tokens"] == 5
    assert engine.requests[-1].params.max_tokens == 5


def test_n_predict_minus_one_gets_the_default():
    engine, client = bounded_client(default_max_tokens=2)
    out = client.post("/v1/completions", json={"prompt": "hi", "n_predict": -1}).get_json()
    assert out["usage"]["completion_tokens"] == 2


def test_the_limit_alone_bounds_a_request_naming_none():
    engine, client = bounded_client(max_tokens_limit=4)
    out = client.post("/v1/chat/completions", json={"messages": MSGS}).get_json()
    assert out["usage"]["completion_tokens"] == 4 and out["choices"][0]["finish_reason"] == "length"


def test_no_bounds_runs_to_the_end_as_before():
    engine, client = bounded_client()
    out = client.post("/v1/chat/completions", json={"messages": MSGS}).get_json()
    assert out["usage"]["completion_tokens"] == WORDS + 1  # and its end-of-generation token
    assert engine.requests[-1].params.max_tokens_default is None


def test_the_default_applies_to_streams_and_to_each_choice():
    _, client = bounded_client(default_max_tokens=2, parallel=8)
    text = client.post("/v1/chat/completions", json={
        "messages": MSGS, "stream": True, "n": 2, "stream_options": {"include_usage": True},
    }).get_data(as_text=True)
    assert text.count('"finish_reason":"length"') == 2
    assert '"completion_tokens":4' in text  # two choices of two tokens


def test_the_default_applies_to_vertex_instances():
    engine, client = bounded_client(default_max_tokens=2)
    preds = client.post("/predict", json={"instances": [
        {"messages": MSGS}, {"@requestFormat": "completions", "prompt": "hi"},
    ]}).get_json()["predictions"]
    assert [p["usage"]["completion_tokens"] for p in preds] == [2, 2]


# ---- the limit: a 400 in each API's shape ------------------------------------------------------


def _openai_error(resp, param: str, asked: int, limit: int) -> None:
    assert resp.status_code == 400, resp.get_data(as_text=True)
    err = resp.get_json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param and err["code"] == "invalid_value"
    assert err["message"].startswith(f"{param} is {asked}:")
    assert f"at most {limit} tokens" in err["message"] and "MAX_TOKENS_LIMIT" in err["message"]


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {"messages": MSGS, "max_tokens": 9}, "max_tokens"),
    ("/v1/chat/completions", {"messages": MSGS, "max_completion_tokens": 9},
     "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": MSGS, "n_predict": 9}, "n_predict"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 9}, "max_tokens"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 9}, "max_output_tokens"),
])
def test_openai_shaped_apis_refuse_over_the_limit(path, body, param):
    engine, client = bounded_client(max_tokens_limit=8)
    _openai_error(client.post(path, json=body), param, 9, 8)
    assert engine.requests == []  # refused before the engine
    ok = client.post(path, json={**body, param: 8})
    assert ok.status_code == 200, ok.get_data(as_text=True)


def test_anthropic_refuses_over_the_limit_in_its_shape():
    engine, client = bounded_client(max_tokens_limit=8)
    resp = client.post("/v1/messages", json={"messages": MSGS, "max_tokens": 4096})
    assert resp.status_code == 400
    body = resp.get_json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    msg = body["error"]["message"]
    assert msg.startswith("max_tokens is 4096:") and "at most 8 tokens" in msg
    assert "MAX_TOKENS_LIMIT" in msg
    streamed = client.post("/v1/messages", json={"messages": MSGS, "max_tokens": 9, "stream": True})
    assert streamed.status_code == 400 and streamed.get_json()["type"] == "error"
    ok = client.post("/v1/messages", json={"messages": MSGS, "max_tokens": 8}).get_json()
    assert ok["usage"]["output_tokens"] == 8 and ok["stop_reason"] == "max_tokens"


def test_streams_are_refused_before_the_first_byte():
    _, client = bounded_client(max_tokens_limit=8)
    resp = client.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 9,
                                                     "stream": True})
    _openai_error(resp, "max_tokens", 9, 8)
    resp = client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 9,
                                               "stream": True})
    _openai_error(resp, "max_output_tokens", 9, 8)


def test_vertex_instances_are_refused_each_in_its_api_shape():
    _, client = bounded_client(max_tokens_limit=8)
    resp = client.post("/predict", json={"instances": [
        {"messages": MSGS, "max_tokens": 9},
        {"@requestFormat": "messages", "messages": MSGS, "max_tokens": 9},
        {"@requestFormat": "responses", "input": "hi", "max_output_tokens": 9},
        {"messages": MSGS, "max_tokens": 8},
    ]})
    assert resp.status_code == 200
    preds = resp.get_json()["predictions"]
    assert preds[0]["error"]["param"] == "max_tokens" and preds[0]["error"]["code"] == "invalid_value"
    assert preds[1]["type"] == "error" and "MAX_TOKENS_LIMIT" in preds[1]["error"]["message"]
    assert preds[2]["error"]["param"] == "max_output_tokens"
    assert preds[3]["usage"]["completion_tokens"] == 8
    # the envelope's parameters count as the instances' own
    resp = client.post("/predict", json={"instances": [{"messages": MSGS}],
                                         "parameters": {"max_tokens": 100}})
    assert resp.get_json()["predictions"][0]["error"]["param"] == "max_tokens"
    # a raw body answers as the API's own route
    raw = client.post("/predict", json={"messages": MSGS, "max_completion_tokens": 9})
    _openai_error(raw, "max_completion_tokens", 9, 8)


# ---- shown in /props and /v1/models ------------------------------------------------------------


def test_props_and_models_show_both():
    _, client = bounded_client(default_max_tokens=16, max_tokens_limit=64)
    props = client.get("/props").get_json()
    params = props["default_generation_settings"]["params"]
    assert params["n_predict"] == params["max_tokens"] == 16
    assert props["settings"]["default_max_tokens"] == 16
    assert props["settings"]["max_tokens_limit"] == 64
    assert props["meta"]["max_tokens_default"] == 16 and props["meta"]["max_tokens_limit"] == 64
    meta = client.get("/v1/models").get_json()["data"][0]["meta"]
    assert (meta["max_tokens_default"], meta["max_tokens_limit"]) == (16, 64)
    card = client.get("/v1/models/fake-model").get_json()
    assert card["meta"]["max_tokens_limit"] == 64


def test_props_and_models_without_bounds():
    _, client = bounded_client()
    props = client.get("/props").get_json()
    assert props["default_generation_settings"]["params"]["n_predict"] == -1
    assert (props["settings"]["default_max_tokens"], props["settings"]["max_tokens_limit"]) == (0, 0)
    meta = client.get("/v1/models").get_json()["data"][0]["meta"]
    assert meta["max_tokens_default"] is None and meta["max_tokens_limit"] is None
