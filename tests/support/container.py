"""The image, run with podman the way the platforms run it: start a container with a given
environment, wait for it, read its logs, stop it by id. tests/container/ uses it.

The image is ``VERTEX_GGUF_IMAGE`` (default ``vertex-gguf:cpu``), built beforehand by
``scripts/build-image.sh cpu`` (.ci/run does it). Containers use the host's network, so a test
reaches the server on a loopback port and the server reaches the storage emulator on one."""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import subprocess
import uuid

import pytest
import requests

from tests.support.server import ROOT, free_port, wait_for

IMAGE = os.environ.get("VERTEX_GGUF_IMAGE", "vertex-gguf:cpu")
LABEL = "vertex-gguf-test"  # every container a test starts carries it, so strays can be found


def podman() -> list[str]:
    """The podman command line, or a skip (a failure in CI) saying what is missing."""
    exe = shutil.which("podman")
    if exe is None:
        missing("podman is not installed (Debian: apt-get install podman runc)")
    cmd = [exe]
    if shutil.which("runc"):  # crun fails on hybrid-cgroup hosts; runc works everywhere
        cmd += ["--runtime", "runc"]
    return cmd


def missing(why: str) -> None:
    if os.environ.get("CI_REQUIRE_ALL"):
        pytest.fail(f"{why}: CI runs the container tier")
    pytest.skip(why)


def run(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([*podman(), *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {proc.returncode}\n{proc.stderr}")
    return proc


def inspect_image(image: str = IMAGE) -> dict:
    proc = run("image", "inspect", image, check=False)
    if proc.returncode != 0:
        missing(f"no image {image}: build it with scripts/build-image.sh cpu")
    return json.loads(proc.stdout)[0]


def head_revision() -> str | None:
    proc = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True, timeout=30)
    return proc.stdout.strip() if proc.returncode == 0 else None


def ulimits() -> list[str]:
    """podman's default limits can exceed what the host allows (then nothing starts): ask for
    enough for the server and no more than the host's hard limits (conmon, which starts the
    container, can hold a lower process limit than this process: 4096 stays under it)."""
    nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 65536)
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 4096)
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


class Container:
    """One detached container of the image, on the host's network."""

    def __init__(self, env: dict[str, str], volumes: list[str] = (), image: str = IMAGE,
                 args: list[str] = ()):
        self.name = f"vertex-gguf-test-{uuid.uuid4().hex[:10]}"
        opts = ["--detach", "--name", self.name, "--label", LABEL, "--network", "host", *ulimits()]
        for key, value in env.items():
            opts += ["--env", f"{key}={value}"]
        for volume in volumes:
            opts += ["--volume", volume]
        self.id = run("run", *opts, image, *args).stdout.strip()
        self.port = int(env.get("AIP_HTTP_PORT") or env.get("PORT") or 8080)
        self.base = f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return self.base + path

    def state(self) -> dict:
        return json.loads(run("inspect", self.id).stdout)[0]["State"]

    def running(self) -> bool:
        return self.state()["Status"] == "running"

    def logs(self) -> str:
        proc = run("logs", self.id, check=False)
        return proc.stdout + proc.stderr

    def exec(self, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return run("exec", self.id, *cmd, timeout=timeout, check=False)

    def wait_listening(self, limit: float = 60) -> None:
        def listening() -> bool:
            if not self.running():
                raise AssertionError(f"the container ended early:\n{self.logs()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return True
            except OSError:
                return False

        wait_for(listening, limit, "listening port")

    def wait_ready(self, health: str = "/health", limit: float = 120) -> None:
        def ready() -> bool:
            if not self.running():
                raise AssertionError(f"the container ended early:\n{self.logs()}")
            try:
                return requests.get(self.url(health), timeout=5).status_code == 200
            except requests.RequestException:
                return False

        wait_for(ready, limit, "ready container")

    def exit_code(self, limit: float = 120) -> int:
        """The exit status once the container has ended by itself (bounded wait)."""
        wait_for(lambda: not self.running(), limit, "container exit")
        return int(self.state()["ExitCode"])

    def stop(self, grace: int = 60) -> subprocess.CompletedProcess:
        """``podman stop -t GRACE``: SIGTERM, then SIGKILL after GRACE seconds."""
        return run("stop", "-t", str(grace), self.id, timeout=grace + 60, check=False)

    def remove(self) -> None:
        run("rm", "--force", "--time", "5", self.id, timeout=60, check=False)


def vertex_env(**extra: str) -> dict[str, str]:
    """The variables Vertex AI sets for a custom container (a new free port each time)."""
    return {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(free_port()),
            "AIP_HEALTH_ROUTE": "/v1/endpoints/1234/deployedModels/5678",
            "AIP_PREDICT_ROUTE": "/v1/endpoints/1234/deployedModels/5678:predict",
            "AIP_ENDPOINT_ID": "1234", "AIP_DEPLOYED_MODEL_ID": "5678", **extra}
