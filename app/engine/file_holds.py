"""The files an engine has loaded, held with a shared ``flock`` so that the bounded download
cache (app.model.gcs_cache, MODEL_CACHE_MAX_GB) never deletes one in use.

Eviction takes ``LOCK_EX | LOCK_NB`` on a cached file before it unlinks it and skips the file
when that fails, so a shared lock here is all "in use" means: it spans threads and processes
(flock locks belong to an open file, and two opens conflict even within one process) and a
process that dies lets go of its locks with its descriptors, so a crash leaves nothing stale.

Two holders: LlamaModel holds what llama.cpp opened (the model and its shards, the projector,
the draft model, the adapters) from load to free; the engine that resolved the files (the web
process's RemoteEngine, an in-process LlamaEngine) holds what its resolvers downloaded from the
moment they are ready until the engine stops (``collecting`` and ``keep``), which covers the
gap before the engine process loads them, an engine process's restarts and its idle sleep.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterable, Iterator

from app.base.errors import ModelLoadError
from app.base.threads import close_fd, thread_local
from app.model.gguf_header import named_shards

log = logging.getLogger(__name__)

_collector = thread_local()  # per OS thread: the FileHolds an engine's resolvers fill


def with_shards(path: str) -> list[str]:
    """``path`` and, for the first shard of a split GGUF, the other shards llama.cpp opens
    beside it (those that exist)."""
    return [p for p in named_shards(path) if p == path or os.path.isfile(p)]


class FileHolds:
    """Shared locks on files, released together (``release``), or by the process's end."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}

    @property
    def paths(self) -> list[str]:
        return list(self._fds)

    def hold(self, path: str) -> None:
        """Take a shared lock on ``path`` (once per path). Raises ModelLoadError when the file
        is gone, or was deleted from the cache while the lock was being taken."""
        if path in self._fds:
            return
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise ModelLoadError(f"{path}: cannot open it ({exc.strerror})") from None
        try:
            try:
                # blocks only while an eviction holds its exclusive lock, an instant: it never
                # waits on anything while it holds it
                fcntl.flock(fd, fcntl.LOCK_SH)
            except OSError as exc:  # a filesystem without locks (a FUSE mount): not a cache's
                log.debug("%s: not held (%s)", path, exc.strerror)
                close_fd(fd)
                return
            st = os.fstat(fd)
            try:
                now = os.stat(path)
                same = (now.st_ino, now.st_dev) == (st.st_ino, st.st_dev)
            except OSError:
                same = False
            if st.st_nlink == 0 or not same:
                raise ModelLoadError(f"{path}: deleted or replaced while it was being loaded "
                                     "(MODEL_CACHE_MAX_GB made room for another model in the "
                                     "download cache?): load it again")
        except BaseException:
            close_fd(fd)
            raise
        self._fds[path] = fd

    def hold_all(self, paths: Iterable[str | None]) -> None:
        """Hold every path given (None skipped), a split model's shards with its first."""
        for path in paths:
            if path:
                for p in with_shards(path):
                    self.hold(p)

    def take(self, other: FileHolds) -> None:
        """Hold what ``other`` holds: its locks move here (a path held twice keeps one)."""
        fds, other._fds = other._fds, {}
        for path, fd in fds.items():
            if path in self._fds:
                close_fd(fd)
            else:
                self._fds[path] = fd

    def release(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            with contextlib.suppress(OSError):
                close_fd(fd)


@contextlib.contextmanager
def collecting(holds: FileHolds) -> Iterator[FileHolds]:
    """While resolving an engine's files on this thread: what ``keep`` is given goes to
    ``holds``, which the engine releases when it stops."""
    before = getattr(_collector, "holds", None)
    _collector.holds = holds
    try:
        yield holds
    finally:
        _collector.holds = before


def keep(path: str) -> None:
    """A resolver's file is ready (downloaded, or found in the cache): held by the engine it is
    resolved for, if this thread is resolving for one (``collecting``); else nothing (the
    ``fetch`` command, a test)."""
    holds = getattr(_collector, "holds", None)
    if holds is not None:
        holds.hold(path)
