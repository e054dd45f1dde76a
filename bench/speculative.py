"""Speculative decoding against none, and against llama-server's, in the same run.

Servers, each on the same model with 8 slots: vertex-gguf without speculation, with n-gram
lookup (SPEC_NGRAM=1) and with a draft model (DRAFT_MODEL: the model's first --draft-layers
layers, its quantized tensors copied, tests/support/gguf_requant.py); llama-server likewise
(no flags, --spec-type ngram-simple, -md with the same draft, n_max and p_min). Two workloads,
greedy: "copy" (a completion that repeats a code block from its prompt, each request with its
own function names) and "free" (chat: a short story, each request on its own topic), at c=1
and c=8. Each figure: completion tokens over wall time of all the workload's requests; the
tables give each server's speedup over its own run without speculation.

Then OpenAI's Predicted Outputs, which llama-server does not take: on vertex-gguf without
speculation of its own, chat requests that ask for a code block back, each with its own names,
sent with the code as the prediction (what an editor sends: the file before the edit) and
without; the figure is the speedup of the first over the second.

Then multi-token prediction (issue 53): on the tiny Hunyuan v3 GGUF with one NextN layer
(tests/support/tiny_mtp.py), the echo model (every MTP draft is the model's own greedy token)
and random weights (few kept), vertex-gguf SPEC_MTP=off and on (the gate off: drafting on
every step, and on) against llama-server without and with ``--spec-type draft-mtp``, the same
n_max (3, both defaults), completions of 128 tokens (ignore_eos) at c=1 and c=8, each figure
the best of --repeat runs.

    python bench/speculative.py --llama-server bench/gpu/work/build-cpu/bin/llama-server
    python bench/speculative.py --only-prediction
    python bench/speculative.py --only-mtp --llama-server bench/gpu/work/build-cpu/bin/llama-server
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import process, serve  # noqa: E402

CODE = """def {a}(x, y):
    total = x + y
    return total


def {b}(x, y):
    difference = x - y
    return difference


def {c}(values):
    result = []
    for value in values:
        result.append(value * 2)
    return result
"""
NAMES = ["add", "plus", "combine", "join", "merge", "sum_up", "gather", "unite"]
TOPICS = ["a cat", "the sea", "a robot", "a city at night", "a lost key", "winter", "a train",
          "an old map"]


def copy_body(i: int, max_tokens: int) -> tuple[str, dict]:
    code = CODE.format(a=NAMES[i % 8], b=f"minus_{i}", c=f"double_{i}")
    prompt = f"Here is some code:\n\n```python\n{code}```\n\nThe same code again:\n\n```python\n"
    return "/v1/completions", {"prompt": prompt, "temperature": 0, "max_tokens": max_tokens}


def free_body(i: int, max_tokens: int) -> tuple[str, dict]:
    return "/v1/chat/completions", {
        "messages": [{"role": "user", "content": f"Write a short story about {TOPICS[i % 8]}."}],
        "temperature": 0, "max_tokens": max_tokens}


def edit_body(i: int, max_tokens: int, predict: bool = False) -> tuple[str, dict]:
    code = CODE.format(a=NAMES[i % 8], b=f"minus_{i}", c=f"double_{i}")
    body = {"messages": [{"role": "user", "content": "Repeat this code exactly, in a python "
                          f"code block:\n\n{code}"}],
            "temperature": 0, "max_tokens": max_tokens, "cache_prompt": False}
    if predict:
        body["prediction"] = {"type": "content", "content": f"```python\n{code}```"}
    return "/v1/chat/completions", body


_OWN: dict[tuple[str, int, int], str] = {}


def own_body(base: str, i: int, max_tokens: int) -> tuple[str, dict]:
    """The edit request with its own reply (asked for once, without a prediction, before the
    timed run reaches it) as the prediction: the best a prediction can do."""
    key = (base, i, max_tokens)
    path, body = edit_body(i, max_tokens)
    if key not in _OWN:
        r = requests.post(base + path, json=body, timeout=600)
        r.raise_for_status()
        _OWN[key] = r.json()["choices"][0]["message"]["content"]
    return path, {**body, "prediction": {"type": "content", "content": _OWN[key]}}


WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "hello", "world", "is", "it", "here"]


def tiny_body(i: int, max_tokens: int) -> tuple[str, dict]:
    """A completion in the tiny MTP model's vocabulary, each request its own prompt."""
    prompt = " ".join(WORDS[(i * 7 + k * 5) % len(WORDS)] for k in range(12))
    return "/v1/completions", {"prompt": prompt, "temperature": 0, "max_tokens": max_tokens,
                               "ignore_eos": True}


WORKLOADS = {"copy": copy_body, "free": free_body}


def run(base: str, workload: str, c: int, rounds: int, max_tokens: int) -> dict:
    """``rounds`` x ``c`` requests, ``c`` at a time; tokens per second and draft counts."""
    make = {**WORKLOADS, "edit": edit_body, "tiny": tiny_body,
            "edit+prediction": lambda i, n: edit_body(i, n, predict=True),
            "edit+own": lambda i, n: own_body(base, i, n)}[workload]

    def one(i: int) -> dict:
        path, body = make(i, max_tokens)
        r = requests.post(base + path, json=body, timeout=600)
        r.raise_for_status()
        return r.json()

    one(99)  # warm: the first request's compute buffers, caches
    if workload == "edit+own":  # each request's own reply, asked for before the clock starts
        for i in range(rounds * c):
            own_body(base, i, max_tokens)
    tokens = drafted = accepted = 0
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(c) as pool:
        for rnd in range(rounds):
            for body in pool.map(one, range(rnd * c, rnd * c + c)):
                tokens += body["usage"]["completion_tokens"]
                t = body.get("timings") or {}
                drafted += t.get("draft_n", 0)
                accepted += t.get("draft_n_accepted", 0)
    wall = time.perf_counter() - t0
    return {"tok_s": tokens / wall, "tokens": tokens, "drafted": drafted, "accepted": accepted}


def vertex_env(args) -> dict[str, str]:
    """Every vertex-gguf server's settings in this benchmark, before its mode's."""
    return {"PARALLEL": "8", "CTX_SIZE": "2048", "THREADS": str(args.threads),
            "SPEC_DRAFT_MAX": str(args.n_max), "SPEC_P_MIN": str(args.p_min),
            "MODEL": args.model, "SLOTS_PER_REQUEST": "1"}


def servers(args, draft: Path) -> list[tuple[str, str, contextlib.AbstractContextManager[str]]]:
    """(server, mode, a context giving its base URL) for every server of the run."""
    common = vertex_env(args)
    out = [("vertex-gguf", "none", serve(ROOT, common)),
           ("vertex-gguf", "ngram", serve(ROOT, {**common, "SPEC_NGRAM": "1"})),
           ("vertex-gguf", "draft", serve(ROOT, {**common, "DRAFT_MODEL": str(draft)}))]
    if args.llama_server:
        base = [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "--port", "{port}",
                "-np", "8", "-c", str(8 * 2048), "-t", str(args.threads), "-tb",
                str(args.threads), "--no-webui"]
        spec = ["--spec-draft-n-max", str(args.n_max), "--spec-draft-p-min", str(args.p_min)]
        for mode, extra in (("none", []), ("ngram", ["--spec-type", "ngram-simple", *spec]),
                            ("draft", ["-md", str(draft), *spec])):
            out.append(("llama-server", mode,
                        process(base + extra, None, "/health", f"llama-server-{mode}", 300)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(Path(os.environ.get("MODEL_CACHE_DIR", "/tmp/vertex-gguf"))
                                           / "default" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--llama-server")
    ap.add_argument("--draft-layers", type=int, default=8)
    ap.add_argument("--n-max", type=int, default=8)
    ap.add_argument("--p-min", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--only-prediction", action="store_true",
                    help="only the Predicted Outputs part")
    ap.add_argument("--only-mtp", action="store_true", help="only the MTP part")
    ap.add_argument("--ngl", type=int, default=0, help="layers on the GPU (the MTP part)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure, the best kept "
                    "(the MTP part: a tiny model's figures are mostly the machine's noise)")
    args = ap.parse_args()
    if args.only_mtp:
        mtp(args)
        return
    if not args.only_prediction:
        compare_servers(args)
        mtp(args)
    predictions(args)


def mtp(args) -> None:
    """SPEC_MTP against llama-server's draft-mtp on the tiny hy_v3 models (echo, random)."""
    from tests.support.tiny_bert import build_tiny_bert
    from tests.support.tiny_mtp import build_tiny_mtp

    rows: list[tuple[str, str, str, int, dict]] = []
    with tempfile.TemporaryDirectory() as tmp:
        vocab = build_tiny_bert(Path(tmp) / "bert.gguf")
        for kind in ("echo", "random"):
            model = build_tiny_mtp(Path(tmp) / f"{kind}.gguf", vocab, echo=kind == "echo")
            env = {"PARALLEL": "8", "CTX_SIZE": "512", "THREADS": str(args.threads),
                   "MODEL": str(model), "SLOTS_PER_REQUEST": "1", "GPU_LAYERS": str(args.ngl)}
            sides = [("vertex-gguf", "none", serve(ROOT, {**env, "SPEC_MTP": "off"})),
                     ("vertex-gguf", "mtp", serve(ROOT, {**env, "SPEC_MTP": "on",
                                                         "SPEC_ADAPTIVE": "false"})),
                     ("vertex-gguf", "mtp+gate", serve(ROOT, {**env, "SPEC_MTP": "on"}))]
            if args.llama_server:
                base = [args.llama_server, "-m", str(model), "--host", "127.0.0.1", "--port",
                        "{port}", "-np", "8", "-c", str(8 * 512), "-t", str(args.threads), "-tb",
                        str(args.threads), "-ngl", str(args.ngl), "--no-webui"]
                for mode, extra in (("none", []), ("mtp", ["--spec-type", "draft-mtp",
                                                           "--spec-draft-n-max", "3"])):
                    sides.append(("llama-server", mode, process(
                        base + extra, None, "/health", f"llama-server-{mode}", 300)))
            for name, mode, ctx in sides:
                with ctx as url:
                    for c in (1, 8):  # the best of --repeat runs: this machine is shared
                        r = max((run(url, "tiny", c, args.rounds, args.max_tokens)
                                 for _ in range(args.repeat)), key=lambda x: x["tok_s"])
                        rows.append((kind, name, mode, c, r))
                        print(f"{kind:6} {name:12} {mode:8} c={c}: {r['tok_s']:7.1f} tok/s, "
                              f"{r['accepted']}/{r['drafted']} drafted kept", flush=True)
    got = {(k, n, m, c): r for k, n, m, c, r in rows}
    print("\n| model | server | mode | c | tok/s | vs its own none | drafts kept |")
    print("|---|---|---|---|---|---|---|")
    for (kind, name, mode, c), r in got.items():
        ref = got[(kind, name, "none", c)]
        kept = f"{r['accepted']}/{r['drafted']}" if r["drafted"] else "-"
        print(f"| {kind} | {name} | {mode} | {c} | {r['tok_s']:.1f} | "
              f"{r['tok_s'] / ref['tok_s']:.2f}x | {kept} |")
    print("\nvertex-gguf over llama-server, same mode (mtp: vertex-gguf drafting every step):")
    for (kind, name, mode, c), r in got.items():
        peer = got.get((kind, "llama-server", mode, c))
        if name == "vertex-gguf" and peer:
            print(f"  {kind:6} {mode:5} c={c}: {r['tok_s'] / peer['tok_s']:.2f}x")


def predictions(args) -> None:
    """Predicted Outputs on the edit workload: without a prediction, with the code as the
    prediction (what an editor sends; the model may not repeat it exactly), and with the
    reply itself as the prediction (the best case: all of it kept), on a server with the gate
    (SPEC_ADAPTIVE, the default) and on one that drafts on every step."""
    common = vertex_env(args)
    rows = []
    for gated in (True, False):
        env = common if gated else {**common, "SPEC_ADAPTIVE": "false"}
        with serve(ROOT, env) as base:
            for c in (1, 8):
                plain = run(base, "edit", c, args.rounds, args.max_tokens)
                code = run(base, "edit+prediction", c, args.rounds, args.max_tokens)
                own = run(base, "edit+own", c, args.rounds, args.max_tokens)
                for name, r in (("the code", code), ("the reply", own)):
                    rows.append((gated, c, name, plain, r))
                    print(f"gate {'on' if gated else 'off'} c={c} prediction {name}: "
                          f"{plain['tok_s']:.1f} -> {r['tok_s']:.1f} tok/s, "
                          f"{r['accepted']}/{r['drafted']} drafted kept", flush=True)
                    if r["tokens"] != plain["tokens"]:  # batches of other shapes: a near tie
                        print(f"note: {r['tokens']} tokens with the prediction, "
                              f"{plain['tokens']} without", flush=True)
    print("\n| gate | c | prediction | tok/s without | with | speedup | drafts kept |")
    print("|---|---|---|---|---|---|---|")
    for gated, c, name, plain, r in rows:
        print(f"| {'on' if gated else 'off'} | {c} | {name} | {plain['tok_s']:.1f} | "
              f"{r['tok_s']:.1f} | {r['tok_s'] / plain['tok_s']:.2f}x | "
              f"{r['accepted']}/{r['drafted']} |")


def compare_servers(args) -> None:
    """Each server without speculation, with n-gram lookup and with the draft model."""
    from gguf import GGMLQuantizationType

    from tests.support.gguf_requant import requantize

    results: dict[tuple[str, str, str, int], dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        draft = requantize(Path(args.model), Path(tmp) / "draft.gguf",
                           GGMLQuantizationType.Q4_1, layers=args.draft_layers)
        for name, mode, ctx in servers(args, draft):
            with ctx as base:
                for workload in WORKLOADS:
                    for c in (1, 8):
                        r = run(base, workload, c, args.rounds, args.max_tokens)
                        results[(name, mode, workload, c)] = r
                        print(f"{name:12} {mode:5} {workload:4} c={c}: {r['tok_s']:7.1f} tok/s, "
                              f"{r['accepted']}/{r['drafted']} drafted kept", flush=True)
    print("\n| server | mode | workload | c | tok/s | vs its own none | drafts kept |")
    print("|---|---|---|---|---|---|---|")
    for (name, mode, workload, c), r in results.items():
        ref = results.get((name, "none", workload, c))
        ratio = f"{r['tok_s'] / ref['tok_s']:.2f}x" if ref else "-"
        kept = f"{r['accepted']}/{r['drafted']}" if r["drafted"] else "-"
        print(f"| {name} | {mode} | {workload} | {c} | {r['tok_s']:.1f} | {ratio} | {kept} |")
    print("\nvertex-gguf over llama-server, same mode:")
    for (name, mode, workload, c), r in results.items():
        peer = results.get(("llama-server", mode, workload, c))
        if name == "vertex-gguf" and peer:
            print(f"  {mode:5} {workload:4} c={c}: {r['tok_s'] / peer['tok_s']:.2f}x")


if __name__ == "__main__":
    main()
