"""The suite's fixtures. Shared code lives in tests/support/; tests import it from there, never
from here or from one another. The folder a test sits in is its tier: tests/e2e/ is marked
``e2e``, tests/deploy/ ``deploy`` and tests/container/ ``container`` here, and a tier marker
anywhere else is an error."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.engine.fake import FakeEngine
from app.model.default import default_model_path
from tests.support.app import make_client
from tests.support.gcs_emulator import Emulator
from tests.support.server import (
    VERTEX_HEALTH,
    VERTEX_PREDICT,
    ServerProcess,
    free_port,
    model_cache_dir,
)

TIERS = {"e2e": "e2e", "deploy": "deploy", "container": "container"}  # folder -> marker


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        folder = Path(str(item.fspath)).parent.name
        for marker in TIERS.values():
            if item.get_closest_marker(marker) and TIERS.get(folder) != marker:
                raise pytest.UsageError(f"{item.nodeid}: a {marker} test belongs in tests/{marker}/")
        if folder in TIERS:
            item.add_marker(TIERS[folder])


@pytest.fixture
def fake_engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def client(fake_engine: FakeEngine):
    return make_client(fake_engine)


@pytest.fixture(scope="session")
def default_model() -> Path:
    """The real default model, or E2E_MODEL's GGUF: bench/gpu/run.sh runs end-to-end files on
    a GPU build with a random-weight model (and sets MODEL, which the servers read, to it)."""
    override = os.environ.get("E2E_MODEL")
    if override:
        if not Path(override).is_file():
            pytest.fail(f"E2E_MODEL={override}: no such file")
        return Path(override)
    path = default_model_path(model_cache_dir())
    if not path.is_file():
        pytest.fail(f"default model missing at {path}: run `vertex-gguf fetch-default-model`")
    return path


@pytest.fixture(scope="session")
def model_id(default_model: Path) -> str:
    """The name the servers give the suite's model: its file name without .gguf."""
    return default_model.stem


@pytest.fixture(scope="session")
def sensible_text() -> bool:
    """Whether the suite's model writes sense (the real default model) or noise (E2E_MODEL's
    random weights): a test checks an answer's content only when it does."""
    return not os.environ.get("E2E_MODEL")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("needs_text") and os.environ.get("E2E_MODEL"):
        pytest.skip(f"needs the default model's sensible text; E2E_MODEL={os.environ['E2E_MODEL']}")


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


@pytest.fixture(scope="session")
def emulator(default_model: Path, tmp_path_factory) -> Iterator[Emulator]:
    """The emulator with the test models uploaded (see tests/unit/test_gcs.py for the layout)."""
    from tests.support.gguf_split import split_gguf

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
        # a model and its vision projector side by side, as llama.cpp's converter names them
        from tests.support.tiny_mmproj import build_tiny_mmproj

        proj = build_tiny_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj-smollm2.gguf", 576)
        emu.upload("models", "vision/smollm2.gguf", default_model)
        emu.upload("models", "vision/mmproj-smollm2.gguf", proj)
        from tests.support.images import encoded

        emu.upload("models", "images/red.png", data=encoded("red"))
        yield emu
    finally:
        emu.stop()


@pytest.fixture
def gcs_proxy(emulator: Emulator):
    from tests.support.gcs_proxy import GcsProxy

    with GcsProxy(emulator.url) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def vocab(default_model: Path) -> Iterator:
    """The default model loaded vocab-only (no context): the engine's vocabulary tables, for
    driving its sampler and grammars with logits of a test's own (tests/support/sampling.py)."""
    import llama_cpp
    from llama_cpp import llama_cpp as ll

    from app.engine.sampling import Vocab

    llama_cpp._logger.set_verbose(False)
    ll.llama_backend_init()
    params = ll.llama_model_default_params()
    params.vocab_only = True
    model = ll.llama_model_load_from_file(str(default_model).encode(), params)
    yield Vocab(ll, ll.llama_model_get_vocab(model))
    ll.llama_model_free(model)


@pytest.fixture(scope="session")
def reference(default_model: Path):
    """The default model with logits at every position: an independent computation of log
    probabilities (tests/support/reference.py)."""
    from tests.support.reference import Reference

    return Reference(default_model)
