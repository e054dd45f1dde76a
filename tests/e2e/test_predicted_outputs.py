"""End to end: OpenAI's Predicted Outputs on a real server that does not speculate on its own
(no SPEC_NGRAM, no DRAFT_MODEL). A prediction must change how fast a reply comes, never what
it says: every reply here is compared byte for byte with the same request without one, greedy
and seeded, with logprobs, with n > 1 and streamed, for a prediction that is the reply itself,
one with an edit in the middle, and one that has nothing to do with it. How much of the
prediction was kept comes back in ``usage.completion_tokens_details`` as OpenAI reports it."""

from __future__ import annotations

import json

import openai
import pytest
import requests

from tests.support.bodies import CODE
from tests.support.server import ServerProcess, running_server

ASK = [{"role": "user", "content": f"Repeat this code exactly:\n\n{CODE}"}]
# cache_prompt off: each reply decodes its prompt afresh, as its twin without a prediction did
SAME = {"temperature": 0, "max_tokens": 96, "cache_prompt": False}


BASE = {"PARALLEL": "4", "SLOTS_PER_REQUEST": "2", "CTX_SIZE": "2048"}


@pytest.fixture(scope="module")
def srv():
    # SPEC_ADAPTIVE off: every step drafts, so every test checks drafted output (on this CPU
    # the gate may rightly turn drafting off); the gate's own test is the last one
    with running_server({**BASE, "SPEC_ADAPTIVE": "false"}) as s:
        yield s


def chat(srv: ServerProcess, **kw) -> dict:
    r = requests.post(srv.url("/v1/chat/completions"), timeout=120,
                      json={"messages": ASK, **SAME, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def predicted(text: str) -> dict:
    return {"prediction": {"type": "content", "content": text}}


@pytest.fixture(scope="module")
def plain(srv):
    body = chat(srv)
    assert "completion_tokens_details" not in body["usage"]
    assert "timings" not in body  # the server drafts nothing on its own
    return body


def reply(body: dict, i: int = 0) -> str:
    return body["choices"][i]["message"]["content"]


def test_the_reply_itself_as_prediction_is_kept_and_changes_nothing(srv, plain):
    body = chat(srv, **predicted(reply(plain)))
    assert body["choices"][0]["message"] == plain["choices"][0]["message"]
    assert body["usage"]["completion_tokens"] == plain["usage"]["completion_tokens"]
    details = body["usage"]["completion_tokens_details"]
    # the reply is the prediction: nearly all of it is accepted (a token the reply splits
    # otherwise than the prediction's text alone would be the rest)
    n = body["usage"]["completion_tokens"]
    assert details["accepted_prediction_tokens"] >= n - 3
    assert details["rejected_prediction_tokens"] <= 3
    t = body["timings"]  # most of it came as drafts the model kept (the first never can)
    assert n > t["draft_n_accepted"] > n // 2
    assert t["draft_n"] >= t["draft_n_accepted"]


def test_an_edited_prediction_is_found_again_after_the_edit(srv, plain):
    """The prediction has a line the reply does not: the drafts stop matching there, and the
    place is found again after it, so tokens past the edit are accepted too."""
    text = reply(plain)
    lines = text.split("\n")
    assert len(lines) >= 4, text
    mid = len(lines) // 2
    before = "\n".join(lines[:mid]) + "\n"
    edited = before + "value = compute(1, 2)  # a line the reply does not have\n" + text[len(before):]
    body = chat(srv, **predicted(edited))
    assert reply(body) == text
    details = body["usage"]["completion_tokens_details"]
    assert details["rejected_prediction_tokens"] > 0
    # more accepted than the part before the edit could give: the reply's tokens after it
    n_before = len(requests.post(srv.url("/tokenize"), json={"content": before},
                                 timeout=30).json()["tokens"])
    assert details["accepted_prediction_tokens"] > n_before + 2
    assert body["timings"]["draft_n_accepted"] > 0


def test_an_unrelated_prediction_changes_nothing(srv, plain):
    body = chat(srv, **predicted("The quick brown fox jumps over the lazy dog. " * 20))
    assert body["choices"][0]["message"] == plain["choices"][0]["message"]
    details = body["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] + details["rejected_prediction_tokens"] > 0


def test_seeded_sampling_logprobs_stop_and_n_are_the_same(srv):
    kw = {"temperature": 0.9, "seed": 11, "stop": ["def mul"], "logprobs": True,
          "top_logprobs": 2, "n": 2}
    want = chat(srv, **kw)
    got = chat(srv, **kw, **predicted(CODE))
    for i in range(2):
        a, b = got["choices"][i], want["choices"][i]
        assert a["message"] == b["message"] and a["finish_reason"] == b["finish_reason"]
        assert ([c["token"] for c in a["logprobs"]["content"]]
                == [c["token"] for c in b["logprobs"]["content"]])
    assert got["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0


def test_a_stream_through_the_openai_sdk_reports_it_in_usage(srv, plain):
    client = openai.OpenAI(base_url=srv.url("/v1"), api_key="none", max_retries=0)
    stream = client.chat.completions.create(
        model="m", messages=ASK, temperature=0, max_tokens=96, stream=True,
        stream_options={"include_usage": True}, prediction={"type": "content",
                                                            "content": reply(plain)},
        extra_body={"cache_prompt": False})
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage
    assert text == reply(plain)
    assert usage is not None and usage.completion_tokens_details.accepted_prediction_tokens > 0


def test_the_sdk_reads_the_usage_details_and_content_parts_work(srv, plain):
    client = openai.OpenAI(base_url=srv.url("/v1"), api_key="none", max_retries=0)
    text = reply(plain)
    half = len(text) // 2
    out = client.chat.completions.create(
        model="m", messages=ASK, temperature=0, max_tokens=96,
        prediction={"type": "content", "content": [{"type": "text", "text": text[:half]},
                                                   {"type": "text", "text": text[half:]}]},
        extra_body={"cache_prompt": False})
    assert out.choices[0].message.content == text
    assert out.usage.completion_tokens_details.accepted_prediction_tokens > 0


@pytest.mark.parametrize("prediction", [
    {"type": "text", "content": "x"},
    {"type": "content"},
    {"type": "content", "content": 7},
    {"type": "content", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
    "just text",
])
def test_a_malformed_prediction_is_a_400_naming_it(srv, prediction):
    r = requests.post(srv.url("/v1/chat/completions"), timeout=30,
                      json={"messages": ASK, "prediction": prediction, "max_tokens": 4})
    assert r.status_code == 400, r.text
    assert "prediction" in json.dumps(r.json()["error"])


def test_a_prediction_too_large_for_the_context_is_a_400(srv):
    r = requests.post(srv.url("/v1/chat/completions"), timeout=30,
                      json={"messages": ASK, "max_tokens": 4, **predicted("word " * 100_000)})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "prediction"


def test_completions_do_not_take_a_prediction(srv):
    r = requests.post(srv.url("/v1/completions"), timeout=30,
                      json={"prompt": "x", "max_tokens": 4, **predicted("y")})
    assert r.status_code == 400, r.text
    assert "prediction" in r.json()["error"]["message"]


def test_metrics_count_a_predictions_drafts(srv, plain):
    chat(srv, **predicted(reply(plain)))
    metrics = requests.get(srv.url("/metrics"), timeout=30).text
    accepted = [ln for ln in metrics.splitlines()
                if ln.startswith("vertex_gguf_spec_draft_tokens_accepted_total")]
    assert accepted and float(accepted[0].split()[-1]) > 0


def test_the_gate_measures_predictions_apart_and_keeps_the_bytes(plain):
    """With SPEC_ADAPTIVE on (the default), steps where a prediction drafts are measured with
    and without drafting, apart from the server's own rates, and the reply stays the same."""
    with running_server(BASE) as gated:
        for _ in range(3):
            body = chat(gated, **predicted(reply(plain)))
            assert body["choices"][0]["message"] == plain["choices"][0]["message"]
        engine = requests.get(gated.url("/health"), timeout=30).json()["engine"]
    rates = engine["prediction_rates"]
    assert any(k.endswith(":on") for k in rates) and any(k.endswith(":off") for k in rates)
    assert "spec_rates" not in engine  # the server drafts nothing on its own

