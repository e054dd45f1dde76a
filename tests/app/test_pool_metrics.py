"""GET /metrics of a server of several models (app/base/metrics.py PoolCollector, ModelMetrics):
every per-API series has a ``model`` label (the model the request leased; "" for one that
leased none), each model's pool status and leases are gauges, and the engine gauges of every
model that has an engine carry its name. A single-model server has no ``model`` label at all
(tests/app/test_metrics.py: its names and labels as ever)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.base.metrics import PoolCollector
from app.engine.fake import FakeEngine
from tests.support.app import make_client
from tests.support.pooled_app import HI, chat, served, wait_for

P = "vertex_gguf_"


def scrape(client: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample as {(name, sorted labels): value}."""
    resp = client.get("/metrics")
    assert resp.status_code == 200
    out = {}
    for family in text_string_to_metric_families(resp.get_data(as_text=True)):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: dict, name: str, **labels: str) -> float:
    """The sum over every series of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


def test_the_requests_and_tokens_are_counted_by_model():
    client, pool = served()
    try:
        tokens = {"alpha": 0, "beta": 0}
        for model in ("alpha", "beta", "beta-alias"):
            body = chat(client, model).get_json()
            tokens["beta" if model.startswith("beta") else "alpha"] += (
                body["usage"]["completion_tokens"])
        resp = client.post("/v1/chat/completions",
                           json={"model": "beta", "messages": HI, "stream": True})
        assert resp.status_code == 200 and b"[DONE]" in resp.get_data()
        assert chat(client, "delta").status_code == 404
        s = scrape(client)
        req = P + "requests_total"
        assert value(s, req, api="chat", status="200", model="alpha") == 1
        assert value(s, req, api="chat", status="200", model="beta") == 3  # the stream too
        assert value(s, req, api="chat", status="404", model="") == 1  # leased none
        assert value(s, P + "request_finished_total", api="chat", finish_reason="stop",
                     model="beta") == 3
        assert value(s, P + "generation_tokens_total", api="chat", model="alpha") == (
            tokens["alpha"])
        assert value(s, P + "generation_tokens_total", api="chat", model="beta") >= (
            tokens["beta"] + 1)
        assert value(s, P + "e2e_request_latency_seconds_count", api="chat", model="beta") == 3
        assert value(s, P + "time_to_first_token_seconds_count", api="chat",
                     model="alpha") == 1
        # every series of a per-API metric says its model
        for (name, labels), _v in s.items():
            if name.startswith((P + "requests", P + "generation_tokens", P + "time_to_first_token")):
                assert "model" in dict(labels), name
    finally:
        pool.shutdown()


def test_each_models_status_leases_and_engine_gauges():
    client, pool = served()
    try:
        chat(client, "beta")
        held = pool.lease("beta")
        s = scrape(client)
        held.release()
        st = P + "model_status"
        assert value(s, st, model="alpha", status="loaded") == 1
        assert value(s, st, model="beta", status="loaded") == 1
        assert value(s, st, model="gamma", status="unloaded") == 1
        assert value(s, st, model="gamma", status="loaded") == 0
        assert total(s, st, model="gamma") == 1  # one status at a time
        assert value(s, P + "model_leases", model="beta") == 1
        assert value(s, P + "model_leases", model="alpha") == 0
        assert value(s, P + "model_load_waiting", model="gamma") == 0
        # the engine gauges of the models with an engine, by model; none for gamma
        assert value(s, P + "model_load_state", model="alpha", stage="ready") == 1
        assert value(s, P + "slots_total", model="alpha") > 0
        assert value(s, P + "slots_total", model="beta") > 0
        assert total(s, P + "slots_total") == (value(s, P + "slots_total", model="alpha")
                                               + value(s, P + "slots_total", model="beta"))
        assert not [k for k in s if k[0] == P + "slots_total" and ("model", "gamma") in k[1]]
        assert (P + "slots_total", ()) not in s  # no unlabelled engine series
        assert value(s, P + "kv_cache_total_cells", model="beta") > 0
        assert value(s, P + "safe_mode") == 0  # the worker's own: not by model
        # unloaded: its engine gauges go, its status says so
        assert client.post("/models/unload", json={"model": "beta"}).status_code == 200
        wait_for(lambda: value(scrape(client), st, model="beta", status="unloaded") == 1)
        assert value(scrape(client), P + "slots_total", model="beta") == 0
    finally:
        pool.shutdown()


def test_a_vertex_envelope_counts_each_instance_under_its_model():
    client, pool = served()
    try:
        body = {"instances": [{"messages": HI, "model": "gamma"},
                              {"messages": HI, "model": "beta"}]}
        assert client.post("/predict", json=body).status_code == 200
        s = scrape(client)
        fin = P + "request_finished_total"
        assert value(s, fin, api="predict", finish_reason="stop", model="gamma") == 1
        assert value(s, fin, api="predict", finish_reason="stop", model="beta") == 1
        # the envelope is one request: counted under the first model it leased (its
        # instances lease at once: either)
        assert total(s, P + "requests_total", api="predict") == 1
        assert (value(s, P + "requests_total", api="predict", status="200", model="gamma")
                + value(s, P + "requests_total", api="predict", status="200", model="beta")) == 1
    finally:
        pool.shutdown()


def test_a_single_model_server_has_no_model_label():
    client = make_client(FakeEngine())
    client.post("/v1/chat/completions", json={"messages": HI})
    s = scrape(client)
    assert value(s, P + "requests_total", api="chat", status="200") == 1
    assert value(s, P + "slots_total") > 0
    assert not [k for k in s if "model" in dict(k[1])]
    assert not [k for k in s if k[0].startswith((P + "model_status", P + "model_leases"))]


def test_the_access_log_names_the_model(caplog):
    client, pool = served()
    try:
        with caplog.at_level(logging.INFO, logger="vertex_gguf.access"):
            chat(client, "beta-alias").close()  # the access line is written at the close
            chat(client, "delta").close()
        lines = [r for r in caplog.records if r.name == "vertex_gguf.access"]
        assert "model=beta" in lines[-2].getMessage()
        assert lines[-2].json_fields["model"] == "beta"
        assert "model=" not in lines[-1].getMessage()  # leased none
    finally:
        pool.shutdown()


def test_an_engines_counters_keep_their_type_and_names_under_the_model_label():
    class Drafting(FakeEngine):
        def stats(self) -> dict[str, int]:
            return {"waiting": 1, "draft_tokens": 10, "draft_tokens_accepted": 7}

    engine = Drafting()
    models = [SimpleNamespace(name=n, status=s, leases=0, waiting=0, unloading=False, bytes=b)
              for n, s, b in (("a", "loaded", 5), ("b", "unloaded", None))]
    registry = CollectorRegistry()
    registry.register(PoolCollector(lambda: models, lambda n: engine if n == "a" else None))
    text = generate_latest(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families[P + "spec_draft_tokens"].type == "counter"
    assert 'vertex_gguf_spec_draft_tokens_total{model="a"} 10.0' in text
    assert 'vertex_gguf_spec_draft_tokens_accepted_total{model="a"} 7.0' in text
    assert 'vertex_gguf_num_requests_waiting{model="a"} 1.0' in text
    assert 'vertex_gguf_model_estimated_bytes{model="a"} 5.0' in text
    assert 'model="b"' not in text.split(P + "model_estimated_bytes gauge")[1]
