"""First burst after ready vs later bursts: time to first token of PARALLEL concurrent streams.

Starts the server (this tree, and optionally another checkout of the project for comparison)
on a loopback port, waits for health 200, then sends BURSTS bursts of PARALLEL concurrent
streaming chats and reports each burst's time-to-first-token p50 and max. Every prompt is new
and ``cache_prompt`` is off, so no burst is helped by the prefix cache (repeating the same
prompts makes later bursts look 20x faster for that reason alone). A warm-up that exercises
every slot makes the first burst as fast as the later ones. With ``--cache-prompt`` the
prompts are still new, but what they share (the chat template's opening) may come from the
cache.

    python bench/first_burst.py [--compare /path/to/other/checkout] [--parallel 8] [--bursts 4]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import statistics
import time
from pathlib import Path

import requests
from common import serve

ROOT = Path(__file__).resolve().parent.parent


def ttft(base: str, i: int, burst: int, cache: bool = False) -> float:
    body = {"messages": [{"role": "user", "content": f"Burst {burst}: tell me fact number {i} about the sea."}],
            "max_tokens": 8, "temperature": 0, "stream": True, "cache_prompt": cache}
    t0 = time.perf_counter()
    with requests.post(f"{base}/v1/chat/completions", json=body, stream=True, timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines(chunk_size=None):  # the default buffers 512 bytes
            if line.startswith(b"data: {") and b'"content":"' in line and b'"content":""' not in line:
                return time.perf_counter() - t0
    return time.perf_counter() - t0


def run(repo: Path, parallel: int, bursts: int, cache: bool = False) -> list[dict]:
    out = []
    with serve(repo, {"PARALLEL": str(parallel), "STREAM_HEARTBEAT_SECONDS": "0"}) as base:
        for b in range(bursts):
            with cf.ThreadPoolExecutor(parallel) as pool:
                times = list(pool.map(lambda i, b=b: ttft(base, i, b, cache), range(parallel)))
            out.append({"repo": str(repo), "burst": b + 1, "ttft_p50_ms": round(statistics.median(times) * 1000, 1),
                        "ttft_max_ms": round(max(times) * 1000, 1)})
            time.sleep(0.5)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compare", type=Path, help="another checkout of the project, measured in the same run")
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--bursts", type=int, default=4)
    ap.add_argument("--cache-prompt", action="store_true",
                    help="prefix reuse on (prompts still new): what a chat template's shared "
                    "opening is worth to a burst, and whether the first one gets it too")
    args = ap.parse_args()
    repos = [ROOT] + ([args.compare] if args.compare else [])
    for repo in repos:
        for row in run(repo, args.parallel, args.bursts, args.cache_prompt):
            print(json.dumps(row))


if __name__ == "__main__":
    main()
