"""Several models in one server (docs/models.md), under gunicorn, each model's engine in its own
process: the default model (pinned, preloaded), the near-free model (bench/gpu/models.py's
shape on the default model's vocabulary) and a tiny embedding model, with MODELS_MAX=2.
Loading on demand, the openai client switching models per request, an unknown model's 404,
eviction of the least recently used idle model and never the pinned one, llama-server's
router routes, Ollama's ps, keep_alive 0 and empty requests, /props of each model (its own
preset's context), and a model's engine process killed (SIGKILL) or crashed (SIGSEGV) mid-stream
while another model streams. The in-process tier: tests/app/test_pooled_models.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import ollama
import openai
import pytest
import requests

from tests.support.server import ROOT, ServerProcess, running_server, wait_for
from tests.support.tiny_bert import build_tiny_bert

HI = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def srv(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    folder = tmp_path_factory.mktemp("models")
    models = ROOT / "bench" / "gpu" / "models.py"
    vocab, free = folder / "vocab.gguf", folder / "free.gguf"
    for args in (["vocab", str(default_model), str(vocab)], ["build", "nearfree", str(vocab),
                                                            str(free)]):
        subprocess.run([sys.executable, str(models), *args], check=True, cwd=ROOT,
                       capture_output=True, timeout=120)
    embed = build_tiny_bert(folder / "embed.gguf")
    preset = folder / "models.ini"
    # free loads at the lowest CPU priority (LOAD_PRIORITY=low): its loads still finish
    preset.write_text("[smol]\npin = true\naliases = smol-chat\n\n[free]\nctx-size = 256\n"
                      "load-priority = low\n\n"
                      "[embed]\nembeddings = only\n")
    env = {"MODELS": f"smol={default_model},free={free},embed={embed}",
           "MODELS_PRESET": str(preset), "MODELS_MAX": "2", "CTX_SIZE": "512", "PARALLEL": "2"}
    with running_server(env) as server:
        yield server


@pytest.fixture(scope="module")
def client(srv: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url("/v1"), api_key="x", max_retries=0, timeout=120)


def statuses(srv: ServerProcess) -> dict[str, dict[str, Any]]:
    data = requests.get(srv.url("/v1/models"), timeout=30).json()["data"]
    return {m["id"]: m["status"] for m in data}


def loaded(srv: ServerProcess) -> set[str]:
    return {n for n, s in statuses(srv).items() if s["value"] == "loaded"}


def engine_pid(srv: ServerProcess, name: str) -> int:
    return requests.get(srv.url("/health"), timeout=30).json()["models"][name]["engine_process"]


def chat(client: openai.OpenAI, model: str, n: int = 4) -> str:
    resp = client.chat.completions.create(model=model, messages=HI, max_tokens=n)
    assert resp.model in (model, "smol")
    return resp.choices[0].message.content or ""


def test_the_default_is_preloaded_and_the_others_wait(srv):
    health = requests.get(srv.url("/health"), timeout=30).json()
    assert health["status"] == "ok" and health["default"] == "smol"
    assert statuses(srv) == {"smol": {"value": "loaded"}, "free": {"value": "unloaded"},
                             "embed": {"value": "unloaded"}}
    card = requests.get(srv.url("/v1/models/smol-chat"), timeout=30).json()
    assert card["id"] == "smol" and card["pinned"] is True and card["meta"]["n_ctx"] == 512


def test_the_openai_client_switches_models_and_the_lru_idle_one_goes(srv, client):
    chat(client, "free")  # loaded on demand
    assert loaded(srv) == {"smol", "free"}
    assert chat(client, "smol-chat")
    # MODELS_MAX=2: embed's load evicts free (idle, least recently used); smol is pinned
    emb = client.embeddings.create(model="embed", input=["hello", "world"])
    assert len(emb.data) == 2 and len(emb.data[0].embedding) > 0
    assert wait_for(lambda: loaded(srv) == {"smol", "embed"}, 60, "free evicted")
    chat(client, "free")  # back again: embed goes this time, smol stays
    assert wait_for(lambda: loaded(srv) == {"smol", "free"}, 60, "embed evicted")


def test_a_load_takes_the_spare_engine_process_started_ahead_and_the_next_one_starts(srv):
    """The next load's engine process, started ahead with the engine imported (it skips a
    fresh interpreter: a third of a small model's load), is the one the load runs in."""
    def spare() -> int | None:
        return requests.get(srv.url("/health"), timeout=30).json()["spare_engine_process"]

    assert wait_for(lambda: spare() is not None, 60, "a spare started")
    ahead = spare()
    requests.post(srv.url("/models/unload"), json={"model": "embed"}, timeout=60)
    resp = requests.post(srv.url("/models/load"), json={"model": "embed"}, timeout=120)
    assert resp.status_code == 200
    assert engine_pid(srv, "embed") == ahead
    assert wait_for(lambda: spare() not in (None, ahead), 60, "the next spare")
    emb = requests.post(srv.url("/v1/embeddings"), json={"model": "embed", "input": "hi"},
                        timeout=60)
    assert emb.status_code == 200 and emb.json()["data"][0]["embedding"]


def test_an_unknown_model_is_a_404_naming_the_models(client):
    with pytest.raises(openai.NotFoundError) as err:
        chat(client, "nope")
    assert err.value.code == "model_not_found"
    assert "smol, free, embed" in str(err.value)


def test_the_router_routes_load_and_unload(srv):
    resp = requests.post(srv.url("/models/load"), json={"model": "embed"}, timeout=120)
    assert resp.status_code == 200 and resp.json()["success"] is True
    assert wait_for(lambda: loaded(srv) == {"smol", "embed"}, 60, "embed loaded")
    resp = requests.post(srv.url("/models/unload"), json={"model": "embed"}, timeout=60)
    assert resp.json() == {"success": True, "result": "unloaded"}
    assert wait_for(lambda: loaded(srv) == {"smol"}, 60, "embed unloaded")
    listed = requests.get(srv.url("/models"), timeout=30).json()["data"]
    assert [m["id"] for m in listed] == ["smol", "free", "embed"]


def test_ollama_ps_keep_alive_0_and_empty_requests(srv):
    client = ollama.Client(host=srv.base)
    client.generate(model="free", prompt="")  # an empty generate loads it
    assert wait_for(lambda: "free" in loaded(srv), 60, "free loaded")
    ps = {m.model: m for m in client.ps().models}
    assert set(ps) == {"smol:latest", "free:latest"} and ps["free:latest"].expires_at
    tags = [m.model for m in client.list().models]
    assert tags == ["smol:latest", "free:latest", "embed:latest"]
    reply = client.chat(model="free", messages=HI, keep_alive=0, options={"num_predict": 4})
    assert reply.done
    assert wait_for(lambda: "free" not in loaded(srv), 60, "free unloaded after its answer")
    client.generate(model="free", prompt="")
    assert wait_for(lambda: "free" in loaded(srv), 60, "free loaded")
    client.generate(model="free", prompt="", keep_alive=0)  # ... and an empty one unloads
    assert wait_for(lambda: "free" not in loaded(srv), 60, "free unloaded")


def test_props_shows_the_named_models_own_preset(srv, client):
    chat(client, "free")  # loaded: /props never loads a model
    free = requests.get(srv.url("/props?model=free"), timeout=30).json()
    assert free["model_alias"] == "free"
    assert free["n_ctx"] == 256 and free["settings"]["ctx_size"] == 256  # its preset's
    assert free["settings"]["load_priority"] == "low"
    smol = requests.get(srv.url("/props"), timeout=30).json()  # the default model's
    assert smol["model_alias"] == "smol"
    assert smol["n_ctx"] == 512 and smol["settings"]["ctx_size"] == 512  # CTX_SIZE's


def stream_raw(srv: ServerProcess, model: str, n: int) -> Any:
    """A chat stream's SSE lines, read as they come (the error event in OpenAI's shape)."""
    resp = requests.post(srv.url("/v1/chat/completions"), stream=True, timeout=120, json={
        "model": model, "messages": HI, "max_tokens": n, "stream": True, "ignore_eos": True})
    assert resp.status_code == 200
    return resp.iter_lines(decode_unicode=True)


@pytest.mark.parametrize(("sig", "said"), [(signal.SIGKILL, "was killed (SIGKILL"),
                                           (signal.SIGSEGV, "died from SIGSEGV")])
def test_a_killed_engine_leaves_the_other_models_stream_whole(srv, client, sig, said):
    """A model's engine process dies (killed, or a native crash) with a request of its own
    in flight while another model streams: that request ends with its error event, the other
    stream ends whole, and the dead model's next request waits for its new engine process.
    The victim is the real model (smol), slow enough to be mid-stream when it dies."""
    chat(client, "free")
    victim, other = engine_pid(srv, "smol"), engine_pid(srv, "free")
    assert victim != other
    lines = stream_raw(srv, "smol", 400)
    assert next(line for line in lines if line.startswith("data: {"))  # smol is streaming
    started, texts, errors = threading.Event(), [], []

    def stream() -> None:
        try:
            out = client.chat.completions.create(model="free", messages=HI, max_tokens=200,
                                                 stream=True, extra_body={"ignore_eos": True},
                                                 stream_options={"include_usage": True})
            for chunk in out:
                started.set()
                if chunk.choices and chunk.choices[0].finish_reason:
                    texts.append(chunk.choices[0].finish_reason)
                if chunk.usage is not None:
                    texts.append(chunk.usage.completion_tokens)
        except Exception as exc:  # noqa: BLE001 - said by the assertion below
            errors.append(repr(exc))
            started.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert started.wait(120)
    os.kill(victim, sig)
    rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    error = json.loads(rest[-2][6:])["error"]
    assert error["code"] == "engine_error"
    assert f"engine process {victim} {said}" in error["message"]
    reader.join(300)
    assert not reader.is_alive() and not errors, errors
    assert texts == ["length", 200]  # every token: a loaded machine may send several per chunk
    assert chat(client, "smol") is not None  # its next request waits for its restart
    assert engine_pid(srv, "smol") != victim
    assert engine_pid(srv, "free") == other  # the other model's engine process lived on
