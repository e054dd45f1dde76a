"""Fakes for the model pool's tests (app.core.pool): catalogs of real ModelSpecs, engines whose
load the test drives and which die when told, a clock the test sets."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from app.base.state import LoadState
from app.core.pool import ModelPool
from app.model.catalog import Catalog, ModelSpec
from app.settings import Settings

BASE = Settings()
GB = 10**9
LIMIT = 10.0  # seconds: the bound of every wait here


def spec(name: str, **kw: Any) -> ModelSpec:
    return ModelSpec(name=name, source=f"/models/{name}.gguf", origin="MODELS", settings=BASE,
                     **kw)


def catalog(*specs: ModelSpec, max_loaded: int = 0) -> Catalog:
    return Catalog(base=BASE, models=specs, default=specs[0].name, max_loaded=max_loaded,
                   keep_alive=300.0)


def run(job: Any) -> None:
    job()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeEngine:
    """Loads as its plan says: ``ready`` at start, ``fail`` at start, or ``hold`` until the test
    calls ``finish``."""

    def __init__(self, spec: ModelSpec, on_fatal: Any, plan: str) -> None:
        self.spec = spec
        self.on_fatal = on_fatal
        self.plan = plan
        self.state = LoadState()
        self.closed = False

    def start(self) -> None:
        if self.plan == "ready":
            self.state.set("ready", progress=1.0)
        elif self.plan == "fail":
            self.state.fail(f"cannot read {self.spec.source}")

    def finish(self, error: str | None = None) -> None:
        if error is None:
            self.state.set("ready", progress=1.0)
        else:
            self.state.fail(error)

    def die(self, reason: str) -> None:
        """As an engine that dies for good: its state failed, then its on_fatal."""
        self.state.fail(reason)
        self.on_fatal(reason)

    def shutdown(self) -> None:
        self.closed = True


class Factory:
    def __init__(self) -> None:
        self.plans: dict[str, str] = {}
        self.engines: list[FakeEngine] = []

    def __call__(self, spec: ModelSpec, on_fatal: Any) -> FakeEngine:
        engine = FakeEngine(spec, on_fatal, self.plans.get(spec.name, "ready"))
        self.engines.append(engine)
        return engine

    def of(self, name: str) -> list[FakeEngine]:
        return [e for e in self.engines if e.spec.name == name]


def make_pool(cat: Catalog, factory: Factory, **kw: Any) -> ModelPool:
    kw.setdefault("spawn", run)
    kw.setdefault("clock", Clock())
    return ModelPool(cat, factory, poll=0.005, **kw)


def status(pool: ModelPool, name: str) -> dict[str, Any]:
    return next(s.as_dict() for s in pool.statuses() if s.name == name)


def loaded(pool: ModelPool) -> list[str]:
    return [s.name for s in pool.statuses() if s.status == "loaded"]


def use(pool: ModelPool, name: str, **kw: Any) -> None:
    pool.acquire(name, **kw).release()


def executor() -> ThreadPoolExecutor:
    """Threads for acquires that wait (the tests' ``threads`` fixture)."""
    return ThreadPoolExecutor(8)
