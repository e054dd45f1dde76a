"""PooledModels (app/model/catalog/pooled.py) on its own: every model's engine made with
ENGINE_PROCESS=on and the model's own settings, one Service per model for its whole life, a
lease that waits for a load without holding up the gevent hub, and the view of an unloaded
model's engine. Through create_app and the routes: tests/app/test_pooled_models.py."""

from __future__ import annotations

from typing import Any

import gevent
import pytest

from app.base.errors import ModelNotReady
from app.base.state import LoadState
from app.base.threads import original_sleep, start_native_thread
from app.model.catalog import Catalog, ModelSpec
from app.model.catalog.pooled import PooledModels
from app.settings import Settings


class Slow:
    """An engine that takes ``delay`` s to load, on a thread of its own."""

    def __init__(self, settings: Settings, delay: float) -> None:
        self.settings = settings
        self.delay = delay
        self.state = LoadState()
        self.info = None
        self.stopped = False

    def start(self) -> None:
        def load() -> None:
            original_sleep(self.delay)
            self.state.set("ready", progress=1.0)

        start_native_thread(load)

    def shutdown(self) -> None:
        self.stopped = True

    def queue_depth(self) -> int:
        return 7


def models(delay: float = 0.0) -> tuple[PooledModels, list[Slow]]:
    specs = tuple(ModelSpec(name=n, source=f"/m/{n}.gguf", origin="MODELS",
                            settings=Settings(served_model_name=n, ctx_size=c))
                  for n, c in (("a", 1024), ("b", 2048)))
    cat = Catalog(base=Settings(), models=specs, default="a", max_loaded=0, keep_alive=300.0)
    made: list[Slow] = []

    def engine(settings: Settings, on_fatal: Any) -> Slow:
        made.append(Slow(settings, delay))
        return made[-1]

    return PooledModels(cat, engine, lambda eng, s: (eng, s.ctx_size)), made  # type: ignore[arg-type,return-value]


def test_each_model_runs_in_its_own_process_with_its_own_settings():
    pool, made = models()
    with pool.lease("b") as lease:
        assert lease.service == (pool.engines["b"], 2048)
    assert [(e.settings.engine_process, e.settings.ctx_size) for e in made] == [("on", 2048)]
    assert pool.default_service == (pool.engines["a"], 1024)
    pool.shutdown()


def test_an_unloaded_models_engine_says_so_harmlessly():
    pool, _ = models()
    view = pool.engines["a"]
    assert view.info is None and view.state.stage == "unloaded" and view.slots() == []
    assert view.stats() == {} and view.stalled(5) is None and view.queue_depth() == 0
    with pytest.raises(ModelNotReady):
        view.tokenize("x", True, True)
    with pytest.raises(AttributeError):
        view.no_such_thing  # noqa: B018
    pool.lease("a").release()
    assert view.queue_depth() == 7  # the loaded engine's own answer
    view.shutdown()  # the pool's job, not the view's
    assert pool.pool.engine("a").stopped is False
    pool.shutdown()
    assert pool.pool.engine("a") is None


def test_a_lease_waits_for_its_load_without_holding_up_the_hub():
    pool, _ = models(delay=0.5)
    ticks = []

    def tick() -> None:
        for _ in range(100):
            ticks.append(1)
            gevent.sleep(0.01)

    other = gevent.spawn(tick)
    waiter = gevent.spawn(pool.lease, "b")
    waiter.join(10)
    lease = waiter.get()
    assert len(ticks) >= 20  # the other greenlet ran while the lease waited for the load
    lease.release()
    other.kill()
    pool.shutdown()
