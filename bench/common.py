"""What the bench scripts share: a free loopback port, waiting for health, a server run."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(base: str, path: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if requests.get(base + path, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.05)
    raise RuntimeError("server not ready")


@contextlib.contextmanager
def process(cmd: list[str], env: dict[str, str] | None, health: str, name: str,
            timeout: float, cwd: Path = ROOT) -> Iterator[str]:
    """A server on a free loopback port (``{port}`` in cmd), ready; its base URL. Its log goes
    to a temporary file, whose tail is printed if it dies (removed if not); it is stopped (then
    killed) after."""
    port = free_port()
    full_env = {**os.environ, **(env or {}), "PORT": str(port)}
    with tempfile.NamedTemporaryFile(prefix=f"bench-{name}-", suffix=".log",
                                     delete=False) as log:
        proc = subprocess.Popen([c.replace("{port}", str(port)) for c in cmd], cwd=cwd,
                                env=full_env, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_ready(base, health, proc, timeout=timeout)
            yield base
        finally:
            died = proc.poll() is not None
            if died:
                tail = Path(log.name).read_text(errors="replace")[-3000:]
                print(f"[{name} exited with {proc.returncode}; log {log.name}]\n{tail}",
                      file=sys.stderr)
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
            if not died:
                Path(log.name).unlink(missing_ok=True)


def serve(repo: Path, env: dict[str, str]) -> contextlib.AbstractContextManager[str]:
    """``python -m app`` from checkout ``repo`` on a free loopback port, ready; its base URL."""
    return process([sys.executable, "-m", "app"], {"HOST": "127.0.0.1", **env}, "/health",
                   "vertex-gguf", 120, cwd=repo)
