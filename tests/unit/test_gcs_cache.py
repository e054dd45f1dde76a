"""The download cache's bound (MODEL_CACHE_MAX_GB) and its single-flight downloads
(app/model/gcs_cache.py), against gcp-storage-emulator through the counting proxy.

Objects of this file live in their own bucket, ``cachetest`` (uploaded here): ``lru/{a,b,c}.gguf``
of 100 bytes each, and ``slow/m.gguf`` of 64 KiB.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from app.base.state import LoadState
from app.engine.file_holds import FileHolds, collecting, with_shards
from app.model import gcs, gcs_cache, gcs_download
from app.model.source import resolve
from app.settings import Settings

BUCKET = "cachetest"


@pytest.fixture(scope="module")
def objects(emulator) -> dict[str, bytes]:
    data = {f"lru/{n}.gguf": b"GGUF" + n.encode() * 96 for n in "abc"}
    data["slow/m.gguf"] = b"GGUF" + bytes(range(256)) * 256
    for name, body in data.items():
        emulator.upload(BUCKET, name, data=body)
    return data


def opts(proxy, cache: Path, bound: int | None = None) -> gcs_download.DownloadOptions:
    return gcs_download.DownloadOptions(cache_dir=cache, emulator_host=proxy.url,
                                        cache_max_bytes=bound)


def fetch(proxy, cache: Path, name: str, bound: int | None = 250) -> Path:
    return gcs_download.fetch_model(f"gs://{BUCKET}/{name}", opts(proxy, cache, bound))


def entry(cache: Path, name: str) -> Path:
    return cache / "gcs" / BUCKET / name


def age(cache: Path, name: str, seconds: float) -> None:
    """Make an entry's last use ``seconds`` ago (rather than count on mtime resolution)."""
    when = time.time() - seconds
    os.utime(gcs_cache.meta_path(entry(cache, name)), (when, when))


def wait_until(check, what: str, tries: int = 400) -> None:
    for _ in range(tries):
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


def test_the_least_recently_used_entry_goes_and_a_hit_counts_as_a_use(
        objects, gcs_proxy, tmp_path, caplog):
    fetch(gcs_proxy, tmp_path, "lru/a.gguf")
    fetch(gcs_proxy, tmp_path, "lru/b.gguf")
    age(tmp_path, "lru/a.gguf", 100)
    age(tmp_path, "lru/b.gguf", 50)
    fetch(gcs_proxy, tmp_path, "lru/a.gguf")  # a cache hit: a is now the most recent
    assert gcs_proxy.faults.media_requests == 2
    with caplog.at_level(logging.INFO, logger="app.model.gcs_cache"):
        path = fetch(gcs_proxy, tmp_path, "lru/c.gguf")  # 300 > 250: one must go
    assert path.read_bytes() == objects["lru/c.gguf"]
    assert not entry(tmp_path, "lru/b.gguf").exists()
    assert not gcs_cache.meta_path(entry(tmp_path, "lru/b.gguf")).exists()
    assert entry(tmp_path, "lru/a.gguf").read_bytes() == objects["lru/a.gguf"]
    assert "deleted cachetest/lru/b.gguf (100 bytes" in caplog.text
    assert "MODEL_CACHE_MAX_GB 2.5e-07" in caplog.text


def test_an_entry_in_use_is_skipped(objects, gcs_proxy, tmp_path):
    a = fetch(gcs_proxy, tmp_path, "lru/a.gguf")
    fetch(gcs_proxy, tmp_path, "lru/b.gguf")
    age(tmp_path, "lru/a.gguf", 100)  # a is the oldest, but an engine holds it
    holds = FileHolds()
    holds.hold(str(a))
    try:
        fetch(gcs_proxy, tmp_path, "lru/c.gguf")
        assert a.is_file() and not entry(tmp_path, "lru/b.gguf").exists()
    finally:
        holds.release()


def test_a_download_that_cannot_fit_says_what_is_in_use(objects, gcs_proxy, tmp_path):
    holds = FileHolds()
    with collecting(holds):  # as an engine resolving its files holds them
        fetch(gcs_proxy, tmp_path, "lru/a.gguf")
        fetch(gcs_proxy, tmp_path, "lru/b.gguf")
    assert sorted(Path(p).name for p in holds.paths) == ["a.gguf", "b.gguf"]
    try:
        before = gcs_proxy.faults.media_requests
        with pytest.raises(gcs.GcsError) as exc:
            fetch(gcs_proxy, tmp_path, "lru/c.gguf")
        msg = str(exc.value)
        assert msg.startswith("model gs://cachetest/lru/c.gguf: needs 100 bytes")
        assert "MODEL_CACHE_MAX_GB bounds to 250 bytes" in msg
        assert "200 bytes of it are in use" in msg
        assert "cachetest/lru/a.gguf" in msg and "cachetest/lru/b.gguf" in msg
        assert gcs_proxy.faults.media_requests == before  # refused before downloading
        assert entry(tmp_path, "lru/a.gguf").is_file() and entry(tmp_path, "lru/b.gguf").is_file()
        assert not entry(tmp_path, "lru/c.gguf").exists()
        assert not [p for p in (tmp_path / "gcs").rglob(".*part-*")]
    finally:
        holds.release()
    fetch(gcs_proxy, tmp_path, "lru/c.gguf")  # released: room is made


def test_a_hold_is_another_process_s_and_ends_with_it(objects, gcs_proxy, tmp_path):
    """Crash-safe and cross-process: a process holding the file is in use; killed, it is not."""
    a = fetch(gcs_proxy, tmp_path, "lru/a.gguf")
    fetch(gcs_proxy, tmp_path, "lru/b.gguf")
    code = ("import fcntl, sys, time; f = open(sys.argv[1], 'rb'); "
            "fcntl.flock(f, fcntl.LOCK_SH); print('held', flush=True); time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(a)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(gcs.GcsError, match="in use"):
            fetch(gcs_proxy, tmp_path, "lru/c.gguf", bound=150)  # b goes, a cannot
        assert a.is_file() and not entry(tmp_path, "lru/b.gguf").exists()
    finally:
        holder.kill()
        holder.wait(30)
    fetch(gcs_proxy, tmp_path, "lru/c.gguf", bound=150)
    assert not a.exists()


def test_no_bound_deletes_nothing(objects, gcs_proxy, tmp_path):
    for name in ("lru/a.gguf", "lru/b.gguf", "lru/c.gguf"):
        fetch(gcs_proxy, tmp_path, name, bound=None)
    assert all(entry(tmp_path, f"lru/{n}.gguf").is_file() for n in "abc")


def test_two_callers_of_one_object_download_it_once(objects, gcs_proxy, tmp_path, caplog):
    """The first caller's download is held at the proxy; the second waits, says so in its load
    state, and finds the first's download in the cache."""
    uri = f"gs://{BUCKET}/slow/m.gguf"
    gate = gcs_proxy.faults.gate = threading.Event()
    results: dict[str, object] = {}

    def first() -> None:
        try:
            results["first"] = gcs_download.fetch_model(uri, opts(gcs_proxy, tmp_path, 10**6))
        except Exception as exc:  # noqa: BLE001 - reported below
            results["first"] = exc

    state = LoadState()
    settings = Settings(model=uri, model_cache_dir=tmp_path,
                        storage_emulator_host=gcs_proxy.url, model_cache_max_gb=0.001)

    def second() -> None:
        try:
            results["second"] = resolve(settings, state)
        except Exception as exc:  # noqa: BLE001 - reported below
            results["second"] = exc

    threads = [threading.Thread(target=first, daemon=True),
               threading.Thread(target=second, daemon=True)]
    with caplog.at_level(logging.INFO, logger="app.model.gcs_download"):
        try:
            threads[0].start()
            wait_until(lambda: gcs_proxy.faults.media_requests == 1, "the first download")
            threads[1].start()
            wait_until(lambda: "waiting for another download" in (state.detail or ""),
                       "the second caller's wait in its load state")
            assert state.stage == "downloading"
            assert state.detail == f"{uri}: waiting for another download of {uri}"
        finally:
            gate.set()
            for t in threads:
                t.join(60)
    path = entry(tmp_path, "slow/m.gguf")
    assert results == {"first": path, "second": str(path)}
    assert path.read_bytes() == objects["slow/m.gguf"]
    assert gcs_proxy.faults.media_requests == 1
    assert state.detail == uri  # the wait is over: the last progress names the model alone
    assert caplog.text.count("downloaded and verified") == 1
    assert f"waiting for another download of {uri}" in caplog.text


def test_a_split_model_s_shards_are_held_with_its_first(tmp_path):
    names = [f"m-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    for name in names:
        (tmp_path / name).write_bytes(b"GGUF")
    assert with_shards(str(tmp_path / names[0])) == [str(tmp_path / n) for n in names]
    assert with_shards(str(tmp_path / names[1])) == [str(tmp_path / names[1])]
    holds = FileHolds()
    holds.hold_all([str(tmp_path / names[0]), None])
    try:
        assert holds.paths == [str(tmp_path / n) for n in names]
        assert not gcs_cache._delete(tmp_path / names[2], own=False)  # in use
    finally:
        holds.release()
    assert gcs_cache._delete(tmp_path / names[2], own=False)
    assert not (tmp_path / names[2]).exists()
