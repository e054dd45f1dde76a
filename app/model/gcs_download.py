"""Models from Google Cloud Storage, downloaded fast, verified and cached.

What the objects are (which GGUF a ``gs://`` URI names, its shards, the client) is
:mod:`app.model.gcs`; this module fetches them:

- Large objects download as concurrent ranged slices written in place (``os.pwrite``), each
  slice retried with backoff on transient errors; small ones in one stream. Each stream is
  read 1 MiB at a time (app.base.gcs_client.raise_read_size), not the client's 8 KiB.
- Every object is checked against its crc32c before it is renamed into the cache, made as its
  bytes arrive (each slice's, joined: app.model.crc32c), so the finished file is not read
  again; a mismatch deletes the partial file and fails loudly. A cache hit is hashed again only
  when its file no longer stats as it did when verified (gcs_cache.unchanged).
- Cache entries are keyed by bucket, object and generation (a sidecar ``.meta.json``): a restart
  with the same object downloads nothing, a new generation downloads again. One caller at a
  time downloads an object (the others wait, then find it cached), and MODEL_CACHE_MAX_GB
  bounds the cache: :mod:`app.model.gcs_cache`.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import glob
import hashlib
import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engine import file_holds
from app.model.crc32c import Joiner
from app.model.gcs import GcsError, GcsObject, describe, is_permanent, list_models, make_client
from app.model.gcs_cache import (
    cache_path,
    is_cached,
    meta_path,
    room,
    single_flight,
    stamp,
    touch,
    unchanged,
    write_meta,
)
from app.settings import Settings, setting_default

log = logging.getLogger(__name__)

RETRIES = 6
SPACE_MARGIN = 64 * 1024 * 1024
@dataclass(frozen=True)
class DownloadOptions:
    """How to download a model; the defaults are the settings' (DOWNLOAD_WORKERS, ...)."""

    cache_dir: Path
    workers: int = setting_default("download_workers")
    slice_bytes: int = setting_default("download_slice_mb") << 20
    model_file: str | None = setting_default("model_file")
    emulator_host: str | None = setting_default("storage_emulator_host")
    cache_max_bytes: int | None = None  # MODEL_CACHE_MAX_GB; None: no bound
    progress_interval: float = 3.0

    @classmethod
    def from_settings(cls, settings: Settings) -> DownloadOptions:
        """The options the settings give. The fields keep their short names (tests and
        bench/gcs_download.py build them directly), so this is the one place they are mapped."""
        return cls(
            cache_dir=settings.model_cache_dir,
            workers=settings.download_workers,
            slice_bytes=settings.download_slice_mb << 20,
            model_file=settings.model_file,
            emulator_host=settings.storage_emulator_host,
            cache_max_bytes=int(settings.model_cache_max_gb * 1e9)
            if settings.model_cache_max_gb else None,
        )


# ---- cache (app.model.gcs_cache) ------------------------------------------------------------


def _cached_and_intact(cache_dir: Path, obj: GcsObject) -> bool:
    """A cache hit whose file still matches its checksum: a file changed or truncated behind
    the cache's back must not reach llama.cpp's loader. One that stats as it did when its bytes
    were verified is trusted unread (gcs_cache.unchanged: 0.7 s of hashing from the page cache
    at 4.7 GB, the whole disk read from a cold one); any other is hashed again, and recorded
    anew when it passes."""
    if not is_cached(cache_dir, obj):
        return False
    path = cache_path(cache_dir, obj)
    if unchanged(path):
        return True
    try:
        verify(obj, path)
    except GcsError as exc:
        log.warning("%s; downloading it again", exc)
        path.unlink(missing_ok=True)
        meta_path(path).unlink(missing_ok=True)
        return False
    _record(path, obj)
    return True


def _record(path: Path, obj: GcsObject) -> None:
    """The sidecar of a file just verified, with its stat when the stamp takes (a filesystem
    that refuses it: no record, every hit hashes the file)."""
    try:
        stamped: int | None = stamp(path)
    except OSError as exc:
        log.debug("%s: mtime not stamped (%s): its cache hits re-hash it", path, exc.strerror)
        stamped = None
    write_meta(path, obj, stamped)


# ---- download ------------------------------------------------------------------------------


class _ShortRead(Exception):
    """A slice's stream ended before its last byte (a cut connection): resumed, not failed."""


def _transient(exc: BaseException) -> bool:
    """An error worth retrying a slice for (throttling, a server error, a broken connection)."""
    from google.api_core import exceptions as gexc

    if isinstance(exc, gexc.TooManyRequests | gexc.ServerError):
        return not isinstance(exc, gexc.MethodNotImplemented)
    import http.client

    import requests
    import urllib3

    return isinstance(
        exc,
        requests.exceptions.RequestException
        | urllib3.exceptions.HTTPError
        | http.client.HTTPException
        | ConnectionError
        | TimeoutError
        | _ShortRead,
    )


class Progress:
    """Bytes done across all workers, and the figures the logs and health report."""

    def __init__(self, total: int, on_update: Callable[[Progress], None] | None = None):
        self.total = total
        self.done = 0
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._on_update = on_update
        # what the fetch waits for instead of downloading (another download of its object)
        self.waiting: str | None = None

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n

    @property
    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        rate = self.rate
        return (self.total - self.done) / rate if rate > 0 else None

    def line(self) -> str:
        eta = self.eta
        return (
            f"{self.done / 1e6:.1f}/{self.total / 1e6:.1f} MB, {self.rate / 1e6:.1f} MB/s, "
            f"ETA {eta:.0f} s" if eta is not None else
            f"{self.done / 1e6:.1f}/{self.total / 1e6:.1f} MB"
        )


class _OffsetWriter:
    """A file-like object writing at a fixed offset of a shared file descriptor, its bytes
    added to the slice's CRC-32C as they pass (a retry's writer goes on with the same one)."""

    def __init__(self, fd: int, offset: int, progress: Progress, crc: Any = None):
        self.fd = fd
        self.offset = offset
        self.written = 0
        self.progress = progress
        self.crc = crc

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            n = os.pwrite(self.fd, view, self.offset + self.written)
            if self.crc is not None:  # (a short write, rare, is the one copy)
                self.crc.update(data if n == len(data) else bytes(view[:n]))
            self.written += n
            self.progress.add(n)
            view = view[n:]
        return len(data)

    def flush(self) -> None:
        pass


def _download_range(
    blob, fd: int, start: int, end: int, progress: Progress, uri: str, abort: threading.Event,
    crc: Any = None,
) -> None:
    """Bytes [start, end] of the object into the file, retried; resumes where it broke off.
    ``crc``: the slice's CRC-32C (google_crc32c.Checksum), fed every byte in order."""
    pos = start
    for attempt in range(RETRIES):
        if pos > end or abort.is_set():
            return
        writer = _OffsetWriter(fd, pos, progress, crc)
        try:
            blob.download_to_file(
                writer, start=pos, end=end, raw_download=True, checksum=None, retry=None
            )
            if pos + writer.written != end + 1:
                raise _ShortRead(f"got {writer.written} of {end + 1 - pos} bytes")
            return
        except Exception as exc:  # noqa: BLE001 - classified below
            pos += writer.written
            if is_permanent(exc) or not _transient(exc) or attempt == RETRIES - 1:
                raise
            delay = min(0.2 * 2**attempt, 5.0)
            log.warning(
                "download of %s bytes %d-%d failed (%s); retrying in %.1f s",
                uri, pos, end, type(exc).__name__, delay,
            )
            time.sleep(delay)


def crc32c_of(path: Path) -> str:
    import google_crc32c

    crc = google_crc32c.Checksum()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(8 << 20), b""):
            crc.update(block)
    return base64.b64encode(crc.digest()).decode()


PART_STALE_SECONDS = 24 * 3600  # a partial download untouched this long was abandoned


def _remove_stale_parts(dest: Path) -> None:
    """Delete partial downloads of ``dest`` left by dead processes, never a live one's: a part
    is ``.NAME.part-HOST-PID``; this host's with a dead pid, or anyone's untouched for a day,
    is stale (a cache volume may be shared by several containers)."""
    host = socket.gethostname()
    for part in dest.parent.glob(f".{glob.escape(dest.name)}.part-*"):
        owner = part.name.rsplit(".part-", 1)[1]
        who, _, pid = owner.rpartition("-")
        try:
            old = time.time() - part.stat().st_mtime > PART_STALE_SECONDS
        except OSError:
            continue
        if old or (who == host and pid.isdigit() and not _alive(int(pid))):
            part.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def md5_of(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(8 << 20), b""):
            h.update(block)
    return base64.b64encode(h.digest()).decode()


def verify(obj: GcsObject, path: Path, streamed: int | None = None) -> None:
    """The file against the object's crc32c (``streamed``: the one its bytes made as they
    arrived, else read from the file), else its md5; with neither (emulators, some proxies;
    real Cloud Storage always has a crc32c), loaded with a warning in the log."""
    if obj.crc32c:
        actual = (crc32c_of(path) if streamed is None else
                  base64.b64encode(streamed.to_bytes(4, "big")).decode())
        kind, expected = "crc32c", obj.crc32c
    elif obj.md5:
        kind, expected, actual = "md5", obj.md5, md5_of(path)
    else:
        log.warning("model %s: the object has no crc32c or md5: the download is not verified", obj.uri)
        return
    if actual != expected:
        raise GcsError(
            f"model {obj.uri}: {kind} mismatch (expected {expected}, got {actual}): "
            "the file is corrupt and was deleted"
        )


def _checksum() -> Any:
    import google_crc32c

    return google_crc32c.Checksum()


def _joined(crcs: dict[int, Any], size: int) -> int:
    """The object's CRC-32C from its slices' (keyed by their first byte), in order."""
    joiner = Joiner()
    starts = sorted(crcs)
    for start, end in zip(starts, [*starts[1:], size], strict=True):
        joiner.add(int.from_bytes(crcs[start].digest(), "big"), end - start)
    return joiner.crc


def download_object(client, obj: GcsObject, dest: Path, opts: DownloadOptions, progress: Progress) -> None:
    """Fetch one object to ``dest`` (via a temporary name), verified against its checksum. With
    MODEL_CACHE_MAX_GB, room is made first and the temporary file reserves it at full size."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_parts(dest)
    tmp = dest.with_name(f".{dest.name}.part-{socket.gethostname()}-{os.getpid()}")
    blob = client.bucket(obj.bucket).blob(obj.name, generation=obj.generation)
    done_before = progress.done
    try:
        with room(opts.cache_dir, obj.size, opts.cache_max_bytes, obj.uri, dest):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        # each slice's CRC-32C made as its bytes arrive, joined in order at the end: the
        # download is verified without reading the finished file again
        crcs: dict[int, Any] = {}
        try:
            os.ftruncate(fd, obj.size)
            if obj.size >= 2 * opts.slice_bytes and opts.workers > 1:
                ranges = [
                    (s, min(s + opts.slice_bytes, obj.size) - 1)
                    for s in range(0, obj.size, opts.slice_bytes)
                ]
                crcs = {s: _checksum() for s, _ in ranges}
                abort = threading.Event()
                pool = cf.ThreadPoolExecutor(max_workers=opts.workers)
                try:
                    futures = [
                        pool.submit(_download_range, blob, fd, s, e, progress, obj.uri, abort,
                                    crcs[s])
                        for s, e in ranges
                    ]
                    for fut in cf.as_completed(futures):
                        fut.result()
                except BaseException:
                    abort.set()  # the first failure stops the other slices, not after all of them
                    raise
                finally:
                    pool.shutdown(wait=True, cancel_futures=True)
            elif obj.size:
                crcs = {0: _checksum()}
                _download_range(blob, fd, 0, obj.size - 1, progress, obj.uri, threading.Event(),
                                crcs[0])
        finally:
            os.close(fd)
        verify(obj, tmp, _joined(crcs, obj.size))
        os.replace(tmp, dest)
        _record(dest, obj)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        progress.add(-(progress.done - done_before))
        if isinstance(exc, GcsError):
            raise
        if isinstance(exc, Exception):
            raise GcsError(describe(obj.uri, exc)) from exc
        raise


def fetch_model(
    uri: str, opts: DownloadOptions, on_progress: Callable[[Progress], None] | None = None
) -> Path:
    """Resolve ``uri`` to its object(s), download what the cache lacks; the first shard's path.

    Each object is checked and downloaded under its single-flight lock (gcs_cache): a caller
    that finds another download of it under way waits (``Progress.waiting`` says so) and then
    finds it cached. Each object ready is held (app.engine.file_holds) until the fetch returns,
    and by the engine resolving it, if any, until it stops: eviction never deletes it."""
    client = make_client(opts.emulator_host)
    objects = list_models(client, uri, opts.model_file)
    paths = [cache_path(opts.cache_dir, o) for o in objects]
    counted = [o for o in objects if not is_cached(opts.cache_dir, o)]
    need = sum(o.size for o in counted)
    root = Path(opts.cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    if need and need + SPACE_MARGIN > free:
        raise GcsError(
            f"model {uri}: needs {need / 1e6:.1f} MB in {root} but only {free / 1e6:.1f} MB are "
            "free (on Cloud Run the filesystem is memory: raise the instance memory or mount a "
            "volume as MODEL_CACHE_DIR)"
        )
    progress = Progress(need)
    stop = threading.Event()

    def watch() -> None:
        """Progress to the caller 4 times a second, and to the log every few seconds."""
        last_log = time.monotonic()
        while not stop.wait(0.25):
            if on_progress:
                on_progress(progress)
            if progress.total and time.monotonic() - last_log >= opts.progress_interval:
                last_log = time.monotonic()
                log.info("model %s: %s", uri, progress.line())

    def waiting(obj: GcsObject, now: bool) -> None:
        """Said at each look while another download of ``obj`` holds its lock: told to the
        caller from here (a gevent worker's watcher, a greenlet of this native thread, cannot
        run while this thread sleeps on the lock)."""
        first = now and progress.waiting is None
        progress.waiting = f"waiting for another download of {obj.uri}" if now else None
        if first:
            log.info("model %s: %s (another model, thread or process is downloading it)",
                     uri, progress.waiting)
        if on_progress:
            on_progress(progress)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    mine = file_holds.FileHolds()  # this fetch's objects, until it returns
    fetched = 0
    try:
        for obj, path in zip(objects, paths, strict=True):
            with single_flight(path, on_wait=lambda now, obj=obj: waiting(obj, now)):
                if _cached_and_intact(opts.cache_dir, obj):
                    touch(path)
                    if obj in counted:
                        progress.add(obj.size)  # another caller downloaded it meanwhile
                else:
                    if obj not in counted:
                        progress.total += obj.size  # gone since the first look
                    if not fetched:
                        log.info("model %s: downloading %s, %d workers, %d MB slices", uri,
                                 f"{len(counted) or 1} object(s), {progress.total / 1e6:.1f} MB",
                                 opts.workers, opts.slice_bytes >> 20)
                    download_object(client, obj, path, opts, progress)
                    fetched += obj.size
                mine.hold(str(path))
                file_holds.keep(str(path))
    finally:
        mine.release()
        stop.set()
        watcher.join()
    if on_progress:
        on_progress(progress)
    if not fetched:
        log.info("model %s: cache hit (%s)", uri, paths[0])
        return paths[0]
    elapsed = time.monotonic() - progress.started
    log.info(
        "model %s: downloaded and verified %.1f MB in %.1f s (%.1f MB/s)",
        uri, fetched / 1e6, elapsed, fetched / 1e6 / max(elapsed, 1e-9),
    )
    return paths[0]
