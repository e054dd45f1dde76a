"""Prompts kept across restarts (app/engine/prompt_store.py): an entry written as a file is
found by a fresh store's scan and read back byte for byte; a file of another identity or key
scope is never used; a truncated or corrupt file is refused with a warning and deleted; the
folder stays under its bound, oldest out first; and the same through the storage emulator."""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

import numpy as np
import pytest
from google.cloud.storage import Blob

from app.engine import prompt_file, prompt_store
from app.engine.prompt_cache import Entry
from app.engine.prompt_store import PromptStore, identity
from app.engine.tokens import Mark
from tests.support.gcs_emulator import Emulator

IDENT = identity({"model": "sha256:abc", "llama.cpp": "b1234", "type_k": "f16"})
OTHER = identity({"model": "sha256:abc", "llama.cpp": "b1235", "type_k": "f16"})
IMAGE = Mark(3, 4, "d" * 64)


def _blob(n: int, seed: int = 0):
    data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    return (ctypes.c_uint8 * n).from_buffer_copy(data.tobytes())


def _entry(scope: str, tokens: list[int], size: int = 1000, marks=(), seed: int = 0) -> Entry:
    n_pos = len(tokens) - sum(m.n - 1 for m in marks)  # as if M-RoPE: an image moves it by 1
    return Entry(scope, np.asarray(tokens, dtype=np.int32), tuple(marks), n_pos,
                 _blob(size, seed))


def _with_image(n: int) -> list[int]:
    return [1, 2, 3, -5, -5, -5, -5, *range(10, 10 + n - 7)]


def _files(root: Path, ident: str = IDENT) -> list[Path]:
    return sorted((root / ident[:16]).glob("*.kv"))


def _same(a: Entry, b: Entry) -> None:
    assert a.scope == b.scope and a.n_pos == b.n_pos and a.marks == b.marks
    assert a.tokens.dtype == np.int32 and np.array_equal(a.tokens, b.tokens)
    assert bytes(a.blob) == bytes(b.blob) and isinstance(a.blob, ctypes.Array)


def test_identity_is_over_sorted_parts():
    assert identity({"a": "1", "b": "2"}) == identity({"b": "2", "a": "1"})
    assert identity({"a": "1", "b": "2"}) != identity({"a": "1", "b": "3"})
    assert identity({"a": "1=b"}) != identity({"a": "1", "b": ""})
    assert len(IDENT) == 64


def test_an_entry_written_is_found_and_read_back_by_the_next_process(tmp_path):
    entry = _entry("key-a", _with_image(40), size=3 << 20, marks=(IMAGE,))
    assert PromptStore(str(tmp_path), IDENT, 1 << 30).write(entry)
    (path,) = _files(tmp_path)
    assert path.name.startswith(prompt_store.scope_digest("key-a")[:16] + "-")

    fresh = PromptStore(str(tmp_path), IDENT, 1 << 30)  # a restart
    (stored,) = fresh.scan()
    assert stored.size == path.stat().st_size and stored.blob_size == 3 << 20
    assert stored.marks == (IMAGE,) and stored.n_pos == entry.n_pos
    prompt = np.asarray([*_with_image(40), 99, 98], dtype=np.int32)
    assert fresh.best("key-a", prompt, (IMAGE,)) == (stored, 40)
    # the same placeholder ids for another image: the prefix stops before it
    assert fresh.best("key-a", prompt, (Mark(3, 4, "e" * 64),)) == (stored, 3)
    _same(fresh.read(stored, "key-a"), entry)


def test_another_identity_never_sees_the_file(tmp_path):
    assert PromptStore(str(tmp_path), IDENT, 1 << 30).write(_entry("k", list(range(1, 80))))
    other = PromptStore(str(tmp_path), OTHER, 1 << 30)
    assert other.scan() == [] and other.best("k", np.arange(1, 80, dtype=np.int32)) == (None, 0)
    assert len(_files(tmp_path)) == 1  # not deleted either


def test_a_file_of_another_identity_in_the_folder_is_refused(tmp_path, caplog):
    """A file copied into this identity's folder still carries the identity that wrote it."""
    PromptStore(str(tmp_path), OTHER, 1 << 30).write(_entry("k", list(range(1, 80))))
    (path,) = _files(tmp_path, OTHER)
    os.makedirs(tmp_path / IDENT[:16])
    path.rename(tmp_path / IDENT[:16] / path.name)
    with caplog.at_level(logging.WARNING):
        assert PromptStore(str(tmp_path), IDENT, 1 << 30).scan() == []
    assert "identity" in caplog.text and path.name in caplog.text and _files(tmp_path) == []


def test_another_scope_gets_nothing(tmp_path, caplog):
    store = PromptStore(str(tmp_path), IDENT, 1 << 30)
    tokens = list(range(1, 80))
    assert store.write(_entry("key-a", tokens))
    prompt = np.asarray(tokens + [5], dtype=np.int32)
    assert store.best("key-b", prompt) == (None, 0)
    stored, n = store.best("key-a", prompt)
    assert n == 79
    with caplog.at_level(logging.WARNING):
        assert store.read(stored, "key-b") is None
    assert "another key scope" in caplog.text
    assert len(_files(tmp_path)) == 1 and store.read(stored, "key-a") is not None


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


CORRUPTIONS = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:-100]),
    "longer": lambda p: p.write_bytes(p.read_bytes() + b"\0"),
    "blob byte": lambda p: _flip(p, p.stat().st_size - 500),
    "trailer byte": lambda p: _flip(p, p.stat().st_size - 2),
}
HEAD_CORRUPTIONS = {
    "magic": lambda p: _flip(p, 0),
    "scope digest": lambda p: _flip(p, 16 + 40),
    "n_pos": lambda p: _flip(p, 16 + 64 + 8),
    "token byte": lambda p: _flip(p, 250),
    "empty": lambda p: p.write_bytes(b""),
}


@pytest.mark.parametrize("how", [*CORRUPTIONS, *HEAD_CORRUPTIONS])
def test_a_corrupt_file_is_refused_with_a_warning_and_deleted(tmp_path, caplog, how):
    store = PromptStore(str(tmp_path), IDENT, 1 << 30)
    entry = _entry("k", list(range(1, 80)), size=5000)
    assert store.write(entry)
    (path,) = _files(tmp_path)
    stored, _ = store.best("k", entry.tokens)
    {**CORRUPTIONS, **HEAD_CORRUPTIONS}[how](path)
    with caplog.at_level(logging.WARNING):
        assert store.read(stored, "k") is None
    assert path.name in caplog.text
    assert not path.exists() and store.best("k", entry.tokens) == (None, 0)


@pytest.mark.parametrize("how", [*CORRUPTIONS, *HEAD_CORRUPTIONS])
def test_a_scan_skips_a_bad_head_and_a_wrong_size(tmp_path, caplog, how):
    """A scan reads heads only: a file whose head is bad, or whose size disagrees with it, is
    skipped (and deleted: this folder is local); a bad blob is found by the read."""
    store = PromptStore(str(tmp_path), IDENT, 1 << 30)
    assert store.write(_entry("k", list(range(1, 80)), size=5000))
    (path,) = _files(tmp_path)
    {**CORRUPTIONS, **HEAD_CORRUPTIONS}[how](path)
    with caplog.at_level(logging.WARNING):
        found = PromptStore(str(tmp_path), IDENT, 1 << 30).scan()
    if how in ("blob byte", "trailer byte"):
        assert len(found) == 1 and path.exists()
    else:
        assert found == [] and not path.exists() and path.name in caplog.text


def test_a_file_of_another_format_version_is_left_alone(tmp_path, caplog):
    """A replica of another release may share the folder: its files are not used, nor deleted."""
    store = PromptStore(str(tmp_path), IDENT, 1 << 30)
    entry = _entry("k", list(range(1, 80)))
    assert store.write(entry)
    (path,) = _files(tmp_path)
    stored, _ = store.best("k", entry.tokens)
    _flip(path, 8)
    with caplog.at_level(logging.WARNING):
        assert store.read(stored, "k") is None
        assert PromptStore(str(tmp_path), IDENT, 1 << 30).scan() == []
    assert "format version" in caplog.text and path.exists() and len(store) == 0


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 20])
def test_a_file_arrives_in_chunks_of_any_size(tmp_path, chunk):
    """A download hands the bytes over in whatever pieces the connection gives."""
    entry = _entry("k", _with_image(60), size=3000, marks=(IMAGE,))
    assert PromptStore(str(tmp_path), IDENT, 1 << 30).write(entry)
    (path,) = _files(tmp_path)
    data = path.read_bytes()
    sink = prompt_file.Assembler(IDENT, path.name, prompt_store.scope_digest("k"), None)
    for off in range(0, len(data), chunk):
        sink.write(data[off:off + chunk])
    _same(sink.finish("k"), entry)
    sink = prompt_file.Assembler(IDENT, path.name, prompt_store.scope_digest("k"), None)
    sink.write(data)
    with pytest.raises(prompt_file.BadFile, match="longer"):
        sink.write(b"x")


def test_a_renamed_file_is_refused(tmp_path, caplog):
    """The name says which tokens a file holds: a file under another's name is not used."""
    store = PromptStore(str(tmp_path), IDENT, 1 << 30)
    store.write(_entry("k", list(range(1, 80))))
    (path,) = _files(tmp_path)
    path.rename(path.with_name(path.name[:17] + "0" * 24 + ".kv"))
    with caplog.at_level(logging.WARNING):
        assert PromptStore(str(tmp_path), IDENT, 1 << 30).scan() == []
    assert "name does not match" in caplog.text


def test_the_bound_deletes_the_oldest_files_first(tmp_path):
    store = PromptStore(str(tmp_path), IDENT, 1 << 30)
    for i in range(3):
        assert store.write(_entry("k", [100 * i + t for t in range(1, 80)], size=10_000))
    size = _files(tmp_path)[0].stat().st_size
    for age, s in enumerate(sorted(store.files(), key=lambda s: s.tokens[0])):
        os.utime(tmp_path / IDENT[:16] / s.name, (1e9 + age, 1e9 + age))  # 1st oldest
    first, second, third = sorted(store.files(), key=lambda s: s.tokens[0])

    bounded = PromptStore(str(tmp_path), IDENT, 3 * size + size // 2)
    bounded.scan()
    assert bounded.write(_entry("k", list(range(500, 580)), size=10_000))
    names = {p.name for p in _files(tmp_path)}
    assert first.name not in names and {second.name, third.name} <= names and len(names) == 3
    assert len(bounded) == 3
    # an entry over the bound alone is not written, and deletes nothing
    assert not bounded.write(_entry("k", list(range(700, 780)), size=4 * size))
    assert {p.name for p in _files(tmp_path)} == names


def test_a_write_already_held_is_skipped_and_a_longer_one_replaces_the_shorter(tmp_path):
    store = PromptStore(str(tmp_path), IDENT, 1 << 30)
    long_ = list(range(1, 200))
    assert store.write(_entry("k", long_))
    assert not store.write(_entry("k", long_[:150]))  # held by the longer file
    assert not store.write(_entry("k", long_))  # the same
    assert store.write(_entry("j", long_[:150]))  # another scope's own
    assert len(_files(tmp_path)) == 2
    assert store.write(_entry("k", long_ + [7, 8]))
    (k_file,) = [s for s in store.files() if s.scope_digest == prompt_store.scope_digest("k")]
    assert len(k_file.tokens) == 201 and len(_files(tmp_path)) == 2


def test_a_recurrent_model_keeps_only_whole_prefixes(tmp_path):
    store = PromptStore(str(tmp_path), IDENT, 1 << 30, whole_only=True)
    long_ = list(range(1, 200))
    assert store.write(_entry("k", long_))
    assert store.write(_entry("k", long_[:150]))  # a prompt may diverge after 150: kept
    prompt = np.asarray(long_[:160] + [0], dtype=np.int32)
    stored, n = store.best("k", prompt)
    assert n == 150 and len(stored.tokens) == 150


def test_a_store_that_cannot_write_says_so_and_never_raises(tmp_path, caplog):
    store = PromptStore(str(tmp_path), IDENT, 1 << 30)
    (tmp_path / IDENT[:16]).chmod(0o500)
    try:
        with caplog.at_level(logging.WARNING):
            ok = store.write(_entry("k", list(range(1, 80))))
    finally:
        (tmp_path / IDENT[:16]).chmod(0o700)
    if os.geteuid() != 0:  # root writes anyway
        assert not ok and "not written" in caplog.text
        assert list((tmp_path / IDENT[:16]).iterdir()) == []


# ---- Cloud Storage, through the emulator ---------------------------------------------------


@pytest.fixture(scope="module")
def gcs_emulator():
    emu = Emulator()
    try:
        emu.client.create_bucket("prompts")
        yield emu
    finally:
        emu.stop()


def test_gcs_round_trip_and_a_corrupt_object(gcs_emulator, caplog, monkeypatch):
    """Through the emulator: a blob over the multipart limit (a resumable upload from the
    stream), heads read by range, a flipped byte refused and the object deleted."""
    root = "gs://prompts/cache/run1"
    big = _entry("key-a", list(range(1, 300)), size=9 << 20, seed=1)
    small = _entry("key-a", list(range(1000, 1100)), size=3000, seed=2)
    store = PromptStore(root, IDENT, 1 << 30, emulator_host=gcs_emulator.url)
    assert store.write(big) and store.write(small)
    assert not store.write(_entry("key-a", list(range(1, 200))))  # held already

    fresh = PromptStore(root, IDENT, 1 << 30, emulator_host=gcs_emulator.url)
    ranges = []
    real = Blob.download_as_bytes

    def ranged(self, *args, **kw):
        ranges.append((kw.get("start"), kw.get("end")))
        return real(self, *args, **kw)

    with monkeypatch.context() as m:
        m.setattr(Blob, "download_as_bytes", ranged)
        assert len(fresh.scan()) == 2
    # one ranged read per file, of its head: the 9 MB blob is not downloaded
    assert len(ranges) == 2 and all(start == 0 and end < 256 << 10 for start, end in ranges)
    assert PromptStore(root, OTHER, 1 << 30, emulator_host=gcs_emulator.url).scan() == []
    stored, n = fresh.best("key-a", np.arange(1, 310, dtype=np.int32))
    assert n == 299 and fresh.best("key-b", np.arange(1, 310, dtype=np.int32)) == (None, 0)
    _same(fresh.read(stored, "key-a"), big)

    bucket = gcs_emulator.client.bucket("prompts")
    name = f"cache/run1/{IDENT[:16]}/{stored.name}"
    data = bytearray(bucket.blob(name).download_as_bytes())
    data[-1000] ^= 1
    bucket.blob(name).upload_from_string(bytes(data))
    with caplog.at_level(logging.WARNING):
        assert fresh.read(stored, "key-a") is None
    assert "checksum mismatch" in caplog.text and stored.name in caplog.text
    assert bucket.get_blob(name) is None and len(fresh) == 1


def test_gcs_bound_deletes_the_oldest(gcs_emulator):
    root = "gs://prompts/bounded"
    store = PromptStore(root, IDENT, 1 << 30, emulator_host=gcs_emulator.url)
    assert store.write(_entry("k", list(range(1, 80)), size=10_000))
    (first,) = store.files()
    bounded = PromptStore(root, IDENT, first.size + first.size // 2,
                          emulator_host=gcs_emulator.url)
    assert bounded.write(_entry("k", list(range(100, 180)), size=10_000))
    names = [b.name.rsplit("/", 1)[1]
             for b in gcs_emulator.client.list_blobs("prompts", prefix="bounded/")]
    assert len(names) == 1 and names[0] != first.name


def test_gcs_a_long_prompt_head_takes_a_second_range(gcs_emulator):
    """A 70k-token prompt's head is over the first ranged read: the rest of it comes next."""
    root = "gs://prompts/long"
    entry = _entry("k", list(range(1, 70_001)), size=2000)
    assert PromptStore(root, IDENT, 1 << 30, emulator_host=gcs_emulator.url).write(entry)
    fresh = PromptStore(root, IDENT, 1 << 30, emulator_host=gcs_emulator.url)
    (stored,) = fresh.scan()
    assert len(stored.tokens) == 70_000
    _same(fresh.read(stored, "k"), entry)
