"""Cloud Storage download speed and time-to-ready, against gcp-storage-emulator.

1. Throughput: the same object fetched by our sliced parallel path
   (``app.model.gcs_download``) and by the Python client's single-stream
   ``Blob.download_to_filename`` (what the stock images do), in the same run. Between client
   and emulator sits a loopback proxy capping each connection's bandwidth (``--mb-per-conn``):
   on loopback the emulator has no per-connection limit, real GCS does, and that per-stream
   limit is what slicing beats. Without the cap both are bound by the
   emulator alone; the ratio is printed for both.
2. Time-to-ready: process start to the first 200 from the health route, for the default model
   served from ``gs://`` (through the same capped proxy) on a cold cache, then on a warm cache.

    python bench/gcs_download.py [--mb-per-conn 40] [--workers 8] [--slice-mb 8]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.model import gcs_download  # noqa: E402
from app.model.default import default_model_path  # noqa: E402
from app.settings import DEFAULT_CACHE_DIR  # noqa: E402
from tests.support.gcs_emulator import Emulator  # noqa: E402
from tests.support.gcs_proxy import GcsProxy  # noqa: E402
from tests.support.server import free_port  # noqa: E402


def single_stream(client, dest: Path) -> float:
    blob = client.bucket("models").blob("m/model.gguf")
    t0 = time.perf_counter()
    blob.download_to_filename(str(dest), checksum="crc32c")
    return time.perf_counter() - t0


def sliced(proxy_url: str, cache: Path, workers: int, slice_mb: int) -> float:
    opts = gcs_download.DownloadOptions(cache_dir=cache, workers=workers,
                                        slice_bytes=slice_mb << 20, emulator_host=proxy_url)
    t0 = time.perf_counter()
    gcs_download.fetch_model("gs://models/m/model.gguf", opts)
    return time.perf_counter() - t0


def time_to_ready(proxy_url: str, cache: Path, workers: int, slice_mb: int) -> float:
    port = free_port()
    env = {**os.environ, "AIP_MODE": "PREDICTION", "AIP_STORAGE_URI": "gs://models/m/",
           "AIP_HTTP_PORT": str(port), "HOST": "127.0.0.1", "STORAGE_EMULATOR_HOST": proxy_url,
           "MODEL_CACHE_DIR": str(cache), "DOWNLOAD_WORKERS": str(workers),
           "DOWNLOAD_SLICE_MB": str(slice_mb), "LOG_LEVEL": "warning", "THREADS": "2"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "app"], env=env, cwd=ROOT, start_new_session=True)
    try:
        for _ in range(6000):
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    return time.perf_counter() - t0
            except requests.RequestException:
                pass
            time.sleep(0.02)
        raise RuntimeError("server never became ready")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb-per-conn", type=float, default=40.0)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--slice-mb", type=int, default=8)
    args = ap.parse_args()
    model = default_model_path(DEFAULT_CACHE_DIR)
    size_mb = model.stat().st_size / 1e6
    emu = Emulator()
    try:
        emu.upload("models", "m/model.gguf", model)
        rows = []
        for cap in (args.mb_per_conn, 0):
            with GcsProxy(emu.url) as proxy, tempfile.TemporaryDirectory() as tmp:
                proxy.faults.bytes_per_second = int(cap * 1e6)
                from google.auth.credentials import AnonymousCredentials
                from google.cloud import storage

                client = storage.Client(credentials=AnonymousCredentials(), project="b",
                                        client_options={"api_endpoint": proxy.url})
                t_single = single_stream(client, Path(tmp) / "single.gguf")
                t_sliced = sliced(proxy.url, Path(tmp) / "cache", args.workers, args.slice_mb)
                rows.append((cap, t_single, t_sliced))
        with GcsProxy(emu.url) as proxy, tempfile.TemporaryDirectory() as tmp:
            proxy.faults.bytes_per_second = int(args.mb_per_conn * 1e6)
            cold = time_to_ready(proxy.url, Path(tmp), args.workers, args.slice_mb)
            warm = time_to_ready(proxy.url, Path(tmp), args.workers, args.slice_mb)
    finally:
        emu.stop()
    print(f"object {size_mb:.1f} MB, {args.workers} workers, {args.slice_mb} MiB slices")
    print("| per-connection cap | single stream s (MB/s) | sliced s (MB/s) | speed-up |")
    print("|---|---|---|---|")
    for cap, single, sl in rows:
        label = f"{cap:g} MB/s" if cap else "none (loopback)"
        print(f"| {label} | {single:.2f} ({size_mb / single:.0f}) | {sl:.2f} ({size_mb / sl:.0f}) | "
              f"{single / sl:.2f}x |")
    print(f"time to ready (process start -> health 200), gs:// at {args.mb_per_conn:g} MB/s per "
          f"connection: cold cache {cold:.2f} s, warm cache {warm:.2f} s")


if __name__ == "__main__":
    main()
