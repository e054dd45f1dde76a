"""A server of several models in process (create_app given a catalog): three fake models,
alpha (preloaded, the default), beta (alias beta-alias) and gamma, each engine made when the
pool loads it. For the tests of what a pool shows (/metrics, the model lists); the pool's own
behaviour: tests/app/test_pooled_models.py."""

from __future__ import annotations

import time
from typing import Any

from app import create_app
from app.engine.fake import FakeEngine
from app.model.catalog import Catalog, ModelSpec
from app.settings import Settings

HI = [{"role": "user", "content": "hi"}]
MODELS = (("alpha", ()), ("beta", ("beta-alias",)), ("gamma", ()))


class Engine(FakeEngine):
    """A fake engine that loads when the pool starts it."""

    def __init__(self, settings: Settings, on_fatal: Any) -> None:
        name = settings.served_model_name or "x"
        super().__init__(reply=f"{name.split(',')[0]} says hello",
                         aliases=tuple(name.split(",")), ready=False)

    def start(self) -> None:
        self.state.set("ready", progress=1.0)

    def shutdown(self) -> None:
        pass


def served(**settings: Any) -> tuple[Any, Any]:
    """The test client and the PooledModels, once /health says the preloads are loaded."""
    specs = tuple(ModelSpec(name=n, source=f"/models/{n}.gguf", origin="MODELS",
                            settings=Settings(served_model_name=",".join((n, *aliases))),
                            aliases=aliases, size=1000, preload=n == "alpha")
                  for n, aliases in MODELS)
    base = Settings(**settings)
    cat = Catalog(base=base, models=specs, default="alpha", max_loaded=0, keep_alive=300.0)
    app = create_app(base, catalog=cat, make_engine=Engine)
    app.testing = True
    client = app.test_client()
    wait_for(lambda: client.get("/health").status_code == 200)
    return client, app.extensions["vertex_gguf_pool"]


def wait_for(check: Any, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def chat(client: Any, model: str) -> Any:
    return client.post("/v1/chat/completions", json={"messages": HI, "model": model})
