"""Where the model is in its start-up: what the health route and logs report."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.base.threads import allocate_lock

STAGES = ("starting", "downloading", "loading", "warming_up", "ready", "failed")
PHASES = STAGES[:4]  # what a load goes through before ready


@dataclass(frozen=True)
class _Download:
    """One file's download, as its fetch last reported it."""

    done: int
    total: int
    rate: float
    detail: str


class LoadState:
    """Written by the engine's threads (the model and the files beside it resolve at once),
    under a lock; read by greenlets, unlocked: single attribute writes only."""

    def __init__(self, on_stage: Callable[[str, str], None] | None = None) -> None:
        # told of every stage entered (and a failure's message): the crash guard's record,
        # which the master reads if this worker dies (app.process.crash_guard)
        self._on_stage = on_stage
        self.stage = "starting"
        self.progress: float | None = None
        self.detail: str | None = None
        self.error: str | None = None
        self.download: dict[str, Any] | None = None
        self.started = time.monotonic()
        self.version = 0  # bumped on every change, so watchers can tell
        # for /metrics: when each stage was last entered, and how long it lasted when last left
        self.entered: dict[str, float] = {"starting": self.started}
        self.seconds: dict[str, float] = {}
        # the downloads under way (the model's, a projector's, a draft's, adapters'), by what
        # they fetch: ``download`` is their sum; None: begun, no figures yet
        self._downloads: dict[str | None, _Download | None] = {}
        self._lock = allocate_lock()

    @property
    def ready(self) -> bool:
        return self.stage == "ready"

    def set(self, stage: str, progress: float | None = None, detail: str | None = None) -> None:
        with self._lock:
            self._set(stage, progress, detail)

    def _set(self, stage: str, progress: float | None, detail: str | None) -> None:
        assert stage in STAGES, stage
        if stage != self.stage:
            self.detail = None
            self._downloads = {}  # a later stage's downloads (a restart's) start afresh
            now = time.monotonic()
            self.seconds[self.stage] = now - self.entered.get(self.stage, now)
            self.entered[stage] = now
            if self._on_stage is not None:
                self._on_stage(stage, "")
        self.stage = stage
        self.progress = progress
        if detail is not None:
            self.detail = detail
        self.version += 1

    def begin_download(self, source: str) -> None:
        """A download of ``source`` begins (its size not known yet): the stage is downloading,
        and the detail names it beside any other under way."""
        with self._lock:
            if self.stage != "downloading":
                self._set("downloading", 0.0, None)
            self._downloads.setdefault(source, None)
            self._sum()

    def set_download(self, done: int, total: int, rate: float, eta: float | None,
                     detail: str | None = None, source: str | None = None) -> None:
        """One download's figures (``source``: which, when several run at once). What /health
        and /metrics show is the sum of those under way: bytes, totals and rates added, the
        ETA the bytes left at that rate; the detail each one's, in the order they began."""
        with self._lock:
            if self.stage != "downloading":
                self._set("downloading", 0.0, None)
            self._downloads[source] = _Download(done, total, rate, detail or source or "")
            if len(self._downloads) == 1:  # alone: as it reported itself
                self._show(done, total, rate, eta, detail)
            else:
                self._sum()

    def _sum(self) -> None:
        """``download`` and the progress from every download under way (under the lock)."""
        known = [d for d in self._downloads.values() if d is not None]
        details = [str(k) if d is None else d.detail for k, d in self._downloads.items()]
        detail = ", ".join(x for x in details if x) or None
        if not known:  # nothing measured yet: no figures to show
            self._set("downloading", 0.0, detail)
            return
        done = sum(d.done for d in known)
        total = sum(d.total for d in known)
        going = [d for d in known if d.done < d.total]
        rate = sum(d.rate for d in going or known)
        eta = (total - done) / rate if rate > 0 and len(known) == len(self._downloads) else None
        self._show(done, total, rate, eta, detail, unknown=len(known) < len(self._downloads))

    def _show(self, done: int, total: int, rate: float, eta: float | None,
              detail: str | None, unknown: bool = False) -> None:
        self.download = {
            "downloaded_bytes": done,
            "total_bytes": total,
            "mb_per_s": round(rate / 1e6, 2),
            "eta_s": None if eta is None else round(eta, 1),
        }
        progress = done / total if total else (0.0 if unknown else 1.0)
        self._set("downloading", progress, detail)

    def fail(self, error: str) -> None:
        with self._lock:
            self.error = error
            if self._on_stage is not None:
                self._on_stage("failed", error)
            self.stage = "failed"
            self.version += 1

    def phases(self) -> dict[str, float]:
        """Seconds each phase of the last load took (those it went through: a local file is
        not downloaded), and their ``total``: what a cold start cost, and where. Empty
        before the model is first ready."""
        if not self.ready:
            return {}
        out = {p: round(self.seconds[p], 3) for p in PHASES if p in self.seconds}
        out["total"] = round(sum(out.values()), 3)
        return out

    def phases_text(self) -> str:
        """The phases for a log line: ``downloading 22.1 s, loading 13.0 s, ...``."""
        return ", ".join(f"{k} {v:.1f} s" for k, v in self.phases().items())

    def snapshot(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "status": "ok" if self.ready else self.stage,
            "stage": self.stage,
            "elapsed_s": round(time.monotonic() - self.started, 1),
        }
        if self.progress is not None:
            body["progress"] = round(self.progress, 4)
        if self.detail:
            body["detail"] = self.detail
        if self.error:
            body["error"] = self.error
        if self.download and self.stage == "downloading":
            body["download"] = dict(self.download)
        if self.ready:
            body["cold_start"] = self.phases()
        return body
