"""Where the model is in its start-up: what the health route and logs report."""

from __future__ import annotations

import time
from typing import Any

STAGES = ("starting", "downloading", "loading", "warming_up", "ready", "failed")


class LoadState:
    """Written by the engine thread, read by greenlets; single attribute writes only."""

    def __init__(self) -> None:
        self.stage = "starting"
        self.progress: float | None = None
        self.detail: str | None = None
        self.error: str | None = None
        self.started = time.monotonic()

    @property
    def ready(self) -> bool:
        return self.stage == "ready"

    def set(self, stage: str, progress: float | None = None, detail: str | None = None) -> None:
        assert stage in STAGES, stage
        if stage != self.stage:
            self.detail = None
        self.stage = stage
        self.progress = progress
        if detail is not None:
            self.detail = detail

    def fail(self, error: str) -> None:
        self.error = error
        self.stage = "failed"

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
        return body
