"""Single-stream speed and health latency, this server vs llama-cpp-python in-process.

Starts ``python -m app`` on a free loopback port with the given model, streams greedy
completions of a fixed length, and polls the health route from another thread meanwhile. The
baseline is llama-cpp-python's own ``Llama.create_completion(stream=True)`` in this process on
the same file, threads and context: what a user would get without a server. Its TTFT is not
comparable: ``Llama`` keeps the previous prompt's KV, so repeated runs skip the prefill. Prints one table
with ratios. Not a test: figures depend on the machine.

    python bench/single_stream.py [--model PATH] [--tokens 256] [--runs 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests
from common import free_port

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PROMPT = "List the numbers from 1 to 1000, separated by commas:"


def server_run(base: str, tokens: int) -> tuple[float, float, int]:
    """(ttft_s, tokens_per_s after the first token, completion tokens) for one stream."""
    body = {"prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = None
    n = 0
    with requests.post(base + "/v1/completions", json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: {"):
                continue
            obj = json.loads(line[6:])
            if obj["choices"] and obj["choices"][0]["text"] and first is None:
                first = time.perf_counter()
            if obj.get("usage"):
                n = obj["usage"]["completion_tokens"]
    end = time.perf_counter()
    assert first is not None
    return first - t0, (n - 1) / (end - first), n


def baseline_run(llm, tokens: int) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    first = None
    n = 0
    for _chunk in llm.create_completion(PROMPT, max_tokens=tokens, temperature=0, stream=True):
        n += 1
        if first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    return first - t0, (n - 1) / (end - first), n


def main() -> None:
    from app.model.default import default_model_path
    from app.settings import DEFAULT_CACHE_DIR

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(default_model_path(DEFAULT_CACHE_DIR)))
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu-layers", type=int, default=-1)
    args = ap.parse_args()

    port = free_port()
    env = {**os.environ, "MODEL": args.model, "PORT": str(port), "HOST": "127.0.0.1",
           "THREADS": str(args.threads), "GPU_LAYERS": str(args.gpu_layers), "LOG_LEVEL": "warning"}
    proc = subprocess.Popen([sys.executable, "-m", "app"], env=env, cwd=ROOT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if requests.get(base + "/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.1)
        server_run(base, 16)  # warm
        ours = [server_run(base, args.tokens) for _ in range(args.runs)]
        latencies: list[float] = []
        stop = threading.Event()

        def poll() -> None:
            s = requests.Session()
            while not stop.is_set():
                t0 = time.perf_counter()
                s.get(base + "/health", timeout=5)
                latencies.append((time.perf_counter() - t0) * 1000)
                time.sleep(0.01)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        polled = server_run(base, args.tokens)
        stop.set()
        poller.join(10)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)

    from llama_cpp import Llama

    llm = Llama(args.model, n_ctx=4096, n_threads=args.threads, n_gpu_layers=args.gpu_layers,
                verbose=False)
    baseline_run(llm, 16)
    theirs = [baseline_run(llm, args.tokens) for _ in range(args.runs)]

    def med(rows, i):
        return statistics.median(r[i] for r in rows)

    p99 = statistics.quantiles(latencies, n=100)[98] if len(latencies) >= 2 else float("nan")
    print(f"model {Path(args.model).name}, {args.tokens} tokens greedy, {args.runs} runs, "
          f"threads {args.threads}, gpu_layers {args.gpu_layers}")
    print("| | decode tok/s | TTFT ms |")
    print("|---|---|---|")
    print(f"| vertex-gguf (HTTP, SSE) | {med(ours, 1):.1f} | {med(ours, 0) * 1000:.0f} |")
    print(f"| llama-cpp-python in-process | {med(theirs, 1):.1f} | {med(theirs, 0) * 1000:.0f} |")
    print(f"| ratio | {med(ours, 1) / med(theirs, 1):.2f} | {med(ours, 0) / med(theirs, 0):.2f} |")
    print(f"health during a generation ({polled[1]:.1f} tok/s while polled): {len(latencies)} polls, p50 "
          f"{statistics.median(latencies):.1f} ms, p99 {p99:.1f} ms, max {max(latencies):.1f} ms")


if __name__ == "__main__":
    main()
