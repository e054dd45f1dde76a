"""What log probabilities cost: nothing to requests that do not ask, measured against the
commit before they existed; and what they cost to requests that do.

Starts ``python -m app`` from two checkouts in turn, rounds interleaved (before, this, before,
this, ...) so the machine's drift falls on both: ``--before`` (a checkout without logprobs, e.g.
``git worktree add /tmp/before 644a807``) and this one. Each serves the same model with the same
slots and threads, and is driven by streaming chats (2 x c requests of ``--max-tokens`` tokens,
``ignore_eos``, temperature 0) at each concurrency. Per run: aggregate tok/s, and the server's
CPU seconds per 1000 generated tokens (all its processes, from /proc): the CPU figure is the one
to read on a shared machine, where wall time wanders. This checkout also runs the same chats
with ``logprobs: true, top_logprobs: 5``, and scores a prompt (Completions' ``echo`` with
``logprobs``, ``max_tokens: 0``) against decoding the same prompt unscored (``cache_prompt:
false``, ``max_tokens: 1``). Not a test: record the figures in bench/RESULTS.md with the machine.

    git worktree add /tmp/before 644a807
    python bench/logprobs.py --before /tmp/before
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import requests
from common import free_port, group_cpu_seconds, wait_ready

ROOT = Path(__file__).resolve().parent.parent


def chat(base: str, i: int, max_tokens: int, logprobs: bool) -> int:
    """One streamed chat; the tokens it carried (entries, with logprobs), or -1 on error."""
    body = {"messages": [{"role": "user", "content": f"Write a long story, number {i}."}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    if logprobs:
        body.update(logprobs=True, top_logprobs=5)
    tokens = 0
    with requests.post(base + "/v1/chat/completions", json=body, stream=True, timeout=900) as r:
        if r.status_code != 200:
            return -1
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                obj = json.loads(line[6:])
                if obj.get("usage"):
                    tokens = obj["usage"]["completion_tokens"]
    return tokens


def level(base: str, group: int, c: int, max_tokens: int, logprobs: bool) -> tuple[float, float]:
    """(tok/s, CPU seconds per 1000 tokens) of 2 x c chats, c at a time."""
    cpu0, t0 = group_cpu_seconds(group), time.perf_counter()
    with cf.ThreadPoolExecutor(c) as pool:
        counts = list(pool.map(lambda i: chat(base, i, max_tokens, logprobs), range(2 * c)))
    wall, cpu = time.perf_counter() - t0, group_cpu_seconds(group) - cpu0
    if min(counts) < 0:
        raise RuntimeError("a request failed")
    return sum(counts) / wall, cpu / sum(counts) * 1000


def scoring(base: str, prompt: list[int], runs: int) -> tuple[float, float]:
    """(prompt tokens/s scored with echo and logprobs, decoded unscored), sequential requests."""
    out = []
    for body in ({"prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 1},
                 {"prompt": prompt, "max_tokens": 1, "cache_prompt": False}):
        t0 = time.perf_counter()
        for _ in range(runs):
            r = requests.post(base + "/v1/completions", json=body, timeout=600)
            r.raise_for_status()
        out.append(len(prompt) * runs / (time.perf_counter() - t0))
    return out[0], out[1]


def server(repo: Path, args) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "MODEL": args.model, "PARALLEL": str(args.parallel),
           "CTX_SIZE": str(args.ctx), "THREADS": str(args.threads), "LOG_LEVEL": "warning",
           "STREAM_HEARTBEAT_SECONDS": "0", "HOST": "127.0.0.1", "PORT": str(port)}
    proc = subprocess.Popen([sys.executable, "-m", "app"], cwd=repo, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    wait_ready(base, "/health", proc)
    return proc, base


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from app.model.default import default_model_path
    from app.settings import DEFAULT_CACHE_DIR

    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="a checkout without logprobs")
    ap.add_argument("--model", default=str(default_model_path(DEFAULT_CACHE_DIR)))
    ap.add_argument("--levels", default="1,8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=1024, help="context per slot")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    runs: dict[tuple[str, int], list[tuple[float, float]]] = {}
    scored: list[tuple[float, float]] = []
    names = ("before", "this", "this, logprobs top 5")
    for rnd in range(args.rounds):
        for name, repo in (("before", Path(args.before)), ("this", ROOT)):
            proc, base = server(repo, args)
            try:
                level(base, proc.pid, 1, 8, False)  # warm up
                for c in levels:
                    runs.setdefault((name, c), []).append(
                        level(base, proc.pid, c, args.max_tokens, False))
                    if name == "this":
                        runs.setdefault((names[2], c), []).append(
                            level(base, proc.pid, c, args.max_tokens, True))
                if name == "this":
                    ids = requests.post(base + "/tokenize", json={
                        "prompt": "The quick brown fox jumps over the lazy dog. " * 60,
                        "add_special_tokens": False}, timeout=60).json()["tokens"]
                    scored.append(scoring(base, ids[: args.prompt_tokens], 3))
            finally:
                stop(proc)
            print(f"round {rnd + 1}: {name} done", file=sys.stderr, flush=True)
    print(f"model {Path(args.model).name}, threads {args.threads}, {args.parallel} slots x "
          f"{args.ctx} ctx, 2 x c streamed chats of {args.max_tokens} tokens (ignore_eos, "
          f"temperature 0), {args.rounds} rounds interleaved; medians (and each round)")
    print("| server | c | tok/s | CPU s / 1000 tokens | vs before (CPU) |")
    print("|---|---|---|---|---|")
    for c in levels:
        base_cpu = statistics.median(r[1] for r in runs[("before", c)])
        for name in names:
            rs = runs[(name, c)]
            tps, cpu = statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)
            each = ", ".join(f"{r[0]:.0f}/{r[1]:.2f}" for r in rs)
            print(f"| {name} | {c} | {tps:.1f} | {cpu:.2f} ({each}) | {cpu / base_cpu:.3f} |")
    score = statistics.median(s[0] for s in scored)
    plain = statistics.median(s[1] for s in scored)
    print(f"\nprompt of {args.prompt_tokens} tokens, 3 sequential requests per round: scored "
          f"(echo, logprobs 1, max_tokens 0) {score:.0f} tok/s, decoded unscored "
          f"(cache_prompt false, max_tokens 1) {plain:.0f} tok/s, ratio {score / plain:.2f}")


if __name__ == "__main__":
    main()
