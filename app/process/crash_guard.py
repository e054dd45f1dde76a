"""Keeps a native crash from becoming a restart loop.

llama.cpp can kill the worker process outright: a SIGSEGV in a CPU kernel (the AMX one on
Sapphire Rapids, llama.cpp#20824), a ``GGML_ABORT``, a CUDA out-of-memory abort. gunicorn's
master restarts a dead worker at once, and a model that dies while loading dies the same way
again: the container would answer 503 "loading" for ever. The guard lives in the master (through
gunicorn's hooks, app.process.gunicorn_conf) and in each worker:

- Before each fork the master opens two anonymous files for the new worker: its stage record
  (the worker writes its load stage there at every change, ``exited`` on a clean exit, and the
  requests in flight at each request's start and end) and its fault record (Python's
  faulthandler writes the fatal signal and every thread's stack there when the worker dies of
  one).
- When a worker is gone, the master reads both. No ``exited``: the worker died. Dead while
  loading, the next worker boots in safe mode (the risky settings still at ``auto`` turned off);
  dead while loading in safe mode too, or ``CRASH_LIMIT`` deaths after ready with nothing in
  flight within ``CRASH_WINDOW`` (a broken model or machine), and the master refuses the next
  fork: the process exits with code 4 and the cause as its last log line, so Cloud Run and
  Vertex AI show a failed revision.
- A death with requests in flight may be a request's doing (a native allocation a field sized,
  an OOM kill): halting on it would let requests turn into an outage. The next worker waits a
  back-off before it loads (1 s, doubling with each such death within ``CRASH_WINDOW``, up to
  ``CRASH_BACKOFF_MAX``), and the server goes on.
- A worker starts with what the master knew when it forked it (the deaths so far, safe mode,
  its back-off): /health, /props and /metrics report it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import re
import signal
import tempfile
import time
from typing import Any, BinaryIO

from app.base.boot import Boot, Crash

log = logging.getLogger(__name__)

# gunicorn's code for "the app could not load": the process ends with it whenever the model
# cannot be served (a load error, a crash while loading, a crash loop)
EXIT_CODE = 4
# settings safe mode turns off when they are still at auto; none of them changes an answer
SAFE_SETTINGS = {"cpu_extra_buffers": "off", "flash_attn": "off"}
# ... and in the environment: CUDA graphs (read by ggml-cuda at first use; no-op on the CPU)
SAFE_ENV = {"GGML_CUDA_DISABLE_GRAPHS": "1"}
LOAD_STAGES = ("starting", "downloading", "loading", "warming_up")
RECORD_BYTES = 4096  # the stage and its detail; the exit mark is the byte after them
FLIGHT_AT = RECORD_BYTES + 64  # the requests in flight (JSON, padded with NULs)
FLIGHT_BYTES = 1024
PATH_CHARS = 100  # of a request's path kept in the record (4 bytes a character at most)
BACKOFF_FIRST = 1.0  # seconds before the load after the first death with requests in flight
FAULT_BYTES = 64 << 10  # of a fault record, read back (all threads' stacks; the top is enough)
# faulthandler's first line names the signal in words
_FAULTS = {
    "segmentation fault": "SIGSEGV",
    "bus error": "SIGBUS",
    "illegal instruction": "SIGILL",
    "floating-point exception": "SIGFPE",
    "floating point exception": "SIGFPE",
    "aborted": "SIGABRT",
}
_FATAL = re.compile(r"Fatal Python error: ([^\n]+)")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)')


def parse_fault(text: str) -> tuple[str, str]:
    """(signal name, where) from what faulthandler wrote; ("unknown", "") for nothing."""
    m = _FATAL.search(text)
    if not m:
        return "unknown", ""
    sig = _FAULTS.get(m.group(1).strip().lower(), m.group(1).strip())
    # the first thread block with Python frames: the faulting thread's, unless that one is a
    # native thread (ggml's compute threads have none), then the thread that called into it
    for block in re.split(r"\n\s*\n", text[m.end():]):
        frames = [f for f in (_FRAME.match(line) for line in block.splitlines()) if f]
        if frames:
            current = block.lstrip().startswith("Current thread")
            where = "; ".join(f"{os.path.basename(f[1])}:{f[2]} in {f[3]}" for f in frames[:3])
            return sig, where if current else f"(a native thread; beside it) {where}"
    return sig, ""


def safe_changes(settings: Any) -> dict[str, str]:
    """What safe mode would change: each risky setting the operator left at auto."""
    changes = {k: v for k, v in SAFE_SETTINGS.items() if getattr(settings, k, None) == "auto"}
    if getattr(settings, "kv_cache_type_v", "f16") not in ("f32", "f16", "bf16"):
        changes.pop("flash_attn", None)  # a quantized V cache cannot load without it
    return changes


class _Record:
    """A worker's stage and fault records: anonymous files the master opens before the fork
    and reads after the worker is gone (nothing on disk, nothing to clean up)."""

    def __init__(self, fds: tuple[int, int] | None = None) -> None:
        """Opens both files; with ``fds`` (stage, fault), adopts files a parent opened (an
        engine process writes the records its web process reads: app.engine.child)."""
        self._files: list[BinaryIO] = []
        if fds is not None:
            self.stage_fd, self.fault_fd = fds
            return
        self.stage_fd = self._open("vertex-gguf-stage")
        self.fault_fd = self._open("vertex-gguf-fault")

    def _open(self, name: str) -> int:
        if hasattr(os, "memfd_create"):
            return os.memfd_create(name)
        f = tempfile.TemporaryFile(prefix=name)  # noqa: SIM115 - kept open until close()
        self._files.append(f)
        return f.fileno()

    def write(self, stage: str, detail: str = "") -> None:
        data = f"{stage}\n{detail}".encode("utf-8", "replace")[:RECORD_BYTES]
        os.pwrite(self.stage_fd, data.ljust(RECORD_BYTES, b"\0"), 0)

    def mark_exited(self) -> None:
        """The worker is leaving through Python's exit path (its stage is kept)."""
        os.pwrite(self.stage_fd, b"x", RECORD_BYTES)

    def write_flight(self, flight: dict[str, Any]) -> None:
        """The requests in flight, written at each change (one pwrite: the master reads it only
        once this worker is gone)."""
        data = json.dumps(flight, ensure_ascii=False).encode("utf-8", "replace")
        os.pwrite(self.stage_fd, data[:FLIGHT_BYTES].ljust(FLIGHT_BYTES, b"\0"), FLIGHT_AT)

    def read_flight(self) -> dict[str, Any]:
        """What ``write_flight`` last wrote ({} for nothing)."""
        raw = os.pread(self.stage_fd, FLIGHT_BYTES, FLIGHT_AT).rstrip(b"\0")
        try:
            flight = json.loads(raw.decode("utf-8", "replace")) if raw else {}
        except ValueError:
            return {}
        return flight if isinstance(flight, dict) else {}

    def read(self) -> tuple[str, str, bool, str]:
        """(stage, detail, exited cleanly, fault text)."""
        raw = os.pread(self.stage_fd, RECORD_BYTES + 1, 0)
        stage, _, detail = raw[:RECORD_BYTES].rstrip(b"\0").decode("utf-8", "replace").partition(
            "\n")
        fault = os.pread(self.fault_fd, FAULT_BYTES, 0).decode("utf-8", "replace")
        return stage or "starting", detail, raw[RECORD_BYTES:] == b"x", fault

    def close(self) -> None:
        if self._files:
            for f in self._files:
                f.close()
        else:
            os.close(self.stage_fd)
            os.close(self.fault_fd)


class CrashGuard:
    """The master's record of its workers' deaths, and what each new worker inherits."""

    def __init__(self, crash_limit: int, crash_window: float, safe: dict[str, str],
                 backoff_max: float = 60.0, what: str = "worker"):
        self.what = what  # what its children are called in its log lines
        self.limit = crash_limit
        self.window = crash_window
        self.safe = safe  # what safe mode changes (empty: no fallback applies)
        self.backoff_max = backoff_max
        self.crashes: list[Crash] = []
        self.safe_reason = ""  # set: every worker from now on boots in safe mode
        self.halt_reason = ""  # set: the next fork is refused and the process ends
        self.backoff = 0.0  # seconds the next worker waits before it loads the model
        self._live: dict[int, _Record] = {}  # id(worker) -> its record (master)
        self._mine: _Record | None = None  # in a worker: its own record
        self._halted = False
        # in a worker: its requests in flight (id -> "METHOD /path", oldest first), the last one
        # ended, the generations requests left running (as of the last end: only a request
        # starts one, so the figure is never too low), and when its load may begin
        self._flight: dict[int, str] = {}
        self._last = ""
        self._left = 0
        self._hold_until = 0.0

    @classmethod
    def from_settings(cls, settings: Any) -> CrashGuard:
        return cls(settings.crash_limit, settings.crash_window, safe_changes(settings),
                   settings.crash_backoff_max)

    # ---- master --------------------------------------------------------------------------
    def before_fork(self, worker: object) -> _Record | None:
        """gunicorn's pre_fork: refuse to fork into a known death, else give the worker its
        records (the child finds them in ``_mine``; a process spawned rather than forked is
        handed the returned record's descriptors)."""
        if self.halt_reason:
            from gunicorn.errors import HaltServer

            self._halted = True
            raise HaltServer(self.halt_reason, EXIT_CODE)
        try:
            rec = _Record()
        except OSError as exc:  # no fd or no temp space: run unguarded, as plain gunicorn
            log.warning("crash guard off for the next %s: %s", self.what, exc)
            self._mine = None
            return None
        self._live[id(worker)] = rec
        self._mine = rec
        return rec

    def child_exit(self, worker: Any, stopping: bool, exit_signal: str = "") -> None:
        """gunicorn's child_exit: a worker is gone. Did it die, and what happens next?
        ``exit_signal``: the signal that ended it, when its parent reaped it (a SIGKILL
        leaves no fault record to name it)."""
        rec = self._live.pop(id(worker), None)
        if rec is None:
            return
        try:
            stage, _detail, exited, fault = rec.read()
            flight = rec.read_flight()
        finally:
            rec.close()
        sig, where = parse_fault(fault)
        if sig == "unknown" and exit_signal:
            sig = exit_signal
        # a clean exit, or a load error (gunicorn halts on its exit code); a fault recorded
        # counts whatever exit path the worker took after it
        if stage == "failed" or (exited and sig == "unknown"):
            return
        # before ready no request reaches the model (a 503): the requests then are no cause
        followed = _followed(flight) if stage not in LOAD_STAGES else {}
        crash = Crash(pid=int(getattr(worker, "pid", 0) or 0), stage=stage, signal=sig,
                      at=time.time(), where=where, what=self.what, **followed)
        self.crashes.append(crash)
        log.error("%s%s", crash.describe(), f" (in {where})" if where else "")
        if not stopping:
            self._decide(crash)

    def _decide(self, crash: Crash) -> None:
        self.backoff = 0.0
        if crash.stage in LOAD_STAGES:
            if self.safe_reason:
                self.halt_reason = (f"the model cannot start: {crash.describe()}, in safe mode "
                                    f"too ({_settings_text(self.safe)})")
            elif not self.safe:
                self.halt_reason = (f"the model cannot start: {crash.describe()}, and no safe "
                                    "fallback applies (CPU_EXTRA_BUFFERS and FLASH_ATTN are set "
                                    "explicitly)")
            else:
                self.safe_reason = crash.describe()
                log.error("the next %s starts in safe mode: %s (and CUDA graphs off)",
                          self.what, _settings_text(self.safe))
            return
        # after ready: only deaths alike within the window count (requests in flight or not)
        recent = [c for c in self.crashes if c.stage not in LOAD_STAGES
                  and c.after_requests == crash.after_requests
                  and crash.at - c.at <= self.window]
        if crash.after_requests:
            # maybe a request's doing: never a halt (requests would make it an outage)
            self.backoff = min(self.backoff_max, BACKOFF_FIRST * 2.0 ** min(len(recent) - 1, 30))
            log.error("restarting the %s; it loads the model after a back-off of %g s "
                      "(deaths with requests in flight within %g s: %d; these never stop the "
                      "server; CRASH_BACKOFF_MAX=%g)", self.what, self.backoff, self.window,
                      len(recent), self.backoff_max)
        elif len(recent) >= self.limit:
            self.halt_reason = (f"{len(recent)} {self.what} deaths with nothing in flight within "
                                f"{self.window:g} s after the model was ready "
                                f"(CRASH_LIMIT={self.limit}); the last: {crash.describe()}")
        else:
            log.error("restarting the %s (%d of CRASH_LIMIT=%d deaths with nothing in "
                      "flight within %g s)", self.what, len(recent), self.limit, self.window)

    def exiting(self) -> None:
        """gunicorn's on_exit: a worker whose model failed to load (gunicorn halted on its exit
        code before child_exit) left the cause in its record: make it the last line."""
        if self._halted:
            return
        for rec in self._live.values():
            stage, detail, _, _ = rec.read()
            if stage == "failed":
                log.error("vertex-gguf stops (exit code %d): %s", EXIT_CODE, detail)
                return

    # ---- worker --------------------------------------------------------------------------
    def start_worker(self) -> Boot:
        """In a new worker, before its app is built: arm faulthandler on the fault record, put
        safe mode's environment in place, start the back-off, and say what this worker
        inherits."""
        rec = self._mine
        if rec is not None:
            # a native abort() (GGML_ABORT) must end the worker with SIGABRT, as every other
            # fatal signal does: not run gunicorn's SIGABRT handler (its "timeout" exit path,
            # racing the abort) after faulthandler has written the fault
            signal.signal(signal.SIGABRT, signal.SIG_DFL)
            faulthandler.enable(file=rec.fault_fd, all_threads=True)
            rec.write("starting")
        self._hold_until = time.monotonic() + self.backoff if self.backoff else 0.0
        boot = self.boot()
        if boot.safe_reason:
            for name, value in boot.safe_mode.items():
                if name in SAFE_ENV:
                    os.environ[name] = value
            log.error("safe mode: %s, because %s", _settings_text(boot.safe_mode),
                      boot.safe_reason)
        if boot.backoff:
            log.warning("the model loads after a back-off of %g s: the last worker died with "
                        "requests in flight", boot.backoff)
        return boot

    def boot(self) -> Boot:
        """What a worker forked now inherits (its own records, if the hooks gave it any)."""
        rec = self._mine
        safe: dict[str, str] = {}
        if self.safe_reason:
            safe = dict(self.safe)
            safe.update({k: v for k, v in SAFE_ENV.items() if k not in os.environ})
        return Boot(crashes=tuple(self.crashes), safe_mode=safe, safe_reason=self.safe_reason,
                    backoff=self.backoff,
                    record=self._record_stage if rec is not None else Boot.record)

    def _record_stage(self, stage: str, detail: str = "") -> None:
        """Boot.record: the first stage past ``starting`` (the load's first step, on the
        engine's load thread) waits out the back-off; gevent's sleep, so the worker serves
        health meanwhile."""
        if self._hold_until and stage not in ("starting", "failed"):
            wait, self._hold_until = self._hold_until - time.monotonic(), 0.0
            if wait > 0:
                time.sleep(wait)
        if self._mine is not None:
            self._mine.write(stage, detail)

    def request_started(self, req: Any) -> None:
        """gunicorn's pre_request: one more request in flight, in the record."""
        self._flight[id(req)] = _request_text(req)
        self._write_flight()

    def request_ended(self, req: Any, left: int) -> None:
        """gunicorn's post_request (called whatever the request's end): ``left`` is how many
        generations still run with no request on them (resumable streams whose client left,
        cancelled work the engine has not dropped yet)."""
        self._last = self._flight.pop(id(req), "") or _request_text(req)
        self._left = left
        self._write_flight()

    def _write_flight(self) -> None:
        if self._mine is None:
            return
        oldest = next(iter(self._flight.values()), "")
        with contextlib.suppress(OSError):  # a record lost never fails the request
            self._mine.write_flight({"n": len(self._flight), "oldest": oldest,
                                     "left": self._left, "last": self._last})

    def worker_exit(self) -> None:
        """gunicorn's worker_exit: a clean exit (whatever happens after is no crash loop)."""
        if self._mine is not None:
            self._mine.mark_exited()


def _request_text(req: Any) -> str:
    """"METHOD /path" (never the query string, as the access log)."""
    return f"{getattr(req, 'method', '?')} {str(getattr(req, 'path', ''))[:PATH_CHARS]}"


def _followed(flight: dict[str, Any]) -> dict[str, Any]:
    """Crash's request fields from a dead worker's flight record."""
    try:
        n, left = int(flight.get("n", 0)), int(flight.get("left", 0))
    except (TypeError, ValueError):
        return {}
    if n:
        return {"in_flight": n, "request": str(flight.get("oldest", ""))}
    if left:
        return {"left": left, "request": str(flight.get("last", ""))}
    return {}


def apply_safe_mode(settings: Any, boot: Boot) -> Any:
    """The settings a worker in safe mode runs with."""
    changes = {k: v for k, v in boot.safe_mode.items() if k in SAFE_SETTINGS}
    return settings.model_copy(update=changes) if changes else settings


def apply_safe_mode_to_models(catalog: Any, boot: Boot) -> Any:
    """Several models (an app.model.catalog Catalog): a worker in safe mode starts each
    model's engine process in safe mode too, each model by the rule above applied to its own
    settings (the risky settings its preset and the environment left at auto)."""
    return catalog.in_safe_mode(safe_changes) if boot.safe_reason else catalog


def _settings_text(changes: dict[str, str]) -> str:
    return ", ".join(f"{k.upper()}={v}" for k, v in changes.items()) or "nothing to change"
