"""An engine's files resolved at once (app.engine.resolve): the projector, the draft model and
the LoRA adapters fetched beside the model, not after it; their errors reported in the order
they used to run in, with the same messages; the load state summing the downloads under way.

The gs:// cases run the real resolvers (app.model.source) against the storage emulator through
the counting proxy, its gate holding every download: all of them asked for at once is what
shows they run together (one after another, only the model's would be)."""

from __future__ import annotations

import fcntl
import os
import threading
from functools import partial
from pathlib import Path

import pytest

from app.base.errors import ModelLoadError
from app.base.state import LoadState
from app.engine import file_holds
from app.engine.file_holds import FileHolds
from app.engine.resolve import resolve_files
from app.model import source
from app.settings import Settings

BUCKET = "resolvetest"
OBJECTS = {"m/model.gguf": b"GGUF the model", "m/mmproj.gguf": b"GGUF its projector",
           "m/draft.gguf": b"GGUF a draft", "m/style.gguf": b"GGUF an adapter"}


@pytest.fixture(scope="module")
def objects(emulator) -> dict[str, bytes]:
    for name, body in OBJECTS.items():
        emulator.upload(BUCKET, name, data=body)
    return OBJECTS


def uri(name: str) -> str:
    return f"gs://{BUCKET}/{name}"


def resolvers(settings: Settings) -> tuple:
    return (partial(source.resolve, settings), partial(source.resolve_projector, settings),
            partial(source.resolve_draft, settings), partial(source.resolve_adapters, settings))


def held(path: Path) -> bool:
    """Someone holds a shared lock on ``path`` (what keeps the cache from evicting it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def wait_until(check, what: str, tries: int = 400) -> None:
    for _ in range(tries):
        if check():
            return
        threading.Event().wait(0.05)
    raise AssertionError(f"never happened: {what}")


def test_gs_files_download_beside_the_model(objects, gcs_proxy, tmp_path):
    settings = Settings(model=uri("m/model.gguf"), mmproj=uri("m/mmproj.gguf"),
                        draft_model=uri("m/draft.gguf"),
                        lora_adapters=f"style={uri('m/style.gguf')}:0.5",
                        model_cache_dir=tmp_path, storage_emulator_host=gcs_proxy.url)
    state, holds = LoadState(), FileHolds()
    gate = gcs_proxy.faults.gate = threading.Event()
    out: list[object] = []

    def run() -> None:
        try:
            out.append(resolve_files(state, holds, *resolvers(settings)))
        except Exception as exc:  # noqa: BLE001 - reported below
            out.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    try:
        worker.start()
        wait_until(lambda: gcs_proxy.faults.media_requests == 4, "four downloads at once")
        assert state.stage == "downloading"
        for name in OBJECTS:  # the detail names every download under way
            assert uri(name) in (state.detail or "")
    finally:
        gate.set()
        worker.join(60)
    try:
        (path, mmproj, draft, adapters), = out
        files = [path, mmproj, draft, adapters[0].path]
        assert [Path(p).read_bytes() for p in files] == list(OBJECTS.values())
        assert adapters[0].name == "style" and adapters[0].scale == 0.5
        assert sorted(holds.paths) == sorted(files)  # every file held for the engine
        total = sum(len(b) for b in OBJECTS.values())
        assert state.download is not None
        assert state.download["downloaded_bytes"] == state.download["total_bytes"] == total
        assert state.progress == 1.0
    finally:
        holds.release()


@pytest.mark.parametrize("broken, message", [
    ("mmproj", "MMPROJ gs://resolvetest/m/nope.gguf: no such object"),
    ("draft_model", "DRAFT_MODEL gs://resolvetest/m/nope.gguf: no such object"),
])
def test_a_file_beside_the_model_fails_with_its_own_message(objects, gcs_proxy, tmp_path,
                                                            broken, message):
    settings = Settings(model=uri("m/model.gguf"), model_cache_dir=tmp_path,
                        storage_emulator_host=gcs_proxy.url, **{broken: uri("m/nope.gguf")})
    holds = FileHolds()
    with pytest.raises(ModelLoadError) as exc:
        resolve_files(LoadState(), holds, *resolvers(settings))
    assert str(exc.value).startswith(message)
    holds.release()


# ---- the order of errors and what is held, with resolvers of the test's own ------------------


def test_the_model_s_error_comes_first_and_an_abandoned_file_is_let_go(tmp_path):
    """The model fails while the projector is still resolving: the model's error is raised at
    once, and the projector's file, ready later, is not left held."""
    proj = tmp_path / "mmproj.gguf"
    proj.write_bytes(b"GGUF")
    release = threading.Event()
    ended = threading.Event()

    def projector(state: LoadState) -> str:
        release.wait(30)
        file_holds.keep(str(proj))  # held, as a download's file is, by the resolver's holds
        assert held(proj)
        ended.set()
        return str(proj)

    def model(state: LoadState) -> str:
        raise ModelLoadError("the model's error")

    def draft(state: LoadState) -> str:
        raise ModelLoadError("the draft's error")

    holds = FileHolds()
    with pytest.raises(ModelLoadError, match="the model's error"):
        resolve_files(LoadState(), holds, model, projector, draft, lambda state: [])
    release.set()
    assert ended.wait(30)
    wait_until(lambda: not held(proj), "the abandoned projector's hold let go")
    assert holds.paths == []


def test_errors_beside_the_model_come_in_order(tmp_path):
    def fails(what: str):
        def fn(state: LoadState):
            raise ModelLoadError(what)
        return fn

    path = str(tmp_path / "m.gguf")
    with pytest.raises(ModelLoadError, match="projector"):
        resolve_files(LoadState(), FileHolds(), lambda s: path, fails("projector"),
                      fails("draft"), fails("adapters"))
    with pytest.raises(ModelLoadError, match="adapters"):
        resolve_files(LoadState(), FileHolds(), lambda s: path, lambda s: None, lambda s: None,
                      fails("adapters"))
    assert resolve_files(LoadState(), FileHolds(), lambda s: path, lambda s: None,
                         lambda s: None, lambda s: []) == (path, None, None, [])


# ---- the load state's sum of downloads -------------------------------------------------------


def test_the_load_state_sums_the_downloads_under_way():
    mb, m, d = 10**6, "gs://b/model.gguf", "gs://b/draft.gguf"
    state = LoadState()
    state.begin_download(m)
    assert (state.stage, state.progress, state.detail) == ("downloading", 0.0, m)
    assert state.download is None  # no figures yet
    state.set_download(100 * mb, 1000 * mb, 1e6, 900.0, m, source=m)
    assert state.download == {"downloaded_bytes": 100 * mb, "total_bytes": 1000 * mb,
                              "mb_per_s": 1.0, "eta_s": 900.0}
    state.begin_download(d)  # not sized yet: the sum so far, no ETA
    assert state.detail == f"{m}, {d}"
    assert state.download["eta_s"] is None and state.progress == 0.1
    state.set_download(0, 1000 * mb, 1e6, None, d, source=d)
    assert state.download == {"downloaded_bytes": 100 * mb, "total_bytes": 2000 * mb,
                              "mb_per_s": 2.0, "eta_s": 950.0}
    state.set_download(1000 * mb, 1000 * mb, 1e6, 0.0, m, source=m)
    assert state.download["mb_per_s"] == 1.0 and state.download["eta_s"] == 1000.0
    assert state.progress == 0.5
    state.set("loading", progress=None)
    state.begin_download("gs://b/other.gguf")  # a later start: its downloads alone
    assert state.detail == "gs://b/other.gguf"
