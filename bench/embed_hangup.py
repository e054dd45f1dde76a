"""A big embedding batch against another key's small one: hung up, and still running.

Security round 3 (issue 47): a client that sent 1024 inputs and hung up held another key's
one-input embedding for 14 s. This runs a real server (the default model, EMBEDDINGS=on, two
keys) and, twice:

- hang-up: key A posts ``--inputs`` texts, hangs up once their first decode has run; key B then
  embeds one text. Printed: B's latency, and the inputs the embedder decoded after the hang-up
  (from /health's counters: ideally at most the decode in progress);
- running: A's batch runs on while B embeds one text. Printed: B's latency, how many of A's
  inputs were decoded by the time B was answered, and whether A had finished (then A hangs up).

Not a test: the figures depend on the machine (the structure is asserted in
tests/e2e/test_embedding_turns.py).

    python bench/embed_hangup.py [--repo CHECKOUT] [--inputs 1024] [--words 30] [--fill]
    python bench/embed_hangup.py --sizes 2048,512 [--inputs 384] [--words 10]

``--fill``: each input is a list of 2048 token ids, the whole embedding context (what Vertex's
autoTruncate makes of a long text), so each fills a decode alone. ``--sizes``: no server; the
embedder's tokens/s with decodes of at most each of these many tokens (EMBEDDING_CTX), in one
process, two rounds each: what a shorter decode, so a shorter wait for the one in progress,
costs in throughput.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import requests  # noqa: E402

from bench.common import ROOT, serve  # noqa: E402

KEY_A = "bench-key-a-0123456789"
KEY_B = "bench-key-b-0123456789"
CTX = 2048  # EMBEDDING_CTX


def texts(n: int, words: int, fill: bool) -> list:
    if fill:
        return [[1000 + i % 500] * CTX for i in range(n)]
    return [" ".join(f"word{(i * 7 + k) % 997}" for k in range(words)) for i in range(n)]


def counters(base: str) -> dict:
    return requests.get(base + "/health", timeout=30).json()["embeddings"]


def decoded(stats: dict) -> int:
    """Inputs decoded so far: the counter when there is one, else from the batch widths."""
    if "inputs" in stats:
        return int(stats["inputs"])
    return sum(int(k) * v for k, v in stats["batch_widths"].items())


def raw_post(base: str, body: dict, key: str) -> socket.socket:
    """The request sent on a socket of its own, not read: the caller hangs up or reads."""
    url = urlparse(base)
    data = json.dumps(body).encode()
    sock = socket.create_connection((url.hostname, url.port), timeout=600)
    sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nAuthorization: Bearer " + key.encode() + b"\r\nContent-Length: "
                 + str(len(data)).encode() + b"\r\n\r\n" + data)
    return sock


def started(base: str, before: int, limit: float = 300) -> None:
    """Until the embedder has decoded inputs beyond ``before`` (A's batch is running)."""
    deadline = time.monotonic() + limit
    while decoded(counters(base)) <= before:
        if time.monotonic() > deadline:
            raise RuntimeError("the big batch never started")
        time.sleep(0.05)


def one(base: str) -> float:
    t0 = time.monotonic()
    r = requests.post(base + "/v1/embeddings", json={"input": "one small text"}, timeout=600,
                      headers={"Authorization": f"Bearer {KEY_B}"})
    r.raise_for_status()
    return time.monotonic() - t0


def hang_up(base: str, big: list[str]) -> None:
    before = decoded(counters(base))
    sock = raw_post(base, {"input": big}, KEY_A)
    started(base, before)
    at_hangup = decoded(counters(base))
    sock.close()
    b = one(base)
    time.sleep(2.0)  # anything still running would decode on
    after = decoded(counters(base))
    stats = counters(base)
    print(f"hang-up: B answered in {b:.2f} s; inputs decoded after the hang-up "
          f"{after - at_hangup} (incl. B's 1) of {len(big)}; counters {json.dumps(stats)}")


def running(base: str, big: list[str]) -> None:
    before = decoded(counters(base))
    sock = raw_post(base, {"input": big}, KEY_A)
    started(base, before)
    at_start = decoded(counters(base)) - before
    b = one(base)
    a_inputs = decoded(counters(base)) - before - 1
    sock.settimeout(0)
    try:
        finished = bool(sock.recv(1))  # A's answer already there
    except BlockingIOError:
        finished = False
    sock.close()  # no need to wait for the rest
    print(f"running: B answered in {b:.2f} s; A's inputs decoded {at_start} when B was sent, "
          f"{a_inputs} when B was answered (of {len(big)}); "
          f"A finished {'before' if finished else 'after'} B")


def sizes(ctxs: list[int], inputs: tuple[str, ...]) -> None:
    from app import engine_config
    from app.base.state import LoadState
    from app.engine.embed import EmbedRequest
    from app.engine.llama_engine import LlamaEngine
    from app.model.default import default_model_path
    from app.settings import Settings

    model = str(default_model_path(Settings().model_cache_dir))
    engines = {}
    for ctx in ctxs:
        s = Settings(model=model, threads=2, parallel=1, embeddings="on", embedding_ctx=ctx,
                     embedding_batch=256)
        engines[ctx] = LlamaEngine(engine_config(s), LoadState(), lambda _: model)
        engines[ctx].start()
        for _ in range(3000):  # bounded: 300 s
            if engines[ctx].state.ready:
                break
            time.sleep(0.1)
    for _ in range(2):
        for ctx, eng in engines.items():
            t = time.perf_counter()
            out = eng.embedder.submit(EmbedRequest(inputs)).result(1200)
            dt = time.perf_counter() - t
            toks = sum(o.tokens for o in out)
            print(f"decodes of at most {ctx} tokens: {toks} tokens in {dt:.1f} s, "
                  f"{toks / dt:.0f} tokens/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=ROOT, help="the checkout to serve")
    ap.add_argument("--inputs", type=int, default=1024)
    ap.add_argument("--words", type=int, default=30)
    ap.add_argument("--fill", action="store_true", help="inputs of the context's length")
    ap.add_argument("--sizes", help="compare decode sizes in process (comma-separated)")
    args = ap.parse_args()
    if args.sizes:
        sizes([int(x) for x in args.sizes.split(",")], tuple(texts(args.inputs, args.words, False)))
        return
    env = {"EMBEDDINGS": "on", "API_KEY": f"{KEY_A},{KEY_B}", "THREADS": "2", "PARALLEL": "2",
           "CTX_SIZE": "2048", "EMBEDDING_CTX": str(CTX)}
    big = texts(args.inputs, args.words, args.fill)
    with serve(args.repo, env) as base:
        hang_up(base, big)
        running(base, big)


if __name__ == "__main__":
    main()
