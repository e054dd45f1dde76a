"""A cold start at 8B scale, phase by phase (issue 52): the server started on Llama 3.1 8B's
shape (4.66 GB of Q4_K, bench/gpu/models.py) from ``gs://`` through the storage emulator, with
an empty download cache, then again with the cache filled (a restart on the same disk); each
time /health's ``cold_start`` once ready (starting, downloading, loading, warming_up, total)
and the wall time from the process's start to its first 200.

    python bench/cold_start.py [--big PATH] [--ctx 1024]

Not a test: the figures depend on the machine (its disk, and whether the page cache holds the
file: named in the output). Talks to loopback only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import requests
from common import serve
from models import BIG, Storage, big_model

ROOT = Path(__file__).resolve().parent.parent


def start(env: dict[str, str]) -> dict:
    t0 = time.perf_counter()
    with serve(ROOT, env) as base:
        wall = time.perf_counter() - t0
        health = requests.get(f"{base}/health", timeout=30).json()
    return {"to_first_200_s": round(wall, 2), "cold_start": health.get("cold_start")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--big", type=Path, default=BIG)
    ap.add_argument("--ctx", type=int, default=1024)
    args = ap.parse_args()
    big = big_model(args.big)
    storage = Storage()
    cache = Path(tempfile.mkdtemp(prefix="bench-cold-"))
    try:
        uri = storage.upload_file("llama-8b/model.gguf", big)
        env = {"MODEL": uri, "MODEL_CACHE_DIR": str(cache), "CTX_SIZE": str(args.ctx),
               "PARALLEL": "1", "STORAGE_EMULATOR_HOST": storage.url}
        out = {"model_gb": round(big.stat().st_size / 1e9, 2),
               "empty_cache": start(env),  # downloaded, then loaded from the page cache
               "filled_cache": start(env)}  # a restart: the file cached on disk
        print(json.dumps(out, indent=2))
    finally:
        storage.stop()
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
