"""Does a long reply cost more per token than a short one? The serving layers, measured apart.

Two parts, both for this tree only (no peer: llama-server's own work cannot be taken apart
from its decode this way):

1. **Streams.** Starts vertex-gguf on the near-free model (``bench/gpu/models.py build
   nearfree``: its math costs next to nothing) and sends 2 x c streaming chats of 100 and of
   4000 tokens (``ignore_eos``, temperature 0) at each concurrency. Per 1000 tokens it reports
   the server's CPU seconds (every process, from /proc), the HTTP thread's (the worker's main
   thread: parsing, JSON, SSE, sockets), the engine thread's time outside ``llama_decode``
   (scheduling, sampling, text; from the health body's ``step_seconds - decode_seconds``) and
   the time inside it. llama.cpp's attention grows with the context, so the total and the
   decode column grow with the reply; the two serving columns must not.
2. **Reply parsing.** A reply is parsed again after every piece (``app.core.decode``): for
   each tool-call format, one call whose argument is 4000 pieces long, and a 4000-piece
   thought, fed piece by piece; microseconds per piece over the first and the last 100.

    python bench/reply_length.py [--model bench/gpu/work/models/nearfree.gguf] [--levels 1,8]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import requests
from batching import run_level
from common import ROOT, process

sys.path.insert(0, str(ROOT))

LENGTHS = (100, 4000)


def worker_pid(master: int) -> int:
    """gunicorn's worker: the server process's child (itself when it has none)."""
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return int(children[0]) if children else master


def thread_cpu(pid: int, tid: int) -> float:
    fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def group_cpu(pid: int) -> float:
    """Every thread of the worker (gunicorn's master does nothing per token)."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += thread_cpu(pid, int(task.name))
        except OSError:
            continue
    return total


def engine(base: str) -> dict:
    return requests.get(base + "/health", timeout=10).json()["engine"]


def streams(model: str, levels: list[int], threads: int) -> list[str]:
    env = {"MODEL": model, "PARALLEL": str(max(levels)), "CTX_SIZE": str(max(LENGTHS) + 160),
           "THREADS": str(threads), "LOG_LEVEL": "warning", "STREAM_HEARTBEAT_SECONDS": "0"}
    rows = ["| reply tokens | c | tok/s | CPU s / 1k tok | HTTP thread | engine, outside "
            "llama_decode | inside llama_decode |", "|---|---|---|---|---|---|---|"]
    cmd = [sys.executable, "-m", "app", "--host", "127.0.0.1", "--port", "{port}"]
    with process(cmd, env, "/health", "vertex-gguf", 300) as base:
        port = int(base.rsplit(":", 1)[1])
        master = next(int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                      and _listens(int(p.name), port))
        pid = worker_pid(master)
        run_level(base, "/health", 1, 16, ignore_eos=True)  # warm
        for length in LENGTHS:
            for c in levels:
                e0, cpu0, http0 = engine(base), group_cpu(pid), thread_cpu(pid, pid)
                r = run_level(base, "/health", c, length, ignore_eos=True)
                e1, cpu1, http1 = engine(base), group_cpu(pid), thread_cpu(pid, pid)
                k = 1000 / r.tokens
                decode = e1["decode_seconds"] - e0["decode_seconds"]
                host = e1["step_seconds"] - e0["step_seconds"] - decode
                rows.append(f"| {length} | {c} | {r.tokens / r.wall:.0f} | {(cpu1 - cpu0) * k:.3f} | "
                            f"{(http1 - http0) * k:.3f} | {host * k:.3f} | {decode * k:.3f} |")
                print(rows[-1], file=sys.stderr, flush=True)
    return rows


def _listens(pid: int, port: int) -> bool:
    """Whether ``pid`` is the server started for ``port`` (its command line names it)."""
    try:
        return f"--port\0{port}\0" in Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return False


def parsing(pieces: int = 4000) -> list[str]:
    from app import formats
    from app.core.decode import ReplyStream
    from app.formats.spec import ReplySpec

    word = "line of code; "
    calls = {  # one call in each format's markup, its argument left open to grow
        "hermes": '<tool_call>\n{"name": "write_file", "arguments": {"content": "',
        "llama3": '{"name": "write_file", "parameters": {"content": "',
        "mistral": '[TOOL_CALLS][{"name": "write_file", "arguments": {"content": "',
        "qwen3_coder": "<tool_call>\n<function=write_file>\n<parameter=content>\n",
        "generic": '{"tool_calls": [{"name": "write_file", "arguments": {"content": "',
    }
    strings = {"write_file": frozenset({"content"})}  # qwen3_coder streams a string value as is
    cases = [(name, ReplySpec(format=formats.get(name), names=frozenset({"write_file"}),
                              string_params=strings), head)
             for name, head in calls.items() if name in formats.FORMATS]
    cases.append(("a thought", ReplySpec(think=True), "<think>"))
    rows = ["| reply | first 100 pieces, us / piece | last 100 pieces, us / piece |", "|---|---|---|"]
    for name, spec, head in cases:
        stream = ReplyStream(spec)
        took = []
        for i in range(pieces):
            t = time.perf_counter()
            stream.feed(head if i == 0 else word)
            took.append(time.perf_counter() - t)
        rows.append(f"| {name} | {sum(took[1:101]) * 1e4:.1f} | {sum(took[-100:]) * 1e4:.1f} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / "bench/gpu/work/models/nearfree.gguf"))
    ap.add_argument("--levels", default="1,8")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    print("\n".join(streams(args.model, levels, args.threads)))
    print()
    print("\n".join(parsing()))


if __name__ == "__main__":
    main()
