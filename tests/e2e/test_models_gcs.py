"""Several models from Cloud Storage (docs/models.md), against gcp-storage-emulator through the
counting proxy: MODELS_DIR a gs:// folder of three tiny embedding models (a, b, c, each S
bytes), and ``twin`` (MODELS) naming a's object too. The download cache is bounded to 2.5 S
(MODEL_CACHE_MAX_GB): two models naming one object download it once; loading c evicts the
unloaded b, never the older but loaded a; with a and c loaded, b cannot fit and its load fails
saying so. The cache on its own: tests/unit/test_gcs_cache.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.gcs_proxy import GcsProxy
from tests.support.server import ServerProcess, running_server, wait_for
from tests.support.tiny_bert import build_tiny_bert

BUCKET, FOLDER = "zoo", "e2e"


@pytest.fixture(scope="module")
def proxy(emulator) -> Iterator[GcsProxy]:
    with GcsProxy(emulator.url) as p:
        yield p


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def srv(emulator, proxy: GcsProxy, cache: Path,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("zoo")
    sizes = []
    for seed, name in enumerate("abc"):
        path = build_tiny_bert(folder / f"{name}.gguf", seed=seed)
        emulator.upload(BUCKET, f"{FOLDER}/{name}.gguf", path)
        sizes.append(path.stat().st_size)
    assert len(set(sizes)) == 1
    env = {"MODELS_DIR": f"gs://{BUCKET}/{FOLDER}/", "MODELS": f"twin=gs://{BUCKET}/{FOLDER}/a.gguf",
           "MODELS_PRELOAD": "none", "MODELS_MAX": "0", "STORAGE_EMULATOR_HOST": proxy.url,
           "MODEL_CACHE_DIR": str(cache), "MODEL_CACHE_MAX_GB": f"{2.5 * sizes[0] / 1e9:.12f}"}
    with running_server(env) as server:
        yield server


def models(srv: ServerProcess) -> dict[str, dict[str, Any]]:
    return requests.get(srv.url("/health"), timeout=30).json()["models"]


def loaded(srv: ServerProcess) -> set[str]:
    return {n for n, m in models(srv).items() if m["status"] == "loaded"}


def load(srv: ServerProcess, name: str) -> None:
    requests.post(srv.url("/models/load"), json={"model": name}, timeout=120)


def downloads(proxy: GcsProxy, name: str) -> int:
    return sum(1 for method, path in proxy.faults.sent
               if method == "GET" and "alt=media" in path and f"{FOLDER}%2F{name}.gguf" in path)


def cached(cache: Path, name: str) -> Path:
    return cache / "gcs" / BUCKET / FOLDER / f"{name}.gguf"


def test_two_models_of_one_object_download_it_once(srv, proxy, cache):
    gate = proxy.faults.gate = threading.Event()  # the first download waits for the test
    loads = [threading.Thread(target=load, args=(srv, name), daemon=True) for name in ("a", "twin")]
    try:
        loads[0].start()
        wait_for(lambda: downloads(proxy, "a") == 1, 60, "a's download")
        loads[1].start()
        waiting = f"waiting for another download of gs://{BUCKET}/{FOLDER}/a.gguf"
        wait_for(lambda: waiting in (models(srv)["twin"].get("detail") or ""), 60,
                 "twin waiting for a's download")
    finally:
        gate.set()
        proxy.faults.gate = None
        for t in loads:
            t.join(120)
    wait_for(lambda: {"a", "twin"} <= loaded(srv), 120, "a and twin loaded")
    assert downloads(proxy, "a") == 1
    assert cached(cache, "a").is_file()


def test_loading_past_the_bound_evicts_an_unloaded_model_never_a_loaded_one(srv, proxy, cache):
    load(srv, "b")
    wait_for(lambda: "b" in loaded(srv), 120, "b loaded")
    requests.post(srv.url("/models/unload"), json={"model": "b"}, timeout=60)
    wait_for(lambda: "b" not in loaded(srv), 60, "b unloaded")
    assert cached(cache, "b").is_file()  # unloaded, still cached: a and b fit
    load(srv, "c")  # a (oldest, loaded) and b (unloaded) cached: one must go for c
    wait_for(lambda: "c" in loaded(srv), 120, "c loaded")
    assert not cached(cache, "b").exists() and cached(cache, "a").is_file()
    assert f"deleted {BUCKET}/{FOLDER}/b.gguf" in srv.logs()
    assert loaded(srv) == {"a", "twin", "c"}
    # now a and c are loaded and nothing may go: b's load fails, saying what is in use
    load(srv, "b")
    status = wait_for(lambda: next((m for m in requests.get(srv.url("/v1/models"), timeout=30)
                                    .json()["data"] if m["id"] == "b"
                                    and m["status"].get("failed")), None), 120, "b's failure")
    reason = status["status"]["reason"]
    assert "MODEL_CACHE_MAX_GB" in reason and "in use" in reason, reason
    assert f"{BUCKET}/{FOLDER}/a.gguf" in reason and f"{BUCKET}/{FOLDER}/c.gguf" in reason
    assert downloads(proxy, "b") == 1  # refused before a second download
