"""A GGUF file's header, read without its weights: the metadata (key/value pairs) and each
tensor's name, shape, ggml type and offset. Split models (``x-00001-of-00003.gguf``) are read
shard by shard, as llama.cpp finds them.

What reads it: the memory estimate (app.engine.footprint) before llama.cpp loads a model, so a
model that cannot fit is refused with its reason instead of crashing. The file may be hostile or
corrupt, so every length, count and offset is checked against the file before it is trusted,
and nothing grows with a number the file states: strings, arrays and counts are bounded by the
bytes that are there. Versions 2 and 3 are read (version 1 had 32-bit counts and is gone from
llama.cpp too); a big-endian file is refused by name.

Large arrays (a tokenizer's 150,000 tokens and scores) are not decoded: an ``ArrayInfo`` holds
their element type and count, which is what an estimate needs of them.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from typing import Any

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME = 63  # GGML_MAX_NAME less its NUL: llama.cpp refuses longer tensor names
MAX_KEY = 1 << 16
MAX_STRING = 1 << 28  # no metadata string is near this (chat templates are ~100 KB)
DECODED_ARRAY = 4096  # arrays up to this many elements are decoded; longer ones summarized
MAX_SPLITS = 9999

# ggml_type -> (name, values per block, bytes per block): every type a GGUF may hold, as ggml
# defines them (the removed ones are absent; tests/unit/test_gguf_header.py checks the table
# against the ggml llama.cpp ships)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("f32", 1, 4), 1: ("f16", 1, 2), 2: ("q4_0", 32, 18), 3: ("q4_1", 32, 20),
    6: ("q5_0", 32, 22), 7: ("q5_1", 32, 24), 8: ("q8_0", 32, 34), 9: ("q8_1", 32, 36),
    10: ("q2_K", 256, 84), 11: ("q3_K", 256, 110), 12: ("q4_K", 256, 144),
    13: ("q5_K", 256, 176), 14: ("q6_K", 256, 210), 15: ("q8_K", 256, 292),
    16: ("iq2_xxs", 256, 66), 17: ("iq2_xs", 256, 74), 18: ("iq3_xxs", 256, 98),
    19: ("iq1_s", 256, 50), 20: ("iq4_nl", 32, 18), 21: ("iq3_s", 256, 110),
    22: ("iq2_s", 256, 82), 23: ("iq4_xs", 256, 136), 24: ("i8", 1, 1), 25: ("i16", 1, 2),
    26: ("i32", 1, 4), 27: ("i64", 1, 8), 28: ("f64", 1, 8), 29: ("iq1_m", 256, 56),
    30: ("bf16", 1, 2), 34: ("tq1_0", 256, 54), 35: ("tq2_0", 256, 66),
    39: ("mxfp4", 32, 17), 40: ("nvfp4", 64, 36), 41: ("q1_0", 128, 18), 42: ("q2_0", 64, 18),
}
TYPE_IDS = {name: tid for tid, (name, _, _) in GGML_TYPES.items()}

# gguf_type: the metadata value types, with their struct format (strings and arrays apart)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
_SPLIT_NAME = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")


_U64 = struct.Struct("<Q")  # a string's length


class GgufError(ValueError):
    """The file is not a GGUF this reader accepts; the message names the file and the fault."""


def row_bytes(ggml_type: int, n: int) -> int:
    """Bytes of ``n`` values of a type (``n`` a whole number of blocks)."""
    _, block, size = GGML_TYPES[ggml_type]
    return n // block * size


@dataclass(frozen=True)
class ArrayInfo:
    """A metadata array too long to decode: its element type (a gguf_type) and length."""

    element_type: int
    count: int

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml's order: ne[0] (a row's values) first
    ggml_type: int
    offset: int  # from the start of its shard's data section
    shard: int = 0

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return row_bytes(self.ggml_type, self.n_elements)

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]


@dataclass
class GgufHeader:
    """One file's header (for a split model, the first shard's metadata and every shard's
    tensors: ``read_model``)."""

    path: str
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    alignment: int = DEFAULT_ALIGNMENT
    data_offset: int = 0
    file_size: int = 0
    shards: list[str] = field(default_factory=list)  # every file of the model, in order

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def arch(self, key: str, default: Any = None) -> Any:
        """A key under the architecture's prefix: ``arch("block_count")`` is
        ``llama.block_count`` in a llama model."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def count(self, key: str) -> int:
        """The length of an array value (0 when absent)."""
        value = self.metadata.get(key)
        return len(value) if isinstance(value, (tuple, ArrayInfo)) else 0

    @property
    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


class _Reader:
    """Bounds-checked little-endian reads over one file's bytes."""

    def __init__(self, buf: mmap.mmap | bytes, path: str):
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.path = path

    def fail(self, what: str) -> GgufError:
        return GgufError(f"{self.path}: not a valid GGUF file: {what}")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"{what} runs past the end of the file (at byte {self.pos} of "
                            f"{self.size}: truncated or corrupt)")

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return value

    def u32(self, what: str) -> int:
        return self.unpack("<I", what)

    def u64(self, what: str) -> int:
        return self.unpack("<Q", what)

    def string(self, what: str, limit: int = MAX_STRING) -> str:
        n = self.u64(f"the length of {what}")
        if n > limit:
            raise self.fail(f"{what} is {n} bytes long, past the limit of {limit}")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip_string(self, what: str) -> None:
        n = self.u64(f"the length of {what}")
        self.need(n, what)
        self.pos += n

    def _skip_strings(self, count: int, key: str) -> None:
        """``count`` strings passed over in one tight loop: a vocabulary is 50k-260k of them,
        and the general reads (a call per length, each bounds-checked with its message) cost
        a tenth of a second per load at 50k."""
        buf, size, pos, length = self.buf, self.size, self.pos, _U64.unpack_from
        for _ in range(count):
            if pos + 8 > size:
                break
            pos += 8 + length(buf, pos)[0]
            if pos > size:
                break
        else:
            self.pos = pos
            return
        self.pos = min(pos, size)
        self.need(size, f"an element of {key}")  # past the end: raises, saying where

    def value(self, vtype: int, key: str) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype], f"the value of {key}")
        if vtype == STRING:
            return self.string(f"the value of {key}")
        if vtype == ARRAY:
            return self.array(key)
        raise self.fail(f"{key} has an unknown value type {vtype}")

    def array(self, key: str) -> tuple | ArrayInfo:
        etype = self.u32(f"the element type of {key}")
        count = self.u64(f"the length of {key}")
        if etype == ARRAY:
            raise self.fail(f"{key} is an array of arrays, which GGUF readers refuse")
        if etype not in _SCALARS and etype != STRING:
            raise self.fail(f"{key} has an unknown element type {etype}")
        least = 8 if etype == STRING else struct.calcsize(_SCALARS[etype])
        if count > (self.size - self.pos) // least:
            raise self.fail(f"{key} claims {count} elements, more than the file can hold")
        if count <= DECODED_ARRAY:
            return tuple(self.value(etype, key) for _ in range(count))
        if etype == STRING:
            self._skip_strings(count, key)
        else:
            self.pos += count * least
        return ArrayInfo(etype, count)


def read_header(path: str | os.PathLike[str], shard: int = 0) -> GgufHeader:
    """One GGUF file's metadata and tensor infos. Raises GgufError (a ValueError) for a file
    that is not GGUF, is truncated, or states a length, count, type or offset it cannot hold;
    OSError when it cannot be opened."""
    path = os.fspath(path)
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < 24:
            raise GgufError(f"{path}: not a GGUF file ({size} bytes)")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(_Reader(buf, path), shard)


def _parse(r: _Reader, shard: int) -> GgufHeader:
    if bytes(r.buf[:4]) != MAGIC:
        raise GgufError(f"{r.path}: not a GGUF file (bad magic)")
    r.pos = 4
    version = r.u32("the version")
    if version not in (2, 3):
        if version & 0xFFFF == 0 and struct.unpack(">I", struct.pack("<I", version))[0] in (2, 3):
            raise r.fail("a big-endian GGUF, which this reader (and a little-endian llama.cpp) "
                         "cannot use")
        raise r.fail(f"GGUF version {version} (versions 2 and 3 are read)")
    n_tensors = r.u64("the tensor count")
    n_kv = r.u64("the metadata count")
    # the least bytes each takes: a key or name's length (8), a type (4), a value or dims
    if n_kv > (r.size - r.pos) // 13:
        raise r.fail(f"{n_kv} metadata entries claimed, more than the file can hold")
    if n_tensors > (r.size - r.pos) // 32:
        raise r.fail(f"{n_tensors} tensors claimed, more than the file can hold")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = r.string("a metadata key", MAX_KEY)
        if key in metadata:
            raise r.fail(f"the metadata key {key} appears twice")
        metadata[key] = r.value(r.u32(f"the type of {key}"), key)
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 \
            or alignment & (alignment - 1):
        raise r.fail(f"general.alignment is {alignment!r}, not a power of two")
    tensors = [_tensor(r, shard) for _ in range(n_tensors)]
    names = {t.name for t in tensors}
    if len(names) != len(tensors):
        raise r.fail("a tensor name appears twice")
    data_offset = -(-r.pos // alignment) * alignment
    room = r.size - data_offset
    for t in tensors:
        if t.offset % alignment:
            raise r.fail(f"tensor {t.name}'s offset {t.offset} is not aligned to {alignment}")
        if t.offset + t.nbytes > room:
            raise r.fail(f"tensor {t.name}'s data ({t.nbytes} bytes at {t.offset}) runs past "
                         "the end of the file (truncated?)")
    return GgufHeader(path=r.path, version=version, metadata=metadata,
                      tensors=tensors, alignment=alignment, data_offset=data_offset,
                      file_size=r.size, shards=[r.path])


def _tensor(r: _Reader, shard: int) -> TensorInfo:
    name = r.string("a tensor name", MAX_KEY)
    if len(name.encode()) > MAX_NAME:
        raise r.fail(f"the tensor name {name[:80]!r} is longer than {MAX_NAME} bytes")
    n_dims = r.u32(f"the dimension count of {name}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise r.fail(f"tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS})")
    shape = tuple(r.u64(f"a dimension of {name}") for _ in range(n_dims))
    n = 1
    for d in shape:
        n *= d
        if n >= 1 << 62:
            raise r.fail(f"tensor {name} has a shape too large: {shape}")
    ggml_type = r.u32(f"the type of {name}")
    if ggml_type not in GGML_TYPES:
        raise r.fail(f"tensor {name} has an unknown ggml type {ggml_type}")
    block = GGML_TYPES[ggml_type][1]
    if shape[0] % block:
        raise r.fail(f"tensor {name}'s rows ({shape[0]} values) are not whole "
                     f"{GGML_TYPES[ggml_type][0]} blocks of {block}")
    offset = r.u64(f"the offset of {name}")
    return TensorInfo(name, shape, ggml_type, offset, shard)


def shard_paths(path: str, count: int) -> list[str]:
    """Every shard of a split model, from the first one's path (llama.cpp's naming:
    ``PREFIX-00001-of-00003.gguf``)."""
    m = _SPLIT_NAME.match(os.path.basename(path))
    if not m or int(m.group(2)) != 1 or int(m.group(3)) != count:
        raise GgufError(f"{path}: the first shard of a model split in {count} must be named "
                        f"PREFIX-00001-of-{count:05d}.gguf")
    prefix = os.path.join(os.path.dirname(path), m.group(1))
    return [f"{prefix}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def named_shards(path: str) -> list[str]:
    """``path`` and, when its name makes it the first shard of a split model, every shard of
    that model (by name; they may not exist); any other path alone."""
    m = _SPLIT_NAME.match(os.path.basename(path))
    if not m or int(m.group(2)) != 1:
        return [path]
    return shard_paths(path, int(m.group(3)))


def read_model(path: str | os.PathLike[str]) -> GgufHeader:
    """A model's header: one file, or every shard of a split model (``path`` its first), the
    tensors of all of them together under the first shard's metadata."""
    head = read_header(path)
    count = head.get("split.count", 0)
    if not isinstance(count, int) or count <= 1:
        return head
    if count > MAX_SPLITS:
        raise GgufError(f"{head.path}: split.count is {count}, past {MAX_SPLITS}")
    if head.get("split.no", 0) != 0:
        raise GgufError(f"{head.path}: shard {head.get('split.no')} of a split model, not its "
                        "first")
    paths = shard_paths(head.path, count)
    tensors = list(head.tensors)
    for i, p in enumerate(paths[1:], start=1):
        if not os.path.isfile(p):
            raise GgufError(f"{head.path}: shard {i + 1} of {count} ({os.path.basename(p)}) "
                            "is missing")
        shard = read_header(p, shard=i)
        if shard.get("split.no") != i:
            raise GgufError(f"{p}: says it is shard {shard.get('split.no')}, not {i}")
        tensors.extend(shard.tensors)
    expected = head.get("split.tensors.count")
    if isinstance(expected, int) and expected != len(tensors):
        raise GgufError(f"{head.path}: split.tensors.count is {expected}, the shards hold "
                        f"{len(tensors)} tensors")
    if len({t.name for t in tensors}) != len(tensors):
        raise GgufError(f"{head.path}: a tensor name appears in two shards")
    head.tensors = tensors
    head.shards = paths
    return head
