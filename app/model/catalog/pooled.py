"""Several models served at once: a catalog's models in a ModelPool (app.core.pool), each in an
engine process of its own, behind the Models seam every API leases from (docs/models.md).

Each model has ONE Service for the life of the server, over a :class:`SpecEngine`: a view of
whatever engine the pool holds for that model now. A request's lease keeps that engine loaded
while the request runs; the routes that hold no lease (/props, /tokenize, the default model's
card) read the view, which says ``model_not_ready`` while the model is unloaded rather than
failing. One Service per model keeps what lives beside a model across its reloads: reasoning
control's live runs, LoRA default scales.

The factories come in from the composition root (create_app), so nothing here imports upward:
``make_engine(settings, on_fatal)`` builds an engine for a model's settings (always with
ENGINE_PROCESS=on: one model's native crash ends its own process, never another model's),
``make_service(engine, settings)`` its Service with the model's own plan options.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from app.base import reqctx
from app.base.errors import ModelNotFound, ModelNotReady, ShuttingDown
from app.base.threads import start_native_thread
from app.core.models import Listed, ModelLease, Models
from app.core.pool import ModelPool, ModelStatus, PoolEngine
from app.core.service import Service
from app.model.catalog.spec import Catalog, ModelSpec
from app.settings import Settings

log = logging.getLogger(__name__)

MakeEngine = Callable[[Settings, Callable[[str], None]], PoolEngine]
MakeService = Callable[[Any, Settings], Service]


class Unloaded:
    """The load state of a model that has no engine: read as a LoadState is (health, the
    metrics' stage gauge, /models/sse), never written."""

    stage = "unloaded"
    ready = False
    error: str | None = None
    progress: float | None = None
    detail: str | None = None
    download: dict | None = None
    version = 0
    seconds: dict[str, float] = {}
    entered: dict[str, float] = {}

    def snapshot(self) -> dict[str, Any]:
        return {"status": "unloaded", "stage": "unloaded"}


UNLOADED = Unloaded()

# what a model without an engine answers, where an engine would answer something harmless
_IDLE: dict[str, Any] = {
    "state": UNLOADED, "info": None, "embedder": None, "pid": None, "sleeping": False,
    "slots": lambda: [], "queue_depth": lambda: 0, "stats": lambda: {},
    "stalled": lambda limit: None, "drain": lambda: None, "abort": lambda message: None,
}
# what needs the model loaded: a ModelNotReady (503) rather than an AttributeError (500)
_NEEDS_MODEL = ("submit", "count_tokens", "prompt_tokens", "tokenize", "pieces")


class SpecEngine:
    """One model's engine as its Service sees it: the engine the pool holds for it now
    (loading, loaded or closing), else an unloaded model's harmless answers."""

    def __init__(self, name: str, current: Callable[[], Any]) -> None:
        self._name = name
        self._current = current

    @property
    def pool_name(self) -> str:
        """The model's name in the catalog (what its metrics are labelled with)."""
        return self._name

    @property
    def engine(self) -> Any:
        """The pool's engine of this model now, or None."""
        return self._current()

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: the pool shuts its engines down (PooledModels.shutdown)."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        engine = self._current()
        if engine is not None:
            return getattr(engine, attr)
        if attr in _IDLE:
            return _IDLE[attr]
        if attr in _NEEDS_MODEL:
            raise ModelNotReady(f"model {self._name} is not loaded")
        raise AttributeError(attr)


class PooledModels(Models):
    """The catalog's models, loaded on demand by a ModelPool and leased per request."""

    pooled = True

    def __init__(self, catalog: Catalog, make_engine: MakeEngine, make_service: MakeService,
                 on_fatal: Callable[[str], None] | None = None,
                 on_ready: Callable[[], None] | None = None, spares: Any = None,
                 **pool_options: Any) -> None:
        """``on_fatal``: a preload that failed (a start-up error: the server stops, as a single
        model's failed load stops it); a model failing later is that model's alone.
        ``on_ready``: the preloads are loaded (at once when there are none). ``spares``: the
        engine processes started ahead (app.engine.spare), closed with the pool."""
        self.catalog = catalog
        self.spares = spares
        self._on_fatal = on_fatal
        self._on_ready = on_ready
        self._make_engine = make_engine
        self.pool = ModelPool(catalog, self._make, **pool_options)
        self.engines = {spec.name: SpecEngine(spec.name, partial(self.pool.engine, spec.name))
                        for spec in catalog.models}
        self.services = {spec.name: make_service(self.engines[spec.name], spec.settings)
                         for spec in catalog.models}
        self.preload_error: str | None = None
        self.draining = False
        self.preloaded = not any(spec.preload for spec in catalog.models)

    def _make(self, spec: ModelSpec, on_fatal: Callable[[str], None]) -> PoolEngine:
        """The model's engine: in its own process, whatever ENGINE_PROCESS says. WARM_UP=auto:
        a full warm-up while the preloads load (no request waits: the server is not ready
        yet), a light one once a request is what asks for the model (it waits for the load,
        and models beside it serve)."""
        update: dict[str, Any] = {"engine_process": "on"}
        if spec.settings.warm_up == "auto":
            update["warm_up"] = "light" if self.preloaded else "full"
        return self._make_engine(spec.settings.model_copy(update=update), on_fatal)

    # ---- the Models seam ------------------------------------------------------------------
    @property
    def default_service(self) -> Service:
        return self.services[self.catalog.default]

    @property
    def default_engine(self) -> SpecEngine:
        return self.engines[self.catalog.default]

    def lease(self, name: str | None, keep_alive: float | None = None) -> ModelLease:
        """The pool's lease (a load first when the model is not loaded: the pool's waits park
        the calling greenlet, never the hub), carrying the model's Service."""
        if self.draining:  # SIGTERM: nothing new loads; the load balancer retries elsewhere
            raise ShuttingDown("server is shutting down")
        held = self.pool.acquire(name, keep_alive)
        _note(held.name)
        return ModelLease(self.services[held.name], held.release)

    def load(self, name: str | None, keep_alive: float | None = None) -> str:
        if self.draining:
            raise ShuttingDown("server is shutting down")
        result = self.pool.load(name, keep_alive)
        spec = self.catalog.get(name)
        if spec is not None:
            _note(spec.name)
        return result

    def unload(self, name: str | None) -> str:
        return self.pool.unload(name)

    def listing(self) -> list[Listed]:
        """Every model with its status, and its ModelInfo when its engine has one."""
        wall = time.time()
        out = []
        for status in self.pool.statuses():
            spec = self.catalog.get(status.name)
            assert spec is not None
            engine = self.pool.engine(status.name)
            info = engine.info if engine is not None else None
            expires = None if status.expires_in is None else wall + status.expires_in
            out.append(Listed(status.name, spec.aliases, status, info, spec.size,
                              spec.files[0] if spec.files else spec.source, expires))
        return out

    def service_named(self, name: str | None) -> Service:
        """The Service of the model ``name`` names (None: the default), loaded or not (a route
        that takes ``?model=`` and holds no lease: /props, /slots, /tokenize, /models/sse)."""
        return self.services[self.spec_named(name).name]

    def spec_named(self, name: str | None) -> ModelSpec:
        """The catalog's entry for the model ``name`` names (None: the default): its own
        settings, which /props and /slots show rather than the server's; a 404 naming the
        models for a name none answers to."""
        spec = self.catalog.get(name)
        if spec is None:
            assert name is not None
            raise ModelNotFound(f"The model {name[:100]!r} does not exist: the models are "
                                f"{', '.join(self.catalog.names)}", param="model")
        return spec

    def canonical(self, name: str | None) -> str | None:
        spec = self.catalog.get(name)
        return spec.name if spec is not None else None

    # ---- start and end ----------------------------------------------------------------------
    def start(self, sweep_interval: float = 1.0) -> None:
        """Preload in the background (health says 503 until done) and sweep for keep_alive."""
        self.pool.start_sweeper(sweep_interval)
        if not self.preloaded:
            start_native_thread(self._preload)
        elif self._on_ready is not None:
            self._on_ready()

    def _preload(self) -> None:
        try:
            names = self.pool.preload(timeout=math.inf)
        except Exception as exc:  # noqa: BLE001 - said on /health, and in the log
            self.preload_error = str(getattr(exc, "message", "") or exc)
            log.error("preloading the models failed: %s", self.preload_error)
            if self._on_fatal is not None:
                self._on_fatal(self.preload_error)
            return
        self.preloaded = True
        log.info("preloaded: %s", ", ".join(names))
        if self._on_ready is not None:
            self._on_ready()

    def ready(self) -> bool:
        """Whether the platform may route traffic: the preloads loaded (and not failed)."""
        return self.preloaded and self.preload_error is None

    def statuses(self) -> list[ModelStatus]:
        return self.pool.statuses()

    def shutdown(self) -> None:
        if self.spares is not None:
            self.spares.close()
        self.pool.shutdown()

    def drain(self) -> None:
        """SIGTERM: every loaded model refuses new requests, no model loads; those in flight
        go on."""
        self.draining = True
        for engine in self._engines():
            engine.drain()

    def abort(self, message: str) -> None:
        for engine in self._engines():
            engine.abort(message)

    def _engines(self) -> list[Any]:
        return [e for e in (self.pool.engine(n) for n in self.catalog.names) if e is not None]


def _note(name: str) -> None:
    """The request's model, for its metrics' and access log's ``model`` (the first it
    leased: a predict envelope's instances may name several)."""
    info = reqctx.current()
    if info is not None and info.model is None:
        info.model = name
