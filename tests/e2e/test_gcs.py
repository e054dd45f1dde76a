"""End to end: a real server loads its model from Cloud Storage, against gcp-storage-emulator
with the real google-cloud-storage client (through a loopback proxy that counts downloads and
injects faults). The download itself, unit by unit: tests/unit/test_gcs.py.

Bucket layout (uploaded by the ``emulator`` fixture):
  models/single/smollm2.gguf           the default model
  models/dir-one/smollm2.gguf          ... next to a README
  models/dir-many/{a,b}.gguf           two (tiny, fake) models
  models/split/SmolLM2-135M-Instruct.Q4_1-0000{1,2,3}-of-00003.gguf   the default model split in 3 shards
  models/vision/{smollm2,mmproj-smollm2}.gguf   the default model and a vision projector for it
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

SPLIT = "SmolLM2-135M-Instruct.Q4_1"


# ---- end to end: the server started the way Vertex AI starts it -----------------------------


def vertex_env(proxy, cache: Path, uri: str, **extra) -> dict[str, str]:
    return {"AIP_MODE": "PREDICTION", "AIP_STORAGE_URI": uri, "STORAGE_EMULATOR_HOST": proxy.url,
            "MODEL_CACHE_DIR": str(cache), **extra}


def test_server_downloads_with_progress_then_serves(server_factory, gcs_proxy, tmp_path):
    gcs_proxy.faults.bytes_per_second = 16 * 1024 * 1024  # per connection, so it takes a while
    srv = server_factory(vertex_env(gcs_proxy, tmp_path, "gs://models/single/",
                                    DOWNLOAD_WORKERS="2", DOWNLOAD_SLICE_MB="8"))
    srv.wait_listening()
    events = []
    with requests.get(srv.url("/models/sse"), stream=True, timeout=60) as sse:
        health_bodies = []
        for line in sse.iter_lines():
            if line.startswith(b"event: "):
                kind = line[7:].decode()
            elif line.startswith(b"data: "):
                events.append((kind, json.loads(line[6:])))
                if len(health_bodies) < 3:
                    health_bodies.append(requests.get(srv.url("/health"), timeout=5))
    kinds = [k for k, _ in events]
    assert "download_progress" in kinds
    assert events[-1][0] == "model_status" and events[-1][1]["status"] == "loaded"
    progress = [e["downloaded_bytes"] for k, e in events if k == "download_progress"]
    assert progress == sorted(progress) and progress[-1] > 0
    first = health_bodies[0]
    assert first.status_code == 503
    assert first.json()["stage"] in {"starting", "downloading"}
    downloading = [h.json() for h in health_bodies if h.json().get("stage") == "downloading"]
    assert downloading and "progress" in downloading[0]
    r = requests.post(srv.url("/predict"), json={"instances": [{"prompt": "The capital of France is",
                      "max_tokens": 6, "temperature": 0}]}, timeout=60)
    assert "Paris" in r.json()["predictions"][0]["choices"][0]["text"]
    assert "downloaded and verified" in srv.logs()
    assert "MB/s" in srv.logs() and "ETA" in srv.logs()


def test_server_loads_and_generates_from_a_split_gguf(server_factory, gcs_proxy, tmp_path):
    srv = server_factory(vertex_env(gcs_proxy, tmp_path, "gs://models/split"))
    srv.wait_ready()
    r = requests.post(srv.url("/v1/completions"), json={"prompt": "The capital of France is",
                      "max_tokens": 6, "temperature": 0}, timeout=60)
    assert "Paris" in r.json()["choices"][0]["text"]
    assert r.json()["model"] == f"{SPLIT}-00001-of-00003"
    # a restart with the same objects finds them in the cache
    srv.stop()
    before = gcs_proxy.faults.media_requests
    srv2 = server_factory(vertex_env(gcs_proxy, tmp_path, "gs://models/split"))
    srv2.wait_ready()
    assert gcs_proxy.faults.media_requests == before
    assert "cache hit" in srv2.logs()


def test_a_directory_pairs_the_model_with_its_projector(server_factory, gcs_proxy, tmp_path):
    from tests.support.images import data_url, encoded

    srv = server_factory(vertex_env(gcs_proxy, tmp_path, "gs://models/vision/"))
    srv.wait_ready()
    props = requests.get(srv.url("/props"), timeout=10).json()
    assert props["modalities"]["vision"] is True
    assert props["model_path"] == "smollm2.gguf"  # the projector is never taken for the model
    r = requests.post(srv.url("/v1/chat/completions"), timeout=60, json={
        "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(encoded("red"))}}]}]})
    assert r.status_code == 200, r.text
    # MMPROJ=none leaves it unpaired: the same directory serves text only
    srv.stop()
    srv2 = server_factory(vertex_env(gcs_proxy, tmp_path, "gs://models/vision/", MMPROJ="none"))
    srv2.wait_ready()
    assert requests.get(srv2.url("/props"), timeout=10).json()["modalities"]["vision"] is False


@pytest.mark.parametrize("uri", ["gs://models/single/missing.gguf", "gs://models/dir-many/"])
def test_server_exits_non_zero_when_the_model_cannot_be_fetched(server_factory, gcs_proxy, tmp_path, uri):
    srv = server_factory(vertex_env(gcs_proxy, tmp_path, uri))
    assert srv.proc.wait(60) != 0
    lines = [ln for ln in srv.logs().splitlines() if "model load failed" in ln]
    assert len(lines) == 1 and uri in lines[0], srv.logs()


# ---- hostile names, shared caches, missing checksums (security review L4) ------------------


