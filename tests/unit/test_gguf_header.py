"""app.model.gguf_header: the metadata and tensor infos of real GGUFs read as gguf-py's reader
reads them (the default model, tiny models of several builders, a split model's shards), ggml's
type table as the ggml llama.cpp ships defines it, and hostile or corrupt files refused with a
message naming the fault, never a crash or an allocation the file asks for."""

from __future__ import annotations

import ctypes
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from app.model.gguf_header import (
    GGML_TYPES,
    ArrayInfo,
    GgufError,
    read_header,
    read_model,
    shard_paths,
)
from tests.support.gguf_split import split_gguf
from tests.support.tiny_bert import build_tiny_bert
from tests.support.tiny_moe import build_moe
from tests.support.tiny_qwen2vl import build_projector
from tests.support.tiny_shapes import Shape, build_shape


def _same_as_gguf_py(path: Path) -> None:
    ours = read_header(path)
    theirs = GGUFReader(str(path))
    for key, f in theirs.fields.items():
        if key.startswith("GGUF."):
            continue
        got = ours.metadata[key]
        if f.types[0] == GGUFValueType.ARRAY:
            want = f.contents()
            if isinstance(got, ArrayInfo):
                assert got.count == len(want) and got.element_type == f.types[-1], key
            else:
                assert list(got) == pytest.approx(list(want)) if f.types[-1] in (
                    GGUFValueType.FLOAT32, GGUFValueType.FLOAT64) else list(got) == list(want), key
        elif f.types[0] in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
            assert got == pytest.approx(f.contents()), key
        else:
            assert got == f.contents(), key
    assert set(ours.metadata) == {k for k in theirs.fields if not k.startswith("GGUF.")}
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, t in zip(ours.tensors, theirs.tensors, strict=True):
        assert mine.shape == tuple(int(d) for d in t.shape), t.name
        assert mine.ggml_type == int(t.tensor_type), t.name
        assert mine.nbytes == int(t.n_bytes), t.name
        assert ours.data_offset + mine.offset == int(t.data_offset), t.name


def test_the_default_model_reads_as_gguf_py_reads_it(default_model):
    _same_as_gguf_py(default_model)
    h = read_header(default_model)
    assert (h.version, h.architecture) == (3, "llama")
    assert h.arch("block_count") == 30 and h.arch("attention.head_count_kv") == 3
    assert h.count("tokenizer.ggml.tokens") == 49152  # summarized, not decoded
    assert isinstance(h.metadata["tokenizer.ggml.tokens"], ArrayInfo)
    # every byte of the file past the header is a tensor's (llama.cpp's model buffer: 92.10 MiB)
    assert round(h.tensor_bytes / 2**20, 2) == 92.10


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory) -> Path:
    """A tokenizer of a hundred-odd tokens (tiny_bert's), so the models build in no time."""
    return build_tiny_bert(tmp_path_factory.mktemp("vocab") / "bert.gguf")


@pytest.mark.parametrize("build", ["moe", "bert", "projector", "gemma3", "q8_0"])
def test_tiny_models_read_as_gguf_py_reads_them(build, small_vocab, tmp_path):
    path = tmp_path / "m.gguf"
    {"moe": lambda: build_moe(path, small_vocab),
     "bert": lambda: build_tiny_bert(path),
     "projector": lambda: build_projector(path),
     "gemma3": lambda: build_shape(path, small_vocab, Shape(arch="gemma3", n_layer=2)),
     "q8_0": lambda: build_shape(path, small_vocab, Shape(matrix="Q8_0", n_layer=1)),
     }[build]()
    _same_as_gguf_py(path)


def test_split_shards_read_as_one_model(small_vocab, tmp_path):
    model = build_shape(tmp_path / "model.gguf", small_vocab, Shape(n_layer=3))
    (tmp_path / "split").mkdir()
    shards = split_gguf(model, tmp_path / "split", 3)
    whole = read_model(model)
    split = read_model(shards[0])
    assert split.shards == [str(s) for s in shards]
    assert [t.name for t in split.tensors] == [t.name for t in whole.tensors]
    assert split.tensor_bytes == whole.tensor_bytes
    assert [t.shard for t in split.tensors][-1] == 2
    for shard in shards:
        _same_as_gguf_py(shard)
    shards[1].unlink()
    with pytest.raises(GgufError, match=r"shard 2 of 3 \(.*-00002-of-00003.gguf\) is missing"):
        read_model(shards[0])


def test_shard_names_follow_llama_cpp():
    assert shard_paths("/m/x-00001-of-00002.gguf", 2) == ["/m/x-00001-of-00002.gguf",
                                                          "/m/x-00002-of-00002.gguf"]
    with pytest.raises(GgufError, match="must be named"):
        shard_paths("/m/x.gguf", 2)


def test_the_type_table_is_ggml_s():
    """Every type of the table has the block and byte sizes the ggml llama.cpp ships gives it,
    and every type that ggml still has is in the table."""
    from llama_cpp import llama_cpp as ll

    ggml = ctypes.CDLL(ll._lib._name, handle=ll._lib._handle)
    ggml.ggml_type_size.restype = ctypes.c_size_t
    ggml.ggml_blck_size.restype = ctypes.c_int64
    ggml.ggml_type_name.restype = ctypes.c_char_p
    for tid in range(max(GGML_TYPES) + 1):
        block = ggml.ggml_blck_size(tid)
        if tid in GGML_TYPES:
            name, per, size = GGML_TYPES[tid]
            assert (ggml.ggml_type_name(tid).decode(), block, ggml.ggml_type_size(tid)) == \
                (name, per, size)
        else:
            assert block == 0, f"ggml type {tid} is missing from the table"


# ---- hostile and corrupt files -------------------------------------------------------------

def _header(version: int = 3, n_tensors: int = 0, n_kv: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def _kv(key: str, vtype: int, payload: bytes) -> bytes:
    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", vtype) + payload


def _write(tmp_path: Path, data: bytes) -> Path:
    p = tmp_path / "bad.gguf"
    p.write_bytes(data + b"\0" * 64)
    return p


@pytest.mark.parametrize(("data", "says"), [
    (b"GGML" + b"\0" * 40, "bad magic"),
    (_header(version=1), "GGUF version 1"),
    (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "big-endian"),
    (_header(n_kv=1 << 60), "more than the file can hold"),
    (_header(n_tensors=1 << 60), "more than the file can hold"),
    (_header(n_kv=1) + _kv("general.name", 8, struct.pack("<Q", 1 << 40)), "past the limit"),
    (_header(n_kv=1) + _kv("a", 8, struct.pack("<Q", 1 << 20)), "past the end of the file"),
    (_header(n_kv=1) + _kv("a", 9, struct.pack("<IQ", 4, 1 << 50)), "claims"),
    (_header(n_kv=1) + _kv("a", 9, struct.pack("<IQ", 9, 1)), "array of arrays"),
    (_header(n_kv=1) + _kv("a", 42, b""), "unknown value type 42"),
    (_header(n_kv=2) + _kv("a", 4, b"\1\0\0\0") * 2, "appears twice"),
    (_header(n_kv=1) + _kv("general.alignment", 4, struct.pack("<I", 3)), "power of two"),
])
def test_a_bad_header_is_refused_by_name(tmp_path, data, says):
    with pytest.raises(GgufError, match=says):
        read_header(_write(tmp_path, data))


def _one_tensor(tmp_path: Path, dims: list[int], ggml_type: int = 0, offset: int = 0,
                name: str = "t") -> Path:
    n = name.encode()
    info = struct.pack("<Q", len(n)) + n + struct.pack("<I", len(dims))
    info += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", ggml_type, offset)
    return _write(tmp_path, _header(n_tensors=1) + info)


@pytest.mark.parametrize(("dims", "kw", "says"), [
    ([4, 4, 4, 4, 4], {}, "5 dimensions"),
    ([1 << 40, 1 << 40], {}, "shape too large"),
    ([4], {"ggml_type": 4}, "unknown ggml type 4"),
    ([31], {"ggml_type": 2}, "not whole q4_0 blocks of 32"),
    ([4], {"offset": 3}, "not aligned"),
    ([1 << 20], {}, "runs past the end of the file"),
    ([4], {"name": "x" * 64}, "longer than 63 bytes"),
])
def test_a_bad_tensor_is_refused_by_name(tmp_path, dims, kw, says):
    with pytest.raises(GgufError, match=says):
        read_header(_one_tensor(tmp_path, dims, **kw))


def test_truncated_anywhere_is_an_error_not_a_crash(default_model, tmp_path):
    """The default model's header cut at many places: each a GgufError."""
    head = default_model.read_bytes()[:4096]
    for cut in range(0, 4096, 97):
        p = tmp_path / "cut.gguf"
        p.write_bytes(head[:cut])
        with pytest.raises(GgufError):
            read_header(p)


def test_a_long_array_is_summarized_and_a_short_one_decoded(tmp_path):
    p = tmp_path / "a.gguf"
    w = GGUFWriter(str(p), "llama")
    w.add_array("x.short", [1, 2, 3])
    w.add_array("x.long", list(range(5000)))
    w.add_array("x.words", [f"w{i}" for i in range(5000)])
    w.add_tensor("t", np.zeros(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    h = read_header(p)
    assert h.get("x.short") == (1, 2, 3)
    assert h.count("x.long") == 5000 and isinstance(h.get("x.long"), ArrayInfo)
    assert h.count("x.words") == 5000
    assert [t.name for t in h.tensors] == ["t"]


@pytest.mark.parametrize("tail", [
    struct.pack("<Q", 1 << 20),  # the last string's length runs past the end
    b"\x05\0\0",  # the file ends inside a length
])
def test_a_long_string_array_cut_short_is_refused_by_name(tmp_path, tail):
    """A vocabulary (skipped, not decoded) whose strings run past the end of the file."""
    words = b"".join(struct.pack("<Q", 2) + b"w%d" % (i % 10) for i in range(5000))
    data = _header(n_kv=1) + _kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 5001))
    p = tmp_path / "cut.gguf"
    p.write_bytes(data + words + tail)  # no padding: the end is where the array says
    with pytest.raises(GgufError, match="element of tokenizer.ggml.tokens runs past the end"):
        read_header(p)
