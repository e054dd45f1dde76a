"""``GET /metrics``: Prometheus text format, with the official prometheus-client.

Names follow vLLM's (``vllm:time_to_first_token_seconds`` ...) with a ``vertex_gguf_`` prefix (a
colon is legal but reserved for recording rules). Every app has its own registry (tests build
many apps in one process), kept in ``app.extensions["vertex_gguf_metrics"]``.

Where each figure is taken, at the narrowest point that knows it:
- a generation (app.core.service.Run): time to first token, inter-token latency, queue time,
  tokens, how it finished, the client going away, timeouts (:class:`ApiMetrics`);
- an HTTP request (:func:`install`): end-to-end latency and the request counter by status,
  once the response has ended (a stream when its generator closes);
- the engine and load state: gauges read at scrape time (:class:`EngineCollector`), so nothing
  is written on the engine thread or the hub for them.

``api`` is the route the request came through: chat, completions, messages, responses,
embeddings, rerank, score, predict (every Vertex AI predict call, whatever its instances are).

A server of several models (``Metrics(by_model=True)``, docs/models.md) adds a ``model`` label:
to every per-API metric (the model the request leased: a Service counts through its model's
:class:`ModelMetrics`; a request that leased none, a 404 for an unknown model or a 401, has
``model=""``), and to the engine gauges of every model that has an engine (:class:`PoolCollector`,
beside each model's pool status and leases). A single-model server has no ``model`` label: its
names and labels are as they always were.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from app.base import reqctx
from app.base.errors import GenerationTimeout, ServiceError

if TYPE_CHECKING:  # the core imports this module: Flask only where HTTP is
    from flask import Flask, Response

log = logging.getLogger(__name__)

# One series less per counter and histogram: ``*_created`` timestamps (Managed Prometheus bills
# by sample, and nothing here reads them). Process-wide, as the client library offers it.
prometheus_client.disable_created_metrics()

PREFIX = "vertex_gguf_"

# Api.name -> the ``api`` label
API_LABELS = {
    "chat": "chat",
    "completion": "completions",
    "messages": "messages",
    "responses": "responses",
    "embeddings_openai": "embeddings",
    "embeddings": "embeddings",
    "ollama_chat": "ollama",
    "ollama_generate": "ollama",
    "ollama_embed": "embeddings",
    "gemini": "gemini",
    "gemini_embed": "embeddings",
    "rerank": "rerank",
    "rerank_cohere_v1": "rerank",
    "rerank_cohere_v2": "rerank",
    "score": "score",
}
PREDICT = "predict"

# Buckets that resolve both a GPU (milliseconds) and a CPU (seconds to minutes).
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 7.5, 10.0,
    15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0,
)
E2E_BUCKETS = LATENCY_BUCKETS + (180.0, 300.0, 600.0)
ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
    0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
)

# How a generation ended: its first choice's reason, or one of these.
ABORT, ERROR, TIMEOUT = "abort", "error", "timeout"


@dataclass(frozen=True)
class ApiMetrics:
    """One API's children of every labelled metric, resolved once (a label lookup takes a lock
    and a dict probe; a token takes only an observe())."""

    ttft: Any
    itl: Any
    queue: Any
    prompt_tokens: Any
    cached_tokens: Any
    generation_tokens: Any
    disconnects: Any
    timeouts: Any
    finished: Callable[[str], Any]  # finish reason -> its counter
    later: Callable[[Callable[[], None]], None]  # Metrics.later: for code a finalizer may run

    def gone(self) -> None:
        self.disconnects.inc()

    def failed(self, err: ServiceError) -> str:
        """Count a generation's failure; the finish reason it ends with."""
        if isinstance(err, GenerationTimeout):
            self.timeouts.inc()
            return TIMEOUT
        return ERROR


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None, by_model: bool = False):
        """``by_model``: several models served (a pool): every per-API metric has a ``model``
        label after its others."""
        self.registry = registry if registry is not None else CollectorRegistry()
        self.by_model = by_model
        r = self.registry
        tail = ["model"] if by_model else []
        api = ["api", *tail]
        self.ttft = Histogram(
            PREFIX + "time_to_first_token_seconds",
            "Seconds from submitting a generation to its first token (queue and prefill "
            "included).", api, buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(
            PREFIX + "inter_token_latency_seconds",
            "Seconds between two generated tokens of a choice (the first choice of each "
            "request).", api, buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram(
            PREFIX + "e2e_request_latency_seconds",
            "Seconds from a request's arrival to the end of its response (a stream's last "
            "byte).", api, buckets=E2E_BUCKETS, registry=r)
        self.queue = Histogram(
            PREFIX + "request_queue_time_seconds",
            "Seconds a generation waited for a slot (submitted to admitted into the batch).",
            api, buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter(
            PREFIX + "prompt_tokens", "Prompt tokens of finished requests (embedding inputs "
            "included).", api, registry=r)
        self.cached_tokens = Counter(
            PREFIX + "prompt_tokens_cached", "Prompt tokens whose KV cache was reused from a "
            "slot's previous request (not computed again).", api, registry=r)
        self.generation_tokens = Counter(
            PREFIX + "generation_tokens", "Tokens generated (every choice; a cancelled "
            "request's tokens so far included).", api, registry=r)
        self.requests = Counter(
            PREFIX + "requests", "HTTP requests to the generation and embedding routes, by "
            "status code, counted when the response ends.", ["api", "status", *tail], registry=r)
        self.finished = Counter(
            PREFIX + "request_finished", "Generations ended, by finish reason: stop, length, "
            "tool_calls, abort (client gone), error, timeout.",
            ["api", "finish_reason", *tail], registry=r)
        self.disconnects = Counter(
            PREFIX + "client_disconnects", "Requests whose client went away before the answer "
            "was complete (the generation is cancelled).", api, registry=r)
        self.timeouts = Counter(
            PREFIX + "timeouts", "Requests that ran past REQUEST_TIMEOUT.", api, registry=r)
        self._apis: dict[tuple[str, str], ApiMetrics] = {}
        self._later: deque[Callable[[], None]] = deque()

    def later(self, update: Callable[[], None]) -> None:
        """Queue an update from code that may run inside a garbage-collector finalizer (the
        ``finally`` of a response's generator that nobody closed): the collector may have
        stopped this very thread inside a metric's lock, which is not reentrant, so nothing
        here takes one. ``flush`` applies the queue on the next request, or scrape."""
        self._later.append(update)

    def flush(self) -> None:
        """Apply the updates ``later`` queued (a finalizer running meanwhile only queues more)."""
        while True:
            try:
                update = self._later.popleft()
            except IndexError:
                return
            try:
                update()
            except Exception:  # noqa: BLE001 - metrics never break a response
                log.warning("metrics: a queued update failed", exc_info=True)

    def _values(self, label: str, model: str | None, *more: str) -> tuple[str, ...]:
        """A child's label values: ``model`` last where models are labelled."""
        return (label, *more, model or "") if self.by_model else (label, *more)

    def api(self, label: str, model: str | None = None) -> ApiMetrics:
        """The children of API ``label``; ``model``: the model the request runs on (read only
        where models are labelled)."""
        key = (label, (model or "") if self.by_model else "")
        found = self._apis.get(key)
        if found is None:
            finished: dict[str, Any] = {}

            def finish(reason: str) -> Any:
                child = finished.get(reason)
                if child is None:
                    child = finished[reason] = self.finished.labels(
                        *self._values(label, model, reason))
                return child

            values = self._values(label, model)
            found = self._apis[key] = ApiMetrics(
                ttft=self.ttft.labels(*values),
                itl=self.itl.labels(*values),
                queue=self.queue.labels(*values),
                prompt_tokens=self.prompt_tokens.labels(*values),
                cached_tokens=self.cached_tokens.labels(*values),
                generation_tokens=self.generation_tokens.labels(*values),
                disconnects=self.disconnects.labels(*values),
                timeouts=self.timeouts.labels(*values),
                finished=finish,
                later=self.later,
            )
        return found

    def for_model(self, model: str) -> ModelMetrics:
        """What one model's Service counts into (a pool's: each model's own)."""
        return ModelMetrics(self, model)

    def request_done(self, label: str, started: float, status: int,
                     ended: float | None = None, model: str | None = None) -> None:
        self.e2e.labels(*self._values(label, model)).observe(
            (ended or time.monotonic()) - started)
        self.requests.labels(*self._values(label, model, str(status))).inc()

    def watch(self, engine: Any, boot: Any = None) -> None:
        """The engine's gauges, read at each scrape; with ``boot`` (app.process.crash_guard.Boot), the
        worker deaths the master saw before this worker and whether it runs in safe mode."""
        self.registry.register(EngineCollector(engine))
        if boot is not None:
            self.registry.register(BootCollector(boot))

    def watch_pool(self, statuses: Callable[[], list[Any]], engine_of: Callable[[str], Any],
                   boot: Any = None) -> None:
        """A pool's models: each one's status and leases, and the engine gauges of each that
        has an engine, labelled by model (``statuses()``: app.core.pool.ModelStatus, every model;
        ``engine_of(name)``: its engine now, or None)."""
        self.registry.register(PoolCollector(statuses, engine_of))
        if boot is not None:
            self.registry.register(BootCollector(boot))

    def exposition(self, accept: str | None) -> Response:
        from flask import Response

        self.flush()
        encode, content_type = choose_encoder(accept or "")
        return Response(encode(self.registry), headers={"Content-Type": content_type})


class ModelMetrics:
    """One model's view of a pool's :class:`Metrics`, as a Service holds it: each API's
    children labelled with the model; everything else is the Metrics' own."""

    def __init__(self, metrics: Metrics, model: str):
        self.metrics = metrics
        self.model = model

    def api(self, label: str, model: str | None = None) -> ApiMetrics:
        return self.metrics.api(label, model or self.model)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(self.metrics, attr)


# a pooled model's status, as the pool says it (app.core.pool.ModelStatus.status)
POOL_STATUSES = ("loaded", "loading", "unloaded", "failed")


class PoolCollector:
    """A pool's models at scrape time: each model's status (one series per status, 1 for its
    own), leases, waiting requests and estimated footprint; and the :class:`EngineCollector`
    gauges of every model that has an engine (loading, loaded or unloading), with a ``model``
    label added to each of their series."""

    def __init__(self, statuses: Callable[[], list[Any]], engine_of: Callable[[str], Any]):
        self.statuses = statuses
        self.engine_of = engine_of

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Metric]:
        statuses = self.statuses()
        status = GaugeMetricFamily(
            PREFIX + "model_status", "1 for the pool status the model is in (loaded, loading, "
            "unloaded, failed), 0 for the others.", labels=["model", "status"])
        leases = GaugeMetricFamily(
            PREFIX + "model_leases", "Requests holding the model (it is neither evicted nor "
            "unloaded while any does).", labels=["model"])
        waiting = GaugeMetricFamily(
            PREFIX + "model_load_waiting", "Requests waiting for the model to load (or for room "
            "to load it, or its restart).", labels=["model"])
        unloading = GaugeMetricFamily(
            PREFIX + "model_unloading", "1 while the model takes no new requests and unloads "
            "once idle.", labels=["model"])
        need = GaugeMetricFamily(
            PREFIX + "model_estimated_bytes", "The model's estimated memory footprint (weights, "
            "KV cache, compute buffers), where it is known.", labels=["model"])
        for s in statuses:
            for value in POOL_STATUSES:
                status.add_metric([s.name, value], 1.0 if s.status == value else 0.0)
            leases.add_metric([s.name], float(s.leases))
            waiting.add_metric([s.name], float(s.waiting))
            unloading.add_metric([s.name], 1.0 if s.unloading else 0.0)
            if s.bytes is not None:
                need.add_metric([s.name], float(s.bytes))
        yield from (status, leases, waiting, unloading, need)
        merged: dict[str, Metric] = {}
        for s in statuses:
            engine = self.engine_of(s.name)
            if engine is None:
                continue
            try:
                families = list(EngineCollector(engine).collect())
            except Exception:  # noqa: BLE001 - an engine going away mid-scrape: the others
                log.debug("metrics: model %s's figures unavailable", s.name, exc_info=True)
                continue
            for family in families:
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(family.name, family.documentation,
                                                        family.type)
                for sample in family.samples:
                    into.add_sample(sample.name, {**sample.labels, "model": s.name},
                                    sample.value)
        yield from merged.values()


class EngineCollector:
    """Gauges read from the engine at scrape time: slots, KV cells, queues, the load."""

    def __init__(self, engine: Any):
        self.engine = engine

    def describe(self) -> list:
        return []  # no describe at registration: collect() reads a live engine

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from app.base.state import STAGES

        engine = self.engine
        state = engine.state
        stage = GaugeMetricFamily(
            PREFIX + "model_load_state", "1 for the stage the model is in, 0 for the others.",
            labels=["stage"])
        stages = dict.fromkeys(STAGES)
        stages[state.stage] = None
        for name in stages:
            stage.add_metric([name], 1.0 if name == state.stage else 0.0)
        yield stage
        timing = getattr(state, "seconds", {})
        if "ready" in getattr(state, "entered", {}):
            yield GaugeMetricFamily(
                PREFIX + "model_load_seconds", "Seconds the last model load took from the local "
                "file to ready (loading and warm-up; a download is counted apart).",
                value=timing.get("loading", 0.0) + timing.get("warming_up", 0.0))
            phases = GaugeMetricFamily(
                PREFIX + "model_load_phase_seconds", "Seconds each phase of the last load "
                "took (starting, downloading, loading, warming_up) and their total: a cold "
                "start's cost, and where it went.", labels=["phase"])
            for phase, secs in getattr(state, "phases", dict)().items():
                phases.add_metric([phase], secs)
            yield phases
        download = state.download
        if download is not None:
            yield GaugeMetricFamily(
                PREFIX + "model_download_bytes", "Bytes downloaded from Cloud Storage for the "
                "model (the last download).", value=float(download["downloaded_bytes"]))
            yield GaugeMetricFamily(
                PREFIX + "model_download_size_bytes", "Bytes the model download had to fetch "
                "from Cloud Storage (what the cache lacked).", value=float(download["total_bytes"]))
            secs = timing.get("downloading")
            entered = getattr(state, "entered", {}).get("downloading")
            if state.stage == "downloading" and entered is not None:
                secs = time.monotonic() - entered
            if secs is not None:
                yield GaugeMetricFamily(
                    PREFIX + "model_download_seconds", "Seconds the model download from Cloud "
                    "Storage took (so far, while it runs).", value=secs)
        try:
            rows = engine.slots() if engine.info is not None else []
            stats = engine.stats()
        except Exception:  # noqa: BLE001 - a scrape must not fail on a model mid-(un)load
            log.debug("metrics: engine figures unavailable", exc_info=True)
            return
        busy = [r for r in rows if r["is_processing"]]
        yield GaugeMetricFamily(
            PREFIX + "num_requests_running", "Requests generating in a slot.",
            value=sum(1 for r in busy if r.get("choice", 0) == 0))
        yield GaugeMetricFamily(
            PREFIX + "num_requests_waiting", "Generation requests accepted and waiting for a "
            "slot (or being prepared).", value=float(stats.get("waiting", 0)))
        yield GaugeMetricFamily(PREFIX + "slots_busy", "Slots generating (a request with n "
                                "choices takes n).", value=len(busy))
        yield GaugeMetricFamily(PREFIX + "slots_total", "Slots (PARALLEL).", value=len(rows))
        used = float(sum(r["n_kv"] for r in rows))
        total = float(sum(r["n_ctx"] for r in rows))
        yield GaugeMetricFamily(PREFIX + "kv_cache_used_cells", "KV cache cells holding tokens "
                                "(running requests, and idle slots' reusable prefixes).",
                                value=used)
        yield GaugeMetricFamily(PREFIX + "kv_cache_total_cells", "KV cache cells (PARALLEL x "
                                "the context of a slot).", value=total)
        yield GaugeMetricFamily(PREFIX + "kv_cache_usage_perc", "KV cache cells used, 0 to 1.",
                                value=used / total if total else 0.0)
        if "draft_tokens" in stats:  # speculative decoding is on
            yield CounterMetricFamily(
                PREFIX + "spec_draft_tokens", "Tokens drafted for the model to check "
                "(speculative decoding).", value=float(stats["draft_tokens"]))
            yield CounterMetricFamily(
                PREFIX + "spec_draft_tokens_accepted", "Drafted tokens the model sampled too, "
                "kept without a decode of their own; over spec_draft_tokens: the acceptance "
                "rate.", value=float(stats["draft_tokens_accepted"]))
        mtp = stats.get("mtp")
        if isinstance(mtp, dict):  # SPEC_MTP: the model's own MTP layers draft
            yield CounterMetricFamily(
                PREFIX + "spec_mtp_draft_tokens", "Tokens the model's MTP layers drafted and "
                "the model checked (part of spec_draft_tokens).", value=float(mtp["draft_tokens"]))
            yield CounterMetricFamily(
                PREFIX + "spec_mtp_draft_tokens_accepted", "MTP-drafted tokens the model sampled "
                "too.", value=float(mtp["draft_tokens_accepted"]))
        cache = stats.get("prompt_cache")
        if isinstance(cache, dict) and "bytes" in cache:  # PROMPT_CACHE_RAM_MB is on
            yield GaugeMetricFamily(PREFIX + "prompt_cache_bytes", "Host RAM held by prompts "
                                    "kept when their slot was taken.", value=cache["bytes"])
            yield GaugeMetricFamily(PREFIX + "prompt_cache_entries", "Prompts kept in the "
                                    "host-RAM prompt cache.", value=cache["entries"])
            yield CounterMetricFamily(PREFIX + "prompt_cache_restored", "Prompts copied back "
                                      "from the host-RAM prompt cache into a slot.",
                                      value=cache["restored"])
            yield CounterMetricFamily(PREFIX + "prompt_cache_restored_tokens", "Prompt tokens "
                                      "whose decode a copy back from the prompt cache spared.",
                                      value=cache["restored_tokens"])
            yield CounterMetricFamily(PREFIX + "prompt_cache_evicted", "Prompts dropped from "
                                      "the prompt cache for room.", value=cache["evicted"])
        embedder = getattr(engine, "embedder", None)
        if embedder is not None:
            waiting = embedder.stats().get("waiting", 0)
            yield GaugeMetricFamily(PREFIX + "embedding_requests_waiting", "Embedding requests "
                                    "queued for the embedding context.", value=float(waiting))


class BootCollector:
    """What this worker inherited from the crash guard: every earlier worker's death (the
    master counts them; a worker is forked after each, so its figure is always current)."""

    def __init__(self, boot: Any):
        self.boot = boot

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        crashes = CounterMetricFamily(
            PREFIX + "worker_crashes", "Worker processes that died from a signal (SIGSEGV, "
            "SIGABRT, ...; unknown: killed with no fault recorded), by the load stage they were "
            "in (ready: after the model was ready) and whether requests were in flight "
            "(in_flight: never stops the server; none: counts against CRASH_LIMIT).",
            labels=["stage", "signal", "requests"])
        counts: dict[tuple[str, str, str], int] = {}
        for c in self.boot.crashes:
            key = (c.stage, c.signal, "in_flight" if c.after_requests else "none")
            counts[key] = counts.get(key, 0) + 1
        for labels, n in sorted(counts.items()):
            crashes.add_metric(list(labels), float(n))
        yield crashes
        yield GaugeMetricFamily(
            PREFIX + "safe_mode", "1 when this worker runs in safe mode (CPU_EXTRA_BUFFERS and "
            "FLASH_ATTN off) after a worker died while loading.",
            value=1.0 if self.boot.safe_reason else 0.0)
        yield GaugeMetricFamily(
            PREFIX + "worker_backoff_seconds", "Seconds this worker waited before loading the "
            "model, because the worker before it died with requests in flight (0: none).",
            value=float(self.boot.backoff))


def install(app: Flask, metrics: Metrics, endpoints: dict[str, str]) -> None:
    """Count the requests to ``endpoints`` (Flask endpoint -> api label) and time them to the
    end of their response; serve ``GET /metrics``."""
    from flask import request

    key = "vertex_gguf.metrics"

    @app.before_request
    def _arrived() -> None:
        label = endpoints.get(request.endpoint or "")
        if label is not None:
            request.environ[key] = (label, time.monotonic())

    @app.after_request
    def _answered(resp: Response) -> Response:
        mark = request.environ.pop(key, None)
        if mark is None:
            return resp
        label, started = mark
        metrics.flush()
        # the model the request leased (app.model.catalog.pooled), read at its end
        info = reqctx.current() if metrics.by_model else None
        if resp.is_streamed:  # counted when the stream ends, however it ends
            resp.response = _on_end(resp.response, lambda: metrics.later(
                partial(metrics.request_done, label, started, resp.status_code, time.monotonic(),
                        info.model if info is not None else None)))
        else:
            metrics.request_done(label, started, resp.status_code,
                                 model=info.model if info is not None else None)
        return resp

    app.add_url_rule("/metrics", "metrics",
                     lambda: metrics.exposition(request.headers.get("Accept")), methods=["GET"])


def _on_end(body: Any, done: Callable[[], None]) -> Iterator[bytes]:
    try:
        yield from body
    finally:
        try:
            done()
        except Exception:  # noqa: BLE001 - metrics never break a response
            log.warning("metrics: recording a stream's end failed", exc_info=True)
