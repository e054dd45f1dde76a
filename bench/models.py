"""Several models in one server (issue 50): what one model's arrival costs another's streams,
and how long a switch between models takes against llama-server's router.

``gap``: model A (the default model) streams greedy, back to back, first alone, then while
model B (Llama 3.1 8B's shape, 4.6 GB, random weights: bench/gpu/models.py) downloads from
the storage emulator and loads (``POST /models/load``, which answers once B is loaded and
warm). The figure is A's longest gap between two tokens during B's arrival against its longest
gap alone, and their medians. The emulator stands in for Cloud Storage, a service on other
machines: it runs at the lowest CPU priority (``nice 19``), so its own work is not counted as
the server's (on the 2-core machine it would otherwise take a core from A).

    python bench/models.py gap [--big PATH] [--alone-streams 4] [--tokens 256]

``switch``: two servers over one folder of models, ``MODELS_MAX=1`` here and
``--models-max 1`` for llama-server's router (``--models-dir``): requests alternate between
the two models, so each one unloads the other model and loads its own. The figure is the time
from a request naming the unloaded model to its one-token answer, each server measured
in turn, round by round.

    python bench/models.py switch [--models A.gguf B.gguf] [--rounds 5]

Not a test: the figures depend on the machine. Talks to loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests
from common import LLAMA_SERVER, process, serve

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.gcs_emulator import Emulator  # noqa: E402

DEFAULT_MODEL = Path("/tmp/vertex-gguf/default/SmolLM2-135M-Instruct.Q4_1.gguf")
BIG = Path("/tmp/vertex-gguf/bench/llama-8b-shape.gguf")
VOCAB = ROOT / "bench/gpu/kit/vocab/llama3.gguf"
BUCKET = "bench-models"


# ---- the 8B-shaped file and the storage emulator ------------------------------------------------
def big_model(path: Path) -> Path:
    """The 8B-shaped GGUF, made once (bench/gpu/models.py writes its blocks directly)."""
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"making {path} (Llama 3.1 8B's shape, random weights)", flush=True)
        subprocess.run([sys.executable, str(ROOT / "bench/gpu/models.py"), "build", "8b",
                        str(VOCAB), str(path)], check=True)
    return path


class Storage(Emulator):
    """gcp-storage-emulator in memory on a loopback port, at the lowest CPU priority, with
    one bucket."""

    def __init__(self) -> None:
        super().__init__(nice=19)
        self.client.create_bucket(BUCKET)

    def upload_file(self, name: str, path: Path) -> str:
        """One media upload (the client's would send 100 MB chunks the emulator joins by
        copying); its gs:// URI."""
        with open(path, "rb") as fh:
            r = requests.post(f"{self.url}/upload/storage/v1/b/{BUCKET}/o",
                              params={"uploadType": "media", "name": name}, data=fh,
                              headers={"Content-Length": str(path.stat().st_size),
                                       "Content-Type": "application/octet-stream"},
                              timeout=900)
        r.raise_for_status()
        return f"gs://{BUCKET}/{name}"


# ---- gap ------------------------------------------------------------------------------------------
def stream_gaps(base: str, model: str, tokens: int) -> list[tuple[float, float]]:
    """One greedy stream of ``tokens`` tokens; each gap between two arrivals as (start, end)."""
    body = {"model": model, "prompt": "Count to a thousand:", "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    arrivals: list[float] = []
    with requests.post(f"{base}/v1/completions", json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines(chunk_size=None):
            if line.startswith(b"data: {"):
                arrivals.append(time.perf_counter())
    return list(zip(arrivals, arrivals[1:], strict=False))


def summary(gaps: list[tuple[float, float]]) -> dict[str, float]:
    ms = sorted((b - a) * 1000 for a, b in gaps)
    return {"gaps": len(ms), "median_ms": statistics.median(ms),
            "p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))], "max_ms": ms[-1]}


def gap(args: argparse.Namespace) -> None:
    big = big_model(args.big)
    storage = Storage()
    cache = Path(tempfile.mkdtemp(prefix="bench-models-cache-"))
    try:
        t0 = time.monotonic()
        uri = storage.upload_file("llama-8b/model.gguf", big)
        print(f"uploaded {big.stat().st_size / 1e9:.2f} GB to the emulator in "
              f"{time.monotonic() - t0:.0f} s", flush=True)
        preset = cache / "models.ini"
        a_threads = f"threads = {args.a_threads}\n" if args.a_threads else ""
        preset.write_text(f"version = 1\n\n[big]\nctx-size = {args.big_ctx}\nparallel = 1\n\n"
                          f"[a]\nparallel = 1\n{a_threads}")
        env = {"MODELS": f"a={args.model},big={uri}", "MODELS_PRELOAD": "a",
               "MODELS_PRESET": str(preset), "MODEL_CACHE_DIR": str(cache / "cache"),
               "STORAGE_EMULATOR_HOST": storage.url, "STREAM_HEARTBEAT_SECONDS": "0",
               "KEEP_ALIVE": "-1", **dict(kv.split("=", 1) for kv in args.env)}
        with serve(ROOT, env) as base:
            stream_gaps(base, "a", 32)  # the first stream's one-time costs, not counted
            alone: list[tuple[float, float]] = []
            for _ in range(args.alone_streams):
                alone += stream_gaps(base, "a", args.tokens)
            loaded: dict[str, float] = {}
            stages: list[tuple[float, str]] = []

            def load() -> None:
                loaded["start"] = time.perf_counter()
                r = requests.post(f"{base}/models/load", json={"model": "big"}, timeout=1800)
                loaded["end"] = time.perf_counter()
                loaded["status"] = r.status_code
                if r.status_code != 200:
                    print(f"load answered {r.status_code}: {r.text[:500]}", flush=True)

            def watch() -> None:
                """B's stage, once a second (the phases: downloading, loading)."""
                last = None
                for _ in range(3600):
                    if "end" in loaded:
                        return
                    cards = requests.get(f"{base}/v1/models", timeout=30).json()["data"]
                    status = next(c["status"] for c in cards if c["id"] == "big")
                    stage = status.get("stage") or status["value"]
                    if stage != last:
                        stages.append((time.perf_counter(), stage))
                        last = stage
                    time.sleep(1)

            loader = threading.Thread(target=load, daemon=True)
            watcher = threading.Thread(target=watch, daemon=True)
            during: list[tuple[float, float]] = []
            loader.start()
            watcher.start()
            for _ in range(10_000):  # A streams back to back until B is loaded
                during += stream_gaps(base, "a", args.tokens)
                if not loader.is_alive():
                    break
            loader.join(1800)
            watcher.join(30)
            window = [g for g in during if g[1] >= loaded["start"] and g[0] <= loaded["end"]]
            after_b = stream_gaps(base, "big", 4)  # B answers
        result = {
            "alone": summary(alone), "during_b_arrival": summary(window),
            "b_load_seconds": loaded["end"] - loaded["start"], "b_load_status": loaded["status"],
            "b_stages": [(round(t - loaded["start"], 1), s) for t, s in stages],
            "b_answered_tokens": len(after_b) + 1,
        }
        # each phase of B's arrival (its stages as /v1/models said them, a second apart)
        bounds = [t for t, _ in stages] + [loaded["end"]]
        result["by_stage"] = {
            f"{name} ({bounds[i + 1] - t:.0f} s)": summary(part) for i, (t, name) in
            enumerate(stages)
            if (part := [g for g in window if g[1] >= t and g[0] <= bounds[i + 1]])}
        result["longest_gaps"] = [(round(a - loaded["start"], 2), round((b - a) * 1000))
                                  for a, b in sorted(window, key=lambda g: g[0] - g[1])[:8]]
        result["max_gap_ratio"] = (result["during_b_arrival"]["max_ms"]
                                   / result["alone"]["max_ms"])
        result["median_gap_ratio"] = (result["during_b_arrival"]["median_ms"]
                                      / result["alone"]["median_ms"])
        print(json.dumps(result, indent=2))
    finally:
        storage.stop()
        shutil.rmtree(cache, ignore_errors=True)


# ---- switch ---------------------------------------------------------------------------------------
def one_token(base: str, model: str) -> float:
    """Seconds from sending a one-token chat naming ``model`` to its answer."""
    t0 = time.perf_counter()
    r = requests.post(f"{base}/v1/chat/completions", timeout=900, json={
        "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
        "temperature": 0})
    took = time.perf_counter() - t0
    if r.status_code != 200:
        raise RuntimeError(f"{model}: {r.status_code} {r.text[:300]}")
    return took


def switch_times(base: str, names: list[str], rounds: int) -> dict[str, list[float]]:
    """Each round, each model in turn: the request that loads it (the other unloaded), then
    one more to the loaded model (the request's own cost, for reference)."""
    out: dict[str, list[float]] = {"switch": [], "loaded": []}
    one_token(base, names[-1])  # the last model loaded: the first round starts with a switch
    for _ in range(rounds):
        for name in names:
            took = one_token(base, name)
            out["switch"].append(took)
            out.setdefault(f"switch to {name}", []).append(took)
            out["loaded"].append(one_token(base, name))
    return out


def router_names(base: str) -> list[str]:
    """The models' names as the server lists them (file names without .gguf on both)."""
    return sorted(m["id"] for m in requests.get(f"{base}/models", timeout=30).json()["data"])


def switch(args: argparse.Namespace) -> None:
    folder = Path(tempfile.mkdtemp(prefix="bench-models-dir-"))
    try:
        for path in args.models:
            (folder / Path(path).name).symlink_to(Path(path).resolve())
        threads = str(os.cpu_count() or 2)
        ours = {"MODELS_DIR": str(folder), "MODELS_MAX": "1", "MODELS_PRELOAD": "none",
                "KEEP_ALIVE": "-1", "CTX_SIZE": str(args.ctx), "PARALLEL": "1"}
        peer = [str(LLAMA_SERVER), "--host", "127.0.0.1", "--port", "{port}", "--models-dir",
                str(folder), "--models-max", "1", "-c", str(args.ctx), "-np", "1", "-t", threads,
                "--no-webui"]
        rows: dict[str, dict[str, list[float]]] = {"vertex-gguf": {}, "llama-server": {}}
        for _ in range(args.repeats):  # each server in turn, a fresh start each time
            with serve(ROOT, ours) as base:
                names = router_names(base)
                for k, v in switch_times(base, names, args.rounds).items():
                    rows["vertex-gguf"].setdefault(k, []).extend(v)
            with process(peer, None, "/health", "llama-server", 120) as base:
                names = router_names(base)
                for k, v in switch_times(base, names, args.rounds).items():
                    rows["llama-server"].setdefault(k, []).extend(v)
        result: dict[str, object] = {"models": [Path(p).name for p in args.models]}
        for server, row in rows.items():
            result[server] = {k: {"median_s": round(statistics.median(v), 3),
                                  "min_s": round(min(v), 3), "max_s": round(max(v), 3),
                                  "n": len(v)} for k, v in row.items()}
        result["switch_ratio_llama_server_over_ours"] = round(
            statistics.median(rows["llama-server"]["switch"])
            / statistics.median(rows["vertex-gguf"]["switch"]), 3)
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    g = sub.add_parser("gap", help="A's stream gaps while B downloads and loads")
    g.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="model A")
    g.add_argument("--big", type=Path, default=BIG, help="model B (made when missing)")
    g.add_argument("--big-ctx", type=int, default=1024)
    g.add_argument("--alone-streams", type=int, default=4)
    g.add_argument("--tokens", type=int, default=256)
    g.add_argument("--a-threads", type=int, default=0,
                   help="model A's compute threads (0: every core); fewer leave cores free, "
                   "as a GPU machine's do while its models decode on the GPU")
    g.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="a setting of the server's (LOAD_PRIORITY=normal, ...)")
    s = sub.add_parser("switch", help="time to switch models, against llama-server's router")
    s.add_argument("--models", type=Path, nargs=2,
                   default=[DEFAULT_MODEL, ROOT / "bench/gpu/work/models/small.gguf"])
    s.add_argument("--ctx", type=int, default=2048)
    s.add_argument("--rounds", type=int, default=5)
    s.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    gap(args) if args.what == "gap" else switch(args)


if __name__ == "__main__":
    main()
