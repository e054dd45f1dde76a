"""Reranking against llama-server's ``--rerank``, on the same GGUF, in one run (issue 51).

Starts vertex-gguf (``python -m app``: the reranker on its embedding engine) and then
llama-server (``--rerank``) on the same GGUF with the same threads and the same tokens per
decode, one after the other, and measures documents per second on each:
  1. one request of ``--docs`` documents (a fresh slice of short distinct sentences every
     request, median of ``--reps`` after a warm-up);
  2. ``--clients`` concurrent clients, each sending ``--requests`` requests of 16 documents.
Both answer llama-server's ``/v1/rerank`` body; the scores of the first request are compared
(vertex-gguf with ``use_activation: false`` gives llama-server's raw number) and the largest
difference printed. Every request is bounded by ``--timeout``; servers are stopped in a
``finally``. Not a test: figures depend on the machine.

    python bench/rerank.py --shape bert-base --llama-server bench/gpu/work/build-cpu/bin/llama-server
    python bench/rerank.py --model my-reranker.gguf   # vertex-gguf only

Shapes (random weights, built once into --cache): bert-base, a cross-encoder of bge-reranker-
base's size (12 layers x 768, 512 tokens; the WordPiece vocabulary of the test model, about a
token a character); qwen3-small, a decoder reranker (8 layers x 512, the default model's
tokenizer, Qwen3-Reranker's rerank template, 2048 tokens).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import itertools
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import requests
from common import process

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QUERY = "which animal sat on the old mat near the door"


def sentences() -> Iterator[str]:
    """Distinct short sentences, never repeating."""
    adjs = ["quiet", "bright", "old", "small", "busy", "green", "cold", "tall", "lazy", "red"]
    nouns = ["cat", "dog", "river", "city", "garden", "train", "house", "forest", "bird", "mat"]
    verbs = ["sat near", "ran past", "looked at", "waited by", "slept under", "moved toward"]
    for i in itertools.count():
        a, n, v = adjs[i % 10], nouns[(i // 10) % 10], verbs[(i // 100) % 6]
        yield f"the {a} {n} {v} the door number {i}"


def build(shape: str, cache: Path) -> Path:
    from app.model.default import default_model_path
    from app.settings import DEFAULT_CACHE_DIR
    from tests.support.tiny_bert import build_tiny_bert
    from tests.support.tiny_reranker import build_tiny_reranker

    path = cache / f"bench-rerank-{shape}.gguf"
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    if shape == "bert-base":
        build_tiny_bert(path, pooling="rank", n_embd=768, n_layer=12, n_ff=3072, n_head=12,
                        n_ctx=512, f16=True)
    else:
        build_tiny_reranker(path, default_model_path(DEFAULT_CACHE_DIR), n_embd=512,
                            n_layer=8, n_ff=1536, f16=True)
    return path


def rerank(base: str, docs: list[str], timeout: float, raw: bool = False) -> dict:
    body: dict = {"model": "m", "query": QUERY, "documents": docs, "return_documents": False}
    if raw:
        body["use_activation"] = False
    r = requests.post(base + "/v1/rerank", json=body, timeout=timeout)
    r.raise_for_status()
    return r.json()


def measure(base: str, args: argparse.Namespace) -> dict:
    texts = sentences()
    # llama-server's number: a cross-encoder's raw logit; a Qwen3 reranker's P(yes), as is
    first = rerank(base, list(itertools.islice(texts, args.docs)), args.timeout,
                   raw=args.shape == "bert-base" or bool(args.model))
    scores = {x["index"]: x["relevance_score"] for x in first["results"]}
    times = []
    for _ in range(args.reps):
        docs = list(itertools.islice(texts, args.docs))
        t0 = time.perf_counter()
        rerank(base, docs, args.timeout)
        times.append(time.perf_counter() - t0)
    one = statistics.median(times)
    batches = [[list(itertools.islice(texts, 16)) for _ in range(args.requests)]
               for _ in range(args.clients)]

    def client(mine: list[list[str]]) -> None:
        for docs in mine:
            rerank(base, docs, args.timeout)

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(args.clients) as pool:
        list(pool.map(client, batches))
    many = time.perf_counter() - t0
    return {"one_s": one, "one_per_s": args.docs / one,
            "many_per_s": args.clients * args.requests * 16 / many, "scores": scores,
            "tokens": first["usage"]["prompt_tokens"] / args.docs}


def version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    return " ".join((out.stdout + out.stderr).split("\n")[-3:-1]).strip() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a reranker GGUF (default: --shape, built)")
    ap.add_argument("--shape", choices=("bert-base", "qwen3-small"), default="bert-base")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/vertex-gguf"))
    ap.add_argument("--llama-server", help="llama-server binary to compare with")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--docs", type=int, default=64, help="documents in the single request")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=4, help="per client, of 16 documents")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600, help="seconds, every request")
    args = ap.parse_args()
    model = Path(args.model) if args.model else build(args.shape, args.cache)
    causal = args.shape == "qwen3-small" and not args.model
    ctx = 2048 if causal else 512  # tokens per pair, and per decode
    ub = 512  # llama-server's micro-batch: ours is the whole decode for an encoder, 512 else
    env = {"MODEL": str(model), "HOST": "127.0.0.1", "THREADS": str(args.threads),
           "EMBEDDING_CTX": str(ctx), "EMBEDDING_BATCH": "64"}
    servers = [("vertex-gguf", [sys.executable, "-m", "app"], env)]
    if args.llama_server:
        servers.append(("llama-server", [
            args.llama_server, "-m", str(model), "--host", "127.0.0.1", "--port", "{port}",
            "-t", str(args.threads), "--rerank", "-np", "8", "-c", str(8 * ctx),
            "-b", str(ctx), "-ub", str(ub if causal else ctx)], None))
        print(f"llama-server: {version(args.llama_server)}")
    results = {}
    for name, cmd, e in servers:
        with process(cmd, e, "/health", name, timeout=300) as base:
            results[name] = measure(base, args)
    print(f"\nmodel {model.name}, threads {args.threads}, {ctx} tokens per pair and decode, "
          f"median of {args.reps}\n")
    names = list(results)
    print("| server | tokens/pair | 1 x " + f"{args.docs} docs: s | docs/s | "
          f"{args.clients} clients x {args.requests} x 16 docs: docs/s |")
    print("|---|---|---|---|---|")
    for n in names:
        r = results[n]
        print(f"| {n} | {r['tokens']:.1f} | {r['one_s']:.2f} | {r['one_per_s']:.0f} | "
              f"{r['many_per_s']:.0f} |")
    if len(names) == 2:
        a, b = (results[n] for n in names)
        diff = max(abs(a["scores"][i] - b["scores"][i]) for i in a["scores"])
        print(f"\nratio vertex-gguf / llama-server: {a['one_per_s'] / b['one_per_s']:.2f} (one "
              f"request), {a['many_per_s'] / b['many_per_s']:.2f} (concurrent); largest score "
              f"difference on the first request (raw): {diff:.2e}")


if __name__ == "__main__":
    main()
