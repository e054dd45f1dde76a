"""Streaming end to end: real server, real model, real clients (openai, LangChain, pydantic-ai,
guidellm), every profile through the client-rule checkers, disconnects and timeouts."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import openai
import pytest
import requests

from tests.support.metrics import scrape, value
from tests.support.server import ROOT, ServerProcess, running, running_server, wait_for
from tests.support.stream_rules import outcomes

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def server(default_model) -> ServerProcess:
    with running_server({"STREAM_HEARTBEAT_SECONDS": "0"}) as srv:
        yield srv


def raw_stream(srv: ServerProcess, body: dict, headers: dict | None = None) -> tuple[str, list[float]]:
    """The SSE body as text, and the arrival time of each content-bearing event."""
    arrivals: list[float] = []
    text = b""
    t0 = time.perf_counter()
    with requests.post(srv.url("/v1/chat/completions"), json=body, headers=headers, stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        assert r.headers["Content-Type"].startswith("text/event-stream")
        for chunk in r.iter_content(chunk_size=None):
            text += chunk
            if b'"content":"' in chunk and b'"content":""' not in chunk:
                arrivals.append(time.perf_counter() - t0)
    return text.decode(), arrivals


def test_each_chunk_leaves_when_its_token_is_generated(server):
    body = {"messages": [{"role": "user", "content": "Count from 1 to 100."}], "max_tokens": 200,
            "temperature": 0, "stream": True, "ignore_eos": True}
    text, arrivals = raw_stream(server, body)
    n_events = text.count('"content":"') - 1
    # one network read per content event on the whole: nothing buffers the stream
    assert len(arrivals) >= 0.8 * n_events > 50, (len(arrivals), n_events)


@pytest.mark.parametrize("profile", ["openai", "strict", "llama.cpp"])
def test_every_profile_against_the_client_rules(server_factory, profile):
    srv = server_factory({"STREAM_PROFILE": profile})
    srv.wait_ready()
    body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 12, "temperature": 0, "stream": True}
    text, _ = raw_stream(srv, body)
    expected_done = profile != "strict"
    assert outcomes(text) == {
        "inference-benchmarker": "ok" if expected_done else "broken: Connection closed before completion",
        "genai-perf": "ok" if expected_done else "broken: no [DONE]",
        "openai-python": "ok",
    }
    # one deployment serves both kinds of client: the header flips [DONE] per request
    flipped, _ = raw_stream(srv, body, headers={"X-Stream-Done": "0" if expected_done else "1"})
    assert flipped.endswith("data: [DONE]\n\n") != expected_done
    # the openai SDK reads every profile
    sdk = openai.OpenAI(base_url=srv.url("/v1"), api_key="x", max_retries=0)
    chunks = list(sdk.chat.completions.create(model="m", messages=body["messages"], max_tokens=12,
                                              temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.role) == 1


def test_openai_sdk_raises_on_a_mid_stream_error(server_factory):
    srv = server_factory({"REQUEST_TIMEOUT": "1"})
    srv.wait_ready()
    sdk = openai.OpenAI(base_url=srv.url("/v1"), api_key="x", max_retries=0)
    # ignore_eos: still generating when the 1 s limit ends it, however fast the machine
    stream = sdk.completions.create(model="m", prompt="List the numbers from 1 to 1000:", max_tokens=1000,
                                    temperature=0, stream=True, extra_body={"ignore_eos": True})
    got = []
    with pytest.raises(openai.APIError) as exc:
        for chunk in stream:
            got.append(chunk.choices[0].text)
    assert got, "the stream had started before the error"
    assert "request timeout" in str(exc.value)
    # the server stays healthy and serves the next request
    assert requests.get(srv.url("/health"), timeout=5).status_code == 200
    assert sdk.completions.create(model="m", prompt="Hi", max_tokens=2).usage.completion_tokens == 2


def test_disconnect_cancels_the_generation_and_frees_the_engine(server):
    def state() -> tuple[int, float, float]:
        """Sequences in the engine; aborted completions and tokens generated so far."""
        m = scrape(server)
        return (running(server),
                value(m, "vertex_gguf_request_finished_total", api="completions", finish_reason="abort"),
                value(m, "vertex_gguf_generation_tokens_total", api="completions"))

    _, aborts, tokens = state()
    body = {"prompt": "List the numbers from 1 to 5000:", "max_tokens": 3000, "temperature": 0, "stream": True}
    r = requests.post(server.url("/v1/completions"), json=body, stream=True, timeout=60)
    lines = r.iter_lines()
    for _ in range(5):
        next(lines)
    r.close()  # the client goes away after a few tokens
    # structural, not timed: the generation is counted as aborted and leaves the engine long
    # before its 3000 tokens (bounded wait: the whole generation would take ~30 s here)
    busy, aborted, generated = wait_for(lambda: (s := state())[0] == 0 and s[1] != aborts and s, 60,
                                        "abort")
    assert busy == 0 and aborted == aborts + 1, (busy, aborted)
    assert generated - tokens < 3000 / 2, f"{generated - tokens} tokens: the generation ran on"
    assert server.logs().count("client went away mid-stream") >= 1
    # the engine serves the next request
    with requests.post(server.url("/v1/completions"), json={"prompt": "Hi", "max_tokens": 4, "stream": True},
                       stream=True, timeout=60) as r2:
        first = next(ln for ln in r2.iter_lines() if ln.startswith(b"data: {"))
    assert json.loads(first[6:])["choices"][0]["text"]


# ---- real clients ----------------------------------------------------------------------------


def test_langchain_chat_openai_streaming(server, model_id):
    from langchain_openai import ChatOpenAI

    kw = {"base_url": server.url("/v1"), "api_key": "x", "model": "m", "temperature": 0, "max_tokens": 24,
          "max_retries": 0}
    full = ChatOpenAI(**kw).invoke(QUESTION)
    llm = ChatOpenAI(streaming=True, stream_usage=True, **kw)
    chunks = list(llm.stream(QUESTION))
    assert len(chunks) > 3
    merged = chunks[0]
    for c in chunks[1:]:
        merged = merged + c
    assert merged.content == full.content
    assert merged.response_metadata["finish_reason"] in {"stop", "length"}
    assert merged.response_metadata["model_name"] == model_id  # not glued together
    assert merged.usage_metadata["output_tokens"] == full.usage_metadata["output_tokens"]


def test_pydantic_ai_streaming(server):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("m", provider=OpenAIProvider(base_url=server.url("/v1"), api_key="x"))
    agent = Agent(model, model_settings={"temperature": 0, "max_tokens": 24})

    async def run() -> tuple[list[str], str]:
        async with agent.run_stream(QUESTION) as result:
            deltas = [d async for d in result.stream_text(delta=True, debounce_by=None)]  # every delta
        full = await agent.run(QUESTION)
        return deltas, full.output

    deltas, full = asyncio.run(run())
    assert len(deltas) > 1
    assert "".join(deltas) == full


def guidellm_binary() -> str | None:
    candidates = [os.environ.get("GUIDELLM"), str(ROOT / ".venv-guidellm" / "bin" / "guidellm"),
                  shutil.which("guidellm")]
    return next((c for c in candidates if c and Path(c).is_file()), None)


def test_guidellm_benchmark_completes_without_errors(server, tmp_path):
    binary = guidellm_binary()
    if binary is None:
        if os.environ.get("CI_REQUIRE_ALL"):
            pytest.fail("guidellm is not installed (.ci/run installs it into .venv-guidellm)")
        pytest.skip("guidellm not installed: .ci/run installs it into .venv-guidellm")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(
        json.dumps({"prompt": f"Write a short story about robot number {i}.", "output_tokens_count": 24}) + "\n"
        for i in range(6)))
    out = tmp_path / "out.json"
    cmd = [binary, "run", "--backend", f"kind=openai_http,target={server.base}",
           "--profile", "kind=concurrent,streams=2", "--constraint", "kind=max_requests,count=6",
           "--data", f"kind=json_file,path={prompts}", "--disable-console-interactive",
           "--output", f"kind=json,path={out}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads(out.read_text())["benchmarks"][0]["metrics"]
    assert metrics["request_totals"]["errored"] == 0
    assert metrics["request_totals"]["successful"] == 6
    ttft = metrics["time_to_first_token_ms"]["successful"]["median"]
    itl = metrics["inter_token_latency_ms"]["successful"]["median"]
    print(f"guidellm concurrent@2: TTFT p50 {ttft:.1f} ms, ITL p50 {itl:.1f} ms")
    assert ttft > 0 and itl > 0
