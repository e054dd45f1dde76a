"""End to end: speculative decoding on real servers. The same requests go to a server without
speculation, one drafting by n-gram lookup (SPEC_NGRAM) and one with a draft model (the suite's
model cut to its first layers, tests/support/draft_model.py), and the replies must be the same
bytes: greedy and seeded sampling, on Chat Completions, Completions, Anthropic Messages and a
stream, through a JSON-schema grammar, with stop strings, logprobs and n > 1, alone and side
by side. The draft counts come back in llama-server's ``timings`` and in /metrics."""

from __future__ import annotations

import concurrent.futures as cf
import json

import anthropic
import pytest
import requests
from gguf import GGMLQuantizationType

from tests.support.bodies import CODE
from tests.support.gguf_requant import requantize
from tests.support.server import ServerProcess, running_server

BASE = {"PARALLEL": "4", "SLOTS_PER_REQUEST": "2", "CTX_SIZE": "2048"}
COPY = f"Here is some code:\n\n```python\n{CODE}```\n\nThe same code again:\n\n```python\n"
ASKS = [
    [{"role": "user", "content": f"Repeat this code exactly:\n\n{CODE}"}],
    [{"role": "user", "content": "Write a short story about a cat."}],
]


@pytest.fixture(scope="module")
def draft(default_model, tmp_path_factory):
    """The model's first 8 of 30 layers, its quantized tensors copied as they are."""
    return requantize(default_model, tmp_path_factory.mktemp("draft") / "draft.gguf",
                      GGMLQuantizationType.Q4_1, layers=8)


@pytest.fixture(scope="module")
def servers(draft):
    # SPEC_ADAPTIVE off: every step drafts, so every test checks speculated output (on this
    # CPU the gate would mostly, and rightly, turn drafting off)
    spec = {**BASE, "SPEC_ADAPTIVE": "false"}
    with (running_server(BASE) as plain,
          running_server({**spec, "SPEC_NGRAM": "1"}) as ngram,
          running_server({**spec, "DRAFT_MODEL": str(draft), "SPEC_P_MIN": "0"}) as model):
        yield {"plain": plain, "ngram": ngram, "draft": model}


def chat(srv: ServerProcess, messages, **kw) -> dict:
    r = requests.post(srv.url("/v1/chat/completions"), timeout=120,
                      json={"messages": messages, "temperature": 0, "max_tokens": 96, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def each(servers, fn):
    """``fn`` on every server: the plain one's result, and the speculating ones'."""
    got = {name: fn(srv) for name, srv in servers.items()}
    return got.pop("plain"), got


@pytest.mark.parametrize("messages", ASKS, ids=["copy", "story"])
def test_greedy_chat_is_the_same_bytes(servers, messages):
    plain, spec = each(servers, lambda s: chat(s, messages))
    for name, body in spec.items():
        assert body["choices"][0]["message"] == plain["choices"][0]["message"], name
        assert body["usage"]["completion_tokens"] == plain["usage"]["completion_tokens"]
        t = body["timings"]
        assert t["draft_n"] >= t["draft_n_accepted"] >= 0
        assert t["predicted_n"] == body["usage"]["completion_tokens"]
    assert "timings" not in plain  # nothing speculated, nothing to say


def test_drafts_are_checked_and_kept_on_a_copy(servers):
    """A reply that copies its prompt: both drafters propose, and the model keeps some."""
    for name in ("ngram", "draft"):
        r = requests.post(servers[name].url("/v1/completions"), timeout=120,
                          json={"prompt": COPY, "temperature": 0, "max_tokens": 64})
        t = r.json()["timings"]
        assert t["draft_n"] > 0 and t["draft_n_accepted"] > 0, (name, t)


def test_seeded_sampling_stop_strings_and_logprobs_are_the_same(servers):
    kw = {"temperature": 0.9, "seed": 7, "stop": ["\n\n"], "logprobs": True, "top_logprobs": 2}
    plain, spec = each(servers, lambda s: chat(s, ASKS[0], **kw))
    for body in spec.values():
        got, want = body["choices"][0], plain["choices"][0]
        assert got["message"] == want["message"]
        assert got["finish_reason"] == want["finish_reason"]
        toks = [(c["token"], [t["token"] for t in c["top_logprobs"]])
                for c in got["logprobs"]["content"]]
        assert toks == [(c["token"], [t["token"] for t in c["top_logprobs"]])
                        for c in want["logprobs"]["content"]]
        for a, b in zip(got["logprobs"]["content"], want["logprobs"]["content"], strict=True):
            assert a["logprob"] == pytest.approx(b["logprob"], abs=0.05)


def test_a_grammar_and_n_choices_are_the_same(servers):
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"]}
    kw = {"n": 2, "temperature": 0.7, "seed": 3,
          "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}}
    msgs = [{"role": "user", "content": "Give a person as JSON."}]
    plain, spec = each(servers, lambda s: chat(s, msgs, **kw))
    for body in spec.values():
        assert [c["message"]["content"] for c in body["choices"]] == \
               [c["message"]["content"] for c in plain["choices"]]
        for c in body["choices"]:
            json.loads(c["message"]["content"])


def test_a_stream_and_the_anthropic_api_are_the_same(servers):
    def streamed(srv):
        text = []
        with requests.post(srv.url("/v1/chat/completions"), stream=True, timeout=120, json={
                "messages": ASKS[0], "temperature": 0, "max_tokens": 80, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith(b"data: {"):
                    obj = json.loads(line[6:])
                    for c in obj["choices"]:
                        text.append(c["delta"].get("content") or "")
                    if "timings" in obj:
                        text.append(f"<timings {sorted(obj['timings'])}>")
        return "".join(text)

    plain, spec = each(servers, streamed)
    for text in spec.values():
        assert text.split("<timings")[0] == plain
        assert text.endswith("<timings ['draft_n', 'draft_n_accepted', 'predicted_n', "
                             "'prompt_n']>")

    def messages(srv):
        client = anthropic.Anthropic(base_url=srv.base, api_key="x", max_retries=0)
        return client.messages.create(model="m", max_tokens=80, messages=ASKS[0],
                                      extra_body={"temperature": 0}).content[0].text

    plain, spec = each(servers, messages)
    assert all(text == plain for text in spec.values())


def test_responses_gemini_and_ollama_are_the_same(servers):
    prompt = ASKS[0][0]["content"]

    def responses(srv):
        r = requests.post(srv.url("/v1/responses"), timeout=120, json={
            "input": prompt, "temperature": 0, "max_output_tokens": 64})
        assert r.status_code == 200, r.text
        return r.json()["output"][-1]["content"][0]["text"]

    def gemini(srv):
        r = requests.post(srv.url("/v1beta/models/m:generateContent"), timeout=120, json={
            "contents": [{"role": "user", "parts": [{"text": prompt}]}],
            "generationConfig": {"temperature": 0, "maxOutputTokens": 64}})
        assert r.status_code == 200, r.text
        return r.json()["candidates"][0]["content"]["parts"][0]["text"]

    def ollama(srv):
        r = requests.post(srv.url("/api/chat"), timeout=120, json={
            "model": "m", "messages": ASKS[0], "stream": False,
            "options": {"temperature": 0, "num_predict": 64}})
        assert r.status_code == 200, r.text
        return r.json()["message"]["content"]

    for fn in (responses, gemini, ollama):
        plain, spec = each(servers, fn)
        assert plain and all(text == plain for text in spec.values()), fn.__name__


def test_side_by_side_each_reply_is_its_own(servers):
    """Three requests at once in one speculating batch: each as it is alone."""
    asks = [ASKS[1], [{"role": "user", "content": "Count from one to twenty."}],
            [{"role": "user", "content": "What is the capital of France?"}]]
    # cache_prompt false, as in test_batching: a reused prefix decodes the prompt's last token
    # in another batch shape, which can move logits in the last bits. (Not the copy prompt: its
    # first token is a near tie, which prompts read in other chunks beside it can flip.)
    fresh = {"cache_prompt": False}
    alone = [chat(servers["plain"], m, **fresh)["choices"][0]["message"]["content"]
             for m in asks]
    for name in ("ngram", "draft"):
        with cf.ThreadPoolExecutor(3) as pool:
            got = list(pool.map(lambda m, srv=servers[name]: chat(srv, m, **fresh), asks))
        assert [g["choices"][0]["message"]["content"] for g in got] == alone, name


def test_a_draft_sync_larger_than_a_batch(servers, draft):
    """The draft model catches up with each sequence's tokens in batches: with a 20-token
    batch, every prompt overflows one, and two at once overflow it together. Each reply is still
    what the plain server gives."""
    small = {**BASE, "SPEC_ADAPTIVE": "false", "DRAFT_MODEL": str(draft), "SPEC_P_MIN": "0",
             "BATCH_SIZE": "8", "PREFILL_CHUNK": "16"}
    asks = [ASKS[1], [{"role": "user", "content": "Count from one to twenty."}]]
    fresh = {"cache_prompt": False}
    with running_server(small) as srv:
        alone = [text_of(chat(srv, m, **fresh)) for m in asks]
        with cf.ThreadPoolExecutor(2) as pool:
            together = [text_of(b) for b in pool.map(lambda m: chat(srv, m, **fresh), asks)]
        drafted = requests.get(srv.url("/health"), timeout=30).json()["engine"]["draft_tokens"]
    assert alone == together == [text_of(chat(servers["plain"], m, **fresh)) for m in asks]
    assert drafted > 0


def test_a_request_may_turn_it_off_or_narrow_it(servers):
    srv = servers["ngram"]
    off = chat(srv, ASKS[0], **{"speculative.n_max": 0})
    assert off["timings"]["draft_n"] == 0
    one = chat(srv, ASKS[0], **{"speculative.n_max": 1})
    assert one["timings"]["draft_n"] <= one["usage"]["completion_tokens"]
    assert one["choices"][0]["message"] == off["choices"][0]["message"]
    for bad in ({"speculative.n_max": -1}, {"speculative.n_max": "4"},
                {"speculative.p_min": 2}):
        r = requests.post(srv.url("/v1/chat/completions"), timeout=30,
                          json={"messages": ASKS[0], **bad})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_the_adaptive_gate_measures_both_choices_and_keeps_the_bytes(servers):
    """SPEC_ADAPTIVE (the default): the engine times generation steps with drafting and
    without, per batch width, and /health shows both rates; the reply is unchanged."""
    asks = [ASKS[1], [{"role": "user", "content": "Count from one to twenty."}]]
    with running_server({**BASE, "SPEC_NGRAM": "1"}) as gated:
        for messages in asks:  # afresh on both: the plain server's cache has another history
            assert (text_of(chat(gated, messages, cache_prompt=False))
                    == text_of(chat(servers["plain"], messages, cache_prompt=False)))
        rates = requests.get(gated.url("/health"), timeout=30).json()["engine"]["spec_rates"]
    assert rates.get("1:on", 0) > 0 and rates.get("1:off", 0) > 0, rates


def text_of(body: dict) -> str:
    return body["choices"][0]["message"]["content"]


def test_metrics_count_drafted_and_accepted_tokens(servers):
    text = requests.get(servers["draft"].url("/metrics"), timeout=30).text
    drafted = accepted = None
    for line in text.splitlines():
        if line.startswith("vertex_gguf_spec_draft_tokens_total "):
            drafted = float(line.split()[1])
        if line.startswith("vertex_gguf_spec_draft_tokens_accepted_total "):
            accepted = float(line.split()[1])
    assert drafted and accepted is not None and 0 < accepted <= drafted
    assert "vertex_gguf_spec_draft_tokens" not in requests.get(
        servers["plain"].url("/metrics"), timeout=30).text


def test_a_draft_with_another_vocabulary_stops_the_start(server_factory, tmp_path):
    from tests.support.tiny_bert import build_tiny_bert

    other = build_tiny_bert(tmp_path / "bert.gguf")
    srv = server_factory({**BASE, "DRAFT_MODEL": str(other)})
    assert srv.exit_code() != 0
    assert "a draft must share the model's vocabulary" in srv.logs()
    srv = server_factory({**BASE, "DRAFT_MODEL": str(tmp_path / "missing.gguf")})
    assert srv.exit_code() != 0
    assert "DRAFT_MODEL" in srv.logs() and "file not found" in srv.logs()
