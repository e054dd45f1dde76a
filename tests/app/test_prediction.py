"""Predicted Outputs through the API layer, on the fake engine (the end-to-end file,
tests/e2e/test_predicted_outputs.py, checks what a real model does with them): the prediction
reaches the engine as text, a malformed one is a 400 naming it, and a request whose thought has
a token budget is not speculated (drafting would move where the thought ends)."""

from __future__ import annotations

import pytest

from app.engine.fake import FakeEngine
from tests.support.app import make_client

ASK = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def test_the_prediction_reaches_the_engine_as_text():
    engine = FakeEngine(reply="Hello there.")
    client = make_client(engine)
    r = client.post("/v1/chat/completions", json={
        **ASK, "prediction": {"type": "content", "content": [
            {"type": "text", "text": "Hello "}, {"type": "text", "text": "there."}]}})
    assert r.status_code == 200, r.get_json()
    assert engine.requests[-1].params.speculative.prediction == "Hello there."
    client.post("/v1/chat/completions", json=ASK)
    assert engine.requests[-1].params.speculative.prediction == ""


@pytest.mark.parametrize("prediction", [
    {"type": "content", "content": "x", "extra": 1},
    {"type": "content", "content": [{"type": "text"}]},
    {"type": "content", "content": None},
    [],
])
def test_a_malformed_prediction_is_a_400(prediction):
    client = make_client(FakeEngine(reply="x"))
    r = client.post("/v1/chat/completions", json={**ASK, "prediction": prediction})
    assert r.status_code == 400
    err = r.get_json()["error"]
    assert err["type"] == "invalid_request_error" and "prediction" in str(err)


def test_a_thought_with_a_budget_is_not_speculated():
    engine = FakeEngine(reply="<think>Easy.</think>Hi.")
    client = make_client(engine, reasoning_format="parsed")
    body = {**ASK, "prediction": {"type": "content", "content": "Hi."}}
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    assert engine.requests[-1].params.speculative.n_max is None
    assert client.post("/v1/chat/completions",
                       json={**body, "reasoning_budget": 4}).status_code == 200
    assert engine.requests[-1].params.speculative.n_max == 0
