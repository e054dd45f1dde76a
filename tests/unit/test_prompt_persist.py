"""The engine's side of PROMPT_CACHE_DIR (app/engine/prompt_persist.py) over a real folder and the
stand-in for llama.cpp: what leaves RAM is written by the writer thread (the engine thread only
hands it over, and past the pending bound drops it, counted); at exit every idle slot's
conversation and every RAM entry is written; a prompt that extends a file more than any slot
does has it read back on its prep thread (and not when a slot already holds it); slot files
save, erase and restore with llama-server's answers."""

from __future__ import annotations

import ctypes
import time

import numpy as np
import pytest

from app.base.errors import BadRequest, NotFound
from app.engine.prompt_cache import Entry, PromptCache
from app.engine.prompt_persist import Persist
from app.engine.prompt_store import PromptStore, identity
from app.engine.scheduler import Features
from app.engine.slot_files import slot_action, slot_file_name
from tests.support.fake_llama import job, run, scheduler

IDENT = identity({"model": "test"})


def _scanned(persist: Persist, n: int) -> None:
    """Wait (bounded) for the writer's scan of the folder to find ``n`` files."""
    for _ in range(3000):
        if len(persist.store.files()) == n:
            return
        time.sleep(0.01)
    raise AssertionError(f"the scan found {len(persist.store.files())} files, not {n}")


def _preload(persist: Persist, j, slots, cache) -> None:
    """What the engine's prep thread does: the file the job wants, read by the reader thread
    (waited for here), into ``j.preloaded``."""
    stored = persist.wanted(j, slots, cache)
    if stored is None:
        return
    got: list = []
    persist.read_for(j, stored, got.append)
    for _ in range(3000):  # bounded: 30 s
        if got:
            return
        time.sleep(0.01)
    raise AssertionError("the reader never delivered the job")


def _entry(tokens: list[int], scope: str = "", size: int = 64) -> Entry:
    blob = (ctypes.c_uint8 * size)(*range(size))
    return Entry(scope, np.asarray(tokens, dtype=np.int32), (), len(tokens), blob)


def _persist(tmp_path, min_tokens: int = 8, pending_max: int = 1 << 20,
             n_vocab: int = 0) -> Persist:
    persist = Persist(PromptStore(str(tmp_path), IDENT, 1 << 30), min_tokens, pending_max,
                      n_vocab)
    persist.start()
    return persist


def test_what_leaves_ram_is_written_by_the_writer_and_short_ones_are_not(tmp_path):
    persist = _persist(tmp_path)
    cache = PromptCache(max_bytes=100, min_tokens=8)
    cache.on_evict = persist.spill
    cache.put(_entry(list(range(1, 21))))
    cache.put(_entry(list(range(30, 50))))  # the first leaves for room: to the writer
    persist.spill(_entry([1, 2, 3]))  # under PROMPT_CACHE_MIN_TOKENS: never written
    persist.close(30)
    assert persist.written == 1 and persist.write_failed == 0
    fresh = PromptStore(str(tmp_path), IDENT, 1 << 30)
    assert [list(s.tokens) for s in fresh.scan()] == [list(range(1, 21))]


def test_the_writer_behind_by_more_than_the_bound_drops_and_counts(tmp_path):
    persist = Persist(PromptStore(str(tmp_path), IDENT, 1 << 30), 8, pending_max=100)
    # not started: nothing is written, so the second blob finds the bound full
    persist.spill(_entry(list(range(1, 21)), size=64))
    persist.spill(_entry(list(range(30, 50)), size=64))
    assert persist.dropped == 1
    persist.spill(_entry(list(range(60, 80)), size=64), force=True)  # the writes at exit
    assert persist.dropped == 1
    persist.start()
    persist.close(30)
    assert persist.written == 2


A = list(range(1, 25))  # a conversation of 24 tokens, one slot
B = list(range(10, 30))


def _sched_with(conversation: list[int], scope: str = ""):
    sched, ll = scheduler(parallel=1, chunk=8, features=Features(
        prompt_cache=PromptCache(1 << 20, min_tokens=8)))
    j = job(conversation, ll, [], max_new=2, stop_after=99)
    j.request = j.request.__class__(tuple(conversation), j.request.params, cache_scope=scope)
    sched.waiting.append(j)
    run(sched)
    return sched, ll


def test_at_exit_every_slot_and_ram_entry_is_written_then_read_back_for_its_scope(tmp_path):
    sched, ll = _sched_with(A, scope="key-a")
    cache = sched.features.prompt_cache
    cache.put(_entry(B, scope="key-a"))
    persist = _persist(tmp_path)
    persist.at_exit(sched.slots, None, cache, timeout=30)
    assert persist.written == 2
    again = _persist(tmp_path)  # a new process: the writer scans the folder first
    _scanned(again, 2)
    # the next turn of A, in a fresh process whose slot holds nothing: read back
    fresh, ll2 = scheduler(parallel=1, chunk=8,
                           features=Features(prompt_cache=PromptCache(1 << 20, min_tokens=8)))
    nxt = job([*A, 5, 6], ll2, [], max_new=2)
    nxt.request = nxt.request.__class__(tuple(nxt.tokens), nxt.request.params,
                                        cache_scope="key-a")
    _preload(again, nxt, fresh.slots, fresh.features.prompt_cache)
    assert nxt.preloaded is not None and again.read == 1
    fresh.waiting.append(nxt)
    run(fresh)  # the mirror checked against the cells after every step
    assert nxt.cached_tokens >= len(A) and ll2.restores == [0]
    # another key's identical prompt: no file of its scope
    other = job([*A, 5, 6], ll2, [], max_new=2)
    other.request = other.request.__class__(tuple(other.tokens), other.request.params,
                                            cache_scope="key-b")
    _preload(again, other, fresh.slots, None)
    assert other.preloaded is None and again.read == 1


def test_no_read_when_a_slot_already_holds_the_prompt(tmp_path):
    persist = _persist(tmp_path)
    sched, ll = _sched_with(A)
    persist.at_exit(sched.slots, None, None, timeout=30)
    reader = _persist(tmp_path)
    _scanned(reader, 1)
    nxt = job([*A, 5, 6], ll, [], max_new=2)
    _preload(reader, nxt, sched.slots, None)  # the slot holds A still: no read
    assert nxt.preloaded is None and reader.read == 0


def test_slot_files_in_llama_servers_shapes(tmp_path):
    sched, ll = _sched_with(A, scope="key-a")
    persist = _persist(tmp_path)
    held = len(sched.slots[0].kv)

    def on_engine(fn):
        return fn(sched)

    store = persist.store
    saved = slot_action(store, on_engine, 0, "save", "s1.bin")
    assert saved["n_saved"] == held and saved["n_written"] > 0 and "save_ms" in saved["timings"]
    assert slot_action(store, on_engine, 0, "erase", None) == {"id_slot": 0, "n_erased": held}
    with pytest.raises(BadRequest):
        slot_action(store, on_engine, 0, "save", "s2.bin")  # nothing to save
    with pytest.raises(NotFound):
        slot_action(store, on_engine, 0, "restore", "missing.bin")
    restored = slot_action(store, on_engine, 0, "restore", "s1.bin")
    assert restored["n_restored"] == held and list(sched.slots[0].kv.tokens) == ll.held(0)
    assert sched.slots[0].scope.startswith("\0digest:")  # serves key-a's prompts only
    (tmp_path / IDENT[:16] / "slots" / "s1.bin").write_bytes(b"vgguf-kv" + b"\0" * 40)
    with pytest.raises(BadRequest):
        slot_action(store, on_engine, 0, "restore", "s1.bin")


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "", "x" * 129, 7, None])
def test_a_slot_file_name_never_leaves_the_folder(name):
    with pytest.raises(BadRequest):
        slot_file_name(name)


def _fresh_job(tokens: list[int], scope: str = "key-a"):
    sched, ll = scheduler(parallel=1, chunk=8,
                          features=Features(prompt_cache=PromptCache(1 << 20, min_tokens=8)))
    j = job(tokens, ll, [], max_new=2)
    j.request = j.request.__class__(tuple(tokens), j.request.params, cache_scope=scope)
    return sched, ll, j


def test_a_file_whose_cells_llama_cpp_refuses_is_deleted(tmp_path):
    persist = _persist(tmp_path)
    persist.spill(_entry(A, scope="key-a"), force=True)  # checksums fine, cells unreadable
    persist.close(30)
    reader = _persist(tmp_path, n_vocab=32)
    _scanned(reader, 1)
    sched, ll, nxt = _fresh_job([*A, 5, 6])
    _preload(reader, nxt, sched.slots, sched.features.prompt_cache)
    assert nxt.preloaded is not None
    sched.waiting.append(nxt)
    run(sched)
    assert ll.restores == [0] and nxt.cached_tokens == 0  # refused: decoded whole
    assert reader.read_failed == 1 and reader.store.files() == []
    assert list(tmp_path.glob("*/*.kv")) == []


def test_cells_that_do_not_end_where_the_tokens_do_are_refused(tmp_path):
    sched, ll = _sched_with(A, scope="key-a")
    kv = sched.slots[0].kv
    held, n_pos = list(kv.tokens), kv.n_pos
    blob = kv.snapshot(None)
    assert kv.restore(None, blob, held, (), n_pos)  # its own: taken back
    ll.cells[0] = [(p + 5000, t) for p, t in ll.cells[0]]  # a crafted file's positions
    forged = kv.snapshot(None)
    assert not kv.restore(None, forged, list(A), (), len(A)) and len(kv) == 0
    assert ll.held(0) == []  # nothing left for the next decode to trip on


def test_a_file_with_a_token_outside_the_vocabulary_is_deleted(tmp_path):
    persist = _persist(tmp_path)
    persist.spill(_entry([*A[:-1], 99], scope="key-a"), force=True)
    persist.close(30)
    reader = _persist(tmp_path, n_vocab=32)
    _scanned(reader, 1)
    sched, _, nxt = _fresh_job([*A[:-1], 99, 5, 6])
    _preload(reader, nxt, sched.slots, None)
    assert nxt.preloaded is None and reader.read_failed == 1 and reader.store.files() == []
