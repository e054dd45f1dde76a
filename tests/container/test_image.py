"""The container tier: the real image (``scripts/build-image.sh cpu``), run with podman as Vertex
AI, Cloud Run and ``docker run`` run it, checked from outside over loopback. Nothing here runs
the app from the virtualenv: the server, its Python, llama.cpp and the embedded model are the
image's own. Without podman or the image the tier is skipped with the reason (CI fails instead).

Each test stops its containers by id and removes them, whatever happens."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator

import pytest
import requests

from tests.support.container import (
    IMAGE,
    LABEL,
    Container,
    head_revision,
    inspect_image,
    run,
    vertex_env,
)
from tests.support.responses import check_stream
from tests.support.server import free_port, wait_for

CHAT = {"messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 24, "temperature": 0}


@pytest.fixture(scope="module")
def image() -> dict:
    """The image's configuration; in CI it must have been built from the commit under test."""
    config = inspect_image()
    built = config["Config"].get("Labels", {}).get("org.opencontainers.image.revision")
    head = head_revision()
    if os.environ.get("CI_REQUIRE_ALL") and head and built != head:
        pytest.fail(f"{IMAGE} was built from {built}, not from {head}: rebuild it")
    return config


@pytest.fixture
def containers(image) -> Iterator[list[Container]]:
    started: list[Container] = []

    def start(env: dict[str, str], **kw) -> Container:
        box = Container(env, **kw)
        started.append(box)
        return box

    yield start
    for box in started:
        box.remove()
    left = run("ps", "--all", "--quiet", "--filter", f"label={LABEL}").stdout.split()
    assert not set(left) & {b.id for b in started}


def sse_data(body: str) -> list[str]:
    return [line[len("data: "):] for line in body.split("\n") if line.startswith("data: ")]


# ---- Vertex AI: AIP_* variables, the colon-form routes, the three predict forms ----------------


def test_vertex_ai_contract(containers):
    env = vertex_env()
    box = containers(env)
    box.wait_listening()  # the port opens at once, before the model is loaded ...
    health = env["AIP_HEALTH_ROUTE"]
    first = requests.get(box.url(health), timeout=10)
    assert first.status_code == 503, first.text  # ... and says so until it is
    assert first.json()["stage"] in {"starting", "loading", "warming_up"}
    box.wait_ready(health)
    predict = box.url(env["AIP_PREDICT_ROUTE"])

    # predict: an envelope with several instances, one prediction each, in order
    prompts = ["The capital of France is", "The capital of Italy is", "One, two,"]
    r = requests.post(predict, json={"instances": [{"prompt": p} for p in prompts],
                                     "parameters": {"max_tokens": 6, "temperature": 0}}, timeout=120)
    assert r.status_code == 200, r.text
    predictions = r.json()["predictions"]
    assert len(predictions) == 3
    assert "Paris" in predictions[0]["choices"][0]["text"]
    assert "Rome" in predictions[1]["choices"][0]["text"]

    # rawPredict: an OpenAI body as it is, answered as it is
    raw = requests.post(predict, json=CHAT, timeout=120)
    assert raw.status_code == 200 and raw.json()["object"] == "chat.completion", raw.text
    answer = raw.json()["choices"][0]["message"]["content"]
    assert answer

    # streamRawPredict: true SSE, event by event, ending with [DONE]
    with requests.post(predict, json={**CHAT, "stream": True}, stream=True, timeout=120) as s:
        assert s.status_code == 200
        assert s.headers["Content-Type"].startswith("text/event-stream")
        pieces = [p for p in s.iter_content(chunk_size=None) if p]
    body = b"".join(pieces).decode()
    assert len(pieces) > 2  # written as it was generated, not in one piece
    data = sse_data(body)
    assert data[-1] == "[DONE]"
    text = "".join(json.loads(d)["choices"][0]["delta"].get("content") or "" for d in data[:-1])
    assert text == answer  # greedy: the same answer, streamed

    # the health route Vertex AI was told of, and nothing set AIP_* inside the image
    assert requests.get(box.url(health), timeout=10).json()["status"] == "ok"


# ---- Cloud Run: PORT only; the three streaming APIs -----------------------------------------


def test_cloud_run_contract(containers):
    box = containers({"PORT": str(free_port())})
    box.wait_ready("/health")

    with requests.post(box.url("/v1/chat/completions"), json={**CHAT, "stream": True},
                       stream=True, timeout=120) as s:
        assert s.status_code == 200
        chat = s.text
    assert sse_data(chat)[-1] == "[DONE]"

    with requests.post(box.url("/v1/messages"), stream=True, timeout=120,
                       headers={"anthropic-version": "2023-06-01"},
                       json={"model": "any", "max_tokens": 24, "stream": True,
                             "messages": [{"role": "user", "content": "Say hello"}]}) as s:
        assert s.status_code == 200
        messages = s.text
    kinds = [json.loads(d)["type"] for d in sse_data(messages)]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds

    with requests.post(box.url("/v1/responses"), stream=True, timeout=120,
                       json={"model": "any", "input": "Say hello", "max_output_tokens": 24,
                             "stream": True}) as s:
        assert s.status_code == 200
        responses = s.text
    datas = check_stream(responses)
    assert datas[-1]["type"] in {"response.completed", "response.incomplete"}


# ---- the image's own configuration ----------------------------------------------------------


def test_runs_as_uid_1000_with_no_platform_variable_baked_in(image, containers):
    config = image["Config"]
    assert config["User"] == "1000"
    assert not [e for e in config.get("Env") or [] if e.startswith("AIP_")]
    # kept because the image is built in Docker's format (podman's OCI default drops it)
    assert "docker" in image.get("ManifestType", "docker")
    healthcheck = image.get("Healthcheck") or config.get("Healthcheck")  # podman's, docker's place
    assert healthcheck and healthcheck["Test"] == ["CMD", "vertex-gguf", "probe"]

    box = containers({"PORT": str(free_port())})
    assert box.exec("id", "-u").stdout.strip() == "1000"
    # the image's HEALTHCHECK command, run inside the container, fails while loading and
    # succeeds once the model is ready
    box.wait_listening()
    probe = healthcheck["Test"][1:]
    box.wait_ready("/health")
    ready = box.exec(*probe)
    assert ready.returncode == 0, ready.stdout + ready.stderr
    uids = box.exec("python3", "-c", "import os; print(sorted({os.stat(f'/proc/{p}').st_uid "
                    "for p in os.listdir('/proc') if p.isdigit()}))")
    assert uids.stdout.strip() == "[1000]", uids.stdout + uids.stderr  # nothing runs as root


def test_healthcheck_fails_before_the_server_answers(containers):
    # a server that never becomes ready: a model path that does not exist ends it, and until
    # then (and after) the probe fails
    box = containers({"PORT": str(free_port()), "MODEL": "/nowhere/model.gguf"})
    probe = box.exec("vertex-gguf", "probe")
    assert probe.returncode != 0
    assert box.exit_code() != 0


# ---- SIGTERM during a stream ---------------------------------------------------------------


def test_sigterm_during_a_stream_finishes_it_and_exits_zero(containers):
    # The graceful timeout is far longer than the reply needs even on a loaded machine (a CI run
    # once took over 45 s for 600 tokens here, and the drain ended the stream with its error
    # event, as it should past the timeout): this test is about the order of events, not speed.
    box = containers({"PORT": str(free_port()), "GRACEFUL_TIMEOUT": "240"})
    box.wait_ready("/health")
    body = {"messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": 300, "ignore_eos": True, "temperature": 0, "stream": True}
    stopped: dict = {}
    with requests.post(box.url("/v1/chat/completions"), json=body, stream=True, timeout=300) as s:
        chunks = s.iter_content(chunk_size=None)
        got = next(chunks)
        stopper = threading.Thread(target=lambda: stopped.update(proc=box.stop(grace=250)))
        stopper.start()
        got += b"".join(chunks)
    stopper.join(320)
    assert not stopper.is_alive()
    data = sse_data(got.decode())
    assert data[-1] == "[DONE]"
    last = json.loads(data[-2])
    assert "error" not in last, last  # ended by the drain: the graceful timeout ran out
    finish = last["choices"][0]["finish_reason"]
    assert finish == "length"  # the whole answer, not one cut short
    state = box.state()
    assert state["Status"] == "exited" and state["ExitCode"] == 0, box.logs()[-3000:]
    # the signal came while the answer was being written: gunicorn took it before the request's
    # access line (written at its end)
    lines = box.logs().splitlines()
    term = next(i for i, ln in enumerate(lines) if "Handling signal: term" in ln)
    served = next(i for i, ln in enumerate(lines) if "POST /v1/chat/completions 200" in ln)
    assert term < served and "finish_reason=length" in lines[served]


# ---- a model from Cloud Storage --------------------------------------------------------------


def test_model_from_cloud_storage_lands_in_the_cache_once(containers, gcs_proxy, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chown(cache, 1000, 1000)
    env = vertex_env(AIP_STORAGE_URI="gs://models/single/", STORAGE_EMULATOR_HOST=gcs_proxy.url,
                     MODEL_CACHE_DIR="/cache")
    first = containers(env, volumes=[f"{cache}:/cache"])
    first.wait_ready(env["AIP_HEALTH_ROUTE"])
    downloads = gcs_proxy.faults.media_requests
    assert downloads > 0
    r = requests.post(first.url("/v1/completions"), timeout=120,
                      json={"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0})
    assert "Paris" in r.json()["choices"][0]["text"]
    models = [p for p in cache.rglob("*.gguf")]
    assert models and all(p.stat().st_uid == 1000 for p in models), models
    assert first.stop(grace=30).returncode == 0

    again = containers({**env, "AIP_HTTP_PORT": str(free_port())}, volumes=[f"{cache}:/cache"])
    again.wait_ready(env["AIP_HEALTH_ROUTE"])
    assert gcs_proxy.faults.media_requests == downloads  # not downloaded a second time
    assert "cache hit" in again.logs()


def test_a_bucket_that_does_not_exist_ends_the_container(containers, gcs_proxy):
    uri = "gs://no-such-bucket/model.gguf"
    env = vertex_env(AIP_STORAGE_URI=uri, STORAGE_EMULATOR_HOST=gcs_proxy.url)
    box = containers(env)
    seen = []

    def ended() -> bool:
        with contextlib.suppress(requests.RequestException):
            seen.append(requests.get(box.url(env["AIP_HEALTH_ROUTE"]), timeout=5).status_code)
        return not box.running()

    wait_for(ended, 120, "the container's end")
    assert 200 not in seen  # never healthy on the way down
    assert box.state()["ExitCode"] != 0
    failed = [ln for ln in box.logs().splitlines() if "model load failed" in ln]
    assert len(failed) == 1 and uri in failed[0], box.logs()[-3000:]
