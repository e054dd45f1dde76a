"""No crash loop (issue 35): a worker that dies from a signal while loading is restarted once in
safe mode, then the process exits with the cause; deaths after ready with nothing in flight are
restarted up to CRASH_LIMIT; deaths with requests in flight (maybe a request's doing) are
restarted after a back-off and never stop the server (security review 3, C1). Driven through the
real gunicorn master (tests/support/crash_server.py: an engine that kills its own worker with a
real SIGSEGV, abort() or signal at a chosen stage, or when a request asks it to), plus the
guard's decisions and records on their own."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import pytest
import requests
from gunicorn.errors import HaltServer

from app.base.boot import Crash
from app.process import crash_guard
from app.process.crash_guard import (
    EXIT_CODE,
    CrashGuard,
    _Record,
    apply_safe_mode,
    parse_fault,
    safe_changes,
)
from app.settings import Settings
from tests.support.server import ServerProcess, wait_for


def crash_server(**env: object) -> ServerProcess:
    return ServerProcess({k: str(v) for k, v in env.items()}, module="tests.support.crash_server")


def booted(srv: ServerProcess) -> int:
    return srv.logs().count("Booting worker with pid")


def last_line(srv: ServerProcess) -> str:
    return srv.logs().strip().splitlines()[-1]


def metric(text: str, name: str) -> dict[str, float]:
    """``{labels: value}`` of one metric in a Prometheus text answer."""
    out = {}
    for m in re.finditer(rf"^vertex_gguf_{name}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        out[m.group(1) or ""] = float(m.group(2))
    return out


# ---- through the real gunicorn master -----------------------------------------------------

@pytest.mark.parametrize("sig", ["SIGSEGV", "SIGILL", "SIGKILL"])
def test_a_death_while_warming_up_is_restarted_once_in_safe_mode_and_reported(sig):
    srv = crash_server(CRASH_AT="warming_up", CRASH_SIGNAL=sig, CRASH_UNLESS_SAFE=1)
    try:
        srv.wait_ready()
        health = requests.get(srv.url("/health"), timeout=10).json()
        crashes = health["worker_crashes"]
        assert crashes["total"] == 1
        assert crashes["last"]["stage"] == "warming_up"
        # SIGKILL leaves no fault record (the OOM killer's signal): said so, not guessed
        assert crashes["last"]["signal"] == (sig if sig != "SIGKILL" else "unknown")
        if sig != "SIGKILL":  # where it died: the Python frames of the faulting thread
            assert "crash_server.py" in crashes["last"]["where"]
            assert f"died from {sig} while warming up" in health["safe_mode"]["reason"]
        else:
            assert "killed with no fault recorded" in health["safe_mode"]["reason"]
        assert health["safe_mode"]["changed"]["cpu_extra_buffers"] == "off"
        assert health["safe_mode"]["changed"]["flash_attn"] == "off"

        props = requests.get(srv.url("/props"), timeout=10).json()
        assert props["settings"]["cpu_extra_buffers"] == "off"
        assert props["settings"]["flash_attn"] == "off"
        assert props["safe_mode"] == health["safe_mode"]
        assert props["worker_crashes"]["total"] == 1

        text = requests.get(srv.url("/metrics"), timeout=10).text
        label = sig if sig != "SIGKILL" else "unknown"
        assert metric(text, "worker_crashes_total") == {
            f'{{requests="none",signal="{label}",stage="warming_up"}}': 1.0}
        assert metric(text, "safe_mode") == {"": 1.0}

        logs = srv.logs()
        assert re.search(r"ERROR \S+: worker \d+ (died from|was killed)", logs)
        assert re.search(r"ERROR \S+: safe mode: CPU_EXTRA_BUFFERS=off, FLASH_ATTN=off", logs)
        assert booted(srv) == 2  # one death, one restart: no loop
        # the safe worker serves
        r = requests.post(srv.url("/v1/completions"), json={"prompt": "hi"}, timeout=10)
        assert r.status_code == 200
    finally:
        srv.proc.send_signal(signal.SIGTERM)
    # a clean exit (SIGTERM) is no death: nothing more is counted, and the exit is 0
    assert srv.exit_code() == 0
    assert len(re.findall(r"crash_guard: worker \d+ (died|was killed)", srv.logs())) == 1
    srv.stop()


@pytest.mark.parametrize("sig", ["SIGABRT", "SIGBUS"])
def test_a_second_death_while_loading_ends_the_process_with_the_cause_last(sig):
    srv = crash_server(CRASH_AT="loading", CRASH_SIGNAL=sig)
    try:
        assert srv.exit_code() == EXIT_CODE
        assert booted(srv) == 2  # the first boot, the safe one, and no third
        line = last_line(srv)
        assert "ERROR" in line and "the model cannot start" in line
        assert f"died from {sig} while loading, in safe mode too" in line
    finally:
        srv.stop()


def test_no_safe_mode_when_the_risky_settings_are_explicit():
    srv = crash_server(CRASH_AT="loading", CRASH_SIGNAL="SIGSEGV", CRASH_UNLESS_SAFE=1,
                       CPU_EXTRA_BUFFERS="on", FLASH_ATTN="on")
    try:
        assert srv.exit_code() == EXIT_CODE
        assert booted(srv) == 1
        assert "no safe fallback applies" in last_line(srv)
    finally:
        srv.stop()


def crash_request(srv: ServerProcess, sig: str) -> None:
    """A request that kills the worker serving it (its connection dies with it)."""
    with pytest.raises(requests.ConnectionError):
        requests.post(srv.url("/v1/completions"), json={"prompt": f"CRASH {sig}"}, timeout=10)


def test_requests_that_kill_the_worker_never_stop_the_server():
    """Security review 3, C1: CRASH_LIMIT deaths that requests cause (a crash, an OOM kill) used
    to end the process for good. Past the limit, the server is restarted (after a back-off:
    1 s, then doubling, here up to CRASH_BACKOFF_MAX=2) and serves."""
    srv = crash_server(CRASH_AT="generating", CRASH_LIMIT=2, CRASH_BACKOFF_MAX=2)
    try:
        srv.wait_ready()
        for n, sig in enumerate(["SIGSEGV", "SIGKILL", "SIGSEGV"], start=2):
            crash_request(srv, sig)
            wait_for(lambda n=n: booted(srv) == n, 30, f"worker {n}")
            srv.wait_ready()
        assert srv.proc.poll() is None  # three deaths past CRASH_LIMIT=2: still up
        r = requests.post(srv.url("/v1/completions"), json={"prompt": "hi"}, timeout=10)
        assert r.status_code == 200

        health = requests.get(srv.url("/health"), timeout=10).json()
        crashes = health["worker_crashes"]
        assert crashes["total"] == 3 and crashes["after_requests"] == 3
        assert crashes["backoff_s"] == 2.0  # 1, 2, then the cap
        last = crashes["last"]
        assert last["stage"] == "ready" and last["signal"] == "SIGSEGV"
        assert last["after_requests"] is True and last["in_flight"] == 1
        assert last["request"] == "POST /v1/completions"  # the path, never a query string
        assert "safe_mode" not in health
        props = requests.get(srv.url("/props"), timeout=10).json()
        assert props["worker_crashes"] == crashes

        text = requests.get(srv.url("/metrics"), timeout=10).text
        assert metric(text, "worker_crashes_total") == {
            '{requests="in_flight",signal="SIGSEGV",stage="ready"}': 2.0,
            '{requests="in_flight",signal="unknown",stage="ready"}': 1.0}
        assert metric(text, "worker_backoff_seconds") == {"": 2.0}
        assert metric(text, "safe_mode") == {"": 0.0}

        logs = srv.logs()
        assert re.search(r"ERROR \S+: worker \d+ died from SIGSEGV after the model was ready, "
                         r"with 1 request in flight \(the oldest: POST /v1/completions\) "
                         r"\(in .*_generate", logs)
        assert re.search(r"worker \d+ was killed with no fault recorded \(SIGKILL: out of "
                         r"memory\?\) after the model was ready, with 1 request in flight", logs)
        backoffs = re.findall(r"restarting the worker; it loads the model after a back-off of "
                              r"(\S+) s \(deaths with requests in flight within 600 s: (\d);",
                              logs)
        assert backoffs == [("1", "1"), ("2", "2"), ("2", "3")]
        assert "Reason:" not in logs and "CRASH_LIMIT=2 deaths" not in logs
    finally:
        srv.proc.send_signal(signal.SIGTERM)
    assert srv.exit_code() == 0
    srv.stop()


def test_deaths_with_nothing_in_flight_end_the_process_at_crash_limit():
    """A worker that dies after ready with no request on it (a broken model or machine): the
    CRASH_LIMIT-th such death within CRASH_WINDOW ends the process, code 4, cause last."""
    srv = crash_server(CRASH_AT="idle", CRASH_SIGNAL="SIGSEGV", CRASH_LIMIT=2)
    try:
        assert srv.exit_code() == EXIT_CODE
        assert booted(srv) == 2
        logs = srv.logs()
        assert "restarting the worker (1 of CRASH_LIMIT=2 deaths with nothing in flight " \
               "within 600 s)" in logs
        assert "back-off" not in logs
        line = last_line(srv)
        assert "2 worker deaths with nothing in flight within 600 s after the model was ready " \
               "(CRASH_LIMIT=2); the last: worker" in line
        assert line.endswith("died from SIGSEGV after the model was ready")
    finally:
        srv.stop()


def test_a_model_that_fails_to_load_exits_4_with_its_error_as_the_last_line(tmp_path):
    """The real engine's load error (no crash): gunicorn halts on the exit code, and the cause
    is the last line, not gunicorn's "App failed to load."."""
    missing = tmp_path / "missing.gguf"
    srv = ServerProcess({"MODEL": str(missing)})
    try:
        assert srv.exit_code() == EXIT_CODE
        line = last_line(srv)
        assert f"vertex-gguf stops (exit code 4): model {missing}: file not found" in line
        assert booted(srv) == 1
    finally:
        srv.stop()


# ---- the guard's parts ----------------------------------------------------------------------

def test_parse_fault_reads_real_faulthandler_output():
    code = "import ctypes, faulthandler\nfaulthandler.enable(all_threads=True)\n\n" \
           "def boom():\n    ctypes.string_at(0)\n\nboom()\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -signal.SIGSEGV
    sig, where = parse_fault(proc.stderr)
    assert sig == "SIGSEGV"
    assert "in string_at" in where and "<string>:5 in boom" in where
    assert parse_fault("") == ("unknown", "")


class _Worker:
    def __init__(self, pid: int):
        self.pid = pid


class _Request:
    def __init__(self, method: str, path: str):
        self.method = method
        self.path = path


def _boot_and_die(guard: CrashGuard, pid: int, stage: str, fault: str = "",
                  exited: bool = False, busy: bool = False) -> None:
    """What a worker does to its records, then its end, as the master sees it (``busy``: a
    request in flight)."""
    worker = _Worker(pid)
    guard.before_fork(worker)
    rec = guard._mine
    assert rec is not None
    guard._flight.clear()  # a worker's own requests (a copy of the master's none, after fork)
    guard._left = 0
    rec.write(stage)
    if busy:
        guard.request_started(_Request("POST", "/api/generate"))
    if fault:
        import os

        os.pwrite(rec.fault_fd, fault.encode(), 0)
    if exited:
        rec.mark_exited()
    guard.child_exit(worker, stopping=False)


SEGV = "Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call " \
       "first):\n  File \"/x/llama_engine.py\", line 9 in _decode_step\n"


def test_clean_exits_and_load_errors_are_no_deaths():
    guard = CrashGuard(3, 600, {"cpu_extra_buffers": "off"})
    _boot_and_die(guard, 1, "ready", exited=True)
    _boot_and_die(guard, 2, "loading", exited=True)
    _boot_and_die(guard, 3, "failed")
    assert guard.crashes == [] and not guard.safe_reason and not guard.halt_reason
    # a fault recorded counts even when Python's exit path ran after it
    _boot_and_die(guard, 4, "ready", fault=SEGV, exited=True)
    assert [c.signal for c in guard.crashes] == ["SIGSEGV"]
    assert guard.crashes[0].where == "llama_engine.py:9 in _decode_step"


def test_load_deaths_go_to_safe_mode_then_halt():
    guard = CrashGuard(3, 600, {"cpu_extra_buffers": "off"})
    _boot_and_die(guard, 1, "warming_up", fault=SEGV)
    assert "SIGSEGV while warming up" in guard.safe_reason and not guard.halt_reason
    second = _Worker(2)
    guard.before_fork(second)
    boot = guard.boot()
    assert boot.safe_mode["cpu_extra_buffers"] == "off"
    assert apply_safe_mode(Settings(), boot).cpu_extra_buffers == "off"
    guard.child_exit(second, stopping=False)  # it died before writing a stage: "starting"
    assert "in safe mode too" in guard.halt_reason
    with pytest.raises(HaltServer) as info:
        guard.before_fork(_Worker(3))
    assert info.value.exit_status == EXIT_CODE


def test_deaths_while_stopping_are_counted_but_decide_nothing():
    guard = CrashGuard(1, 600, {"cpu_extra_buffers": "off"})
    worker = _Worker(1)
    guard.before_fork(worker)
    guard._mine.write("ready")
    guard.child_exit(worker, stopping=True)
    assert len(guard.crashes) == 1 and not guard.halt_reason


def test_only_deaths_within_the_window_count_against_the_limit():
    guard = CrashGuard(2, 60, {})
    guard.crashes.append(Crash(pid=1, stage="ready", signal="SIGSEGV", at=0.0))  # long ago
    _boot_and_die(guard, 2, "ready", fault=SEGV)
    assert not guard.halt_reason
    _boot_and_die(guard, 3, "ready", fault=SEGV)
    assert "2 worker deaths with nothing in flight within 60 s" in guard.halt_reason


def test_deaths_with_requests_in_flight_back_off_and_never_halt():
    guard = CrashGuard(2, 600, {}, backoff_max=8)
    backoffs = []
    for pid in range(1, 7):
        _boot_and_die(guard, pid, "ready", fault=SEGV, busy=True)
        backoffs.append(guard.backoff)
    assert backoffs == [1, 2, 4, 8, 8, 8]  # doubling to the cap
    assert not guard.halt_reason
    assert all(c.after_requests and c.in_flight == 1 for c in guard.crashes)
    assert guard.crashes[-1].request == "POST /api/generate"
    # they do not count against CRASH_LIMIT: deaths with nothing in flight do
    _boot_and_die(guard, 7, "ready", fault=SEGV)
    assert guard.backoff == 0 and not guard.halt_reason
    _boot_and_die(guard, 8, "ready")  # SIGKILL (no fault), nothing in flight
    assert "2 worker deaths with nothing in flight" in guard.halt_reason
    boot = guard.boot()
    assert boot.report()["worker_crashes"]["after_requests"] == 6


def test_the_back_off_starts_again_after_a_window_without_such_deaths():
    guard = CrashGuard(2, 60, {}, backoff_max=30)
    for at in (0.0, 1.0, 2.0):  # long ago
        guard.crashes.append(Crash(pid=1, stage="ready", signal="SIGSEGV", at=at, in_flight=1))
    _boot_and_die(guard, 2, "ready", fault=SEGV, busy=True)
    assert guard.backoff == 1
    _boot_and_die(guard, 3, "ready", fault=SEGV, busy=True)
    assert guard.backoff == 2
    assert CrashGuard(2, 60, {}, backoff_max=0).backoff == 0  # CRASH_BACKOFF_MAX=0: at once


def test_the_worker_records_its_requests_in_flight_and_what_they_left_running():
    guard = CrashGuard(3, 600, {})
    worker = _Worker(1)
    guard.before_fork(worker)
    rec = guard._mine
    a, b = _Request("POST", "/v1/chat/completions"), _Request("GET", "/health")
    guard.request_started(a)
    guard.request_started(b)
    assert rec.read_flight()["n"] == 2
    guard.request_ended(b, 0)
    assert rec.read_flight() == {"n": 1, "oldest": "POST /v1/chat/completions", "left": 0,
                                 "last": "GET /health"}
    guard.request_ended(a, 1)  # its generation runs on (a resumable stream whose client left)
    rec.write("ready")
    guard.child_exit(worker, stopping=False)
    crash = guard.crashes[-1]
    assert (crash.in_flight, crash.left, crash.after_requests) == (0, 1, True)
    assert crash.describe().endswith("after the model was ready, with 1 generation requests "
                                     "left running (the last request: POST /v1/chat/completions)")
    assert guard.backoff == 1 and not guard.halt_reason
    # a long path is cut, and the record stays whole
    guard.before_fork(_Worker(2))
    guard.request_started(_Request("POST", "/" + "\u00e9" * 5000))
    assert len(guard._mine.read_flight()["oldest"]) == crash_guard.PATH_CHARS + 5
    guard._mine.close()


def test_requests_while_loading_decide_nothing():
    """Before ready, requests are 503s: a death then is a load death, whatever was in flight."""
    guard = CrashGuard(3, 600, {"cpu_extra_buffers": "off"})
    _boot_and_die(guard, 1, "loading", fault=SEGV, busy=True)
    assert not guard.crashes[0].after_requests and "SIGSEGV while loading" in guard.safe_reason


def test_the_load_waits_out_the_back_off(monkeypatch):
    """The first stage past ``starting`` (the engine's load thread) waits; nothing else does."""
    guard = CrashGuard(3, 600, {}, backoff_max=60)
    _boot_and_die(guard, 1, "ready", fault=SEGV, busy=True)
    _boot_and_die(guard, 2, "ready", fault=SEGV, busy=True)
    waits: list[float] = []
    monkeypatch.setattr(crash_guard.time, "sleep", waits.append)
    # what start_worker arms for a real worker, not for this test process
    monkeypatch.setattr(crash_guard.faulthandler, "enable", lambda **kw: None)
    monkeypatch.setattr(crash_guard.signal, "signal", lambda *a: None)
    guard.before_fork(_Worker(3))
    boot = guard.start_worker()
    assert boot.backoff == 2 and boot.report()["worker_crashes"]["backoff_s"] == 2
    boot.record("starting", "")
    assert waits == []
    boot.record("loading", "")
    assert len(waits) == 1 and 0 < waits[0] <= 2
    boot.record("warming_up", "")
    boot.record("ready", "")
    assert len(waits) == 1
    assert guard._mine.read()[0] == "ready"
    guard._mine.close()


def test_safe_mode_changes_only_what_is_left_at_auto():
    assert safe_changes(Settings()) == {"cpu_extra_buffers": "off", "flash_attn": "off"}
    assert safe_changes(Settings(cpu_extra_buffers="on")) == {"flash_attn": "off"}
    # a quantized V cache cannot load without flash attention: safe mode leaves it on
    assert safe_changes(Settings(kv_cache_type_v="q8_0")) == {"cpu_extra_buffers": "off"}
    assert safe_changes(Settings(cpu_extra_buffers="off", flash_attn="on")) == {}


def test_a_record_keeps_the_stage_apart_from_the_exit_mark():
    rec = _Record()
    try:
        rec.write("warming_up", "detail")
        assert rec.read() == ("warming_up", "detail", False, "")
        rec.mark_exited()
        rec.write("ready")
        assert rec.read()[:3] == ("ready", "", True)
    finally:
        rec.close()
