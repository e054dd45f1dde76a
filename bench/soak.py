"""Soak: mixed APIs at 32 concurrent clients for a while, with disconnects, resumes, hostile
bodies and two API keys mixed in (issue 26).

Starts the server (this tree) on a loopback port with two keys, then runs ``--clients`` threads
until ``--seconds`` have passed. Each thread loops over tasks drawn at random:
  - an honest stream on one of the four chat APIs (chat, completions, messages, responses), read
    to its end: the longest gap between two of its chunks is recorded;
  - a stream dropped after its first chunks (the generation must be cancelled);
  - a resumable stream (X-Conversation-Id) dropped, then resumed from the last whole event: the
    resumed bytes must complete it;
  - a hostile body (deep JSON, a dead grammar, a wrong type, a 2 MB string, n over the slots,
    bad UTF-8): it must be a 4xx.
Every request carries one of the two keys. Prints errors (a 5xx, a connection error, a 4xx where
a 200 belonged, a stream without its end), worker restarts, the worker's RSS and open file
descriptors at start (after a warm-up) and at the end (after the load stops), and the longest
gap an honest stream saw. The target: zero errors, zero restarts, flat memory and descriptors.
Not a test: figures depend on the machine; record runs in bench/RESULTS.md.

    python bench/soak.py                 # 180 s
    python bench/soak.py --seconds 1800  # the longer run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import requests
from common import ROOT, free_port, wait_ready

KEYS = ("soak-key-one", "soak-key-two")
PROMPT = "Tell me about the sea in a few sentences."
BODIES = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": PROMPT}]},
    "/v1/completions": {"prompt": PROMPT},
    "/v1/messages": {"messages": [{"role": "user", "content": PROMPT}]},
    "/v1/responses": {"input": PROMPT},
}
DELTAS = {"/v1/chat/completions": b'"delta":{"content"', "/v1/completions": b'"text":',
          "/v1/messages": b"content_block_delta", "/v1/responses": b"output_text.delta"}
HOSTILE = [
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "x": '
     + b"[" * 3000 + b"]" * 3000 + b"}"),
    ("/v1/completions", json.dumps({"prompt": "x", "grammar": "root ::= root"}).encode()),
    ("/v1/messages", json.dumps({"messages": "not a list", "max_tokens": 5}).encode()),
    ("/v1/responses", json.dumps({"input": "x" * 2_000_000, "max_output_tokens": 5}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}],
                                         "n": 1000}).encode()),
    ("/v1/completions", b'{"prompt": "\xff\xfe"}'),
]


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.gaps: list[float] = []

    def count(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1

    def error(self, what: str) -> None:
        with self.lock:
            self.errors[what[:120]] += 1

    def gap(self, seconds: float) -> None:
        with self.lock:
            self.gaps.append(seconds)


def headers(rng: random.Random, conv: str | None = None) -> dict[str, str]:
    key = rng.choice(KEYS)
    out = {"Authorization": f"Bearer {key}"} if rng.random() < 0.5 else {"x-api-key": key}
    out["Content-Type"] = "application/json"
    if conv:
        out["X-Conversation-Id"] = conv
    return out


def stream_body(path: str, tokens: int) -> dict:
    body = {**BODIES[path], "stream": True}
    body["max_output_tokens" if path == "/v1/responses" else "max_tokens"] = tokens
    return body


def open_stream(base: str, rng: random.Random, tally: Tally, task: str, tokens: int,
                ) -> tuple[str, requests.Response | None]:
    """A streaming POST on one of the four chat APIs: (its path, the response or None when it
    was refused, counted as an error)."""
    path = rng.choice(list(BODIES))
    r = requests.post(base + path, json=stream_body(path, tokens), headers=headers(rng),
                      stream=True, timeout=300)
    if r.status_code != 200:
        tally.error(f"{task} {path}: {r.status_code} {r.text[:80]}")
        r.close()
        return path, None
    return path, r


def honest(base: str, rng: random.Random, tally: Tally) -> None:
    path, r = open_stream(base, rng, tally, "honest", 48)
    if r is None:
        return
    with r:
        last, data = None, b""
        for chunk in r.iter_content(chunk_size=None):
            # gaps between two chunks that carry generated text: what a reader of a running
            # stream waits (the events sent on acceptance may wait for a slot first)
            if DELTAS[path] in chunk:
                now = time.monotonic()
                if last is not None:
                    tally.gap(now - last)
                last = now
            data += chunk
    ends = {"/v1/chat/completions": b"[DONE]", "/v1/completions": b"[DONE]",
            "/v1/messages": b"message_stop", "/v1/responses": b"response.completed"}
    if ends[path] not in data and b"response.incomplete" not in data:
        tally.error(f"honest {path}: no end event")
    tally.count("honest")


def dropped(base: str, rng: random.Random, tally: Tally) -> None:
    _, r = open_stream(base, rng, tally, "dropped", 400)
    if r is None:
        return
    with r:
        chunks = r.iter_content(chunk_size=None)
        next(chunks, None)
        next(chunks, None)
    tally.count("dropped")


def resumed(base: str, rng: random.Random, tally: Tally) -> None:
    conv = f"soak-{rng.getrandbits(48):x}"
    hdrs = headers(rng, conv)
    got = b""
    with requests.post(base + "/v1/chat/completions", json=stream_body(
            "/v1/chat/completions", 64), headers=hdrs, stream=True, timeout=300) as r:
        if r.status_code == 429:
            tally.count("resumable refused (429, by design)")
            return
        if r.status_code != 200:
            tally.error(f"resumable: {r.status_code} {r.text[:80]}")
            return
        for chunk in r.iter_content(chunk_size=None):
            got += chunk
            if got.count(b"\n\n") >= 3:
                break
    cut = got.rindex(b"\n\n") + 2
    del hdrs["X-Conversation-Id"]
    rest = requests.get(f"{base}/v1/stream", params={"conv_id": conv, "from": cut},
                        headers=hdrs, timeout=300)
    if rest.status_code != 200 or not rest.content.endswith(b"data: [DONE]\n\n"):
        tally.error(f"resume: {rest.status_code} {rest.content[-60:]!r}")
        return
    tally.count("resumed")


def hostile(base: str, rng: random.Random, tally: Tally) -> None:
    path, data = rng.choice(HOSTILE)
    r = requests.post(base + path, data=data, headers=headers(rng), timeout=120)
    if not 400 <= r.status_code < 500:
        tally.error(f"hostile {path}: {r.status_code}")
    tally.count("hostile")


TASKS = {"honest": (honest, 0.5), "dropped": (dropped, 0.15), "resumed": (resumed, 0.15),
         "hostile": (hostile, 0.2)}


def client(base: str, seed: int, until: float, tally: Tally, only: list[str]) -> None:
    rng = random.Random(seed)
    tasks, weights = zip(*(TASKS[name] for name in only), strict=True)
    while time.monotonic() < until:
        task = rng.choices(tasks, weights)[0]
        try:
            task(base, rng, tally)
        except requests.RequestException as exc:
            tally.error(f"{task.__name__}: {type(exc).__name__}")


def worker_pid(master: int) -> int:
    with open(f"/proc/{master}/task/{master}/children") as fh:
        return int(fh.read().split()[0])


def usage(pid: int) -> tuple[int, int]:
    """(RSS in KiB, open file descriptors) of a process."""
    with open(f"/proc/{pid}/status") as fh:
        rss = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=180)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--parallel", type=int, default=16)
    ap.add_argument("--warmup", type=float, default=20, help="load before the first reading")
    ap.add_argument("--model", help="a GGUF (default: the embedded default model)")
    ap.add_argument("--tasks", default=",".join(TASKS), help="which tasks to mix")
    args = ap.parse_args()

    port = free_port()
    env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port), "API_KEY": ",".join(KEYS),
           "PARALLEL": str(args.parallel), "CTX_SIZE": "1024", "MAX_QUEUE": "256",
           "STREAM_MAX_LIVE_PER_KEY": str(args.parallel)}
    if args.model:
        env["MODEL"] = args.model
    log = Path(f"/tmp/bench-soak-{port}.log")
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "app"], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, "/health", proc, timeout=300)
        tally = Tally()
        start = time.monotonic()
        until = start + args.seconds
        only = args.tasks.split(",")
        threads = [threading.Thread(target=client, args=(base, i, until, tally, only),
                                    daemon=True) for i in range(args.clients)]
        for t in threads:
            t.start()
        time.sleep(min(args.warmup, args.seconds / 4))
        pid = worker_pid(proc.pid)
        rss0, fds0 = usage(pid)
        timeline = [(time.monotonic() - start, rss0)]
        deadline = until + 600
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            time.sleep(min(30.0, max(0.1, until - time.monotonic())) if time.monotonic() < until
                       else 1.0)
            if time.monotonic() < until + 1:
                timeline.append((time.monotonic() - start, usage(pid)[0]))
        time.sleep(5)  # cancelled generations and closed connections settle
        alive = worker_pid(proc.pid)
        rss1, fds1 = usage(alive)
        restarts = log.read_text(errors="replace").count("Booting worker") - 1
        crashes = requests.get(base + "/health", timeout=10).json().get("worker_crashes")
        health = requests.get(base + "/health", timeout=10).json()
    finally:
        proc.terminate()
        proc.wait(60)
    print(f"\n{args.clients} clients, {args.seconds:g} s, PARALLEL={args.parallel}, "
          f"{os.cpu_count()} CPUs")
    print("| task | count |\n|---|---|")
    for what, n in sorted(tally.counts.items()):
        print(f"| {what} | {n} |")
    print(f"\nerrors: {sum(tally.errors.values())}")
    for what, n in tally.errors.most_common(10):
        print(f"  {n} x {what}")
    print(f"worker restarts: {restarts} (same worker at the end: {alive == pid}; "
          f"deaths the crash guard saw: {crashes or 0})")
    print(f"worker RSS: {rss0 / 1024:.0f} MiB after the warm-up -> {rss1 / 1024:.0f} MiB at the "
          f"end; open fds: {fds0} -> {fds1}")
    print("RSS under load (s: MiB): " + ", ".join(f"{t:.0f}: {r / 1024:.0f}" for t, r in timeline))
    gaps = sorted(tally.gaps) or [0.0]
    print(f"gaps between an honest stream's chunks once it generates: p50 "
          f"{gaps[len(gaps) // 2] * 1000:.0f} ms, p99 {gaps[int(len(gaps) * 0.99)] * 1000:.0f} "
          f"ms, longest {gaps[-1]:.2f} s ({len(gaps)} gaps)")
    print(f"at the end: running {health['engine']['running']}, waiting "
          f"{health['engine']['waiting']}, streams live {health['streams']['live']}")
    log.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
