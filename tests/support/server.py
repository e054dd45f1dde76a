"""Real server processes on loopback ports: start one, wait for it, read its logs, stop it."""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import requests

from app.settings.models import CATALOG_FIELDS

ROOT = Path(__file__).resolve().parents[2]  # the repository
DATA = ROOT / "tests" / "data"  # golden transcripts, chat templates


def model_cache_dir() -> Path:
    return Path(os.environ.get("MODEL_CACHE_DIR", "/tmp/vertex-gguf"))


def wait_for(check, limit: float = 120, what: str = "condition", nap=time.sleep):
    """Poll ``check`` until it returns something truthy (returned), at most ``limit`` seconds:
    the one bounded wait of the suite (``nap=gevent.sleep`` in-process, where a producer
    greenlet must get to run)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        nap(0.05)
    raise AssertionError(f"no {what} in {limit} s")


def running(srv: ServerProcess) -> int:
    """Sequences in the server's engine now (from /health)."""
    return requests.get(srv.url("/health"), timeout=10).json()["engine"]["running"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``python -m app`` (or another ``module``) on a free loopback port; logs go to a temp
    file."""

    def __init__(self, env: dict[str, str] | None = None, args: list[str] | None = None,
                 module: str = "app"):
        self.port = free_port()
        fd, self.log_path = tempfile.mkstemp(prefix="vertex-gguf-", suffix=".log")
        self.log_file = os.fdopen(fd, "wb")
        # the platform's variables, and the several-models settings (a shell's MODELS, as
        # bench/gpu/run.sh's list of shapes, would stop the server): a test sets its own
        full_env = {k: v for k, v in os.environ.items()
                    if not k.startswith("AIP_") and k.lower() not in CATALOG_FIELDS}
        full_env.update({"HOST": "127.0.0.1", "PORT": str(self.port), "THREADS": "2"})
        full_env.update(env or {})
        if "AIP_HTTP_PORT" in full_env:
            self.port = int(full_env["AIP_HTTP_PORT"])
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *(args or [])],
            env=full_env,
            cwd=ROOT,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.base = f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return self.base + path

    def wait_listening(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited early:\n{self.logs()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.01)
        raise AssertionError(f"server did not listen in {timeout}s:\n{self.logs()}")

    def wait_ready(self, health: str = "/health", timeout: float = 60) -> None:
        self.wait_listening(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited early:\n{self.logs()}")
            try:
                if requests.get(self.url(health), timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise AssertionError(f"server not ready in {timeout}s:\n{self.logs()}")

    def logs(self) -> str:
        return Path(self.log_path).read_text(errors="replace")

    def exit_code(self, limit: float = 60) -> int:
        """The server's exit status once it has ended by itself (bounded wait)."""
        wait_for(lambda: self.proc.poll() is not None, limit, "server exit")
        return self.proc.returncode

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log_file.close()
        Path(self.log_path).unlink(missing_ok=True)


@contextlib.contextmanager
def running_server(env: dict[str, str]) -> Iterator[ServerProcess]:
    """A ready server for a module's tests, stopped afterwards."""
    srv = ServerProcess(env)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


VERTEX_HEALTH = "/v1/endpoints/1234/deployedModels/5678"
VERTEX_PREDICT = "/v1/endpoints/1234/deployedModels/5678:predict"


@contextlib.contextmanager
def loopback_http(handler: type[http.server.BaseHTTPRequestHandler]
                  ) -> Iterator[http.server.ThreadingHTTPServer]:
    """A threaded HTTP server with ``handler`` on a free loopback port (the files a test lets
    the server fetch), shut down after."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
