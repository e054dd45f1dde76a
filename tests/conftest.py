"""Shared fixtures: a Flask test client over the fake engine, and real server processes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from app import create_app
from app.engine.fake import FakeEngine
from app.model.default import default_model_path
from app.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fake_engine() -> FakeEngine:
    return FakeEngine()


def make_client(engine: FakeEngine, **settings):
    app = create_app(Settings(**settings), engine=engine)
    app.testing = True
    return app.test_client()


@pytest.fixture
def client(fake_engine: FakeEngine):
    return make_client(fake_engine)


# ---- end-to-end: a real gunicorn process with the real default model -----------------------


def model_cache_dir() -> Path:
    return Path(os.environ.get("MODEL_CACHE_DIR", "/tmp/vertex-gguf"))


@pytest.fixture(scope="session")
def default_model() -> Path:
    path = default_model_path(model_cache_dir())
    if not path.is_file():
        pytest.fail(f"default model missing at {path}: run `vertex-gguf fetch-default-model`")
    return path


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
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("AIP_")}
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


@pytest.fixture
def server_factory(default_model: Path) -> Iterator:
    started: list[ServerProcess] = []

    def start(env: dict[str, str] | None = None, args: list[str] | None = None) -> ServerProcess:
        srv = ServerProcess(env, args)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


VERTEX_HEALTH = "/v1/endpoints/1234/deployedModels/5678"
VERTEX_PREDICT = "/v1/endpoints/1234/deployedModels/5678:predict"


@pytest.fixture(scope="module", params=["1", "4"], ids=["parallel1", "parallel4"])
def vertex_server(default_model: Path, request) -> Iterator[ServerProcess]:
    """One server started the way Vertex AI starts the container; every test using it runs
    with one slot and with four (continuous batching)."""
    port = free_port()
    srv = ServerProcess(
        {
            "AIP_MODE": "PREDICTION",
            "AIP_HTTP_PORT": str(port),
            "AIP_HEALTH_ROUTE": VERTEX_HEALTH,
            "AIP_PREDICT_ROUTE": VERTEX_PREDICT,
            "AIP_DEPLOYED_MODEL_ID": "5678",
            "AIP_ENDPOINT_ID": "1234",
            "MAX_QUEUE": "16",
            "PARALLEL": request.param,
        }
    )
    try:
        srv.wait_ready(VERTEX_HEALTH)
        yield srv
    finally:
        srv.stop()


# ---- Cloud Storage: the emulator, started by the tests on a loopback port ---------------------


class Emulator:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        exe = Path(sys.executable).with_name("gcp-storage-emulator")
        self.proc = subprocess.Popen(
            [str(exe), "start", "--host", "127.0.0.1", "--port", str(self.port), "--in-memory", "-q"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.05)
        else:
            raise AssertionError("storage emulator did not start")
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        self.client = storage.Client(
            credentials=AnonymousCredentials(), project="test", client_options={"api_endpoint": self.url}
        )

    def upload(self, bucket: str, name: str, path: Path | None = None, data: bytes | None = None):
        b = self.client.lookup_bucket(bucket) or self.client.create_bucket(bucket)
        blob = b.blob(name)
        if path is not None:
            blob.upload_from_filename(str(path))
        else:
            blob.upload_from_string(data or b"")
        return b.get_blob(name)

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(10)


@pytest.fixture(scope="session")
def emulator(default_model: Path, tmp_path_factory) -> Iterator[Emulator]:
    """The emulator with the test models uploaded (see tests/test_gcs.py for the layout)."""
    from tests.gguf_split import split_gguf

    emu = Emulator()
    try:
        emu.upload("models", "single/smollm2.gguf", default_model)
        emu.upload("models", "dir-one/smollm2.gguf", default_model)
        emu.upload("models", "dir-one/README.md", data=b"one model in here")
        emu.upload("models", "dir-many/a.gguf", data=b"GGUF model a")
        emu.upload("models", "dir-many/b.gguf", data=b"GGUF model b")
        shards = split_gguf(default_model, tmp_path_factory.mktemp("split"), 3)
        for shard in shards:
            emu.upload("models", f"split/{shard.name}", shard)
        yield emu
    finally:
        emu.stop()


@pytest.fixture
def gcs_proxy(emulator: Emulator):
    from tests.gcs_proxy import GcsProxy

    with GcsProxy(emulator.url) as proxy:
        yield proxy
