"""Prompts kept across restarts: the prompt cache's entries as files, in a local folder or
under a ``gs://`` prefix (PROMPT_CACHE_DIR).

A restart (a rollout, a scale from zero) loses every slot's KV and the RAM cache with them; the
next turn of each conversation decodes its whole prompt again (minutes for an agent's 20k
tokens on a CPU). An entry written here is read back by the next replica instead. A blob is
only valid for the model file, llama.cpp build and KV types that made it, so files live under
``<root>/<identity[:16]>/`` (another model or build never lists them) and carry the whole
identity; and they are checked, never trusted: a file of another identity or key scope, a
truncated or corrupt one, or one whose name does not match its content is refused with a
warning (and deleted when it is corrupt).

The files' format and checks: app.engine.prompt_file. Bounded by bytes: the oldest files (by
mtime, or Cloud Storage's ``updated``) are deleted to make room; a local file read back is
touched, so locally the bound is least recently used. The bound counts the folder's listing,
not only this process's index, so replicas sharing a prefix keep it together (roughly: they
race). A local write is a temp file renamed into place, without fsync: a file a crash left
short is found by its checks. A Cloud Storage write is one upload (all or nothing).

I/O never raises out of here: a failure is a warning and a miss (the prompt is decoded).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.base.gcs_client import split_uri, thread_client
from app.base.threads import allocate_lock
from app.engine.prompt_cache import Entry, holds, longest
from app.engine.prompt_file import (
    CRC,
    PRELUDE,
    Assembler,
    BadFile,
    OtherVersion,
    crc32c,
    encode_head,
    file_name,
    identity,
    parse_head,
    read_prelude,
    scope_digest,
)
from app.engine.tokens import Mark

__all__ = ["PromptStore", "Stored", "identity", "scope_digest"]

log = logging.getLogger(__name__)

_HEAD_GUESS = 256 << 10  # a scan's first ranged read of a gs:// file (64k tokens' head)
_CHUNK = 8 << 20  # reads, writes and uploads go by this much
_STALE_TEMP_S = 3600.0  # a writer's temp file older than this was left by a killed process


@dataclass(frozen=True, eq=False)
class Stored:
    """One file, as the index knows it (its head read, its blob not)."""

    name: str
    scope_digest: str  # hex sha256 of the key scope
    tokens: np.ndarray  # int32
    marks: tuple[Mark, ...]
    n_pos: int
    blob_size: int  # the blob's bytes: what reading it back allocates
    size: int  # the file's bytes
    mtime: float


class _Concat(io.RawIOBase):
    """Byte strings read as one seekable stream (an upload's body, without a joined copy)."""

    def __init__(self, parts: Sequence[Any]):
        self.parts = [memoryview(p).cast("B") for p in parts]
        self.length = sum(len(p) for p in self.parts)
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self.pos, self.length)[whence]
        self.pos = max(0, min(self.length, base + offset))
        return self.pos

    def readinto(self, b: Any) -> int:
        out, done, start = memoryview(b).cast("B"), 0, 0
        for part in self.parts:
            if self.pos < start + len(part) and done < len(out):
                lo = self.pos - start
                n = min(len(part) - lo, len(out) - done)
                out[done:done + n] = part[lo:lo + n]
                done += n
                self.pos += n
            start += len(part)
        return done


class _Local:
    """Files in a folder: written to a temp file beside them and renamed (atomic)."""

    def __init__(self, folder: str):
        self.folder = folder
        os.makedirs(folder, exist_ok=True)

    def where(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def listing(self) -> list[tuple[str, int, float]]:
        out = []
        with os.scandir(self.folder) as it:
            for e in it:
                try:
                    st = e.stat()
                except OSError:
                    continue  # gone meanwhile
                if e.name.endswith(".kv"):
                    out.append((e.name, st.st_size, st.st_mtime))
                elif e.name.endswith(".tmp") and time.time() - st.st_mtime > _STALE_TEMP_S:
                    with contextlib.suppress(OSError):
                        os.unlink(e.path)
        return out

    def head(self, name: str, size: int) -> bytes:
        with open(self.where(name), "rb") as f:
            prelude = f.read(PRELUDE.size)
            return prelude + f.read(read_prelude(prelude) - len(prelude))

    def stream(self, name: str, into: Callable[[int | None], Assembler]) -> Assembler:
        with open(self.where(name), "rb") as f:
            sink = into(os.fstat(f.fileno()).st_size)
            while chunk := f.read(_CHUNK):
                sink.write(chunk)
        with contextlib.suppress(OSError):
            os.utime(self.where(name))  # read back: the bound keeps it longer
        return sink

    def put(self, name: str, head: bytes, blob: memoryview) -> float:
        tmp = self.where(f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(head)
                crc = crc32c(head)
                for off in range(0, len(blob), _CHUNK):
                    piece = bytes(blob[off:off + _CHUNK])
                    f.write(piece)
                    crc = crc32c(piece, crc)
                f.write(CRC.pack(crc))
            os.replace(tmp, self.where(name))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return os.stat(self.where(name)).st_mtime

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.where(name))


class _Gcs:
    """Objects under a gs:// prefix: written by one upload (atomic), heads read by range."""

    def __init__(self, uri: str, emulator_host: str | None):
        parts = split_uri(uri)
        if parts is None:
            raise ValueError(f"{uri}: not a gs://BUCKET/PATH URI")
        self.bucket_name, path = parts[0], parts[1].strip("/")
        self.prefix = path + "/" if path else ""
        self.emulator_host = emulator_host

    @property
    def client(self) -> Any:
        return thread_client(self.emulator_host)

    @property
    def bucket(self) -> Any:
        return self.client.bucket(self.bucket_name)

    def where(self, name: str) -> str:
        return f"gs://{self.bucket_name}/{self.prefix}{name}"

    def listing(self) -> list[tuple[str, int, float]]:
        return [(b.name[len(self.prefix):], int(b.size),
                 b.updated.timestamp() if b.updated else 0.0)
                for b in self.client.list_blobs(self.bucket_name, prefix=self.prefix,
                                                delimiter="/")
                if b.name.endswith(".kv")]

    def head(self, name: str, size: int) -> bytes:
        if size < PRELUDE.size:
            raise BadFile(f"{size} bytes, shorter than a header")
        blob = self.bucket.blob(self.prefix + name)
        first = blob.download_as_bytes(start=0, end=min(size, _HEAD_GUESS) - 1,
                                       raw_download=True, checksum=None)
        need = read_prelude(first)
        if need > len(first):
            first += blob.download_as_bytes(start=len(first), end=need - 1,
                                            raw_download=True, checksum=None)
        return first

    def stream(self, name: str, into: Callable[[int | None], Assembler]) -> Assembler:
        sink = into(None)  # the listing's size may be an older generation's: the head says
        self.bucket.blob(self.prefix + name).download_to_file(sink, raw_download=True,
                                                               checksum=None)
        return sink

    def put(self, name: str, head: bytes, blob: memoryview) -> float:
        from google.cloud.storage.retry import DEFAULT_RETRY

        crc = crc32c(head)  # the trailer ends the body: one pass over the blob first
        for off in range(0, len(blob), _CHUNK):
            crc = crc32c(bytes(blob[off:off + _CHUNK]), crc)
        body = _Concat([head, blob, CRC.pack(crc)])
        obj = self.bucket.blob(self.prefix + name, chunk_size=4 * _CHUNK)
        # the same name is the same content: a retried upload is safe
        obj.upload_from_file(body, size=body.length, content_type="application/octet-stream",
                             retry=DEFAULT_RETRY)
        return obj.updated.timestamp() if obj.updated else time.time()

    def delete(self, name: str) -> None:
        from google.api_core.exceptions import NotFound

        with contextlib.suppress(NotFound):
            self.bucket.blob(self.prefix + name).delete()


class PromptStore:
    """The files of one identity under ``root`` (a folder, created if missing, or a gs://
    prefix), at most ``max_bytes`` of them, and an index of their heads. Safe to use from
    several native threads: the index is locked, I/O runs outside the lock."""

    def __init__(self, root: str, identity: str, max_bytes: int, *,
                 emulator_host: str | None = None, whole_only: bool = False):
        if len(identity) != 64 or identity.strip("0123456789abcdef"):
            raise ValueError("identity: the hex sha256 prompt_store.identity() returns")
        self.identity, self.max_bytes = identity, max_bytes
        # a recurrent model's memory cannot drop a suffix: a file serves only a prompt that
        # holds all of it (as PromptCache.whole_only)
        self.whole_only = whole_only
        sub = identity[:16]
        self.root = root
        self._io: _Local | _Gcs | None = None
        try:
            self._io = (_Gcs(root.rstrip("/") + "/" + sub, emulator_host)
                        if root.startswith("gs://") else _Local(os.path.join(root, sub)))
        except Exception as exc:  # noqa: BLE001 - a store that cannot open is empty
            log.warning("prompt store %s: cannot open (%s): prompts will not be kept",
                        root, _why(exc))
        self._lock = allocate_lock()
        self._index: dict[str, Stored] = {}
        self._emulator_host = emulator_host
        self._slots: _Local | _Gcs | None = None  # the slot files' folder, opened on first use

    def __len__(self) -> int:
        return len(self._index)

    def files(self) -> list[Stored]:
        with self._lock:
            return list(self._index.values())

    def scan(self) -> list[Stored]:
        """Read every file's head (not its blob) into the index, which it replaces; a file
        whose head is bad is skipped with a warning (and deleted if local; on Cloud Storage,
        where objects are uploaded whole, the read that finds it bad deletes it). Another
        format version's files are left alone."""
        found: dict[str, Stored] = {}
        if self._io is not None:
            try:
                listing = self._io.listing()
            except Exception as exc:  # noqa: BLE001
                log.warning("prompt store %s: cannot list (%s)", self.root, _why(exc))
                listing = []
            for name, size, mtime in listing:
                try:
                    head = parse_head(self._io.head(name, size), self.identity, name)
                    if head.total != size:
                        raise BadFile(f"{size} bytes, its header says {head.total} (truncated?)")
                except BadFile as exc:
                    log.warning("prompt file %s skipped: %s", self._io.where(name), exc)
                    if isinstance(self._io, _Local) and not isinstance(exc, OtherVersion):
                        self._delete(name)
                    continue
                except Exception as exc:  # noqa: BLE001
                    log.warning("prompt file %s skipped: %s", self._io.where(name), _why(exc))
                    continue
                found[name] = Stored(name, head.scope_digest, head.tokens, head.marks,
                                     head.n_pos, head.blob_len, size, mtime)
        with self._lock:
            self._index = found
            return list(found.values())

    def best(self, scope: str, prompt: np.ndarray, wanted: Sequence[Mark] = ()
             ) -> tuple[Stored | None, int]:
        """The file of ``scope`` that shares the longest prefix with ``prompt``, and how long
        (None, 0 when none shares a token): PromptCache.best's rule."""
        digest = scope_digest(scope)
        with self._lock:
            mine = [s for s in self._index.values() if s.scope_digest == digest]
        return longest(mine, prompt, wanted, self.whole_only)

    def write(self, entry: Entry) -> bool:
        """``entry`` as a file (``save``); False when it was not written, for whatever reason."""
        return self.save(entry) == "written"

    def save(self, entry: Entry) -> str:
        """``entry`` as a file, unless a file of its scope already holds its tokens or more:
        "written", "held" or "failed" (an I/O error, an entry over the bound alone). Older files
        are deleted first to keep the folder under the bound, files it extends after. Never
        raises."""
        if self._io is None:
            return "failed"
        try:
            tokens = np.ascontiguousarray(entry.tokens, dtype=np.int32)
            digest = scope_digest(entry.scope)
            name = file_name(digest, tokens, entry.marks)
            blob = memoryview(entry.blob).cast("B")
            head = encode_head(self.identity, digest, tokens, entry.marks, entry.n_pos,
                                len(blob))
        except Exception as exc:  # noqa: BLE001
            log.warning("prompt store: entry not written: %s", exc)
            return "failed"
        size = len(head) + len(blob) + CRC.size
        n = len(tokens)
        with self._lock:
            if any(self._holds(s, digest, tokens, entry.marks) for s in self._index.values()):
                return "held"
        if size > self.max_bytes:
            log.info("prompt store: a %d-token entry of %d bytes is over the bound (%d)",
                     n, size, self.max_bytes)
            return "failed"
        try:
            self._make_room(size, name)
            mtime = self._io.put(name, head, blob)
        except Exception as exc:  # noqa: BLE001
            log.warning("prompt file %s not written: %s", self._io.where(name), _why(exc))
            return "failed"
        stored = Stored(name, digest, tokens.copy(), tuple(entry.marks), entry.n_pos, len(blob),
                        size, mtime)
        with self._lock:
            self._index[name] = stored
            extended = [] if self.whole_only else [
                s for s in self._index.values() if s is not stored and s.scope_digest == digest
                and holds(stored, s.tokens, s.marks)]
        for s in extended:
            self.remove(s)
        return "written"

    def _holds(self, s: Stored, digest: str, tokens: np.ndarray, marks: Sequence[Mark]) -> bool:
        return (s.scope_digest == digest and (not self.whole_only or len(s.tokens) == len(tokens))
                and holds(s, tokens, marks))

    def _make_room(self, size: int, name: str) -> None:
        """Delete the oldest files until ``size`` more bytes fit the bound (the listing, not the
        index: replicas sharing a prefix write files this one never scanned)."""
        listing = sorted((m, n, s) for n, s, m in self._io.listing() if n != name)
        total = sum(s for _, _, s in listing)
        for _, old, old_size in listing:
            if total + size <= self.max_bytes:
                break
            log.info("prompt file %s deleted for room", self._io.where(old))
            self._delete(old)
            total -= old_size

    def read(self, stored: Stored, scope: str) -> Entry | None:
        """The file's entry, every byte checked (the blob as a ctypes uint8 array), or None: a
        warning names the file and why, and a bad file leaves the index and is deleted. A
        ``scope`` other than the file's is refused without deleting it."""
        if self._io is None:
            return None
        where = self._io.where(stored.name)
        if scope_digest(scope) != stored.scope_digest:
            log.warning("prompt file %s not read: written for another key scope", where)
            return None
        try:
            return self._io.stream(stored.name, lambda size: Assembler(
                self.identity, stored.name, stored.scope_digest, size)).finish(scope)
        except OtherVersion as exc:
            log.warning("prompt file %s not read: %s", where, exc)
            with self._lock:
                self._index.pop(stored.name, None)
        except BadFile as exc:
            log.warning("prompt file %s refused and deleted: %s", where, exc)
            self.remove(stored)
        except Exception as exc:  # noqa: BLE001
            log.warning("prompt file %s not read: %s", where, _why(exc))
            if isinstance(exc, FileNotFoundError) or getattr(exc, "code", None) == 404:
                with self._lock:  # gone (another replica's bound): out of the index
                    self._index.pop(stored.name, None)
        return None

    # ---- slot files (POST /slots/{id}?action=save|restore): named by the operator -----------
    def _slot_io(self) -> _Local | _Gcs:
        """The slot files' folder: ``slots/`` beside this identity's prompt files (so a slot
        file of another model or build is never found, and no scan or bound sees them)."""
        if self._slots is None:
            sub = self.identity[:16] + "/slots"
            self._slots = (_Gcs(self.root.rstrip("/") + "/" + sub, self._emulator_host)
                           if self.root.startswith("gs://")
                           else _Local(os.path.join(self.root, sub)))
        return self._slots

    def write_named(self, name: str, entry: Entry) -> int:
        """``entry`` as the slot file ``name`` (replacing one of that name); its bytes. Raises
        the I/O error."""
        tokens = np.ascontiguousarray(entry.tokens, dtype=np.int32)
        blob = memoryview(entry.blob).cast("B")
        head = encode_head(self.identity, scope_digest(entry.scope), tokens, entry.marks,
                           entry.n_pos, len(blob))
        self._slot_io().put(name, head, blob)
        return len(head) + len(blob) + CRC.size

    def read_named(self, name: str) -> tuple[Entry, int]:
        """The slot file ``name``, every byte checked, and its size; the entry's ``scope`` is
        the file's scope digest (a slot file is restored for whichever key wrote it). Raises
        FileNotFoundError when there is none, BadFile when it fails a check (another model's,
        damaged), else the I/O error."""
        io = self._slot_io()
        try:
            sink = io.stream(name, lambda size: Assembler(self.identity, None, None, size))
        except Exception as exc:
            if getattr(exc, "code", None) == 404:
                raise FileNotFoundError(name) from None
            raise
        head = sink.head
        entry = sink.finish(head.scope_digest if head is not None else "")
        return entry, head.total if head is not None else 0

    def remove(self, stored: Stored) -> None:
        """The file leaves the index and the folder (never raises)."""
        self._delete(stored.name)

    def _delete(self, name: str) -> None:
        with self._lock:
            self._index.pop(name, None)
        try:
            self._io.delete(name)
        except Exception as exc:  # noqa: BLE001
            log.warning("prompt file %s not deleted: %s", self._io.where(name), _why(exc))


def _why(exc: BaseException) -> str:
    """One line for an I/O failure, whatever raised it (a Cloud Storage error's code too)."""
    code = getattr(exc, "code", None)
    msg = getattr(exc, "message", None) or str(exc)
    return f"{type(exc).__name__}{f' ({code})' if isinstance(code, int) else ''}: {msg}"
