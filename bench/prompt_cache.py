"""Prompts kept when their slot is taken (issue 52, part 2): a conversation's second turn, with
a host-RAM prompt cache and without, on vertex-gguf and on llama-server, in one run.

CONVERSATIONS distinct prompts of about PROMPT_TOKENS tokens (pseudo-random English-ish text
from a fixed seed, each different from its first word, in SmolLM2's ChatML turns so that only
the template's opening is shared) on SLOTS slots. Turn 1 sends each conversation once, one at a
time, so every slot is taken again and again; turn 2 sends each one again in the same order:
its turn-1 prompt, the reply the same server gave, and a short new user line. Every request is
a streamed /v1/completions with a raw prompt, temperature 0, ``cache_prompt`` on, MAX_TOKENS
tokens. With SLOTS slots and the same order, each turn-2 prompt's slot has been taken by then
(a later conversation's turn 1 or an earlier one's turn 2): without a prompt cache every turn 2
prefills its whole prompt again; with one it is restored from host RAM.

Four sides, each a fresh server, one at a time, on the same GGUF, threads and context:
  - vertex-gguf (this tree) with PROMPT_CACHE_RAM_MB=0 and with PROMPT_CACHE_RAM_MB=CACHE_MB
    (CTX_SIZE is per slot: CTX_SIZE=SLOT_CTX PARALLEL=SLOTS),
  - llama-server with ``--cache-ram 0`` and with ``--cache-ram CACHE_MB`` (``-c SLOTS*SLOT_CTX
    -np SLOTS --no-kv-unified``: SLOT_CTX tokens per slot, as ours; its other prompt-cache
    settings at their defaults: --cache-idle-slots, --slot-prompt-similarity 0.1, no
    --cache-reuse).
Per side, turn 2: TTFT (to the first streamed text) median and p90, the whole request's mean,
mean prompt and cached tokens (usage.prompt_tokens_details.cached_tokens, which both servers
put in the final chunk with include_usage), and turn 1's TTFT median for scale. Then, per
server, the ratio of the medians with the cache to without and whether turn 2's replies are
the same bytes (greedy: expected on vertex-gguf); and vertex-gguf with against llama-server
with. One JSON line per side, then one with the comparisons. Not a test: figures depend on the
machine; record them in bench/RESULTS.md with the machine named.

    PYTHONPATH=. python bench/prompt_cache.py \\
        --llama-server bench/gpu/work/build-cpu/bin/llama-server \\
        [--conversations 16] [--prompt-tokens 4000] [--slots 4] [--threads 2] [--cache-mb 2048]

The default run prefills 16 x 4k tokens once per turn on a side without a cache (128k tokens,
at the few hundred tokens a second 2 shared cores gave this 135M model): over 10 minutes on 2
cores. ``--prompt-tokens 1000`` keeps the 16 conversations on
4 slots at a quarter of the cost; ``--conversations 6 --prompt-tokens 1000 --slots 2`` is a quick
one. Without --llama-server (and no binary at the default path) only vertex-gguf's two sides
run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import requests
from common import (
    LLAMA_SERVER,
    add_extra_buffers_arg,
    extra_buffers_env,
    llama_server_extra_buffers,
    process,
    serve,
    sse_objects,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORDS = ("time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child",
         "world", "school", "state", "family", "student", "group", "country", "problem", "hand",
         "part", "place", "case", "week", "company", "system", "program", "question", "work",
         "government", "number", "night", "point", "home", "water", "room", "mother", "area",
         "money", "story", "fact", "month", "lot", "right", "study", "book", "eye", "job",
         "word", "business", "issue", "side", "kind", "head", "house", "service", "friend",
         "father", "power", "hour", "game", "line", "end", "member", "law", "car", "city",
         "community", "name", "president", "team", "minute", "idea", "kid", "body",
         "information", "back", "parent", "face", "others", "level", "office", "door", "health",
         "person", "art", "war", "history", "party", "result", "change", "morning", "reason",
         "research", "girl", "guy", "moment", "air", "teacher", "force", "education", "river",
         "garden", "bridge", "market", "train", "winter", "music", "letter", "window", "island",
         "forest", "say", "make", "go", "know", "take", "see", "come", "think", "look", "want",
         "give", "use", "find", "tell", "ask", "seem", "feel", "try", "leave", "call", "keep",
         "begin", "show", "hear", "play", "run", "move", "live", "believe", "hold", "bring",
         "happen", "write", "provide", "sit", "stand", "lose", "pay", "meet", "include",
         "continue", "set", "learn", "lead", "understand", "watch", "follow", "stop", "create",
         "speak", "read", "allow", "add", "spend", "grow", "open", "walk", "win", "offer",
         "remember", "love", "consider", "appear", "buy", "wait", "serve", "die", "send",
         "expect", "build", "stay", "fall", "cut", "reach", "kill", "remain", "suggest", "good",
         "new", "first", "last", "long", "great", "little", "own", "other", "old", "right",
         "big", "high", "different", "small", "large", "next", "early", "young", "important",
         "few", "public", "bad", "same", "able", "late", "hard", "major", "better", "quietly",
         "often", "always", "never", "slowly", "again", "already", "together", "almost", "later",
         "perhaps", "the", "a", "of", "and", "to", "in", "for", "on", "with", "at", "by", "from",
         "about", "into", "over", "after", "under", "between", "through", "during", "without",
         "before")
OPENERS = ("Consider", "Imagine", "Remember", "Listen", "Suppose", "Picture", "Notice", "Recall",
           "Observe", "Describe", "Explain", "Compare", "Examine", "Summarize", "Review",
           "Discuss", "Outline", "Study", "Analyze", "Evaluate", "Follow", "Read", "Trace",
           "Explore")


def turn(user: str) -> str:
    """One ChatML user turn and the assistant's opening (SmolLM2's template)."""
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(6, 16))]
    return " " + " ".join(words).capitalize() + rng.choice(".....?!;")


def prompts(model: str, n: int, tokens: int, seed: int) -> list[str]:
    """``n`` turn-1 prompts of about ``tokens`` tokens each (counted with the model's own
    tokenizer), each opening with a word of its own (conversation i: OPENERS[i], then its
    number) so that no two share more than the template's first tokens."""
    import llama_cpp

    vocab = llama_cpp.Llama(model, vocab_only=True, verbose=False)

    def count(text: str) -> int:
        return len(vocab.tokenize(text.encode(), add_bos=False, special=True))

    out = []
    for i in range(n):
        rng = random.Random(seed * 1_000_003 + i)
        parts = [f"{OPENERS[i % len(OPENERS)]} passage {i + 1}:"]
        used = count(turn(parts[0])) + 8
        for _ in range(tokens):  # each sentence is at least one token: bounded
            if used >= tokens:
                break
            parts.append(sentence(rng))
            used += count(parts[-1])
        out.append(turn("".join(parts)))
    return out


def follow_up(i: int) -> str:
    return f"Thanks. Now say in one sentence what passage {i + 1} was about."


def complete(base: str, prompt: str, max_tokens: int, timeout: float) -> dict:
    """One streamed /v1/completions: its text, seconds to the first text and to the end, and
    the prompt and cached tokens of its usage."""
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "cache_prompt": True}
    t0 = time.perf_counter()
    first = None
    text = []
    usage: dict = {}
    with requests.post(base + "/v1/completions", json=body, stream=True,
                       timeout=(10, timeout)) as r:
        r.raise_for_status()
        for obj in sse_objects(r):
            for ch in obj.get("choices") or []:
                if ch.get("text"):
                    if first is None:
                        first = time.perf_counter() - t0
                    text.append(ch["text"])
            if obj.get("usage"):
                usage = obj["usage"]
    total = time.perf_counter() - t0
    return {"text": "".join(text), "ttft": total if first is None else first, "total": total,
            "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens")}


def converse(base: str, first_prompts: list[str], max_tokens: int, timeout: float) -> dict:
    """Warm-up, turn 1 for each conversation, then turn 2 for each, in the same order."""
    complete(base, turn("Hello."), 4, timeout)
    t1 = []
    for p in first_prompts:
        t1.append(complete(base, p, max_tokens, timeout))
    t2 = []
    for i, (p, r) in enumerate(zip(first_prompts, t1, strict=True)):
        t2.append(complete(base, p + r["text"] + "<|im_end|>\n" + turn(follow_up(i)),
                           max_tokens, timeout))
    return {"turn1": t1, "turn2": t2}


def p90(values: list[float]) -> float:
    s = sorted(values)
    return s[max(0, math.ceil(0.9 * len(s)) - 1)]


def mean(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.fmean(known), 1) if known else None


def summary(name: str, run: dict) -> dict:
    t1, t2 = run["turn1"], run["turn2"]
    ttft = [r["ttft"] * 1000 for r in t2]
    return {"side": name, "turn2_ttft_p50_ms": round(statistics.median(ttft), 1),
            "turn2_ttft_p90_ms": round(p90(ttft), 1),
            "turn2_total_mean_ms": round(statistics.fmean(r["total"] * 1000 for r in t2), 1),
            "turn2_prompt_tokens_mean": mean([r["prompt_tokens"] for r in t2]),
            "turn2_cached_tokens_mean": mean([r["cached_tokens"] for r in t2]),
            "turn1_ttft_p50_ms": round(statistics.median(r["ttft"] * 1000 for r in t1), 1),
            "turn1_cached_tokens_mean": mean([r["cached_tokens"] for r in t1]),
            # prefill speed for scale: turn 1's prompt tokens over its seconds to the first text
            "turn1_prompt_tok_s": round(sum(r["prompt_tokens"] or 0 for r in t1)
                                        / sum(r["ttft"] for r in t1), 1),
            "wall_s": round(run["wall"], 1)}


def main() -> None:
    from app.model.default import default_model_path
    from app.settings import DEFAULT_CACHE_DIR

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(default_model_path(DEFAULT_CACHE_DIR)))
    ap.add_argument("--llama-server", default=str(LLAMA_SERVER) if LLAMA_SERVER.exists() else None,
                    help="a llama-server binary (its sides are left out without one)")
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=4000, help="each turn-1 prompt's size")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--slot-ctx", type=int,
                    help="context per slot (default: prompt tokens + 512, rounded up to 256)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache-mb", type=int, default=2048,
                    help="the cache's size on the 'with' sides (PROMPT_CACHE_RAM_MB, --cache-ram)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=52)
    ap.add_argument("--timeout", type=float, default=300, help="seconds a request may wait to read")
    add_extra_buffers_arg(ap)
    args = ap.parse_args()
    slot_ctx = args.slot_ctx or -(-(args.prompt_tokens + 512) // 256) * 256

    first_prompts = prompts(args.model, args.conversations, args.prompt_tokens, args.seed)

    def ours(cache_mb: int) -> AbstractContextManager[str]:
        return serve(ROOT, {"MODEL": args.model, "PARALLEL": str(args.slots),
                            "CTX_SIZE": str(slot_ctx), "THREADS": str(args.threads),
                            "THREADS_BATCH": str(args.threads), "PROMPT_CACHE_RAM_MB": str(cache_mb),
                            "STREAM_HEARTBEAT_SECONDS": "0", "LOG_LEVEL": "warning",
                            **extra_buffers_env(args)})

    def theirs(cache_mb: int) -> AbstractContextManager[str]:
        binary = args.llama_server
        lib = str(Path(binary).resolve().parent)
        env = {"LD_LIBRARY_PATH": os.pathsep.join(filter(None, (lib, os.environ.get("LD_LIBRARY_PATH"))))}
        return process([binary, "-m", args.model, "--host", "127.0.0.1", "--port", "{port}",
                        "-np", str(args.slots), "-c", str(args.slots * slot_ctx), "--no-kv-unified",
                        "-t", str(args.threads), "-tb", str(args.threads), "--no-webui",
                        "--cache-ram", str(cache_mb), *llama_server_extra_buffers(args)],
                       env, "/health", "llama-server", 300)

    sides: list[tuple[str, Callable[[], AbstractContextManager[str]]]] = [
        ("vertex-gguf without", lambda: ours(0)),
        ("vertex-gguf with", lambda: ours(args.cache_mb)),
    ]
    if args.llama_server:
        sides += [("llama-server without", lambda: theirs(0)),
                  ("llama-server with", lambda: theirs(args.cache_mb))]
    else:
        print("no llama-server binary: its sides are left out", file=sys.stderr)

    runs: dict[str, dict] = {}
    for name, start in sides:
        t0 = time.perf_counter()
        with start() as base:
            run = converse(base, first_prompts, args.max_tokens, args.timeout)
        run["wall"] = time.perf_counter() - t0
        runs[name] = run
        row = summary(name, run)
        runs[name]["summary"] = row
        print(json.dumps(row), flush=True)

    def ratio(a: str, b: str) -> float | None:
        if a not in runs or b not in runs:
            return None
        return round(runs[a]["summary"]["turn2_ttft_p50_ms"] / runs[b]["summary"]["turn2_ttft_p50_ms"], 3)

    def same(a: str, b: str, which: str = "turn2") -> str | None:
        if a not in runs or b not in runs:
            return None
        n = sum(x["text"] == y["text"] for x, y in zip(runs[a][which], runs[b][which], strict=True))
        return f"{n}/{len(runs[a][which])}"

    print(json.dumps({
        "model": Path(args.model).name, "conversations": args.conversations,
        "prompt_tokens": args.prompt_tokens, "slots": args.slots, "slot_ctx": slot_ctx,
        "threads": args.threads, "cache_mb": args.cache_mb, "max_tokens": args.max_tokens,
        "ttft_p50_with_over_without": {"vertex-gguf": ratio("vertex-gguf with", "vertex-gguf without"),
                                       "llama-server": ratio("llama-server with", "llama-server without")},
        "ttft_p50_vertex_gguf_with_over_llama_server_with": ratio("vertex-gguf with", "llama-server with"),
        "turn2_text_same_with_and_without": {"vertex-gguf": same("vertex-gguf with", "vertex-gguf without"),
                                             "llama-server": same("llama-server with", "llama-server without")},
        # turn 2's prompt holds the side's own turn-1 reply: the same prompts only if these match
        "turn1_text_same_with_and_without": {
            "vertex-gguf": same("vertex-gguf with", "vertex-gguf without", "turn1"),
            "llama-server": same("llama-server with", "llama-server without", "turn1")},
    }))


if __name__ == "__main__":
    main()
