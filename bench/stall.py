"""How long costly requests stall a running stream: the stream's largest inter-token gap while
each one is being handled, against its median gap.

Starts the server (this tree, and optionally another checkout for comparison) on a loopback
port with PARALLEL=2, runs a long greedy stream, and sends one costly request at a time beside
it: a plain chat (the control: a new request's prefill is one step), a 4 MB prompt (refused: it
cannot fit), a 1000-value enum response_format (twice: the second finds its prompt cached), a
3000-property schema whose names all escape to one rule name, a 300-deep nested grammar. Requests the other
checkout cannot survive (they crash it) are not sent. Not a test: figures depend on the machine.

    python bench/stall.py [--compare /path/to/other/checkout]

With ``--prefill``, the other stall (security3 L1): a short request's time to first token
alone, and sent while another request's long prompt (about 1,900 and 3,800 tokens) is being
prefilled in PREFILL_CHUNK steps; and whether its first token came before that prompt's end.

    python bench/stall.py --prefill [--compare /path/to/other/checkout]
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


LONG_SENTENCE = "The quick brown fox jumps over the lazy dog. "  # 10 tokens


def prefilling(base: str) -> int | None:
    """The slot holding a long prompt partly decoded (GET /slots), if one does."""
    rows = requests.get(f"{base}/slots", timeout=10).json()
    return next((r["id"] for r in rows if r["is_processing"] and r["n_prompt_tokens"] > 1000
                 and 0 < r["n_prompt_tokens_processed"] < r["n_prompt_tokens"]), None)


def beside(base: str, n: int, k: int) -> dict[str, object]:
    """A short streamed request's time to first token, sent once a prompt of ``n`` x 10
    tokens (0: none) is partly decoded; which slot that prompt took (PARALLEL 2: the short
    one takes the other: before the fix, the lower slot's prompt was served first)."""
    done: list[float] = []
    long_tokens: list[int] = []

    def long_request() -> None:
        body = {"prompt": f"Run {k}. " + LONG_SENTENCE * n, "max_tokens": 1, "cache_prompt": False}
        r = requests.post(f"{base}/v1/completions", json=body, timeout=600)
        long_tokens.append(r.json()["usage"]["prompt_tokens"])
        done.append(time.perf_counter())

    t = threading.Thread(target=long_request, daemon=True)
    slot = None
    if n:
        t.start()
        deadline = time.monotonic() + 120
        while slot is None and time.monotonic() < deadline:
            slot = prefilling(base)
            time.sleep(0.01)
    body = {"prompt": f"Say hello {k}.", "max_tokens": 4, "stream": True, "cache_prompt": False}
    t0 = time.perf_counter()
    first = None
    with requests.post(f"{base}/v1/completions", json=body, stream=True, timeout=600) as r:
        for line in r.iter_lines(chunk_size=None):
            if first is None and line.startswith(b"data: {"):
                first = time.perf_counter()
    if n:
        t.join(600)
    return {"long_prompt_tokens": long_tokens[0] if long_tokens else 0, "long_slot": slot,
            "ttft_ms": round((first - t0) * 1000, 1) if first else None,
            "long_done_after_ms": round((done[0] - t0) * 1000, 1) if done else None,
            "first_token_before_long_prompt_end": bool(n and first and done and first < done[0])}


def prefill(repo: Path, sentences: tuple[int, ...] = (0, 190, 380)) -> list[dict[str, object]]:
    """For each long prompt size, the short request beside it with the long prompt in each of
    the two slots (where it lands depends on what the slots cached: up to 4 tries for both)."""
    out: list[dict[str, object]] = []
    env = {"PARALLEL": "2", "CTX_SIZE": "4096", "STREAM_HEARTBEAT_SECONDS": "0"}
    with serve(repo, env) as base:
        k = 0
        for n in sentences:
            seen: set[object] = set()
            for _ in range(4 if n else 1):
                k += 1
                row = beside(base, n, k)
                if row["long_slot"] not in seen:
                    seen.add(row["long_slot"])
                    out.append(row)
                if len(seen) == (2 if n else 1):
                    break
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compare", type=Path)
    ap.add_argument("--prefill", action="store_true",
                    help="a short request's first token beside a long prompt being prefilled")
    args = ap.parse_args()
    if args.prefill:
        for repo in [ROOT] + ([args.compare] if args.compare else []):
            for row in prefill(repo):
                print(json.dumps({"repo": str(repo), **row}))
        return
    for repo in [ROOT] + ([args.compare] if args.compare else []):
        for name, (median, worst, status) in run(repo).items():
            print(json.dumps({"repo": str(repo), "case": name, "status": status,
                              "gap_median_ms": round(median, 1), "gap_max_during_ms": round(worst, 1)}))


if __name__ == "__main__":
    main()
