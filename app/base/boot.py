"""What a worker knows when it starts, handed down by the gunicorn master (app.process.crash_guard):
the workers that died before it, whether it runs in safe mode, and where it records its load stage.

Its own module in the base because both sides use it: the process layer builds it, and the
composition root (create_app) and the load state (app.base.state) read it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Crash:
    """One worker's death, as the master read it."""

    pid: int
    stage: str  # the load stage it was in (``ready``: after the model was ready)
    signal: str  # SIGSEGV, SIGABRT, ... or ``unknown`` (no fault recorded: SIGKILL, an OOM kill)
    at: float  # time.time()
    where: str = ""  # the innermost Python frames of the thread that faulted, if it had any

    def describe(self) -> str:
        how = f"died from {self.signal}" if self.signal != "unknown" else (
            "was killed with no fault recorded (SIGKILL: out of memory?)")
        when = "after the model was ready" if self.stage == "ready" else (
            f"while {self.stage.replace('_', ' ')}")
        return f"worker {self.pid} {how} {when}"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"stage": self.stage, "signal": self.signal, "at": int(self.at)}
        if self.where:
            out["where"] = self.where
        return out



@dataclass(frozen=True)
class Boot:
    """What a worker knows when it starts: the deaths before it and whether it is in safe mode.
    ``record(stage, detail)`` writes the worker's load stage where the master will read it
    (app.base.state.LoadState calls it at every stage, and with the error when the load fails)."""

    crashes: tuple[Crash, ...] = ()
    safe_mode: dict[str, str] = field(default_factory=dict)  # setting -> safe value (or env)
    safe_reason: str = ""
    record: Callable[[str, str], None] = lambda stage, detail: None

    def report(self) -> dict[str, Any]:
        """For /health and /props: nothing when nothing happened."""
        out: dict[str, Any] = {}
        if self.crashes:
            out["worker_crashes"] = {"total": len(self.crashes),
                                     "last": self.crashes[-1].as_dict()}
        if self.safe_reason:
            out["safe_mode"] = {"reason": self.safe_reason, "changed": dict(self.safe_mode)}
        return out
