"""Where the model is in its start-up: what the health route and logs report."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

STAGES = ("starting", "downloading", "loading", "warming_up", "ready", "failed")
PHASES = STAGES[:4]  # what a load goes through before ready


class LoadState:
    """Written by the engine thread, read by greenlets; single attribute writes only."""

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

    @property
    def ready(self) -> bool:
        return self.stage == "ready"

    def set(self, stage: str, progress: float | None = None, detail: str | None = None) -> None:
        assert stage in STAGES, stage
        if stage != self.stage:
            self.detail = None
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

    def set_download(self, done: int, total: int, rate: float, eta: float | None,
                     detail: str | None = None) -> None:
        self.download = {
            "downloaded_bytes": done,
            "total_bytes": total,
            "mb_per_s": round(rate / 1e6, 2),
            "eta_s": None if eta is None else round(eta, 1),
        }
        self.set("downloading", progress=done / total if total else 1.0, detail=detail)

    def fail(self, error: str) -> None:
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
