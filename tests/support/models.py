"""A fake Models (app.core.models) of two services on two fake engines, for the tests of
which model a request reaches and how long it holds it (tests/app/test_model_routing.py,
tests/app/test_model_leases.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

from app import create_app, plan_options
from app.base.errors import ModelNotFound, Overloaded
from app.core.models import ModelLease, Models
from app.core.service import Service
from app.engine.fake import FakeEngine
from app.engine.fake_embed import FakeEmbedder
from app.settings import Settings

A, B = "model-a", "model-b"
HI = [{"role": "user", "content": "hi"}]
DIMS = {A: 16, B: 8}  # each model's embedding size: which one embedded shows in the answer


class FakeModels(Models):
    """Two (or more) services by name, the first the default; every lease counted."""

    def __init__(self, services: dict[str, Service]):
        self.services = services
        self.asked: list[tuple[str | None, float | None]] = []
        self.live: Counter[str] = Counter()  # leases held now, per model
        self.opened = 0
        self.released = 0
        self.busy = False

    @property
    def default_service(self) -> Service:
        return next(iter(self.services.values()))

    def lease(self, name: str | None, keep_alive: float | None = None) -> ModelLease:
        self.asked.append((name, keep_alive))
        key = name or next(iter(self.services))
        if key not in self.services:
            raise ModelNotFound(f"The model {name!r} does not exist: the models are "
                                f"{', '.join(self.services)}", param="model")
        if self.busy:
            err = Overloaded(f"no room to load {key} now: every loaded model is in use")
            err.retry_after = 7
            raise err
        self.opened += 1
        self.live[key] += 1

        def release() -> None:
            self.live[key] -= 1
            self.released += 1

        return ModelLease(self.services[key], release)

    def settled(self) -> bool:
        """Every lease given back, each once."""
        return self.released == self.opened and not +self.live


def engines(rerank: bool = False) -> dict[str, FakeEngine]:
    out = {}
    for name, reply in ((A, "alpha says hello"), (B, "beta says goodbye")):
        eng = FakeEngine(reply=reply, aliases=(name,))
        if rerank:
            eng.embedder = FakeEmbedder(pooling="rank", n_ctx=256, only=True)  # type: ignore[attr-defined]
            eng._info = replace(eng._info, reranks=True, control_texts=("</s>", "<s>", "<unk>"))
        else:
            eng.embedder = FakeEmbedder(n_embd=DIMS[name])  # type: ignore[attr-defined]
        out[name] = eng
    return out


def two_models(rerank: bool = False, **settings: Any) -> tuple[Any, FakeModels,
                                                               dict[str, FakeEngine]]:
    """A test client over models A (the default) and B."""
    s = Settings(**settings)
    engs = engines(rerank)
    made: list[FakeModels] = []

    def models(default: Service) -> Models:
        other = Service(engs[B], plan_options(s), prepare_timeout=s.prepare_timeout)
        made.append(FakeModels({A: default, B: other}))
        return made[0]

    app = create_app(s, engine=engs[A], models=models)
    app.testing = True
    return app.test_client(), made[0], engs


def counts(engs: dict[str, FakeEngine]) -> dict[str, int]:
    return {name: len(e.requests) for name, e in engs.items()}


def embed_counts(engs: dict[str, FakeEngine]) -> dict[str, int]:
    return {name: len(e.embedder.requests) for name, e in engs.items()}  # type: ignore[attr-defined]
