"""Models from Cloud Storage, against gcp-storage-emulator with the real google-cloud-storage
client (through a loopback proxy that counts downloads and injects faults).

Bucket layout (uploaded by the ``emulator`` fixture):
  models/single/smollm2.gguf           the default model
  models/dir-one/smollm2.gguf          ... next to a README
  models/dir-many/{a,b}.gguf           two (tiny, fake) models
  models/split/SmolLM2-135M-Instruct.Q4_1-0000{1,2,3}-of-00003.gguf   the default model split in 3 shards
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from app.base import gcs_client
from app.model import gcs, gcs_download
from app.model.default import SHA256

CHUNK = 8 << 20
SPLIT = "SmolLM2-135M-Instruct.Q4_1"


def opts(proxy, cache: Path, **kw) -> gcs_download.DownloadOptions:
    return gcs_download.DownloadOptions(cache_dir=cache, workers=4, slice_bytes=CHUNK,
                               emulator_host=proxy.url, **kw)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.rglob("*") if p.is_file() and ".part" in p.name)


def test_single_object_sliced_download_is_verified_and_cached(gcs_proxy, tmp_path):
    seen = []
    path = gcs_download.fetch_model("gs://models/single/smollm2.gguf", opts(gcs_proxy, tmp_path),
                           on_progress=lambda p: seen.append((p.done, p.total)))
    assert sha256(path) == SHA256
    assert gcs_proxy.faults.media_requests == -(-98362432 // CHUNK)  # one request per slice
    meta = json.loads(path.with_name(path.name + ".meta.json").read_text())
    assert meta["uri"] == "gs://models/single/smollm2.gguf" and meta["generation"] > 0
    assert seen and seen[-1] == (98362432, 98362432)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("workers", [4, 1])
def test_a_download_is_verified_as_it_arrives_not_read_back(gcs_proxy, tmp_path, monkeypatch,
                                                            workers):
    """Each slice's CRC-32C is made from its bytes as they are written and the slices' are
    joined: the finished file (4.7 GB for an 8B model) is not read again before ready."""
    def read_back(path):
        raise AssertionError(f"{path} read back")

    monkeypatch.setattr(gcs_download, "crc32c_of", read_back)
    options = dataclasses.replace(opts(gcs_proxy, tmp_path), workers=workers)
    path = gcs_download.fetch_model("gs://models/single/smollm2.gguf", options)
    assert sha256(path) == SHA256


def test_a_slice_is_read_a_mebibyte_at_a_time(gcs_proxy, tmp_path, monkeypatch):
    """The client's 8 KiB reads, a Python loop turn each, bounded the download: its stream is
    read by gcs_client.READ_BYTES (the writes count the reads)."""
    writes: list[int] = []
    real = gcs_download._OffsetWriter.write

    def counting(self, data: bytes) -> int:
        writes.append(len(data))
        return real(self, data)

    monkeypatch.setattr(gcs_download._OffsetWriter, "write", counting)
    path = gcs_download.fetch_model("gs://models/single/smollm2.gguf", opts(gcs_proxy, tmp_path))
    assert sha256(path) == SHA256
    assert sum(writes) == 98362432
    assert len(writes) <= 2 * -(-98362432 // (1 << 20))  # at 8 KiB: 12,007 writes
    assert gcs_client.raise_read_size(gcs_client.READ_BYTES) == []  # raised already, never lowered


def test_small_objects_download_in_one_stream(gcs_proxy, tmp_path):
    path = gcs_download.fetch_model("gs://models/dir-many/", opts(gcs_proxy, tmp_path, model_file="a.gguf"))
    assert path.read_bytes() == b"GGUF model a"
    assert gcs_proxy.faults.media_requests == 1


def test_directory_with_one_gguf(gcs_proxy, tmp_path):
    for uri in ("gs://models/dir-one", "gs://models/dir-one/"):
        path = gcs_download.fetch_model(uri, opts(gcs_proxy, tmp_path))
        assert path.name == "smollm2.gguf" and sha256(path) == SHA256


def test_directory_with_several_ggufs_needs_model_file(gcs_proxy, tmp_path):
    with pytest.raises(gcs.GcsError) as exc:
        gcs_download.fetch_model("gs://models/dir-many", opts(gcs_proxy, tmp_path))
    assert "a.gguf, b.gguf" in str(exc.value) and "MODEL_FILE" in str(exc.value)
    assert gcs_download.fetch_model("gs://models/dir-many", opts(gcs_proxy, tmp_path, model_file="b*")).read_bytes() == b"GGUF model b"
    with pytest.raises(gcs.GcsError, match="matches 2 models"):
        gcs_download.fetch_model("gs://models/dir-many", opts(gcs_proxy, tmp_path, model_file="*.gguf"))


def test_split_gguf_is_fetched_whole(gcs_proxy, tmp_path):
    first = gcs_download.fetch_model("gs://models/split/", opts(gcs_proxy, tmp_path))
    assert first.name == f"{SPLIT}-00001-of-00003.gguf"
    assert sorted(p.name for p in first.parent.glob("*.gguf")) == [
        f"{SPLIT}-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    # naming any shard fetches (here: finds in the cache) the whole set and loads from the first
    before = gcs_proxy.faults.media_requests
    again = gcs_download.fetch_model(f"gs://models/split/{SPLIT}-00002-of-00003.gguf", opts(gcs_proxy, tmp_path))
    assert again == first and gcs_proxy.faults.media_requests == before


def test_corrupted_download_is_refused_and_nothing_is_cached(gcs_proxy, tmp_path):
    gcs_proxy.faults.corrupt = True
    with pytest.raises(gcs.GcsError, match="crc32c mismatch"):
        gcs_download.fetch_model("gs://models/single/smollm2.gguf", opts(gcs_proxy, tmp_path))
    # only the object's single-flight lock file stays (empty; gcs_cache never deletes one)
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == [".smollm2.gguf.lock"]


@pytest.mark.parametrize("uri, needle", [
    ("gs://models/single/nope.gguf", "no such object"),
    ("gs://no-such-bucket/x.gguf", "no such object"),
    ("gs://no-such-bucket/dir/", "NotFound"),
    ("gs://models/empty-dir/", "no .gguf file"),
    ("gs://Bad_Bucket!/x", "not a valid gs:// URI"),
])
def test_missing_or_bad_uri_fails_at_once_naming_it(gcs_proxy, tmp_path, uri, needle):
    gcs_proxy.faults.sent.clear()
    with pytest.raises(gcs.GcsError) as exc:
        gcs_download.fetch_model(uri, opts(gcs_proxy, tmp_path))
    assert needle in str(exc.value) and uri in str(exc.value)
    # permanent errors are not retried: no request was sent twice
    sent = gcs_proxy.faults.sent
    assert len(sent) == len(set(sent)), sent


def test_cache_hit_downloads_nothing_and_new_generation_downloads_again(emulator, gcs_proxy, tmp_path):
    emulator.upload("models", "gen/m.gguf", data=b"GGUF generation one")
    o = opts(gcs_proxy, tmp_path)
    assert gcs_download.fetch_model("gs://models/gen/m.gguf", o).read_bytes() == b"GGUF generation one"
    assert gcs_proxy.faults.media_requests == 1
    gcs_download.fetch_model("gs://models/gen/m.gguf", o)  # a restart with the same object
    assert gcs_proxy.faults.media_requests == 1
    emulator.upload("models", "gen/m.gguf", data=b"GGUF generation two")
    assert gcs_download.fetch_model("gs://models/gen/m.gguf", o).read_bytes() == b"GGUF generation two"
    assert gcs_proxy.faults.media_requests == 2


def test_transient_errors_are_retried_and_slices_resumed(gcs_proxy, tmp_path):
    gcs_proxy.faults.fail_media = 3  # 503s
    gcs_proxy.faults.cut_media = 2  # connections cut half-way through a slice
    path = gcs_download.fetch_model("gs://models/single/smollm2.gguf", opts(gcs_proxy, tmp_path))
    assert sha256(path) == SHA256
    assert gcs_proxy.faults.fail_media == 0 and gcs_proxy.faults.cut_media == 0
    assert leftovers(tmp_path) == []


def test_not_enough_space_is_a_clear_error(gcs_proxy, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 10**6, 10**6))
    with pytest.raises(gcs.GcsError, match=r"needs 98\.4 MB .* only 1\.0 MB are free"):
        gcs_download.fetch_model("gs://models/single/smollm2.gguf", opts(gcs_proxy, tmp_path))
    assert gcs_proxy.faults.media_requests == 0


def test_local_directory_uses_the_same_rules(tmp_path):
    from app.base.state import LoadState
    from app.model.source import resolve
    from app.settings import Settings

    (tmp_path / "a.gguf").write_bytes(b"GGUF a")
    assert resolve(Settings(model=str(tmp_path)), LoadState()) == str(tmp_path / "a.gguf")
    (tmp_path / "b.gguf").write_bytes(b"GGUF b")
    with pytest.raises(Exception, match="MODEL_FILE"):
        resolve(Settings(model=f"file://{tmp_path}"), LoadState())
    assert resolve(Settings(model=str(tmp_path), model_file="b.gguf"), LoadState()) == str(tmp_path / "b.gguf")


# ---- end to end: the server started the way Vertex AI starts it -----------------------------


# ---- hostile names, shared caches, missing checksums (security review L4) ------------------


@pytest.mark.parametrize("name", ["a/../../etc/x.gguf", "/etc/x.gguf", "a//b.gguf", "a\\b.gguf", "./x.gguf", "a\x00.gguf"])
def test_object_names_that_leave_the_cache_are_refused(tmp_path, name):
    obj = gcs.GcsObject("models", name, 1, 1, "")
    with pytest.raises(gcs.GcsError, match="cache path"):
        gcs_download.cache_path(tmp_path, obj)


def test_a_live_process_s_partial_download_is_left_alone(tmp_path):
    import os
    import socket
    import subprocess
    import sys

    dest = tmp_path / "gcs" / "models" / "m[1].gguf"
    dest.parent.mkdir(parents=True)
    host = socket.gethostname()
    live = dest.with_name(f".{dest.name}.part-{host}-{os.getpid()}")
    other_host = dest.with_name(f".{dest.name}.part-another-host-1")
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout.strip()
    dead = dest.with_name(f".{dest.name}.part-{host}-{dead_pid}")
    abandoned = dest.with_name(f".{dest.name}.part-another-host-2")
    for part in (live, other_host, dead, abandoned):
        part.write_bytes(b"x")
    old = time.time() - gcs_download.PART_STALE_SECONDS - 60
    os.utime(abandoned, (old, old))
    gcs_download._remove_stale_parts(dest)
    assert live.exists() and other_host.exists()
    assert not dead.exists() and not abandoned.exists()


def test_an_object_without_crc32c_is_checked_by_md5_or_loaded_with_a_warning(tmp_path, caplog):
    import base64

    data = b"GGUF bytes"
    path = tmp_path / "m.gguf"
    path.write_bytes(data)
    md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
    gcs_download.verify(gcs.GcsObject("b", "m.gguf", len(data), 1, "", md5), path)
    with pytest.raises(gcs.GcsError, match="md5 mismatch"):
        gcs_download.verify(gcs.GcsObject("b", "m.gguf", len(data), 1, "", md5.swapcase()), path)
    with caplog.at_level("WARNING"):
        gcs_download.verify(gcs.GcsObject("b", "m.gguf", len(data), 1, "", ""), path)
    assert "not verified" in caplog.text


def test_a_cached_file_changed_behind_the_cache_s_back_is_fetched_again(gcs_proxy, tmp_path):
    uri = "gs://models/dir-many/"
    path = gcs_download.fetch_model(uri, opts(gcs_proxy, tmp_path, model_file="a.gguf"))
    path.write_bytes(b"GGUF model X")  # same size, other bytes: the meta still matches
    before = gcs_proxy.faults.media_requests
    again = gcs_download.fetch_model(uri, opts(gcs_proxy, tmp_path, model_file="a.gguf"))
    assert again.read_bytes() == b"GGUF model a"
    assert gcs_proxy.faults.media_requests == before + 1


# ---- a cache hit trusts a file that stats as it did when verified -------------------------------


@pytest.fixture
def hashes(monkeypatch) -> list[Path]:
    """Every cached file read back to hash it (gcs_download.crc32c_of), in order."""
    seen: list[Path] = []
    real = gcs_download.crc32c_of

    def counting(path: Path) -> str:
        seen.append(Path(path))
        return real(path)

    monkeypatch.setattr(gcs_download, "crc32c_of", counting)
    return seen


def cached_a(proxy, cache: Path) -> Path:
    return gcs_download.fetch_model("gs://models/dir-many/", opts(proxy, cache, model_file="a.gguf"))


def test_an_unchanged_cache_hit_is_not_read_again(gcs_proxy, tmp_path, hashes):
    path = cached_a(gcs_proxy, tmp_path)
    meta = json.loads(path.with_name(path.name + ".meta.json").read_text())
    st = path.stat()
    assert meta["file"] == {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}
    for _ in range(2):
        assert cached_a(gcs_proxy, tmp_path) == path
    assert hashes == []  # neither the download nor the two hits read the file
    assert gcs_proxy.faults.media_requests == 1


def test_a_touched_cache_hit_is_hashed_once_then_trusted(gcs_proxy, tmp_path, hashes):
    path = cached_a(gcs_proxy, tmp_path)
    os.utime(path)  # the same bytes, another mtime
    assert cached_a(gcs_proxy, tmp_path).read_bytes() == b"GGUF model a"
    assert hashes == [path]  # hashed, passed: recorded anew
    cached_a(gcs_proxy, tmp_path)
    assert hashes == [path] and gcs_proxy.faults.media_requests == 1


def test_a_replaced_cache_file_with_the_recorded_mtime_is_hashed(gcs_proxy, tmp_path, hashes):
    """Another inode (the file replaced by a copy, its mtime set back to the recorded one)."""
    path = cached_a(gcs_proxy, tmp_path)
    st = path.stat()
    copy = path.with_name("copy")
    copy.write_bytes(b"GGUF model Z")
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(copy, path)
    assert cached_a(gcs_proxy, tmp_path).read_bytes() == b"GGUF model a"
    assert hashes == [path]  # hashed, refused, downloaded again
    assert gcs_proxy.faults.media_requests == 2


def test_a_cache_file_written_in_place_at_once_is_hashed_and_refused(gcs_proxy, tmp_path, hashes):
    """Written right after the download (within the clock's tick, where the mtime alone could
    stay the same): the verified file's stamped mtime is in the past, the write's is not."""
    path = cached_a(gcs_proxy, tmp_path)
    with open(path, "r+b") as fh:
        fh.write(b"X")
    assert cached_a(gcs_proxy, tmp_path).read_bytes() == b"GGUF model a"
    assert hashes == [path] and gcs_proxy.faults.media_requests == 2


def test_a_cache_file_of_another_size_is_downloaded_again(gcs_proxy, tmp_path, hashes):
    path = cached_a(gcs_proxy, tmp_path)
    with open(path, "ab") as fh:
        fh.write(b"more")
    assert cached_a(gcs_proxy, tmp_path).read_bytes() == b"GGUF model a"
    assert hashes == [] and gcs_proxy.faults.media_requests == 2  # not a hit at all


def test_a_sidecar_without_a_record_is_hashed_then_recorded(gcs_proxy, tmp_path, hashes):
    """A cache written before the records were kept: hashed once, then trusted."""
    path = cached_a(gcs_proxy, tmp_path)
    meta_file = path.with_name(path.name + ".meta.json")
    meta = json.loads(meta_file.read_text())
    del meta["file"]
    meta_file.write_text(json.dumps(meta))
    cached_a(gcs_proxy, tmp_path)
    cached_a(gcs_proxy, tmp_path)
    assert hashes == [path] and "file" in json.loads(meta_file.read_text())
    assert gcs_proxy.faults.media_requests == 1
