"""End to end: idle sleep on a real server and model. After SLEEP_IDLE_SECONDS without a
request the model, contexts and KV cache are freed (the process's memory drops); health stays
200 and says so; the routes that only read the model's card do not wake it; the next requests
wake it once and all succeed, including requests that race the fall into sleep."""

from __future__ import annotations

import concurrent.futures
import os
import time
from pathlib import Path

import pytest
import requests

from tests.support.server import ServerProcess, running_server

IDLE = 1.5  # SLEEP_IDLE_SECONDS
CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def server(default_model) -> ServerProcess:
    env = {"SLEEP_IDLE_SECONDS": str(IDLE), "PARALLEL": "4", "EMBEDDINGS": "on",
           "EMBEDDING_CTX": "256"}
    with running_server(env) as srv:
        yield srv


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (the gunicorn worker holds the model)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0, [pid]
    while todo:  # bounded by the process count
        p = todo.pop()
        todo += children.get(p, [])
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def health(srv: ServerProcess) -> dict:
    r = requests.get(srv.url("/health"), timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def wait_for_sleep(srv: ServerProcess, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if health(srv)["sleeping"]:
            return
        time.sleep(0.1)
    raise AssertionError(f"not asleep after {limit} s:\n{srv.logs()[-3000:]}")


def chat(srv: ServerProcess) -> dict:
    r = requests.post(srv.url("/v1/chat/completions"), json=CHAT, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_idle_sleep_frees_memory_and_a_burst_wakes_it_once(server):
    assert chat(server)["choices"][0]["message"]["content"] is not None
    awake = tree_rss(server.proc.pid)
    wait_for_sleep(server)
    asleep = tree_rss(server.proc.pid)
    # the weights (92 MB mapped), four slots' KV (4 x 4096 tokens) and both contexts' buffers
    assert awake - asleep > 100 * 2**20, (awake, asleep)
    for path in ("/v1/models", "/props", "/health"):  # they read the card only
        assert requests.get(server.url(path), timeout=10).status_code == 200
    assert health(server)["sleeping"]
    wakes = server.logs().count("woke up: model reloaded")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: chat(server), range(8)))
    assert all(a["choices"][0]["finish_reason"] in {"stop", "length"} for a in answers)
    assert server.logs().count("woke up: model reloaded") == wakes + 1  # one reload for all 8
    assert not health(server)["sleeping"]


def test_an_embedding_and_a_token_count_wake_it_too(server):
    wait_for_sleep(server)
    r = requests.post(server.url("/v1/embeddings"), json={"input": ["a", "b"]}, timeout=120)
    assert r.status_code == 200 and len(r.json()["data"]) == 2
    wait_for_sleep(server)
    r = requests.post(server.url("/v1/messages/count_tokens"), timeout=120, json={
        "model": "m", "messages": [{"role": "user", "content": "count me"}]})
    assert r.status_code == 200 and r.json()["input_tokens"] > 0
    wait_for_sleep(server)
    r = requests.post(server.url("/tokenize"), json={"content": "hello"}, timeout=120)
    assert r.status_code == 200 and r.json()["tokens"]


@pytest.mark.parametrize("offset", [-0.2, -0.1, -0.05, 0.0, 0.02, 0.05, 0.1, 0.2])
def test_a_request_racing_the_fall_into_sleep_succeeds(server, offset):
    """Requests sent around the moment the idle timer runs out: each either keeps the model
    awake or wakes it; none fails or hangs (llama-server can hang one here)."""
    chat(server)  # the idle timer starts from this request's end
    time.sleep(max(0.0, IDLE + offset))
    kinds = [lambda: chat(server),
             lambda: requests.post(server.url("/v1/embeddings"), json={"input": "race"},
                                   timeout=120).raise_for_status()]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for fut in [pool.submit(k) for k in kinds]:
            fut.result(timeout=120)
    assert health(server)["status"] == "ok"
    assert os.path.exists(f"/proc/{server.proc.pid}")


def test_idle_counts_from_ready_and_from_the_last_requests_end(server_factory):
    """A server that took longer to load than SLEEP_IDLE_SECONDS is awake when ready, and a
    request that runs longer than it is not followed at once by sleep."""
    srv = server_factory({"SLEEP_IDLE_SECONDS": "3", "PARALLEL": "2"})
    srv.wait_ready()
    assert not health(srv)["sleeping"]
    body = {**CHAT, "max_tokens": 400, "ignore_eos": True}  # longer than the idle time here
    assert requests.post(srv.url("/v1/chat/completions"), json=body, timeout=300).ok
    assert not health(srv)["sleeping"]
    assert "woke up" not in srv.logs()
