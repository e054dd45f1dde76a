"""One model's place in the pool, what the pool needs of a catalog and an engine, and where
a new model finds room: the pool's bookkeeping, free of threads, so each rule reads alone."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from app.base.errors import ModelTooLarge
from app.base.state import LoadState

# an entry's status: ``closing`` (its engine shutting down, still holding its room) is shown as
# loaded and unloading; ``loaded`` with its engine restarting after a crash as loading
STATUSES = ("unloaded", "loading", "loaded", "closing", "failed")
HOLDS_ROOM = ("loading", "loaded", "closing")
ANY = ""  # the device of a footprint or budget given as one number

# bytes, or bytes per device (app.engine.footprint's devices: "CPU", "CUDA0", ...)
Bytes = int | Mapping[str, int]


class Spec(Protocol):
    """What the pool reads of a model (app.model.catalog.ModelSpec, which this layer may not
    import: the catalog sits above the core, beside the sources it resolves)."""

    @property
    def name(self) -> str: ...
    @property
    def aliases(self) -> tuple[str, ...]: ...
    @property
    def pin(self) -> bool: ...
    @property
    def preload(self) -> bool: ...
    @property
    def keep_alive(self) -> float: ...


class CatalogLike(Protocol):
    """What the pool reads of a catalog (app.model.catalog.Catalog)."""

    @property
    def models(self) -> Sequence[Spec]: ...
    @property
    def max_loaded(self) -> int: ...
    @property
    def names(self) -> tuple[str, ...]: ...
    def get(self, name: str | None) -> Spec | None: ...


class PoolEngine(Protocol):
    """The part of the Engine interface (app.engine.types) a pool drives: LlamaEngine and
    RemoteEngine start loading on ``start`` and say how it goes in ``state``."""

    state: LoadState

    def start(self) -> None: ...
    def shutdown(self) -> None: ...


def per_device(value: Bytes | None) -> dict[str, int] | None:
    """A footprint or budget as bytes per device; one number is the device ANY."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return {dev: int(n) for dev, n in value.items()}
    return {ANY: int(value)}


def keep_seconds(value: float | None, default: float) -> float:
    """Ollama's keep_alive as seconds of idleness: None the model's own, 0 at once, negative
    (or inf) never."""
    if value is None:
        value = default
    return math.inf if value < 0 else float(value)


class Entry:
    """A model of the catalog, as the pool holds it; read and written under the pool's lock.

    ``gen`` counts the engines the entry has had: an engine's late news (its fatal callback, a
    lease of it ended) is for its own generation only, never the one that replaced it.
    """

    __slots__ = ("spec", "status", "engine", "error", "gen", "leases", "waiters", "unloading",
                 "fatal", "poke", "need", "estimated", "last_used", "expires_at")

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.status = "unloaded"
        self.engine: Any = None
        self.error: str | None = None
        self.gen = 0
        self.leases = 0
        self.waiters = 0  # acquires waiting (for its load, its room, its restart)
        self.unloading = False  # asked to unload: no new leases, unloaded once idle
        self.fatal: str | None = None  # its engine's fatal reason, told while it loads
        self.poke: Any = None  # the loader's Reply, woken by a fatal or an unload
        self.need: dict[str, int] | None = None  # its estimated footprint, once known
        self.estimated = False  # the estimate asked (it may have said None: unknown)
        self.last_used: float | None = None
        self.expires_at: float | None = None  # when idleness unloads it; None: never (or busy)

    @property
    def holds_room(self) -> bool:
        return self.status in HOLDS_ROOM

    @property
    def ready(self) -> bool:
        """Loaded, taking leases, and its engine serving (not restarting after a crash)."""
        return (self.status == "loaded" and not self.unloading
                and self.engine.state.stage == "ready")

    @property
    def evictable(self) -> bool:
        return self.status == "loaded" and self.leases == 0 and not self.spec.pin


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e7 else f"{n} bytes"


def _on(x: Entry, dev: str) -> int:
    """What ``x`` needs of the budget's device ``dev``: one number counts against a single
    budget whole, and against each device of a budget per device (it may land anywhere)."""
    need = x.need or {}
    if dev == ANY:
        return sum(need.values())
    return need.get(dev, need.get(ANY, 0))


def plan_room(entry: Entry, entries: Iterable[Entry], max_loaded: int,
              budget: dict[str, int] | None) -> list[Entry] | None:
    """The idle models to unload so ``entry`` can load: least recently used first, never a
    pinned one, the fewest that make room within ``max_loaded`` (0: no limit) and ``budget``
    (bytes per device; None: no check; a device it does not name is not checked; a model of
    unknown footprint counts nothing). None: only models busy now (leased, loading, closing)
    stand in the way, so wait for them. Raises ModelTooLarge when even every model that may
    ever be unloaded gone would not do."""
    held = [x for x in entries if x is not entry and x.holds_room]
    caps = budget or {}

    def over(rest: list[Entry]) -> list[str]:
        return [dev for dev, cap in caps.items()
                if sum(_on(x, dev) for x in rest) + _on(entry, dev) > cap]

    def fits(gone: list[Entry]) -> bool:
        rest = [x for x in held if x not in gone]
        return (not max_loaded or len(rest) + 1 <= max_loaded) and not over(rest)

    gone: list[Entry] = []
    if fits(gone):
        return gone
    idle = sorted((x for x in held if x.evictable), key=lambda x: x.last_used or 0.0)
    for x in idle:
        gone.append(x)
        if fits(gone):
            return gone
    movable = [x for x in held if not x.spec.pin]
    if fits(movable):
        return None
    pinned = [x for x in held if x.spec.pin]
    name = entry.spec.name
    if max_loaded and len(pinned) + 1 > max_loaded:
        raise ModelTooLarge(
            f"model {name} cannot load: all {max_loaded} places (MODELS_MAX) are held by "
            f"pinned models ({', '.join(x.spec.name for x in pinned)})")
    parts = []
    for dev in over(pinned):
        kept = sum(_on(x, dev) for x in pinned)
        by = f", {_gb(kept)} held by pinned models" if kept else ""
        on = f" on {dev}" if dev != ANY else ""
        parts.append(f"it needs {_gb(_on(entry, dev))}{on} (estimated) and "
                     f"{_gb(max(caps[dev] - kept, 0))} of the memory budget of "
                     f"{_gb(caps[dev])} can be free{by}")
    raise ModelTooLarge(f"model {name} cannot load: {'; '.join(parts)}")
