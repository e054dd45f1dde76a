"""A kept prompt's file: what it holds, how it is written, and every check it must pass before
it is used (app.engine.prompt_store keeps the files).

Little-endian::

    b"vgguf-kv" u32 version u32 head_len                     the prelude
    32s identity  32s sha256(scope)  u64 n_tokens  u64 n_pos  u64 blob_len  u32 n_marks
    n_marks x (u64 start, u64 n, u16 len, digest utf-8)
    n_tokens x i32 tokens
    u32 crc32c of all the above                              (head_len bytes so far)
    blob_len bytes: llama_state_seq_get_data's blob
    u32 crc32c of everything before it

The head (prelude to head CRC) is all a scan reads, so a folder of GB blobs is indexed in a
few reads; the file never holds the key scope itself, only its digest. Its name is
``<scope digest[:16]>-<sha256 of the tokens and the images' digests>[:24].kv``: a file under
another's name is refused too. A blob is valid only for what made it (the model file,
llama.cpp's build, the KV types: ``identity``), which every file carries in full.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.engine.prompt_cache import Entry
from app.engine.tokens import Mark

MAGIC = b"vgguf-kv"
VERSION = 1
PRELUDE = struct.Struct("<8sII")  # magic, version, head_len
_FIXED = struct.Struct("<32s32sQQQI")  # identity, scope digest, n_tokens, n_pos, blob_len, n_marks
_MARK = struct.Struct("<QQH")  # start, n, digest length
CRC = struct.Struct("<I")
_MAX_HEAD = 64 << 20  # 16M tokens: a head claiming more is corrupt


def identity(parts: Mapping[str, str]) -> str:
    """The hex sha256 of what makes a blob valid (the model file's identity, llama.cpp's build,
    the KV types, the projector...): ``parts``, sorted, in an unambiguous encoding."""
    text = json.dumps(sorted((str(k), str(v)) for k, v in parts.items()), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


# the scope of a slot restored from a file (POST /slots/{id}?action=restore): the file holds
# only its key scope's digest, so the slot's KV serves the prompts whose scope has that digest
DIGEST = "\0digest:"


def scope_digest(scope: str) -> str:
    """What a file holds of a key scope (never the scope itself); a slot restored from a file
    has the file's digest as its scope, and keeps it."""
    if scope.startswith(DIGEST):
        return scope[len(DIGEST):]
    return hashlib.sha256(scope.encode("utf-8", "surrogatepass")).hexdigest()


def digest_scope(digest: str) -> str:
    """The scope of a slot restored from a file whose key scope has ``digest``."""
    return DIGEST + digest


def file_name(scope_hex: str, tokens: np.ndarray, marks: Sequence[Mark]) -> str:
    """A file's name: its scope and its tokens (with the images' full digests: equal
    placeholder ids are the same image only when the digests say so)."""
    h = hashlib.sha256(np.ascontiguousarray(tokens, dtype="<i4").tobytes())
    for m in marks:
        h.update(f"|{m.start},{m.n},{m.digest}".encode())
    return f"{scope_hex[:16]}-{h.hexdigest()[:24]}.kv"


def crc32c(data: bytes, crc: int = 0) -> int:
    import google_crc32c  # C, ~8 GB/s here; takes only bytes (a chunk's copy)

    return google_crc32c.extend(crc, data)


class BadFile(Exception):
    """A file that must not be used (and is deleted); the message says why."""


class OtherVersion(BadFile):
    """A file of another format version: a replica of another release may share the folder,
    so it is left alone."""


@dataclass(frozen=True)
class Head:
    scope_digest: str
    tokens: np.ndarray
    marks: tuple[Mark, ...]
    n_pos: int
    blob_len: int
    head_len: int

    @property
    def total(self) -> int:
        return self.head_len + self.blob_len + CRC.size


def encode_head(ident: str, scope_hex: str, tokens: np.ndarray, marks: Sequence[Mark],
                 n_pos: int, blob_len: int) -> bytes:
    """The head, its CRC at the end."""
    body = [_FIXED.pack(bytes.fromhex(ident), bytes.fromhex(scope_hex), len(tokens), n_pos,
                        blob_len, len(marks))]
    for m in marks:
        digest = m.digest.encode()
        body += [_MARK.pack(m.start, m.n, len(digest)), digest]
    body.append(np.ascontiguousarray(tokens, dtype="<i4").tobytes())
    rest = b"".join(body)
    head = PRELUDE.pack(MAGIC, VERSION, PRELUDE.size + len(rest) + CRC.size) + rest
    return head + CRC.pack(crc32c(head))


def read_prelude(prelude: bytes) -> int:
    """The head's length from its prelude (the first 16 bytes); BadFile if it is not one."""
    if len(prelude) < PRELUDE.size:
        raise BadFile(f"{len(prelude)} bytes, shorter than a header")
    magic, version, head_len = PRELUDE.unpack_from(prelude)
    if magic != MAGIC:
        raise BadFile("not a prompt file (bad magic)")
    if version != VERSION:
        raise OtherVersion(f"format version {version}, not {VERSION}")
    if not PRELUDE.size + _FIXED.size + CRC.size <= head_len <= _MAX_HEAD:
        raise BadFile(f"header length {head_len} out of range")
    return head_len


def parse_head(buf: bytes, ident: str, name: str | None) -> Head:
    """The head at the start of ``buf``, every field checked; BadFile says what is wrong.
    ``name``: the file's, which must be the one its content makes (None: a slot file, named
    by the operator)."""
    head_len = read_prelude(buf)
    if len(buf) < head_len:
        raise BadFile(f"truncated header ({len(buf)} of {head_len} bytes)")
    (crc,) = CRC.unpack_from(buf, head_len - CRC.size)
    if crc32c(bytes(buf[:head_len - CRC.size])) != crc:
        raise BadFile("header checksum mismatch")
    who, scope, n_tokens, n_pos, blob_len, n_marks = _FIXED.unpack_from(buf, PRELUDE.size)
    if who.hex() != ident:
        raise BadFile(f"written for identity {who.hex()[:16]}..., not this model's {ident[:16]}...")
    off = PRELUDE.size + _FIXED.size
    marks = []
    for _ in range(n_marks):
        if off + _MARK.size > head_len:
            raise BadFile("marks overrun the header")
        start, n, dlen = _MARK.unpack_from(buf, off)
        digest = bytes(buf[off + _MARK.size:off + _MARK.size + dlen])
        off += _MARK.size + dlen
        try:
            marks.append(Mark(start, n, digest.decode()))
        except UnicodeDecodeError:
            raise BadFile("an image digest is not text") from None
    if off + 4 * n_tokens + CRC.size != head_len:
        raise BadFile(f"{n_tokens} tokens do not fill the header")
    tokens = np.frombuffer(buf, dtype="<i4", count=n_tokens, offset=off).astype(np.int32)
    if n_tokens == 0 or blob_len == 0:
        raise BadFile("no tokens or no blob")
    end = 0
    for m in marks:  # in order, apart, inside the tokens, over placeholder (negative) ids
        if m.n == 0 or m.start < end or m.start + m.n > n_tokens \
                or (tokens[m.start:m.start + m.n] >= 0).any():
            raise BadFile(f"image mark {m.start}+{m.n} inconsistent with the tokens")
        end = m.start + m.n
    if n_pos > n_tokens or (not marks and n_pos != n_tokens):
        raise BadFile(f"next position {n_pos} inconsistent with {n_tokens} tokens")
    head = Head(scope.hex(), tokens, tuple(marks), n_pos, blob_len, head_len)
    if name is not None and file_name(head.scope_digest, tokens, head.marks) != name:
        raise BadFile("its name does not match its content")
    return head


class Assembler:
    """A file's bytes, fed in order (a file-like sink: ``write``), checked and assembled into
    an Entry: the head parsed as soon as it is in (a bad one, or one of another scope, stops
    the read before the blob), the blob copied into one preallocated ctypes array, the CRC
    streamed."""

    def __init__(self, ident: str, name: str | None, scope_hex: str | None, size: int | None):
        self.ident, self.name, self.scope_hex, self.size = ident, name, scope_hex, size
        self.buf = bytearray()  # the head, then the trailer
        self.need: int | None = None  # the head's length, once its prelude is in
        self.head: Head | None = None
        self.blob: Any = None
        self.view: memoryview | None = None
        self.got = 0  # blob bytes in
        self.crc = 0

    def write(self, data: bytes) -> int:
        data = data if isinstance(data, bytes) else bytes(data)
        n = len(data)
        if self.head is None:
            if self.need is None:
                take = min(n, PRELUDE.size - len(self.buf))
                self.buf += data[:take]
                data = data[take:]
                if len(self.buf) < PRELUDE.size:
                    return n
                self.need = read_prelude(bytes(self.buf))
            take = min(len(data), self.need - len(self.buf))
            self.buf += data[:take]
            data = data[take:]
            if len(self.buf) < self.need:
                return n
            self._start(bytes(self.buf))
        if data and self.got < self.head.blob_len:
            piece = data[:self.head.blob_len - self.got]
            self.view[self.got:self.got + len(piece)] = piece
            self.crc = crc32c(piece, self.crc)
            self.got += len(piece)
            data = data[len(piece):]
        self.buf += data
        if len(self.buf) > CRC.size:
            raise BadFile("longer than its header says")
        return n

    def _start(self, head_bytes: bytes) -> None:
        head = parse_head(head_bytes, self.ident, self.name)
        if self.scope_hex is not None and head.scope_digest != self.scope_hex:
            raise BadFile("written for another key scope")  # (its name says otherwise)
        if self.size is not None and self.size != head.total:
            raise BadFile(f"{self.size} bytes, its header says {head.total} (truncated?)")
        self.head, self.crc = head, crc32c(head_bytes)
        self.buf = bytearray()
        self.blob = (ctypes.c_uint8 * head.blob_len)()
        self.view = memoryview(self.blob).cast("B")

    def finish(self, scope: str) -> Entry:
        if self.head is None or self.got < self.head.blob_len or len(self.buf) < CRC.size:
            raise BadFile("truncated")
        if CRC.unpack(bytes(self.buf))[0] != self.crc:
            raise BadFile("checksum mismatch")
        h = self.head
        return Entry(scope, h.tokens, h.marks, h.n_pos, self.blob)

    def flush(self) -> None:
        pass
