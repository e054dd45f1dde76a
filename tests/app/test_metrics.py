"""GET /metrics over the fake engine: parsed with prometheus-client's own parser, the counts and
token sums must equal what the requests sent and the answers said."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from app.engine.fake import FakeEngine
from app.engine.fake_embed import FakeEmbedder
from tests.support.app import make_client
from tests.support.clients import paused_stream

CHAT = {"messages": [{"role": "user", "content": "Say hello to everyone here"}]}
PROMPT = {"prompt": "Once upon a time"}
MSG = {"model": "fake-model", "max_tokens": 20,
       "messages": [{"role": "user", "content": "hi there"}]}
RESP = {"input": "hello there you"}


def scrape(client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample as {(name, sorted labels): value}."""
    resp = client.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(resp.get_data(as_text=True)):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples, name: str, **labels: str) -> float:
    """The sum over every series of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


def test_counts_and_tokens_equal_what_was_sent_and_answered():
    client = make_client(FakeEngine())
    usage = {"chat": [0, 0], "completions": [0, 0], "messages": [0, 0], "responses": [0, 0]}
    sent = {"chat": 3, "completions": 2, "messages": 2, "responses": 1}
    for _ in range(sent["chat"]):
        u = client.post("/v1/chat/completions", json=CHAT).get_json()["usage"]
        usage["chat"][0] += u["prompt_tokens"]
        usage["chat"][1] += u["completion_tokens"]
    for _ in range(sent["completions"]):
        u = client.post("/v1/completions", json={**PROMPT, "max_tokens": 4}).get_json()["usage"]
        usage["completions"][0] += u["prompt_tokens"]
        usage["completions"][1] += u["completion_tokens"]
    for _ in range(sent["messages"]):
        u = client.post("/v1/messages", json=MSG).get_json()["usage"]
        usage["messages"][0] += u["input_tokens"]
        usage["messages"][1] += u["output_tokens"]
    u = client.post("/v1/responses", json=RESP).get_json()["usage"]
    usage["responses"][0] += u["input_tokens"]
    usage["responses"][1] += u["output_tokens"]

    m = scrape(client)
    for api, n in sent.items():
        assert value(m, "vertex_gguf_e2e_request_latency_seconds_count", api=api) == n, api
        assert value(m, "vertex_gguf_time_to_first_token_seconds_count", api=api) == n, api
        assert value(m, "vertex_gguf_request_queue_time_seconds_count", api=api) == n, api
        assert value(m, "vertex_gguf_requests_total", api=api, status="200") == n, api
        assert value(m, "vertex_gguf_prompt_tokens_total", api=api) == usage[api][0], api
        assert value(m, "vertex_gguf_generation_tokens_total", api=api) == usage[api][1], api
        assert total(m, "vertex_gguf_request_finished_total", api=api) == n, api
        # one gap between each two tokens of a request
        assert value(m, "vertex_gguf_inter_token_latency_seconds_count", api=api) == (
            usage[api][1] - n), api
        # a histogram's +Inf bucket is its count
        assert value(m, "vertex_gguf_time_to_first_token_seconds_bucket", api=api,
                     le="+Inf") == n
    assert value(m, "vertex_gguf_request_finished_total", api="completions",
                 finish_reason="length") == 2
    assert value(m, "vertex_gguf_request_finished_total", api="chat", finish_reason="stop") == 3
    # the other routes are not counted
    assert total(m, "vertex_gguf_requests_total") == sum(sent.values())


def test_an_error_is_counted_with_its_status():
    client = make_client(FakeEngine(), strict_model_name=True)
    assert client.post("/v1/chat/completions", json={"messages": "nope"}).status_code == 400
    assert client.post("/v1/chat/completions", json={**CHAT, "model": "other"}).status_code == 404
    assert client.post("/v1/messages", json={"max_tokens": 5}).status_code == 400
    m = scrape(client)
    assert value(m, "vertex_gguf_requests_total", api="chat", status="400") == 1
    assert value(m, "vertex_gguf_requests_total", api="chat", status="404") == 1
    assert value(m, "vertex_gguf_requests_total", api="messages", status="400") == 1
    assert value(m, "vertex_gguf_e2e_request_latency_seconds_count", api="chat") == 2
    # no generation ran
    assert total(m, "vertex_gguf_time_to_first_token_seconds_count") == 0
    assert total(m, "vertex_gguf_request_finished_total") == 0


def test_a_stream_is_counted_once_at_its_end():
    engine = FakeEngine()
    engine.hold_after = 2
    client = make_client(engine)
    with paused_stream(client, engine, CHAT) as (_, frames):
        m = scrape(client)  # mid-stream: not counted yet, but running
        assert value(m, "vertex_gguf_requests_total", api="chat", status="200") == 0
        assert value(m, "vertex_gguf_e2e_request_latency_seconds_count", api="chat") == 0
        assert value(m, "vertex_gguf_time_to_first_token_seconds_count", api="chat") == 1
        assert value(m, "vertex_gguf_num_requests_running") == 1
        assert value(m, "vertex_gguf_slots_busy") == 1
        assert value(m, "vertex_gguf_kv_cache_used_cells") > 0
        engine.resume.set()
        rest = b"".join(frames)
        assert b"[DONE]" in rest
    m = scrape(client)
    assert value(m, "vertex_gguf_requests_total", api="chat", status="200") == 1
    assert value(m, "vertex_gguf_e2e_request_latency_seconds_count", api="chat") == 1
    assert value(m, "vertex_gguf_request_finished_total", api="chat", finish_reason="stop") == 1
    assert value(m, "vertex_gguf_client_disconnects_total", api="chat") == 0
    usage = engine.handles[-1]
    assert value(m, "vertex_gguf_generation_tokens_total", api="chat") == usage.decoded
    assert value(m, "vertex_gguf_prompt_tokens_total", api="chat") == usage.prompt_tokens


def test_a_client_that_goes_away_mid_stream_is_counted():
    engine = FakeEngine()
    engine.hold_after = 2
    client = make_client(engine)
    with paused_stream(client, engine, CHAT) as (resp, _):
        resp.close()  # the client hangs up (before the generation resumes): the generator closes
    m = scrape(client)
    assert value(m, "vertex_gguf_client_disconnects_total", api="chat") == 1
    assert value(m, "vertex_gguf_request_finished_total", api="chat", finish_reason="abort") == 1
    assert value(m, "vertex_gguf_requests_total", api="chat", status="200") == 1  # headers sent
    assert engine.handles[-1].cancelled


def test_a_timeout_is_counted():
    client = make_client(FakeEngine(delay=0.05), request_timeout=0.01)
    assert client.post("/v1/messages", json=MSG).status_code == 504
    m = scrape(client)
    assert value(m, "vertex_gguf_timeouts_total", api="messages") == 1
    assert value(m, "vertex_gguf_requests_total", api="messages", status="504") == 1
    assert value(m, "vertex_gguf_request_finished_total", api="messages",
                 finish_reason="timeout") == 1


def test_predict_is_its_own_api_and_counts_each_generation():
    client = make_client(FakeEngine())
    body = {"instances": [{"@requestFormat": "chatCompletions", **CHAT},
                          {"@requestFormat": "chatCompletions", **CHAT}]}
    resp = client.post("/predict", json=body)
    assert resp.status_code == 200, resp.get_json()
    tokens = sum(p["usage"]["completion_tokens"] for p in resp.get_json()["predictions"])
    raw = client.post("/predict", json=CHAT)  # a raw body: answered as the chat route would
    assert raw.status_code == 200
    tokens += raw.get_json()["usage"]["completion_tokens"]
    m = scrape(client)
    assert value(m, "vertex_gguf_requests_total", api="predict", status="200") == 2  # HTTP
    assert value(m, "vertex_gguf_e2e_request_latency_seconds_count", api="predict") == 2
    assert value(m, "vertex_gguf_time_to_first_token_seconds_count", api="predict") == 3
    assert value(m, "vertex_gguf_generation_tokens_total", api="predict") == tokens
    assert value(m, "vertex_gguf_requests_total", api="chat", status="200") == 0


def test_embeddings_are_counted_with_their_tokens():
    engine = FakeEngine()
    engine.embedder = FakeEmbedder()  # type: ignore[attr-defined]
    client = make_client(engine)
    tokens = 0
    for inp in ("one two three", ["a b", "c d e"]):
        resp = client.post("/v1/embeddings", json={"input": inp})
        assert resp.status_code == 200
        tokens += resp.get_json()["usage"]["prompt_tokens"]
    vertex = client.post("/predict", json={"instances": [{"content": "x y"}, {"content": "z"}]})
    assert vertex.status_code == 200
    vtokens = sum(p["embeddings"]["statistics"]["token_count"]
                  for p in vertex.get_json()["predictions"])
    m = scrape(client)
    assert value(m, "vertex_gguf_requests_total", api="embeddings", status="200") == 2
    assert value(m, "vertex_gguf_e2e_request_latency_seconds_count", api="embeddings") == 2
    assert value(m, "vertex_gguf_prompt_tokens_total", api="embeddings") == tokens > 0
    assert value(m, "vertex_gguf_prompt_tokens_total", api="predict") == vtokens > 0
    assert value(m, "vertex_gguf_embedding_requests_waiting") == 0
    assert total(m, "vertex_gguf_time_to_first_token_seconds_count") == 0


def test_load_state_download_and_load_time():
    engine = FakeEngine(ready=False)
    client = make_client(engine)
    m = scrape(client)
    assert value(m, "vertex_gguf_model_load_state", stage="starting") == 1
    assert value(m, "vertex_gguf_model_load_state", stage="ready") == 0
    assert ("vertex_gguf_model_load_seconds", ()) not in m
    state = engine.state
    state.set("downloading", progress=0.0)
    state.set_download(300, 1000, 1e6, 0.5)
    time.sleep(0.02)
    m = scrape(client)
    assert value(m, "vertex_gguf_model_load_state", stage="downloading") == 1
    assert value(m, "vertex_gguf_model_download_bytes") == 300
    assert value(m, "vertex_gguf_model_download_size_bytes") == 1000
    assert value(m, "vertex_gguf_model_download_seconds") > 0
    state.set_download(1000, 1000, 1e6, 0.0)
    state.set("loading", progress=0.0)
    time.sleep(0.02)
    state.set("warming_up")
    state.set("ready", progress=1.0)
    m = scrape(client)
    assert value(m, "vertex_gguf_model_load_state", stage="ready") == 1
    assert value(m, "vertex_gguf_model_load_state", stage="loading") == 0
    assert value(m, "vertex_gguf_model_download_bytes") == 1000
    assert value(m, "vertex_gguf_model_load_seconds") > 0
    # a cold start's phases, each as long as its stage lasted, and their total
    phases = {labels[0][1]: v for (name, labels), v in m.items()
              if name == "vertex_gguf_model_load_phase_seconds"}
    assert set(phases) == {"starting", "downloading", "loading", "warming_up", "total"}
    assert phases["downloading"] >= 0.02 and phases["loading"] >= 0.02
    assert abs(phases["total"] - sum(v for k, v in phases.items() if k != "total")) < 0.01
    health = client.get("/health").get_json()
    assert health["cold_start"] == state.phases()
    assert value(m, "vertex_gguf_slots_total") == engine.capacity
    assert value(m, "vertex_gguf_kv_cache_total_cells") == engine.capacity * 512


def test_each_app_has_its_own_registry_and_openmetrics_is_negotiated():
    a, b = make_client(FakeEngine()), make_client(FakeEngine())
    a.post("/v1/chat/completions", json=CHAT)
    assert value(scrape(a), "vertex_gguf_requests_total", api="chat", status="200") == 1
    assert value(scrape(b), "vertex_gguf_requests_total", api="chat", status="200") == 0
    resp = a.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
    assert resp.get_data(as_text=True).rstrip().endswith("# EOF")


class _WatchedLock:
    """A metric's lock that records, instead of deadlocking, being taken again by the thread that
    already holds it (prometheus-client's locks are not reentrant)."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self._owner: int | None = None
        self.reentered = 0

    def __enter__(self) -> None:
        import threading

        if self._owner == threading.get_ident():
            self.reentered += 1
            raise RuntimeError("a metric's lock taken again by its holder: a deadlock")
        self._lock.acquire()
        self._owner = threading.get_ident()

    def __exit__(self, *exc: object) -> None:
        self._owner = None
        self._lock.release()


def test_a_stream_closed_inside_a_metric_update_takes_no_metric_lock():
    """A stream nobody closed is closed by the garbage collector, which may run in the middle of
    a metric update on this very thread (seen: a whole test run hung in labels()). Its end is
    queued, counted at the next request or scrape, and takes no lock meanwhile."""
    client = make_client(FakeEngine())
    metrics = client.application.extensions["vertex_gguf_metrics"]
    watched = {name: _WatchedLock() for name in ("requests", "e2e", "finished")}
    for name, lock in watched.items():
        getattr(metrics, name)._lock = lock
    resp = client.post("/v1/chat/completions", json={**CHAT, "stream": True}, buffered=False)
    body = iter(resp.response)
    assert next(body)  # the stream has started: its generation is running
    with watched["requests"]:  # as the collector finds this thread: inside requests.labels()
        resp.close()  # the stream's finally runs here, as a finalizer would run it
    assert [lock.reentered for lock in watched.values()] == [0, 0, 0]
    m = scrape(client)
    assert value(m, "vertex_gguf_requests_total", api="chat", status="200") == 1
    assert value(m, "vertex_gguf_request_finished_total", api="chat", finish_reason="abort") == 1
    assert value(m, "vertex_gguf_client_disconnects_total", api="chat") == 1
