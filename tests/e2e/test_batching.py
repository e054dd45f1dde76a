"""Continuous batching end to end: many sequences in one batch give what each gives alone,
prefix reuse, chunked prefill keeping running streams fluent, envelopes through the batch."""

from __future__ import annotations

import concurrent.futures as cf
import json
import time

import pytest
import requests

from tests.support.server import ServerProcess, running_server, wait_for

# Different prompts, lengths and sampling settings (penalties, stops, seeds), all at temperature
# 0: llama.cpp's logits for one sequence can differ in the last bits with the batch's shape
# (other sequences, prompt chunks), which a temperature above 0 turns into different samples.
REQUESTS = [
    {"prompt": "The capital of France is", "max_tokens": 24, "temperature": 0},
    {"prompt": "List three fruits:", "max_tokens": 24, "temperature": 0, "stop": ["\n\n"]},
    {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "seed": 7},
    {"prompt": "def fibonacci(n):", "max_tokens": 24, "temperature": 0},
    {"prompt": "The weather today is", "max_tokens": 20, "temperature": 0, "top_p": 0.9, "seed": 42},
    {"prompt": "Water boils at", "max_tokens": 16, "temperature": 0, "frequency_penalty": 1.0},
    {"prompt": "A haiku about the sea:", "max_tokens": 24, "temperature": 0, "presence_penalty": 0.5},
    {"prompt": "1, 2, 3, 4,", "max_tokens": 24, "temperature": 0, "repeat_penalty": 1.3},
]


@pytest.fixture(scope="module")
def server8(default_model) -> ServerProcess:
    with running_server({"PARALLEL": "8", "STREAM_HEARTBEAT_SECONDS": "0"}) as srv:
        yield srv


def stream_text(srv: ServerProcess, body: dict) -> tuple[str, dict]:
    # cache_prompt false: a reused prefix computes the prompt's last token in another batch shape,
    # which can change logits in the last bits (as in llama-server); this test compares batching
    text, usage = "", {}
    with requests.post(srv.url("/v1/completions"), json={**body, "stream": True, "cache_prompt": False,
                       "stream_options": {"include_usage": True}}, stream=True, timeout=300) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                obj = json.loads(line[6:])
                if obj["choices"]:
                    text += obj["choices"][0]["text"]
                if obj.get("usage"):
                    usage = obj["usage"]
    return text, usage


def test_eight_concurrent_streams_equal_each_alone(server8):
    alone = [stream_text(server8, body) for body in REQUESTS]
    with cf.ThreadPoolExecutor(len(REQUESTS)) as pool:
        together = list(pool.map(lambda b: stream_text(server8, b), REQUESTS))
    for body, (a_text, a_use), (t_text, t_use) in zip(REQUESTS, alone, together, strict=True):
        assert t_text == a_text, body
        assert t_use["completion_tokens"] == a_use["completion_tokens"]
        assert t_use["prompt_tokens"] == a_use["prompt_tokens"]


def test_prefix_reuse_reports_cached_tokens_and_changes_nothing(server8):
    system = "You are a terse assistant. Answer in one short sentence. " * 8
    first = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "Name a color."}],
             "max_tokens": 12, "temperature": 0}
    r1 = requests.post(server8.url("/v1/chat/completions"), json=first, timeout=120).json()
    r2 = requests.post(server8.url("/v1/chat/completions"), json=first, timeout=120).json()
    assert r2["choices"][0]["message"]["content"]
    assert r2["usage"]["prompt_tokens"] == r1["usage"]["prompt_tokens"]
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == r2["usage"]["prompt_tokens"] - 1
    r_off = requests.post(server8.url("/v1/chat/completions"), json={**first, "cache_prompt": False}, timeout=120).json()
    assert r_off["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    follow = {**first, "messages": first["messages"][:1] + [{"role": "user", "content": "Name an animal."}]}
    r3 = requests.post(server8.url("/v1/chat/completions"), json=follow, timeout=120).json()
    shared = r3["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert shared >= 80, r3["usage"]  # the long system prompt came from the cache
    assert shared < r3["usage"]["prompt_tokens"]


def test_chunked_prefill_keeps_running_streams_fluent(server_factory):
    srv = server_factory({"PARALLEL": "2", "PREFILL_CHUNK": "64", "STREAM_HEARTBEAT_SECONDS": "0"})
    srv.wait_ready()
    arrivals: list[float] = []

    def running_stream() -> None:
        body = {"prompt": "Count from 1 to 1000:", "max_tokens": 400, "temperature": 0, "stream": True,
                "ignore_eos": True}
        with requests.post(srv.url("/v1/completions"), json=body, stream=True, timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith(b"data: {"):
                    arrivals.append(time.perf_counter())

    with cf.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(running_stream)
        wait_for(lambda: len(arrivals) >= 20 or fut.done(), 120, "20 tokens")
        assert len(arrivals) >= 20 and not fut.done(), fut.result() if fut.done() else arrivals
        long_prompt = "The quick brown fox jumps over the lazy dog. " * 180  # ~1800 tokens
        t0 = time.perf_counter()
        r = requests.post(srv.url("/v1/completions"), json={"prompt": long_prompt, "max_tokens": 1}, timeout=300)
        t1 = time.perf_counter()
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] > 1500
        fut.result(300)
    # structural, not timed: ~1800 prompt tokens in chunks of 64 are ~28 engine steps, and the
    # running stream gets a token in (nearly) every one of them, not one token after all of them
    during = [a for a in arrivals if t0 <= a <= t1]
    assert len(during) >= 20, f"the running stream got {len(during)} tokens during a ~28-step prefill"


def widths(srv: ServerProcess) -> dict[int, int]:
    """Engine steps so far, by how many sequences each sampled (from /health)."""
    body = requests.get(srv.url("/health"), timeout=10).json()
    return {int(k): v for k, v in body["engine"]["batch_widths"].items()}


def test_envelope_instances_run_through_the_batch(server8):
    """Structural, not timed: the engine reports how many sequences shared each step."""
    instances = [{**b, "max_tokens": 48, "stop": None, "ignore_eos": True} for b in REQUESTS]
    before = widths(server8)
    r = requests.post(server8.url("/predict"), json={"instances": instances}, timeout=300)
    preds = r.json()["predictions"]
    assert all(p["object"] == "text_completion" and p["choices"][0]["text"] for p in preds), preds
    after = widths(server8)
    ran = {w: after.get(w, 0) - before.get(w, 0) for w in after}
    # SLOTS_PER_REQUEST (half of PARALLEL=8): at most 4 instances in the engine at once, and
    # they did share steps: 8 x 48 tokens in ~2 x 48 steps of 4, not 8 x 48 steps of 1
    assert max(w for w, n in ran.items() if n) == 4, ran
    assert ran.get(4, 0) >= 80, ran
    assert sum(ran.values()) < 8 * 48 / 2, ran


def test_n_choices_share_the_prompt_kv(server8):
    import openai

    sdk = openai.OpenAI(base_url=server8.url("/v1"), api_key="x", max_retries=0)
    base = {"model": "m", "prompt": "The capital of France is", "max_tokens": 12, "extra_body": {"cache_prompt": False}}
    one = sdk.completions.create(**base, temperature=0)
    two = sdk.completions.create(**base, temperature=0, n=2)
    assert [c.index for c in two.choices] == [0, 1]
    assert [c.text for c in two.choices] == [one.choices[0].text] * 2  # greedy: same as alone
    assert two.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt counted once
    assert two.usage.completion_tokens == 2 * one.usage.completion_tokens
    sampled = sdk.completions.create(**{**base, "max_tokens": 24}, temperature=1.0, seed=11, n=3)
    assert len({c.text for c in sampled.choices}) > 1, "choices are sampled independently"
    stream = sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], n=3,
                                         max_tokens=10, temperature=1.0, seed=5, stream=True)
    texts = {0: "", 1: "", 2: ""}
    roles = []
    finishes = {}
    for chunk in stream:
        for ch in chunk.choices:
            if ch.delta.role:
                roles.append(ch.index)
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    assert sorted(roles) == [0, 1, 2] and set(finishes) == {0, 1, 2}
    assert all(texts.values())
    r = requests.post(server8.url("/v1/completions"), json={"prompt": "x", "n": 9}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


def test_a_prefill_chunk_larger_than_the_context_starts_and_serves(server_factory):
    """PREFILL_CHUNK is a step's prompt budget across all slots, so it may exceed one slot's
    context; the warm-up once built a prompt that long and failed the load."""
    srv = server_factory({"PARALLEL": "4", "CTX_SIZE": "256", "PREFILL_CHUNK": "1024"})
    srv.wait_ready()
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    r = requests.post(srv.url("/v1/chat/completions"), json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1


def test_a_shared_prefix_is_copied_to_a_free_slot_and_the_conversation_kept(server_factory):
    """Two slots. A second conversation with the first one's system prompt goes to the empty
    slot with that prefix copied across KV streams (llama_memory_seq_cp), so the first
    conversation's KV stays whole for its next turn; the copied prefix gives the reply a
    fresh decode gives."""
    srv = server_factory({"PARALLEL": "3", "STREAM_HEARTBEAT_SECONDS": "0"})  # one holds the
    srv.wait_ready()                                                           # template's opening
    system = {"role": "system", "content": "You are a terse assistant. Answer in one short sentence. " * 8}

    def chat(messages: list[dict], **extra) -> dict:
        body = {"messages": messages, "max_tokens": 12, "temperature": 0, **extra}
        r = requests.post(srv.url("/v1/chat/completions"), json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    turn = [system, {"role": "user", "content": "Name a color."}]
    first = chat(turn)
    other = [system, {"role": "user", "content": "Name an animal."}]
    copied = chat(other)
    assert copied["usage"]["prompt_tokens_details"]["cached_tokens"] >= 80  # the system prompt
    fresh = chat(other, cache_prompt=False)
    assert copied["choices"][0]["message"]["content"] == fresh["choices"][0]["message"]["content"]
    # the first conversation's next turn finds all of its first turn still cached
    nxt = chat([*turn, first["choices"][0]["message"], {"role": "user", "content": "Another?"}])
    assert nxt["usage"]["prompt_tokens_details"]["cached_tokens"] > first["usage"]["prompt_tokens"]


def test_a_stopped_stream_leaves_its_prompt_cached(server_factory):
    """A client that stops a reply (closes the stream) and asks again finds its prompt still
    in the KV cache: the cancelled request's slot keeps what it had decoded."""
    srv = server_factory({"PARALLEL": "2", "STREAM_HEARTBEAT_SECONDS": "0"})
    srv.wait_ready()
    messages = [{"role": "system", "content": "You are a storyteller. " * 10},
                {"role": "user", "content": "Tell me a very long story about the sea."}]
    body = {"messages": messages, "max_tokens": 400, "ignore_eos": True, "stream": True}
    with requests.post(srv.url("/v1/chat/completions"), json=body, stream=True, timeout=120) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith(b"data: {")
            if seen >= 5:
                break  # the client stops the reply: the connection closes here

    def idle() -> bool:
        return requests.get(srv.url("/health"), timeout=10).json()["engine"]["running"] == 0

    wait_for(idle, 60, "the stopped request to leave its slot")
    again = requests.post(srv.url("/v1/chat/completions"), json={"messages": messages, "max_tokens": 4},
                          timeout=120).json()
    usage = again["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1


def test_the_first_chat_after_ready_finds_the_templates_opening_cached(server_factory):
    """The engine decodes the text every chat starts with at load (the default model's system
    prompt and user header), so the first request reuses it as later ones do."""
    srv = server_factory({"PARALLEL": "2", "STREAM_HEARTBEAT_SECONDS": "0"})
    srv.wait_ready()
    body = {"messages": [{"role": "user", "content": "Name a color."}], "max_tokens": 4}
    first = requests.post(srv.url("/v1/chat/completions"), json=body, timeout=120).json()
    cached = first["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 20 <= cached < first["usage"]["prompt_tokens"]
    # the text completions route has no template: nothing of it is cached
    plain = requests.post(srv.url("/v1/completions"), json={"prompt": "Water boils at", "max_tokens": 4},
                          timeout=120).json()
    assert plain["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
