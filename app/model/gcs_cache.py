"""The download cache of Cloud Storage objects (MODEL_CACHE_DIR/gcs): where an object is cached,
whether a copy is current, one download per object at a time, and the size bound.

- An entry is the object's file and a ``.meta.json`` sidecar (generation, crc32c, size); the
  sidecar's mtime is the entry's last use, touched on every cache hit and written by a download.
- The sidecar also records the file as it stood when its bytes were verified (size, inode and an
  mtime stamped then: ``file``). A hit whose file still stats the same is trusted without
  re-hashing it (a 4.7 GB read from a cold disk); any write since (or a replaced file) shows as
  another mtime or inode, and the file is hashed again (``unchanged``, ``stamp``).
- Single flight: a download, or a cache hit's check, holds an exclusive ``flock`` on
  ``.NAME.lock`` beside the entry. A second caller for the same object (another model naming
  it, another thread, another worker or container on a shared volume) waits for it and then
  finds a cache hit. flock locks belong to an open file: two opens conflict even in one
  process, so one mechanism covers threads and processes, and a dead holder's lock goes with it.
- MODEL_CACHE_MAX_GB (``room``): before a download, the least recently used entries are deleted
  until the object fits. An entry in use is never deleted: an engine holds a shared lock on the
  files it loaded (app.engine.file_holds), and eviction takes ``LOCK_EX | LOCK_NB`` on a file
  before unlinking it, skipping it when that fails; an entry whose ``.lock`` is held (being
  downloaded or checked) is skipped too. Downloads under way count at their full size.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from app.base.threads import close_fd, original_sleep
from app.model.gcs import GcsError, GcsObject

log = logging.getLogger(__name__)

POLL_SECONDS = 0.25  # how often a caller waiting for another download of its object looks
_META = ".meta.json"


def cache_root(cache_dir: Path) -> Path:
    return (Path(cache_dir) / "gcs").resolve()


def cache_path(cache_dir: Path, obj: GcsObject) -> Path:
    """Where an object is cached. Object names are arbitrary bytes in Cloud Storage: a name
    with a ``..`` or empty segment, a leading ``/``, a backslash or a NUL would step outside
    the cache (or onto another object's file), so it is refused."""
    name = obj.name
    segments = name.split("/")
    if (not name or "\\" in name or "\x00" in name or name.startswith("/")
            or any(seg in ("", ".", "..") for seg in segments)):
        raise GcsError(
            f"model {obj.uri}: the object name cannot be a cache path (no '..', '.', empty or "
            "leading '/' segments, backslashes or NUL)"
        )
    root = cache_root(cache_dir)
    path = root / obj.bucket / name
    if not path.resolve().is_relative_to(root):
        raise GcsError(f"model {obj.uri}: the object's cache path leaves the cache directory")
    return path


def meta_path(path: Path) -> Path:
    return path.with_name(path.name + _META)


def lock_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


def is_cached(cache_dir: Path, obj: GcsObject) -> bool:
    path = cache_path(cache_dir, obj)
    try:
        meta = json.loads(meta_path(path).read_text())
        return (
            meta.get("generation") == obj.generation
            and meta.get("crc32c") == obj.crc32c
            and path.stat().st_size == obj.size
        )
    except (OSError, ValueError):
        return False


STAMP_AGO_NS = 10**9  # a verified file's mtime is set this far in the past (``stamp``)


def stamp(path: Path) -> int:
    """Set the mtime of a file whose bytes were just verified to a moment already past, and
    return it. Any later write sets the mtime to the (coarse, tick-grained) clock's now, never
    to this value: a write in the same tick as the verification would otherwise leave the mtime
    unchanged (git's "racily clean" files)."""
    when = time.time_ns() - STAMP_AGO_NS
    os.utime(path, ns=(when, when))
    return when


def file_stat(st: os.stat_result) -> dict[str, int]:
    """What a sidecar records of its file, and what a hit compares."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}


def write_meta(path: Path, obj: GcsObject, stamped: int | None = None) -> None:
    """The sidecar of a verified file; its mtime, now, is the entry's first use. ``stamped``:
    the mtime ``stamp`` gave the file when its bytes were verified; the file's stat is recorded
    when it still has it (nothing wrote it since), so that a hit can trust it unread."""
    meta: dict[str, object] = {"uri": obj.uri, "generation": obj.generation,
                               "crc32c": obj.crc32c, "size": obj.size}
    if stamped is not None:
        with contextlib.suppress(OSError):
            st = path.stat()
            if st.st_mtime_ns == stamped:
                meta["file"] = file_stat(st)
    tmp = meta_path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, meta_path(path))


def unchanged(path: Path) -> bool:
    """The cached file stats as it did when its bytes were verified (same size, inode and
    stamped mtime): trusted without reading it. False without a record (a sidecar written
    before records were kept, or a filesystem that would not take the stamp): hash it."""
    try:
        recorded = json.loads(meta_path(path).read_text()).get("file")
        return isinstance(recorded, dict) and recorded == file_stat(path.stat())
    except (OSError, ValueError):
        return False


def touch(path: Path) -> None:
    """A cache hit: the entry's last use is now (what eviction sorts by)."""
    with contextlib.suppress(OSError):
        os.utime(meta_path(path))


# ---- one download per object ---------------------------------------------------------------


def _unsupported(exc: OSError) -> bool:
    """flock refused outright (a network filesystem without locks), not a conflict."""
    return exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


@contextlib.contextmanager
def single_flight(path: Path, on_wait: Callable[[bool], None] | None = None) -> Iterator[None]:
    """Hold the entry's ``.NAME.lock`` exclusively: one caller at a time checks the cache for
    ``path`` and downloads it. A caller that finds it held looks again every POLL_SECONDS,
    saying so each time (``on_wait(True)``: called here, on the waiting thread, whose sleep lets
    no other code of it run), and once it has it ``on_wait(False)``: it then re-checks the
    cache and finds the other caller's download. The wait lasts as long as that download,
    which its own retries bound (a dead holder's lock is released with its process)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if on_wait is not None:
                    on_wait(True)
                waited = True
                original_sleep(POLL_SECONDS)
            except OSError as exc:
                if not _unsupported(exc):
                    raise
                log.warning("%s: no file locks here (%s): concurrent downloads of one object "
                            "are not merged", path.parent, exc.strerror)
                break
        if waited and on_wait is not None:
            on_wait(False)
        yield
    finally:
        close_fd(fd)


# ---- the size bound ------------------------------------------------------------------------


@dataclass
class _File:
    path: Path
    size: int
    last_use: float
    part: bool  # a download under way: counted, never deleted here


def _scan(root: Path) -> list[_File]:
    """Every file the cache holds: entries' files and downloads under way (sidecars and locks
    are a few bytes each, not counted)."""
    out: list[_File] = []
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith((_META, ".meta.tmp", ".lock")):
                continue
            path = Path(folder) / name
            try:
                st = path.stat()
            except OSError:
                continue
            part = name.startswith(".") and ".part-" in name
            try:
                last_use = meta_path(path).stat().st_mtime
            except OSError:
                last_use = st.st_mtime  # no sidecar: never a hit, oldest first
            out.append(_File(path, st.st_size, last_use, part))
    return out


def _delete(path: Path, own: bool) -> bool:
    """Delete a cached entry unless it is in use: its ``.lock`` held (skipped for ``own``, the
    entry the caller downloads), or its file held by an engine. True: deleted."""
    guard = -1
    try:
        if not own:
            guard = os.open(lock_path(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            meta_path(path).unlink(missing_ok=True)  # no cache hit on a file about to go
            path.unlink()
        finally:
            close_fd(fd)
        return True
    except OSError:  # BlockingIOError: in use; or gone meanwhile
        return False
    finally:
        if guard >= 0:
            close_fd(guard)


def _size(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e7 else f"{int(n)} bytes"


def make_room(root: Path, need: int, bound: int, uri: str, own: Path) -> None:
    """Delete the least recently used entries not in use until ``need`` more bytes fit under
    ``bound``; a GcsError saying what is in use when they cannot. Call under ``room``."""
    files = _scan(root)
    used = sum(f.size for f in files)
    if used + need <= bound:
        return
    held: list[_File] = []
    for f in sorted(files, key=lambda f: (f.last_use, str(f.path))):
        if used + need <= bound:
            break
        if f.part or not _delete(f.path, own=f.path == own):
            held.append(f)
            continue
        used -= f.size
        log.info("download cache: deleted %s (%s, last used %s) to make room for %s "
                 "(MODEL_CACHE_MAX_GB %g)", f.path.relative_to(root), _size(f.size),
                 time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(f.last_use)), uri,
                 bound / 1e9)
    if used + need > bound:
        busy = sum(f.size for f in held)
        names = ", ".join(str(f.path.relative_to(root)) for f in held[:6])
        more = f" and {len(held) - 6} more" if len(held) > 6 else ""
        raise GcsError(
            f"model {uri}: needs {_size(need)} in the download cache, which MODEL_CACHE_MAX_GB "
            f"bounds to {_size(bound)}, and {_size(busy)} of it are in use by loaded models or "
            f"downloads under way ({names}{more}): unload a model, or raise MODEL_CACHE_MAX_GB"
        )


@contextlib.contextmanager
def room(cache_dir: Path, need: int, bound: int | None, uri: str, own: Path) -> Iterator[None]:
    """Make room for ``need`` bytes (``make_room``; nothing to do without a bound) and keep the
    cache's eviction lock while the caller reserves them (creates its download's file at full
    size), so two downloads never count the same free bytes."""
    if bound is None:
        yield
        return
    root = cache_root(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / ".evict.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held for a scan of the cache: short
        except OSError as exc:
            if not _unsupported(exc):
                raise
        make_room(root, need, bound, uri, own)
        yield
    finally:
        close_fd(fd)
