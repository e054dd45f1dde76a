"""How long costly requests stall a running stream: the stream's largest inter-token gap while
each one is being handled, against its median gap.

Starts the server (this tree, and optionally another checkout for comparison) on a loopback
port with PARALLEL=2, runs a long greedy stream, and sends one costly request at a time beside
it: a plain chat (the control: a new request's prefill is one step), a 4 MB prompt (refused: it
cannot fit), a 1000-value enum response_format (twice: the second finds its prompt cached), a
3000-property schema whose names all escape to one rule name, a 300-deep nested grammar. Requests the other
checkout cannot survive (they crash it) are not sent. Not a test: figures depend on the machine.

    python bench/stall.py [--compare /path/to/other/checkout]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import requests
from common import serve

ROOT = Path(__file__).resolve().parent.parent
PROPS = {chr(0x4E00 + i): {"type": "string"} for i in range(3000)}
ENUM = {"messages": [{"role": "user", "content": "pick"}], "max_tokens": 8,
        "response_format": {"type": "json_schema", "json_schema": {"name": "e", "schema": {
            "enum": [f"v{i:06d}" for i in range(1000)]}}}}
CASES = {
    # the control: a new chat's own prefill is one engine step beside the running stream
    "plain chat, no grammar (control)": ("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "choose one"}], "max_tokens": 8}),
    "4 MB prompt": ("/v1/completions", {"prompt": "word " * 800_000, "max_tokens": 1}),
    "enum of 1000 (first grammar request)": ("/v1/chat/completions", ENUM),
    "enum of 1000 (again)": ("/v1/chat/completions", ENUM),
    "3000 colliding properties": ("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": "q", "schema": {
            "type": "object", "properties": PROPS, "required": list(PROPS)}}}}),
    "grammar nested 300 deep": ("/v1/completions", {
        "prompt": "hi", "max_tokens": 2, "grammar": "root ::= " + "(" * 300 + '"a"' + ")" * 300}),
}


def run(repo: Path) -> dict[str, tuple[float, float, int]]:
    out = {}
    with serve(repo, {"PARALLEL": "2", "STREAM_HEARTBEAT_SECONDS": "0"}) as base:
        for name, (path, body) in CASES.items():
            arrivals: list[float] = []
            data = json.dumps(body).encode()  # before the stream starts: the client's own work

            def stream(arrivals: list[float] = arrivals) -> None:
                # (a server from before ignore_eos existed ignores the field: the count runs on)
                req = {"prompt": "Count:", "max_tokens": 600, "temperature": 0, "stream": True,
                       "ignore_eos": True}
                with requests.post(f"{base}/v1/completions", json=req, stream=True, timeout=300) as r:
                    for line in r.iter_lines(chunk_size=None):
                        if line.startswith(b"data: {"):
                            arrivals.append(time.perf_counter())

            t = threading.Thread(target=stream, daemon=True)
            t.start()
            while len(arrivals) < 40 and t.is_alive():
                time.sleep(0.01)
            t0 = time.perf_counter()
            r = requests.post(f"{base}{path}", data=data,
                              headers={"Content-Type": "application/json"}, timeout=300)
            t1 = time.perf_counter()
            t.join(300)
            gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
            during = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False) if b >= t0 and a <= t1]
            out[name] = (statistics.median(gaps) * 1000, max(during, default=0) * 1000, r.status_code)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compare", type=Path)
    args = ap.parse_args()
    for repo in [ROOT] + ([args.compare] if args.compare else []):
        for name, (median, worst, status) in run(repo).items():
            print(json.dumps({"repo": str(repo), "case": name, "status": status,
                              "gap_median_ms": round(median, 1), "gap_max_during_ms": round(worst, 1)}))


if __name__ == "__main__":
    main()
