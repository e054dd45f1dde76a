"""What a worker knows when it starts, handed down by the gunicorn master (app.process.crash_guard):
the workers that died before it (and whether requests were in flight in each), whether it runs in
safe mode, how long it waits before loading, and where it records its load stage.

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
    # requests in flight when it died, and generations requests that had ended left running (a
    # resumable stream whose client left, a cancelled one not yet unwound): a death that
    # followed requests may be a request's doing, so it never stops the server
    in_flight: int = 0
    left: int = 0
    request: str = ""  # the oldest in flight ("POST /v1/completions"), else the last ended
    what: str = "worker"  # the process that died: a gunicorn worker, or an engine process

    @property
    def after_requests(self) -> bool:
        return bool(self.in_flight or self.left)

    def describe(self) -> str:
        how = {"unknown": "was killed with no fault recorded (SIGKILL: out of memory?)",
               "SIGKILL": "was killed (SIGKILL: out of memory?)"}.get(
                   self.signal, f"died from {self.signal}")
        when = "after the model was ready" if self.stage == "ready" else (
            f"while {self.stage.replace('_', ' ')}")
        return f"{self.what} {self.pid} {how} {when}{self._flight()}"

    def _flight(self) -> str:
        if self.in_flight:
            many = "s" if self.in_flight > 1 else ""
            return f", with {self.in_flight} request{many} in flight (the oldest: {self.request})"
        if self.left:
            many = "s" if self.left > 1 else ""
            return (f", with {self.left} generation{many} requests left running (the last "
                    f"request: {self.request or 'none'})")
        return ""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"stage": self.stage, "signal": self.signal, "at": int(self.at)}
        if self.where:
            out["where"] = self.where
        out["after_requests"] = self.after_requests
        out["in_flight"] = self.in_flight
        if self.left:
            out["left_running"] = self.left
        if self.request:
            out["request"] = self.request
        return out


@dataclass(frozen=True)
class Boot:
    """What a worker knows when it starts: the deaths before it, whether it is in safe mode,
    and ``backoff``: the seconds it waited before loading (a death with requests in flight).
    ``record(stage, detail)`` writes the worker's load stage where the master will read it
    (app.base.state.LoadState calls it at every stage, and with the error when the load fails);
    the crash guard's own holds the first stage past ``starting`` until the back-off is over,
    so the load waits while health answers 503 ``starting``."""

    crashes: tuple[Crash, ...] = ()
    safe_mode: dict[str, str] = field(default_factory=dict)  # setting -> safe value (or env)
    safe_reason: str = ""
    backoff: float = 0.0
    record: Callable[[str, str], None] = lambda stage, detail: None

    def report(self) -> dict[str, Any]:
        """For /health and /props: nothing when nothing happened."""
        out: dict[str, Any] = {}
        if self.crashes:
            out["worker_crashes"] = {
                "total": len(self.crashes),
                "after_requests": sum(1 for c in self.crashes if c.after_requests),
                "backoff_s": self.backoff,
                "last": self.crashes[-1].as_dict()}
        if self.safe_reason:
            out["safe_mode"] = {"reason": self.safe_reason, "changed": dict(self.safe_mode)}
        return out
