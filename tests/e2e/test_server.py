"""End to end: a real gunicorn process serving the real default model on a loopback port."""

from __future__ import annotations

import json
import signal
import statistics
import threading
import time

import openai
import pytest
import requests

from tests.support.server import VERTEX_HEALTH, VERTEX_PREDICT, ServerProcess, wait_for
from tests.support.tokenizer import tokenizer

CHAT = {"messages": [{"role": "user", "content": "What is the capital of France?"}]}
GREEDY = {"temperature": 0, "max_tokens": 24}


def post(srv: ServerProcess, path: str, body: dict, **kw) -> requests.Response:
    return requests.post(srv.url(path), json=body, timeout=120, **kw)


def read_sse(resp: requests.Response) -> list:
    """Parse an SSE body into JSON objects and '[DONE]', checking the framing."""
    events = []
    buf = b""
    for chunk in resp.iter_content(chunk_size=None):
        buf += chunk
    for block in buf.decode().split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        payload = block[6:]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


# ---- start-up --------------------------------------------------------------------------------


def test_health_is_503_until_loaded_then_200(server_factory):
    srv = server_factory()
    srv.wait_listening()
    first = requests.get(srv.url("/health"), timeout=5)
    seen = [first.status_code]
    bodies = [first.json()]
    deadline = time.monotonic() + 60
    while seen[-1] != 200 and time.monotonic() < deadline:
        r = requests.get(srv.url("/health"), timeout=5)
        seen.append(r.status_code)
        bodies.append(r.json())
        if r.status_code == 503:
            # inference is refused in the OpenAI shape while loading
            pass
    assert seen[0] == 503, f"first health answer was {seen[0]}: {bodies[0]}"
    assert bodies[0]["stage"] in {"starting", "loading", "warming_up"}
    assert seen[-1] == 200 and bodies[-1]["status"] == "ok"


def test_inference_while_loading_is_503_openai_shape(server_factory):
    srv = server_factory()
    srv.wait_listening()
    r = post(srv, "/v1/chat/completions", CHAT)
    if r.status_code == 503:
        assert r.json()["error"]["code"] == "model_loading"
    else:  # the 135M model can be ready within milliseconds of the bind
        assert r.status_code == 200


@pytest.mark.parametrize("kind, cause", [("missing", "file not found"), ("text", "not a GGUF")])
def test_unloadable_model_exits_non_zero_with_one_clear_line(server_factory, tmp_path, kind, cause):
    model = str(tmp_path / "model.gguf")
    if kind == "text":
        (tmp_path / "model.gguf").write_text("this is not a model")
    srv = server_factory({"MODEL": model})
    code = srv.proc.wait(60)
    assert code != 0
    lines = [ln for ln in srv.logs().splitlines() if "model load failed" in ln]
    assert len(lines) == 1, srv.logs()
    assert model in lines[0] and cause in lines[0]


# ---- the Vertex AI contract ------------------------------------------------------------------


def test_vertex_health_route_with_ids(vertex_server):
    r = requests.get(vertex_server.url(VERTEX_HEALTH), timeout=5)
    assert r.status_code == 200
    assert requests.get(vertex_server.url("/health"), timeout=5).status_code == 200


def test_vertex_predict_envelope_mixed_with_failing_instance(vertex_server, sensible_text):
    body = {
        "instances": [
            CHAT,
            {"prompt": "The capital of France is"},
            {"messages": [{"role": "user", "content": "Hi"}], "top_p": 7},
            {"@requestFormat": "chatCompletions", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3},
        ],
        "parameters": GREEDY,
    }
    r = post(vertex_server, VERTEX_PREDICT, body)
    assert r.status_code == 200
    preds = r.json()["predictions"]
    assert len(preds) == 4
    assert preds[0]["object"] == "chat.completion"
    assert preds[0]["choices"][0]["message"]["content"].strip()
    assert preds[1]["object"] == "text_completion"
    assert preds[1]["choices"][0]["text"]
    if sensible_text:
        assert "Paris" in preds[1]["choices"][0]["text"]
    assert preds[2]["error"]["param"] == "top_p"
    assert preds[3]["usage"]["completion_tokens"] <= 3


def test_vertex_envelope_bad_is_400(vertex_server):
    r = post(vertex_server, VERTEX_PREDICT, {"instances": []})
    assert r.status_code == 400 and "empty" in r.json()["error"]["message"]
    r = requests.post(vertex_server.url(VERTEX_PREDICT), data=b"nope", timeout=10,
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    r = requests.post(vertex_server.url(VERTEX_PREDICT), data=b"x" * (10 * 1024 * 1024 + 1), timeout=30,
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    assert requests.get(vertex_server.url(VERTEX_HEALTH), timeout=5).status_code == 200


def test_raw_predict_and_stream_raw_predict(vertex_server):
    r = post(vertex_server, VERTEX_PREDICT, {**CHAT, **GREEDY})
    assert r.json()["object"] == "chat.completion"
    full = r.json()["choices"][0]["message"]["content"]
    r = post(vertex_server, VERTEX_PREDICT, {**CHAT, **GREEDY, "stream": True}, stream=True)
    assert r.headers["Content-Type"].startswith("text/event-stream")
    events = read_sse(r)
    assert events[-1] == "[DONE]"
    streamed = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1])
    assert streamed == full


# ---- OpenAI API with the openai SDK ----------------------------------------------------------


@pytest.fixture
def sdk(vertex_server):
    return openai.OpenAI(base_url=vertex_server.url("/v1"), api_key="unused", max_retries=0)


def test_openai_sdk_chat_non_streaming_with_exact_usage(sdk, model_id):
    resp = sdk.chat.completions.create(model="any", messages=CHAT["messages"], **GREEDY)
    assert resp.object == "chat.completion"
    assert resp.model == model_id
    assert resp.choices[0].message.content.strip()
    assert resp.choices[0].finish_reason in {"stop", "length"}
    # exact prompt token count: the template rendered and tokenized here must agree
    from app.formats.chat_template import render

    tok = tokenizer()
    prompt = render(tok.metadata.get("tokenizer.chat_template"), CHAT["messages"])
    n_prompt = len(tok.tokenize(prompt.encode(), add_bos=False, special=True))
    assert resp.usage.prompt_tokens == n_prompt
    n_completion = len(tok.tokenize(resp.choices[0].message.content.encode(), add_bos=False, special=True))
    assert abs(resp.usage.completion_tokens - n_completion) <= 1 + (resp.choices[0].finish_reason == "stop")
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_openai_sdk_chat_streaming_equals_non_streaming(sdk):
    full = sdk.chat.completions.create(model="m", messages=CHAT["messages"], **GREEDY)
    stream = sdk.chat.completions.create(
        model="m", messages=CHAT["messages"], stream=True, stream_options={"include_usage": True}, **GREEDY
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-2].choices[0].finish_reason == full.choices[0].finish_reason


def test_openai_sdk_completions(sdk, sensible_text):
    # ignore_eos: exactly 8 tokens whatever the model would choose after "Paris"
    resp = sdk.completions.create(model="m", prompt="The capital of France is", max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True})
    if sensible_text:
        assert "Paris" in resp.choices[0].text
    tok = tokenizer()
    assert resp.usage.prompt_tokens == len(tok.tokenize(b"The capital of France is", add_bos=False, special=True))
    assert resp.usage.completion_tokens == 8 and resp.choices[0].finish_reason == "length"
    stream = sdk.completions.create(model="m", prompt="The capital of France is", max_tokens=8, temperature=0,
                                    stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in stream) == resp.choices[0].text


def test_openai_sdk_errors(sdk, model_id):
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.chat.completions.create(model="m", messages=CHAT["messages"], temperature=3)
    assert exc.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("nope")
    assert [m.id for m in sdk.models.list().data] == [model_id]


# ---- sampling --------------------------------------------------------------------------------


@pytest.mark.needs_text  # a random model's reply has no two-token stop string to cut
def test_stop_string_spanning_tokens_never_leaks(sdk):
    base = sdk.completions.create(model="m", prompt="The capital of France is", max_tokens=16, temperature=0)
    text = base.choices[0].text
    tok = tokenizer()
    # a stop string that starts inside one token and ends inside the next
    pieces = [tok.detokenize([t]).decode() for t in tok.tokenize(text.encode(), add_bos=False)]
    k = next(i for i in range(1, len(pieces)) if len(pieces[i - 1].strip()) >= 2 and len(pieces[i].strip()) >= 2)
    start = sum(len(p) for p in pieces[: k - 1])
    cut = start + len(pieces[k - 1]) - 1
    stop = text[cut : cut + 2]
    expected = text[: text.index(stop)]
    for stream in (False, True):
        resp = sdk.completions.create(model="m", prompt="The capital of France is", max_tokens=16,
                                      temperature=0, stop=[stop], stream=stream)
        got = "".join(c.choices[0].text for c in resp) if stream else resp.choices[0].text
        assert got == expected, (stop, got, expected)


def test_seed_makes_sampling_reproducible(sdk):
    kw = {"model": "m", "prompt": "Once upon a time", "max_tokens": 20, "temperature": 1.0,
          "top_p": 0.95, "seed": 1234, "extra_body": {"top_k": 40, "min_p": 0.05}}
    a = sdk.completions.create(**kw).choices[0].text
    b = sdk.completions.create(**kw).choices[0].text
    c = sdk.completions.create(**{**kw, "seed": 99}).choices[0].text
    assert a == b
    assert a != c


def test_penalties_change_the_output(sdk):
    kw = {"model": "m", "prompt": "one one one one one", "max_tokens": 16, "temperature": 0}
    plain = sdk.completions.create(**kw).choices[0].text
    penalised = sdk.completions.create(**kw, frequency_penalty=2.0, presence_penalty=2.0).choices[0].text
    repeat = sdk.completions.create(**kw, extra_body={"repeat_penalty": 2.0}).choices[0].text
    assert plain != penalised and plain != repeat


def test_utf8_is_never_broken_in_streams(sdk):
    msgs = [{"role": "user", "content": "Write three emoji and the word 'café' in Chinese: 咖啡馆"}]
    full = sdk.chat.completions.create(model="m", messages=msgs, max_tokens=40, temperature=0)
    stream = sdk.chat.completions.create(model="m", messages=msgs, max_tokens=40, temperature=0, stream=True)
    parts = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert all("\ufffd" not in p for p in parts)
    assert "".join(parts) == full.choices[0].message.content


def test_context_overflow_is_400_naming_the_counts(vertex_server):
    body = {"messages": [{"role": "user", "content": "word " * 5000}]}
    r = post(vertex_server, "/v1/chat/completions", body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded"
    assert "4096" in err["message"] and "tokens" in err["message"]
    r = post(vertex_server, "/v1/chat/completions", {**CHAT, "max_tokens": 5000, "stream": True})
    assert r.status_code == 400 and r.headers["Content-Type"].startswith("application/json")


# ---- concurrency, queue, health latency, shutdown --------------------------------------------


def test_queue_full_is_429(server_factory):
    srv = server_factory({"MAX_QUEUE": "0", "PARALLEL": "1"})
    srv.wait_ready()
    long_req = {"prompt": "Count: 1, 2, 3,", "max_tokens": 400, "temperature": 0, "stream": True,
                "ignore_eos": True}
    first = requests.post(srv.url("/v1/completions"), json=long_req, stream=True, timeout=60)
    it = first.iter_lines()
    next(it)  # generation is running
    second = post(srv, "/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert second.status_code == 429
    assert second.json()["error"]["type"] == "rate_limit_error"
    # refused at once, not after waiting its turn: the first generation is still streaming
    assert json.loads(next(ln for ln in it if ln)[6:])["choices"][0]["finish_reason"] is None
    first.close()
    # the first request's cancellation frees the engine: a new request succeeds
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        r = post(srv, "/v1/completions", {"prompt": "x", "max_tokens": 2})
        if r.status_code == 200:
            break
        time.sleep(0.05)
    assert r.status_code == 200


def test_health_stays_fast_while_a_long_generation_streams(vertex_server):
    stop = threading.Event()
    finishes: list[str | None] = []  # each chunk's finish_reason, as it arrives

    def generate() -> None:
        # ignore_eos and far more tokens than the checks below need: still running at their end
        body = {"prompt": "List the numbers from 1 to 500:", "max_tokens": 3000, "temperature": 0,
                "stream": True, "ignore_eos": True}
        with requests.post(vertex_server.url("/v1/completions"), json=body, stream=True, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith(b"data: {"):
                    finishes.append(json.loads(line[6:])["choices"][0]["finish_reason"])
                if stop.is_set():
                    break

    t = threading.Thread(target=generate, daemon=True)
    t.start()
    wait_for(lambda: finishes or not t.is_alive(), 60, "first chunk")
    latencies, progress = [], []
    session = requests.Session()
    # health asked until the stream's chunk count has moved ten times between its answers (at
    # most 2000 asks): however slow the machine, so the count says what ran, not how fast
    for _ in range(2000):
        t0 = time.perf_counter()
        assert session.get(vertex_server.url(VERTEX_HEALTH), timeout=5).status_code == 200
        latencies.append((time.perf_counter() - t0) * 1000)
        progress.append(len(finishes))
        if len(set(progress)) >= 10 or not t.is_alive():
            break
        time.sleep(0.01)
    stop.set()
    t.join(60)
    assert not t.is_alive()
    # counted, not timed (bench/ has the latencies): health answered while the stream ran,
    # interleaved with its tokens (the chunk count moved between ten of the answers, and the
    # stream had not finished); a hub blocked by the generation would answer only between
    # whole generations
    assert progress[0] > 0 and all(f is None for f in finishes[:progress[-1]]), finishes
    assert len(set(progress)) >= 10, progress
    p99 = statistics.quantiles(latencies, n=100)[98]
    print(f"health latency during generation: p50 {statistics.median(latencies):.1f} ms, p99 {p99:.1f} ms")


def test_sigterm_drains_in_flight_requests(server_factory):
    # a graceful timeout far longer than the wait below: the worker exits when its last request
    # ends, not when the timeout runs out (which would fail the bounded wait)
    srv = server_factory({"GRACEFUL_TIMEOUT": "600"})
    srv.wait_ready()
    body = {"prompt": "List the numbers from 1 to 100:", "max_tokens": 120, "temperature": 0, "stream": True,
            "ignore_eos": True}
    resp = requests.post(srv.url("/v1/completions"), json=body, stream=True, timeout=60)
    lines = resp.iter_lines()
    assert next(lines).startswith(b"data: ")
    srv.proc.send_signal(signal.SIGTERM)  # as the platform does: to PID 1, the master
    rest = [ln for ln in lines if ln]
    assert rest[-1] == b"data: [DONE]", "the in-flight stream must finish"
    assert json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "length"
    # the drain ends with the last request, not with the graceful timeout (an idle keep-alive
    # connection, like the one this client holds, does not keep the worker up)
    assert srv.proc.wait(120) == 0, srv.logs()
    assert "SIGKILL" not in srv.logs() and "server is shutting down" not in srv.logs()
    with pytest.raises(requests.ConnectionError):
        requests.get(srv.url("/health"), timeout=2)


def test_sigterm_ends_a_stream_longer_than_the_grace_with_an_error_event(server_factory):
    srv = server_factory({"GRACEFUL_TIMEOUT": "4", "PARALLEL": "2"})
    srv.wait_ready()
    body = {"prompt": "Count:", "max_tokens": 3000, "ignore_eos": True, "stream": True}
    resp = requests.post(srv.url("/v1/completions"), json=body, stream=True, timeout=60)
    lines = resp.iter_lines()
    assert next(lines).startswith(b"data: ")
    with requests.Session() as keep:  # a kept-alive connection, as a load balancer holds
        assert keep.get(srv.url("/health"), timeout=5).status_code == 200
        srv.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        late = None
        while time.monotonic() < deadline:
            late = keep.post(srv.url("/v1/completions"), json={"prompt": "hi", "max_tokens": 1}, timeout=5)
            if late.status_code == 503:
                break
            time.sleep(0.1)
        assert late is not None and late.status_code == 503, late.text if late else None
        assert late.json()["error"]["code"] == "shutting_down"
    rest = [ln for ln in lines if ln]
    error = json.loads(rest[-2][6:]) if rest[-1] == b"data: [DONE]" else json.loads(rest[-1][6:])
    assert error["error"]["code"] == "shutting_down", rest[-3:]
    assert srv.proc.wait(30) == 0, srv.logs()


def test_probe_command_follows_health(vertex_server):
    import subprocess
    import sys

    env = {"AIP_HTTP_PORT": str(vertex_server.port), "AIP_HEALTH_ROUTE": VERTEX_HEALTH, "PATH": "/usr/bin:/bin"}
    ok = subprocess.run([sys.executable, "-m", "app", "probe"], env=env, capture_output=True, timeout=30)
    assert ok.returncode == 0, ok.stderr
    from tests.support.server import free_port

    env["AIP_HTTP_PORT"] = str(free_port())  # nothing listens there
    down = subprocess.run([sys.executable, "-m", "app", "probe"], env=env, capture_output=True, timeout=30)
    assert down.returncode == 1


def test_prompt_that_is_not_utf8_is_400_and_nothing_leaks(server_factory):
    srv = server_factory({"PARALLEL": "1", "MAX_QUEUE": "0"})
    srv.wait_ready()
    raw = b'{"prompt": "bad \\ud800 surrogate", "max_tokens": 2}'
    for _ in range(3):  # a leaked in-flight count would turn the later ones into 429s
        r = requests.post(srv.url("/v1/completions"), data=raw, headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 400, r.text
        assert "surrogate" in r.json()["error"]["message"]
    assert post(srv, "/v1/completions", {"prompt": "Hi", "max_tokens": 2}).status_code == 200
