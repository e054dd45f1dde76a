"""What the bench scripts share: a free loopback port, waiting for health, a server run."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import requests


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
def serve(repo: Path, env: dict[str, str]) -> Iterator[str]:
    """``python -m app`` from checkout ``repo`` on a free loopback port, ready; its base URL."""
    port = free_port()
    full = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port), **env}
    proc = subprocess.Popen([sys.executable, "-m", "app"], cwd=repo, env=full,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, "/health", proc, timeout=120)
        yield base
    finally:
        proc.terminate()
        proc.wait(30)
