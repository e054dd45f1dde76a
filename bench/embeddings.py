"""Embeddings against llama-server's, through the official openai SDK, in one run (issue 13).

Starts vertex-gguf (``python -m app``, embeddings in a context of their own beside generation,
mean pooling by default on a generative GGUF) and then llama-server (``--embeddings --pooling
mean``) on the same GGUF with the same threads and slots, one after the other, and measures on
each:
  1. throughput: inputs/s for one request of 1, 16 and 256 short distinct sentences (a fresh
     slice of sentences every request, median of ``--reps`` after a warm-up), and for requests of
     16 inputs sent by 4 concurrent clients;
  2. consistency: for each of 16 texts, the cosine between its vector embedded alone and embedded
     in one request with the other 15; the minimum over the 16;
  3. an embedding beside a generation: a greedy streaming chat of ``--gen-tokens`` tokens with
     ``ignore_eos``, and after its 5th, 300th and 600th chunk one request of 16 inputs; its
     latency, how many chunks (one token each) the stream delivered after the answer (0 would
     mean the embedding waited for the generation to end; the requests go one after another, so
     one that waited delays the next), the stream's largest gap while it was served, and the
     stream's tok/s against the same stream run without embeddings.
Prints markdown tables, with vertex-gguf / llama-server ratios. Every request is bounded by
``--timeout`` and servers are stopped in a ``finally``. Not a test: figures depend on the machine.

    python bench/embeddings.py --llama-server /path/to/llama-server
    python bench/embeddings.py  # vertex-gguf only

Defaults: threads 2, 8 slots of 4096 tokens (vertex-gguf's PARALLEL and CTX_SIZE defaults; for
llama-server ``-np 8 -c 32768``), a per-input limit of 2048 tokens on both (vertex-gguf
``EMBEDDING_CTX=2048``; llama-server ``-b 2048 -ub 2048``, since it refuses an embedding input
longer than its micro-batch).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import itertools
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import requests
from common import add_extra_buffers_arg, extra_buffers_env, llama_server_extra_buffers, process

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SIZES = (1, 16, 256)
CONCURRENT_CLIENTS = 4
CONCURRENT_REQUESTS = 4  # per client, of 16 inputs
PROBE_AT = (5, 300, 600)  # stream chunks after which an embedding request is sent


def sentences() -> Iterator[str]:
    """Distinct short sentences (about 8-12 tokens each), never repeating."""
    adjs = ["quiet", "bright", "old", "small", "busy", "green", "cold", "tall", "lazy", "red",
            "happy", "dusty", "wild", "soft", "empty", "heavy"]
    nouns = ["dog", "river", "teacher", "train", "garden", "robot", "farmer", "city", "window",
             "violin", "ship", "baker", "forest", "lamp", "child", "market"]
    verbs = ["watches", "follows", "paints", "carries", "finds", "repairs", "visits", "hears",
             "sells", "cleans", "draws", "opens"]
    places = ["the bridge", "the station", "the harbour", "the old mill", "the school",
              "the hill", "the library", "the bakery"]
    for place, verb, adj, noun, noun2 in itertools.product(places, verbs, adjs, nouns, nouns):
        if noun != noun2:
            yield f"The {adj} {noun} {verb} a {noun2} near {place}."


class Texts:
    def __init__(self) -> None:
        self._it = sentences()

    def take(self, n: int) -> list[str]:
        return [next(self._it) for _ in range(n)]


def client(base: str, timeout: float) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=timeout)


def embed(c: openai.OpenAI, texts: list[str]) -> tuple[np.ndarray, int]:
    """The vectors (rows, in input order) and the prompt tokens the server counted."""
    r = c.embeddings.create(model="m", input=texts, encoding_format="float")
    rows = sorted(r.data, key=lambda d: d.index)
    if len(rows) != len(texts):
        raise RuntimeError(f"{len(texts)} inputs, {len(rows)} embeddings")
    return np.array([d.embedding for d in rows], dtype=np.float64), r.usage.prompt_tokens


def unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def throughput(c: openai.OpenAI, texts: Texts, reps: int, timeout: float) -> dict:
    out: dict = {}
    embed(c, texts.take(16))  # warm-up
    embed(c, texts.take(256))
    for n in SIZES:
        walls, tokens = [], 0
        for _ in range(reps):
            batch = texts.take(n)
            t0 = time.perf_counter()
            _, used = embed(c, batch)
            walls.append(time.perf_counter() - t0)
            tokens += used
        wall = statistics.median(walls)
        out[f"1 x {n}"] = {"ms": wall * 1000, "per_s": n / wall,
                           "tok_per_input": tokens / (n * reps)}
    rates, lat = [], []
    for _ in range(reps):
        batches = [texts.take(16) for _ in range(CONCURRENT_CLIENTS * CONCURRENT_REQUESTS)]

        def one(b: list[str]) -> float:
            t = time.perf_counter()
            embed(c, b)
            return time.perf_counter() - t

        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(CONCURRENT_CLIENTS) as pool:
            lat += list(pool.map(one, batches, timeout=timeout))
        rates.append(16 * len(batches) / (time.perf_counter() - t0))
    out[f"{CONCURRENT_CLIENTS} clients x 16"] = {"ms": statistics.median(lat) * 1000,
                                                  "per_s": statistics.median(rates),
                                                  "tok_per_input": float("nan")}
    return out


def consistency(c: openai.OpenAI, texts: Texts) -> float:
    group = texts.take(16)
    together, _ = embed(c, group)
    alone = np.vstack([embed(c, [t])[0] for t in group])
    return float(np.min(np.sum(unit(together) * unit(alone), axis=1)))


def stream(base: str, tokens: int, timeout: float, probe: openai.OpenAI | None,
           texts: Texts) -> dict:
    """A greedy chat stream of ``tokens`` tokens; with ``probe``, one 16-input embedding request
    after each chunk count in PROBE_AT, sent from another thread while the stream is read."""
    stamps: list[float] = []  # arrival of each content chunk
    probes: list[dict] = []
    triggers = {k: threading.Event() for k in PROBE_AT}
    stop = threading.Event()

    def prober() -> None:
        for k in PROBE_AT:
            while not triggers[k].wait(0.05):
                if stop.is_set():
                    return
            t0 = time.perf_counter()
            embed(probe, texts.take(16))  # type: ignore[arg-type]
            t1 = time.perf_counter()
            probes.append({"sent": t0, "done": t1})

    worker = None
    if probe is not None:
        pool = cf.ThreadPoolExecutor(1)
        worker = pool.submit(prober)
    body = {"model": "m", "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": tokens, "ignore_eos": True, "temperature": 0, "stream": True}
    deadline = time.monotonic() + timeout
    try:
        with requests.post(base + "/v1/chat/completions", json=body, stream=True,
                           timeout=timeout) as r:
            r.raise_for_status()
            for line in r.iter_lines():  # bounded: the stream ends at max_tokens, or deadline
                if time.monotonic() > deadline:
                    raise TimeoutError("stream ran past the timeout")
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                    stamps.append(time.perf_counter())
                    if len(stamps) in triggers:
                        triggers[len(stamps)].set()
    finally:
        stop.set()
        if worker is not None:
            worker.result(timeout=timeout)
            pool.shutdown()
    gaps = np.diff(stamps) if len(stamps) > 1 else np.array([0.0])
    out = {"chunks": len(stamps),
           "tok_s": (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0,
           "max_gap_ms": float(gaps.max()) * 1000, "probes": []}
    for p in probes:
        inside = [i for i in range(1, len(stamps)) if p["sent"] <= stamps[i] <= p["done"]]
        out["probes"].append({
            "ms": (p["done"] - p["sent"]) * 1000,
            "at": sum(1 for s in stamps if s < p["sent"]),
            "after": sum(1 for s in stamps if s > p["done"]),
            "gap_ms": max((stamps[i] - stamps[i - 1] for i in inside), default=0.0) * 1000,
        })
    return out


def run(base: str, args: argparse.Namespace) -> dict:
    c = client(base, args.timeout)
    texts = Texts()
    res = {"throughput": throughput(c, texts, args.reps, args.timeout), "min_cos": consistency(c, texts)}
    res["idle_16_ms"] = res["throughput"]["1 x 16"]["ms"]
    stream(base, 16, args.timeout, None, texts)  # warm-up of the chat path
    res["plain"] = stream(base, args.gen_tokens, args.timeout, None, texts)
    res["beside"] = stream(base, args.gen_tokens, args.timeout, c, texts)
    return res


def version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    return " ".join((out.stdout + out.stderr).split("\n")[-3:-1]).strip() or "unknown"


def main() -> None:
    from app.model.default import default_model_path
    from app.settings import DEFAULT_CACHE_DIR

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(default_model_path(DEFAULT_CACHE_DIR)))
    ap.add_argument("--llama-server", help="llama-server binary to compare with")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=8, help="slots, on both servers")
    ap.add_argument("--ctx", type=int, default=4096, help="context per slot")
    ap.add_argument("--embedding-ctx", type=int, default=2048,
                    help="most tokens of one embedding input, on both servers")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--gen-tokens", type=int, default=1000)
    ap.add_argument("--timeout", type=float, default=120, help="seconds, every request")
    add_extra_buffers_arg(ap)
    args = ap.parse_args()

    env = {"MODEL": args.model, "HOST": "127.0.0.1", "THREADS": str(args.threads),
           "PARALLEL": str(args.parallel), "CTX_SIZE": str(args.ctx),
           "EMBEDDINGS": "on", "EMBEDDING_CTX": str(args.embedding_ctx),
           **extra_buffers_env(args)}
    servers = [("vertex-gguf", [sys.executable, "-m", "app"], env, "/health")]
    if args.llama_server:
        ub = str(args.embedding_ctx)
        servers.append(("llama-server", [
            args.llama_server, "-m", args.model, "--host", "127.0.0.1", "--port", "{port}",
            "-t", str(args.threads), "-np", str(args.parallel), "-c", str(args.ctx * args.parallel),
            "-b", ub, "-ub", ub, "--embeddings", "--pooling", "mean", "--jinja",
            *llama_server_extra_buffers(args),
        ], None, "/health"))
        print(f"llama-server: {version(args.llama_server)}")
    results: dict[str, dict] = {}
    for name, cmd, e, health in servers:
        with process(cmd, e, health, name, timeout=300) as base:
            results[name] = run(base, args)
    names = list(results)
    ref = results.get("llama-server")

    print(f"\nthreads {args.threads}, {args.parallel} slots x {args.ctx} tokens, per-input limit "
          f"{args.embedding_ctx} tokens, median of {args.reps}, model {Path(args.model).name}\n")
    head = " | ".join(f"{n} ms | {n} inputs/s" for n in names)
    print(f"| request | tokens/input ({' / '.join(names)}) | {head} | ratio |")
    print("|---|---|" + "---|---|" * len(names) + "---|")
    for case, r in results[names[0]]["throughput"].items():
        tok = " / ".join(f"{results[n]['throughput'][case]['tok_per_input']:.1f}" for n in names)
        cells = " | ".join(f"{results[n]['throughput'][case]['ms']:.0f} | "
                           f"{results[n]['throughput'][case]['per_s']:.0f}" for n in names)
        ratio = f"{r['per_s'] / ref['throughput'][case]['per_s']:.2f}" if ref else "-"
        print(f"| {case} | {'-' if 'nan' in tok else tok} | {cells} | {ratio} |")

    print("\n| server | min cosine, alone vs in a list of 16 |")
    print("|---|---|")
    for n in names:
        print(f"| {n} | {results[n]['min_cos']:.6f} |")

    print(f"\nOne request of 16 inputs after chunks {', '.join(map(str, PROBE_AT))} of a "
          f"{args.gen_tokens}-token greedy stream (ignore_eos)\n")
    print("| server | idle ms | sent after chunk | latency ms | chunks after the answer | "
          "stream's largest gap during it ms | stream tok/s alone | with the requests | "
          "its largest gap ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in names:
        r = results[n]
        ps = r["beside"]["probes"]
        at = " / ".join(str(p["at"]) for p in ps)
        lat = " / ".join(f"{p['ms']:.0f}" for p in ps)
        after = " / ".join(str(p["after"]) for p in ps)
        gap = " / ".join(f"{p['gap_ms']:.0f}" for p in ps)
        print(f"| {n} | {r['idle_16_ms']:.0f} | {at} | {lat} | {after} | {gap} | "
              f"{r['plain']['tok_s']:.1f} | {r['beside']['tok_s']:.1f} | "
              f"{r['beside']['max_gap_ms']:.0f} |")
    for n in names:
        r = results[n]
        if r["plain"]["chunks"] != args.gen_tokens or r["beside"]["chunks"] != args.gen_tokens:
            print(f"note: {n} streamed {r['plain']['chunks']} and {r['beside']['chunks']} "
                  f"content chunks for {args.gen_tokens} tokens")


if __name__ == "__main__":
    main()
