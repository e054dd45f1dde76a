"""Several models served from one app (app/model/catalog/pooled.py, app/edge/pool_routes.py):
create_app given a catalog of three fake models, each engine made on demand. Health waits for
the preloads; /v1/models and /models show each model's status as llama-server's router does;
requests load the model they name; MODELS_MAX evicts the least recently used idle model and
never a pinned one; POST /models/load and /models/unload (the operator's key when one is set);
Ollama's /api/tags, /api/ps and its empty generate and chat that load and unload. Real engines
in their own processes: tests/e2e/test_models.py."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import pytest

from app import create_app
from app.engine.fake import FakeEngine
from app.model.catalog import Catalog, ModelSpec
from app.settings import Settings

HI = [{"role": "user", "content": "hi"}]
NAMES = ("alpha", "beta", "gamma")


class Engine(FakeEngine):
    """A fake engine that loads when the pool starts it."""

    def __init__(self, settings: Settings, on_fatal: Any) -> None:
        names = tuple((settings.served_model_name or "x").split(","))
        super().__init__(reply=f"{names[0]} says hello", aliases=names, ready=False)
        self.settings = settings
        self.on_fatal = on_fatal
        self.stopped = False

    def start(self) -> None:
        self.state.set("ready", progress=1.0)

    def shutdown(self) -> None:
        self.stopped = True


def spec(name: str, **kw: Any) -> ModelSpec:
    aliases = kw.pop("aliases", ())
    settings = Settings(served_model_name=",".join((name, *aliases)))
    return ModelSpec(name=name, source=f"/models/{name}.gguf", origin="MODELS",
                     settings=settings, aliases=aliases, size=1000, **kw)


def make(max_loaded: int = 0, pin: str = "", **settings: Any) -> tuple[Any, Any, list[Engine]]:
    specs = tuple(spec(n, preload=n == "alpha", pin=n == pin,
                       aliases=(f"{n}-alias",) if n == "beta" else ()) for n in NAMES)
    base = Settings(**settings)
    cat = Catalog(base=base, models=specs, default="alpha", max_loaded=max_loaded,
                  keep_alive=300.0)
    made: list[Engine] = []

    def engine(s: Settings, on_fatal: Any) -> Engine:
        assert s.engine_process == "on"  # every model in a process of its own
        made.append(Engine(s, on_fatal))
        return made[-1]

    app = create_app(base, catalog=cat, make_engine=engine)
    app.testing = True
    return app.test_client(), app.extensions["vertex_gguf_pool"], made


@pytest.fixture
def served() -> Iterator[tuple[Any, Any, list[Engine]]]:
    client, pool, made = make()
    wait_for(lambda: client.get("/health").status_code == 200)
    yield client, pool, made
    pool.shutdown()


def wait_for(check: Any, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def statuses(client: Any) -> dict[str, dict[str, Any]]:
    return {m["id"]: m["status"] for m in client.get("/v1/models").get_json()["data"]}


def chat(client: Any, model: str | None, **extra: Any) -> Any:
    body = {"messages": HI, **extra} | ({"model": model} if model else {})
    return client.post("/v1/chat/completions", json=body)


def test_health_waits_for_the_preloads_then_lists_every_model(served):
    client, _, made = served
    body = client.get("/health").get_json()
    assert body["status"] == "ok" and body["default"] == "alpha"
    assert {n: m["status"] for n, m in body["models"].items()} == {
        "alpha": "loaded", "beta": "unloaded", "gamma": "unloaded"}
    assert [e.settings.served_model_name for e in made] == ["alpha"]


def test_a_request_loads_the_model_it_names(served):
    client, _, made = served
    assert statuses(client) == {"alpha": {"value": "loaded"}, "beta": {"value": "unloaded"},
                                "gamma": {"value": "unloaded"}}
    resp = chat(client, "beta-alias")
    assert resp.status_code == 200 and "beta says hello" in resp.get_data(as_text=True)
    assert statuses(client)["beta"] == {"value": "loaded"}
    assert "alpha says hello" in chat(client, None).get_data(as_text=True)
    card = client.get("/v1/models/beta").get_json()
    assert card["id"] == "beta" and card["meta"]["n_ctx"] and card["aliases"][0] == "beta"


def test_a_preload_warms_up_fully_and_a_model_a_request_waits_for_lightly(served):
    """WARM_UP=auto: nothing waits on a preload (health says 503 until it is done), a
    request waits on an on-demand load: a light warm-up keeps that wait short."""
    client, _, made = served
    assert chat(client, "beta").status_code == 200
    assert {e.settings.served_model_name.split(",")[0]: e.settings.warm_up
            for e in made} == {"alpha": "full", "beta": "light"}


def test_a_warm_up_a_models_settings_name_is_kept():
    specs = (spec("alpha", preload=True),
             dataclasses.replace(spec("gamma"), settings=Settings(
                 served_model_name="gamma", warm_up="full")))
    cat = Catalog(base=Settings(), models=specs, default="alpha", max_loaded=0,
                  keep_alive=300.0)
    made: list[Engine] = []
    app = create_app(Settings(), catalog=cat,
                     make_engine=lambda s, fatal: made.append(Engine(s, fatal)) or made[-1])
    app.testing = True
    client, pool = app.test_client(), app.extensions["vertex_gguf_pool"]
    try:
        wait_for(lambda: client.get("/health").status_code == 200)
        assert chat(client, "gamma").status_code == 200
        assert [e.settings.warm_up for e in made] == ["full", "full"]
    finally:
        pool.shutdown()


def test_health_says_what_each_loaded_models_load_cost(served):
    client, _, _ = served
    assert chat(client, "beta").status_code == 200
    models = client.get("/health").get_json()["models"]
    assert set(models["beta"]["cold_start"]) >= {"starting", "total"}
    assert "cold_start" not in models["gamma"]  # not loaded


def test_an_unknown_model_is_a_404_naming_the_models(served):
    client, _, _ = served
    resp = chat(client, "delta")
    assert resp.status_code == 404
    err = resp.get_json()["error"]
    assert err["code"] == "model_not_found" and "alpha, beta, gamma" in err["message"]


def test_models_max_evicts_the_least_recently_used_idle_model():
    client, pool, made = make(max_loaded=2)
    try:
        wait_for(lambda: client.get("/health").status_code == 200)
        chat(client, "beta")
        chat(client, "alpha")  # beta is now the least recently used
        assert chat(client, "gamma").status_code == 200
        wait_for(lambda: statuses(client)["beta"] == {"value": "unloaded"})
        assert statuses(client)["alpha"] == {"value": "loaded"}
        assert [e.stopped for e in made] == [False, True, False]
    finally:
        pool.shutdown()


def test_a_pinned_model_is_never_evicted():
    client, pool, _ = make(max_loaded=2, pin="alpha")
    try:
        wait_for(lambda: client.get("/health").status_code == 200)
        chat(client, "beta")
        chat(client, "gamma")  # alpha is the least recently used, but pinned
        wait_for(lambda: statuses(client)["beta"] == {"value": "unloaded"})
        assert statuses(client)["alpha"] == {"value": "loaded"}
        assert client.get("/v1/models").get_json()["data"][0]["pinned"] is True
    finally:
        pool.shutdown()


def test_the_operator_loads_and_unloads(served):
    client, _, _ = served
    resp = client.post("/models/load", json={"model": "gamma"})
    assert resp.status_code == 200 and resp.get_json()["success"] is True
    assert client.get("/models").get_json()["data"][2]["status"] == {"value": "loaded"}
    resp = client.post("/models/unload", json={"model": "gamma"})
    assert resp.get_json() == {"success": True, "result": "unloaded"}
    wait_for(lambda: statuses(client)["gamma"] == {"value": "unloaded"})
    assert client.post("/models/load", json={}).status_code == 400
    assert client.post("/models/load", json={"model": "nope"}).status_code == 404


def test_the_operators_routes_take_the_admin_key_when_one_is_set():
    client, pool, _ = make(admin_api_key="root-key-0123456789abcdef", api_key="user-key-0123456789abcdef")
    try:
        user = {"Authorization": "Bearer user-key-0123456789abcdef"}
        admin = {"Authorization": "Bearer root-key-0123456789abcdef"}
        assert client.post("/models/load", json={"model": "beta"}, headers=user).status_code \
            == 403
        assert client.post("/models/load", json={"model": "beta"}, headers=admin).status_code \
            == 200
        assert client.get("/v1/models", headers=user).status_code == 200
    finally:
        pool.shutdown()


def test_the_routes_without_a_lease_answer_while_the_default_is_unloaded(served):
    client, _, _ = served
    assert client.post("/models/unload", json={"model": "alpha"}).status_code == 200
    wait_for(lambda: statuses(client)["alpha"] == {"value": "unloaded"})
    assert client.get("/props").status_code == 503
    assert client.post("/tokenize", json={"content": "hi"}).status_code == 503
    assert client.get("/metrics").status_code == 200
    assert client.get("/health").status_code == 200  # the preloads were loaded: still ready
    assert chat(client, None).status_code == 200  # the default loads again on demand
    assert client.get("/props").status_code == 200


def test_ollama_lists_every_model_and_the_loaded_ones(served):
    client, _, _ = served
    tags = client.get("/api/tags").get_json()["models"]
    assert [t["name"] for t in tags] == ["alpha:latest", "beta:latest", "gamma:latest"]
    assert tags[1]["size"] == 1000 and tags[0]["details"]["family"] == "llama"
    ps = client.get("/api/ps").get_json()["models"]
    assert [p["name"] for p in ps] == ["alpha:latest"]
    assert ps[0]["expires_at"].endswith("Z") and ps[0]["size_vram"] == 0


def test_ollamas_empty_requests_load_and_keep_alive_0_unloads(served):
    client, _, _ = served
    resp = client.post("/api/generate", json={"model": "gamma"})
    assert resp.get_json()["done_reason"] == "load" and resp.get_json()["response"] == ""
    assert statuses(client)["gamma"] == {"value": "loaded"}
    resp = client.post("/api/chat", json={"model": "gamma", "messages": [], "keep_alive": 0})
    assert resp.get_json()["done_reason"] == "unload"
    assert resp.get_json()["message"] == {"role": "assistant", "content": ""}
    wait_for(lambda: statuses(client)["gamma"] == {"value": "unloaded"})
    resp = client.post("/api/chat", json={"model": "beta", "messages": HI, "stream": False,
                                          "keep_alive": 0})
    assert resp.status_code == 200 and "beta says hello" in resp.get_json()["message"]["content"]
    wait_for(lambda: statuses(client)["beta"] == {"value": "unloaded"})


def test_a_vertex_envelope_loads_what_its_instances_name(served):
    client, _, _ = served
    client.post("/models/unload", json={"model": "alpha"})
    wait_for(lambda: statuses(client)["alpha"] == {"value": "unloaded"})
    body = {"instances": [{"messages": HI, "model": "gamma"}, {"messages": HI, "model": "beta"}]}
    resp = client.post("/predict", json=body)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    preds = resp.get_json()["predictions"]
    assert ["gamma says" in str(preds[0]), "beta says" in str(preds[1])] == [True, True]
    assert statuses(client)["alpha"] == {"value": "unloaded"}


def test_the_load_events_of_an_unloaded_default_end_at_once(served):
    client, _, _ = served
    client.post("/models/unload", json={"model": "alpha"})
    wait_for(lambda: statuses(client)["alpha"] == {"value": "unloaded"})
    text = client.get("/models/sse").get_data(as_text=True)
    assert text.count("event: model_status") == 1 and '"status": "unloaded"' in text.replace(
        '"status":"unloaded"', '"status": "unloaded"')
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'model_status{model="alpha",status="unloaded"} 1.0' in metrics


def test_a_stalled_model_is_said_on_health_while_the_others_serve(served):
    client, _, made = served
    made[0].stall = "a step has run for 99 s"
    resp = client.get("/health")
    assert resp.status_code == 200
    assert resp.get_json()["models"]["alpha"]["stalled"] == "a step has run for 99 s"
    assert chat(client, "beta").status_code == 200


def test_a_draining_server_loads_nothing_new(served):
    client, pool, _ = served
    pool.drain()
    resp = chat(client, "gamma")
    assert resp.status_code == 503 and statuses(client)["gamma"] == {"value": "unloaded"}
    assert client.post("/models/load", json={"model": "gamma"}).status_code == 503


def test_the_introspection_routes_take_a_model_by_query(served):
    client, _, _ = served
    assert client.get("/props?model=beta").status_code == 503  # not loaded, and not loaded here
    assert client.get("/props?model=nope").status_code == 404
    chat(client, "beta")
    props = client.get("/props?model=beta-alias")
    assert props.status_code == 200
    assert client.post("/tokenize?model=beta", json={"content": "hi"}).status_code == 200
    assert client.post("/v1/chat/completions/control",
                       json={"id": "chatcmpl-none", "action": "reasoning_end"}).get_json() == {
        "success": False}


def test_the_memory_budget_evicts_for_room_and_refuses_a_model_past_it(monkeypatch):
    """MEMORY_BUDGET_GB=CPU=1: two models of 0.6 GiB (their files' bytes: these sources are not
    here to read) do not fit together, so the second evicts the first; one of 3 GiB never
    fits: a 503 model_too_large naming what it needs and what is free, in each API's shape."""
    from app.engine import memory_budget
    from app.engine.memory_budget import GIB, Free

    monkeypatch.setattr(memory_budget, "host", lambda root="/": Free(
        "CPU", 64 * GIB, 128 * GIB, "test"))
    monkeypatch.setattr("app.model.catalog.memory.gpu_present", lambda *a: False)
    sizes = {"alpha": int(0.6 * GIB), "beta": int(0.6 * GIB), "gamma": 3 * GIB}
    specs = tuple(dataclasses.replace(spec(n, preload=n == "alpha"), size=sizes[n])
                  for n in NAMES)
    base = Settings(memory_budget_gb="CPU=1")
    cat = Catalog(base=base, models=specs, default="alpha", max_loaded=0, keep_alive=300.0)
    made: list[Engine] = []

    def engine(s: Settings, on_fatal: Any) -> Engine:
        made.append(Engine(s, on_fatal))
        return made[-1]

    app = create_app(base, catalog=cat, make_engine=engine)
    client, pool = app.test_client(), app.extensions["vertex_gguf_pool"]
    try:
        wait_for(lambda: client.get("/health").status_code == 200)
        assert chat(client, "beta").status_code == 200
        wait_for(lambda: statuses(client)["alpha"] == {"value": "unloaded"})
        assert statuses(client)["beta"] == {"value": "loaded"}
        assert made[0].stopped is True
        resp = chat(client, "gamma")
        assert resp.status_code == 503
        err = resp.get_json()["error"]
        assert err["code"] == "model_too_large"
        assert "needs 3.22 GB" in err["message"] and "budget of 1.07 GB" in err["message"]
        resp = client.post("/v1/messages", json={"model": "gamma", "max_tokens": 8,
                                                 "messages": HI})
        body = resp.get_json()
        assert resp.status_code == 503 and body["type"] == "error"
        assert "needs 3.22 GB" in body["error"]["message"]
        assert statuses(client)["beta"] == {"value": "loaded"}  # nothing evicted for it
    finally:
        pool.shutdown()


def test_a_preload_past_the_memory_budget_is_a_start_up_error(monkeypatch):
    from app.engine import memory_budget
    from app.engine.memory_budget import GIB, Free

    monkeypatch.setattr(memory_budget, "host", lambda root="/": Free(
        "CPU", 64 * GIB, 128 * GIB, "test"))
    monkeypatch.setattr("app.model.catalog.memory.gpu_present", lambda *a: False)
    specs = (dataclasses.replace(spec("alpha", preload=True), size=3 * GIB),)
    base = Settings(memory_budget_gb="CPU=1")
    cat = Catalog(base=base, models=specs, default="alpha", max_loaded=0, keep_alive=300.0)
    fatal: list[str] = []
    app = create_app(base, catalog=cat, make_engine=lambda s, f: Engine(s, f),
                     on_fatal=fatal.append)
    client, pool = app.test_client(), app.extensions["vertex_gguf_pool"]
    try:
        wait_for(lambda: bool(fatal))
        assert "needs 3.22 GB" in fatal[0]
        body = client.get("/health").get_json()
        assert client.get("/health").status_code == 503 and "needs 3.22 GB" in str(body)
    finally:
        pool.shutdown()


@pytest.mark.parametrize(("source", "imported"), [
    ("gs://bucket/beta/", True), ("/models/beta.gguf", False)])
def test_the_storage_client_library_is_imported_at_start_when_a_model_is_on_gcs(
        monkeypatch, source, imported):
    """Imported by a load's thread instead, the import held the interpreter lock for 0.14 s,
    a gap in every stream the web process relays."""
    from app.model import gcs

    calls: list[bool] = []
    monkeypatch.setattr(gcs, "import_client_library", lambda: calls.append(True))
    specs = (spec("alpha", preload=True), dataclasses.replace(spec("beta"), source=source))
    cat = Catalog(base=Settings(), models=specs, default="alpha", max_loaded=0,
                  keep_alive=300.0)
    app = create_app(Settings(), catalog=cat,
                     make_engine=lambda s, fatal: Engine(s, fatal))
    try:
        assert calls == ([True] if imported else [])
    finally:
        app.extensions["vertex_gguf_pool"].shutdown()
