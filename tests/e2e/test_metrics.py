"""End to end: GET /metrics of a real server on the real default model, after real traffic
through the openai SDK (streaming and not, an embeddings request, a 4xx, a client that hangs
up), parsed with prometheus-client's parser: histogram counts equal the requests sent, token
counters equal the usage the answers reported."""

from __future__ import annotations

import time

import openai
import pytest
import requests

from tests.support.metrics import scrape, value
from tests.support.server import ServerProcess, running_server

MESSAGES = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def server(default_model) -> ServerProcess:
    with running_server({"EMBEDDINGS": "on", "EMBEDDING_CTX": "256", "PARALLEL": "2"}) as srv:
        yield srv


def test_metrics_after_real_traffic(server):
    client = openai.OpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0, timeout=120)
    before = scrape(server)
    assert value(before, "vertex_gguf_model_load_state", stage="ready") == 1
    assert value(before, "vertex_gguf_model_load_seconds") > 0
    assert value(before, "vertex_gguf_slots_total") == 2
    assert value(before, "vertex_gguf_kv_cache_total_cells") > 0
    prompt = completion = 0
    for _ in range(2):
        r = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=12)
        prompt += r.usage.prompt_tokens
        completion += r.usage.completion_tokens
    for _ in range(2):
        stream = client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=12, stream=True,
            stream_options={"include_usage": True})
        usage = [c.usage for c in stream if c.usage is not None][-1]
        prompt += usage.prompt_tokens
        completion += usage.completion_tokens
    c = client.completions.create(model="m", prompt="Once upon a time", max_tokens=8)
    emb = client.embeddings.create(model="m", input=["hello world", "a second text"])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=[], max_tokens=4)

    deadline = time.monotonic() + 10  # the last stream is counted when its generator closes
    while True:
        m = scrape(server)
        if value(m, "vertex_gguf_requests_total", api="chat", status="200") >= 4:
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert value(m, "vertex_gguf_requests_total", api="chat", status="200") == 4
    assert value(m, "vertex_gguf_requests_total", api="chat", status="400") == 1
    assert value(m, "vertex_gguf_e2e_request_latency_seconds_count", api="chat") == 5
    assert value(m, "vertex_gguf_time_to_first_token_seconds_count", api="chat") == 4
    assert value(m, "vertex_gguf_request_queue_time_seconds_count", api="chat") == 4
    assert value(m, "vertex_gguf_prompt_tokens_total", api="chat") == prompt
    assert value(m, "vertex_gguf_generation_tokens_total", api="chat") == completion
    assert value(m, "vertex_gguf_inter_token_latency_seconds_count", api="chat") > 0
    assert value(m, "vertex_gguf_time_to_first_token_seconds_sum", api="chat") > 0
    assert value(m, "vertex_gguf_requests_total", api="completions", status="200") == 1
    assert value(m, "vertex_gguf_prompt_tokens_total", api="completions") == c.usage.prompt_tokens
    assert value(m, "vertex_gguf_generation_tokens_total",
                 api="completions") == c.usage.completion_tokens
    assert value(m, "vertex_gguf_requests_total", api="embeddings", status="200") == 1
    assert value(m, "vertex_gguf_e2e_request_latency_seconds_count", api="embeddings") == 1
    assert value(m, "vertex_gguf_prompt_tokens_total", api="embeddings") == emb.usage.prompt_tokens
    assert value(m, "vertex_gguf_embedding_requests_waiting") == 0
    assert value(m, "vertex_gguf_num_requests_running") == 0
    assert value(m, "vertex_gguf_kv_cache_used_cells") > 0  # idle slots keep their prefixes


def test_a_client_that_hangs_up_mid_stream_is_counted(server):
    before = scrape(server)
    body = {"messages": [{"role": "user", "content": "Write a long story."}],
            "max_tokens": 400, "ignore_eos": True, "stream": True}  # runs for seconds
    with requests.post(server.url("/v1/chat/completions"), json=body, stream=True,
                       timeout=60) as resp:
        lines = resp.iter_lines()
        for line in lines:
            if line.startswith(b"data: ") and b'"content"' in line:
                break
    # the connection is closed: the server notices at its next write and cancels
    deadline = time.monotonic() + 15
    while True:
        m = scrape(server)
        gone = (value(m, "vertex_gguf_client_disconnects_total", api="chat")
                - value(before, "vertex_gguf_client_disconnects_total", api="chat"))
        if gone >= 1:
            break
        assert time.monotonic() < deadline, "the disconnect was not counted"
        time.sleep(0.1)
    assert gone == 1
    assert (value(m, "vertex_gguf_request_finished_total", api="chat", finish_reason="abort")
            - value(before, "vertex_gguf_request_finished_total", api="chat",
                    finish_reason="abort")) == 1
