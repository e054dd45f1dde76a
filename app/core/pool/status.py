"""One model's status as the APIs show it (/v1/models, /api/ps, /models): what the pool knows
of it, and what its engine's LoadState says while it loads."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from app.core.pool.entry import Entry


@dataclass(frozen=True)
class ModelStatus:
    """``status``: loaded, loading, unloaded or failed (llama-server's router's words).
    ``unloading``: it takes no new requests and unloads once idle (or is shutting down).
    ``stage``, ``progress``, ``detail``: the engine's LoadState while loading (downloading,
    loading, warming_up; a restart after a crash). Times are the pool's clock's; ``expires_in``
    is seconds from now (None: not expiring: busy, or keep_alive never)."""

    name: str
    aliases: tuple[str, ...]
    status: str
    error: str | None
    stage: str | None
    progress: float | None
    detail: str | None
    bytes: int | None  # the estimated footprint, in all
    devices: dict[str, int] | None  # ... per device, where the estimate told ("": not told)
    pinned: bool
    preload: bool
    leases: int
    waiting: int  # acquires waiting for it (its load, its room, its restart)
    unloading: bool
    last_used: float | None
    expires_at: float | None
    expires_in: float | None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def status_of(e: Entry, now: float) -> ModelStatus:
    """Under the pool's lock."""
    status = "loaded" if e.status == "closing" else e.status
    error = e.error if status == "failed" else None
    stage = progress = detail = None
    state = e.engine.state if e.engine is not None else None
    if e.status == "loaded" and state is not None and state.stage == "failed":
        status, error = "failed", state.error or "the engine failed"
    elif status == "loading" or (e.status == "loaded" and state is not None
                                 and state.stage != "ready"):
        status = "loading"
        if state is not None:
            stage, progress, detail = state.stage, state.progress, state.detail
    return ModelStatus(
        name=e.spec.name, aliases=tuple(e.spec.aliases), status=status, error=error,
        stage=stage, progress=progress, detail=detail,
        bytes=None if e.need is None else sum(e.need.values()),
        devices=None if e.need is None else dict(e.need), pinned=e.spec.pin,
        preload=e.spec.preload, leases=e.leases, waiting=e.waiters,
        unloading=e.unloading or e.status == "closing",
        last_used=e.last_used, expires_at=e.expires_at,
        expires_in=None if e.expires_at is None else max(e.expires_at - now, 0.0))
