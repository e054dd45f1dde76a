"""A cold start at 8B scale, phase by phase (issue 52): the server started on Llama 3.1 8B's
shape (4.66 GB of Q4_K, bench/gpu/models.py) from ``gs://`` through the storage emulator, with
an empty download cache, then again with the cache filled (a restart on the same disk); each
time /health's ``cold_start`` once ready (starting, downloading, loading, warming_up, total)
and the wall time from the process's start to its first 200.

- ``single``: the model as one object: empty cache, then restarts with ``WARM_UP=full`` and
  ``WARM_UP=light``, each followed by two chat requests one after the other (new prompts, time
  to first token): what the light warm-up saves at start and costs the first request.
- ``client``: the same object fetched by the google-cloud-storage client's plain single
  stream (``Blob.download_to_filename``, its own crc32c check) to a file on the same disk, in
  the same run: its time against the server's ``downloading`` phase.
- ``reads``: the download alone in this process (``fetch_model``, native threads), the client
  reading each slice's stream 8 KiB at a time (its own size) and then 1 MiB (the server's).
- ``split``: the same model in shards (gguf-split's ``-0000N-of-0000M.gguf``, written by
  tests/support/gguf_split.py once), ``MODEL`` naming the first: empty cache, then a restart.

    python bench/cold_start.py [--big PATH] [--ctx 1024] [--shards 3] [--cases single,client,reads,split]

Each download starts after ``sync`` (no earlier download's writeback pending); the output names
how much of each cached file the page cache held before each restart (``mincore``). Not a test:
the figures depend on the machine. Talks to loopback only.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import mmap
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import requests
from common import serve
from first_burst import ttft
from models import BIG, Storage, big_model

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.model import gcs_download  # noqa: E402
from tests.support.gguf_split import split_gguf  # noqa: E402


def resident(paths: list[Path]) -> float | None:
    """The share of the files' pages in the page cache (mincore over a read-only map)."""
    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    held = total = 0
    for path in paths:
        size = path.stat().st_size
        if not size:
            continue
        # a private map (copy on write, never written): ctypes takes a writable buffer
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY) as m:
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            first = ctypes.c_char.from_buffer(m)  # the map's first byte; released below
            try:
                if libc.mincore(ctypes.c_void_p(ctypes.addressof(first)),
                                ctypes.c_size_t(size), vec) != 0:
                    return None
            finally:
                del first
            held += sum(b & 1 for b in bytes(vec))
            total += pages
    return round(held / total, 3) if total else None


def start(env: dict[str, str], requests_after: int = 0) -> dict:
    """One server start: wall time to the first 200, /health's phases, and the time to first
    token of ``requests_after`` chats sent one by one once ready (new prompts each)."""
    t0 = time.perf_counter()
    with serve(ROOT, env) as base:
        wall = time.perf_counter() - t0
        health = requests.get(f"{base}/health", timeout=30).json()
        # first_burst's chat: 8 tokens asked, timed to the first piece of content
        chats = [round(ttft(base, i, 0, cache=True), 2) for i in range(requests_after)]
    out = {"to_first_200_s": round(wall, 2), "cold_start": health.get("cold_start")}
    if chats:
        out["ttft_s"] = chats
    print(json.dumps(out), flush=True)
    return out


def cached(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "gcs").rglob("*.gguf") if p.is_file())


def client_download(storage: Storage, name: str, dest: Path) -> dict:
    """The object through google-cloud-storage's single stream (its crc32c checked as it
    arrives, as ours is): metadata read and download, timed together."""
    os.sync()
    t0 = time.perf_counter()
    blob = storage.client.bucket("bench-models").get_blob(name)
    blob.download_to_filename(str(dest), checksum="crc32c")
    seconds = time.perf_counter() - t0
    size = dest.stat().st_size
    dest.unlink()
    out = {"seconds": round(seconds, 2), "mb_per_s": round(size / 1e6 / seconds, 1)}
    print(json.dumps({"client": out}), flush=True)
    return out


def read_size(uri: str, emulator: str, size: int, cache: Path) -> float:
    """``fetch_model`` in this process, the client's stream read ``size`` bytes at a time (the
    server's raise_read_size left out); seconds."""
    import importlib

    from app.base import gcs_client

    for name in gcs_client._READ_SIZE_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)._SINGLE_GET_CHUNK_SIZE = size
    folder = cache / f"reads-{size}"
    os.sync()
    t0 = time.perf_counter()
    with mock.patch.object(gcs_client, "_read_size_raised", True):  # as set here
        gcs_download.fetch_model(uri, gcs_download.DownloadOptions(cache_dir=folder,
                                                                  emulator_host=emulator))
    seconds = round(time.perf_counter() - t0, 2)
    shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps({"read_bytes": size, "seconds": seconds}), flush=True)
    return seconds


def single(big: Path, env: dict[str, str], cache: Path, cases: set[str]) -> dict:
    storage = Storage()
    try:
        t0 = time.monotonic()
        uri = storage.upload_file("llama-8b/model.gguf", big)
        print(f"uploaded {big.stat().st_size / 1e9:.2f} GB in {time.monotonic() - t0:.0f} s",
              flush=True)
        env = {**env, "MODEL": uri, "STORAGE_EMULATOR_HOST": storage.url}
        out: dict = {}
        if "single" in cases:
            os.sync()
            out["empty_cache"] = start(env)
            for warm in ("full", "light"):
                out[f"resident_before_{warm}"] = resident(cached(cache))
                out[f"restart_{warm}"] = start({**env, "WARM_UP": warm}, requests_after=2)
        if "client" in cases:
            out["client"] = client_download(storage, "llama-8b/model.gguf",
                                            cache / "client-download.gguf")
        if "reads" in cases:
            out["reads"] = {f"{size >> 10}_kib_s": read_size(uri, storage.url, size, cache)
                            for size in (8 << 10, gcs_download.READ_BYTES)}
        return out
    finally:
        storage.stop()


def split(big: Path, shards: int, env: dict[str, str], cache: Path) -> dict:
    folder = big.with_name(f"{big.stem}-split{shards}")
    parts = sorted(folder.glob("*-of-*.gguf"))
    if len(parts) != shards:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        print(f"splitting {big} into {shards} shards in {folder}", flush=True)
        parts = split_gguf(big, folder, shards)
    storage = Storage()
    try:
        for part in parts:
            storage.upload_file(f"llama-8b-split/{part.name}", part)
        env = {**env, "MODEL": f"gs://bench-models/llama-8b-split/{parts[0].name}",
               "STORAGE_EMULATOR_HOST": storage.url}
        os.sync()
        out = {"shard_gb": [round(p.stat().st_size / 1e9, 2) for p in parts],
               "empty_cache": start(env)}
        out["resident_before_restart"] = resident(cached(cache))
        out["restart"] = start(env)
        return out
    finally:
        storage.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--big", type=Path, default=BIG)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--cases", default="single,client,reads,split")
    args = ap.parse_args()
    cases = set(args.cases.split(","))
    big = big_model(args.big)
    out: dict = {"model_gb": round(big.stat().st_size / 1e9, 2)}
    env = {"CTX_SIZE": str(args.ctx), "PARALLEL": "1"}
    wanted = {"single": bool(cases & {"single", "client", "reads"}), "split": "split" in cases}
    for case in ("single", "split"):
        if not wanted[case]:
            continue
        cache = Path(tempfile.mkdtemp(prefix=f"bench-cold-{case}-", dir=big.parent))
        try:
            env["MODEL_CACHE_DIR"] = str(cache)
            out[case] = (single(big, env, cache, cases) if case == "single"
                         else split(big, args.shards, env, cache))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    single_out = out.get("single", {})
    ours = (single_out.get("empty_cache") or {}).get("cold_start", {}).get("downloading")
    theirs = single_out.get("client", {}).get("seconds")
    if ours and theirs:
        out["download_ours_over_client"] = round(ours / theirs, 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
