"""DETERMINISTIC (issue 53, part 3): how often a reply differs from the same request decoded from
nothing, with the mode off and on, and what the mode costs in throughput; in one run.

Per side (a fresh server each: DETERMINISTIC off, then on; the same GGUF, PARALLEL, context,
PREFILL_CHUNK and FLASH_ATTN as given):
  - the reference: a greedy and a seeded (temperature 1, top_k 40, seed 11) completion of a
    prompt of about PROMPT words, decoded from nothing (``cache_prompt`` off), alone;
  - ROUNDS rounds of four cases, each compared with the reference byte for byte: after its own
    cached prompt; beside STREAMS-1 other streams (started first, still generating); after
    another conversation that shared the prompt's first fifth, half, or all but three words;
    the count of equal replies out of all, per case;
  - throughput: 1 stream, then STREAMS concurrent streams of TOKENS tokens each (``ignore_eos``,
    prompts of their own): tokens per second over the whole run, and TTFT p50.
Then the ratios on/off. One JSON line per side, then one with the comparisons. Not a test:
figures depend on the machine; record them in bench/RESULTS.md with the machine named.

    PYTHONPATH=. python bench/deterministic.py [--model M] [--rounds 3] [--streams 8]
        [--tokens 128] [--flash-attn auto] [--chunk 256]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
from common import serve, sse_objects

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORDS = ["river", "stone", "lantern", "orchard", "copper", "meadow", "violet", "harbor",
         "thunder", "maple", "canvas", "falcon", "ember", "glacier", "saffron", "quarry"]
GREEDY = {"temperature": 0}
SEEDED = {"temperature": 1.0, "top_k": 40, "seed": 11}


def story(seed: int, n: int) -> str:
    return f"Story {seed}: " + " ".join(WORDS[(seed * 7 + i * i) % len(WORDS)] for i in range(n))


def complete(base: str, prompt: str, sampling: dict, max_tokens: int = 32,
             cache: bool = True) -> str:
    r = requests.post(base + "/v1/completions", timeout=600, json={
        "prompt": prompt, "max_tokens": max_tokens, "cache_prompt": cache, **sampling})
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


def stream(base: str, prompt: str, tokens: int, ignore_eos: bool = True) -> tuple[float, int]:
    """A streamed completion: seconds to its first text, and the tokens it sent."""
    t0 = time.perf_counter()
    first, n = None, 0
    with requests.post(base + "/v1/completions", stream=True, timeout=600, json={
            "prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
            "ignore_eos": ignore_eos}) as r:
        r.raise_for_status()
        for obj in sse_objects(r):
            if obj["choices"] and obj["choices"][0].get("text"):
                first = first or time.perf_counter() - t0
                n += 1
    return first or 0.0, n


def invariance(base: str, prompt: str, rounds: int, streams: int) -> dict[str, object]:
    ref = {name: complete(base, prompt, s, cache=False)
           for name, s in (("greedy", GREEDY), ("seeded", SEEDED))}
    equal: dict[str, list[int]] = {}

    def check(case: str, name: str, text: str) -> None:
        tally = equal.setdefault(case, [0, 0])
        tally[0] += text == ref[name]
        tally[1] += 1

    words = prompt.split(" ")
    for k in range(rounds):
        for name, s in (("greedy", GREEDY), ("seeded", SEEDED)):
            check("own cached prompt", name, complete(base, prompt, s))
            with ThreadPoolExecutor(streams - 1) as pool:
                others = [pool.submit(stream, base, story(1000 + 100 * k + i, 120), 96)
                          for i in range(streams - 1)]
                time.sleep(1.0)  # the others admitted and generating
                check(f"beside {streams - 1} streams", name, complete(base, prompt, s))
                for f in others:
                    f.result()
            for cut in (len(words) // 5, len(words) // 2, len(words) - 3):
                complete(base, " ".join(words[:cut]) + f" but the {WORDS[k]}", GREEDY, 4)
                check("after a shared prefix", name, complete(base, prompt, s))
    return {case: f"{a}/{b}" for case, (a, b) in equal.items()}


def throughput(base: str, n: int, tokens: int) -> dict[str, float]:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        got = list(pool.map(lambda i: stream(base, story(5000 + i, 60), tokens), range(n)))
    wall = time.perf_counter() - t0
    return {"tok_s": round(sum(c for _, c in got) / wall, 1),
            "ttft_p50_ms": round(1000 * statistics.median(t for t, _ in got), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="/tmp/vertex-gguf/default/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=300, help="words in the compared prompt")
    ap.add_argument("--flash-attn", default="auto")
    ap.add_argument("--chunk", type=int, default=256, help="PREFILL_CHUNK")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    prompt = story(1, args.prompt) + " And then"
    sides = {}
    for mode in ("off", "on"):
        env = {"MODEL": args.model, "DETERMINISTIC": mode, "PARALLEL": str(args.streams),
               "CTX_SIZE": "2048", "PREFILL_CHUNK": str(args.chunk),
               "FLASH_ATTN": args.flash_attn, "THREADS": str(args.threads), "WARM_UP": "light"}
        with serve(ROOT, env) as base:
            side = {"deterministic": mode, "equal_to_reference":
                    invariance(base, prompt, args.rounds, args.streams),
                    "1_stream": throughput(base, 1, args.tokens),
                    f"{args.streams}_streams": throughput(base, args.streams, args.tokens)}
        print(json.dumps(side), flush=True)
        sides[mode] = side
    key = f"{args.streams}_streams"
    print(json.dumps({"on_over_off_tok_s": {
        "1_stream": round(sides["on"]["1_stream"]["tok_s"] / sides["off"]["1_stream"]["tok_s"], 3),
        key: round(sides["on"][key]["tok_s"] / sides["off"][key]["tok_s"], 3)}}))


if __name__ == "__main__":
    main()
