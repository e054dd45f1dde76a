"""Prompts kept across restarts (PROMPT_CACHE_DIR), as the engine runs the disk store.

Cloud Run scales to zero and every rollout restarts replicas: a restarted replica would decode
every long prompt it had cached again (an agent's 10-20k-token system prompt and history). So
the prompt cache's entries that leave host RAM for room, the slots' conversations when the model
falls asleep, and at SIGTERM's drain every slot's and every RAM entry's, are written to files
(app.engine.prompt_store: checked, never trusted, when read back); a prompt that extends a file
more than any slot or RAM entry does has it read back on its prep thread, before the engine
thread admits it.

Writes run on a writer thread of their own: the engine thread only hands it blobs (a step never
waits for a disk or Cloud Storage), and what it has not written yet is bounded in bytes (past
the bound a blob is dropped, counted).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from app.base.errors import BadRequest, EngineFailure, NotFound
from app.base.threads import ThreadEvent, allocate_lock, start_native_thread
from app.engine import prompt_file
from app.engine.config import EngineConfig
from app.engine.prompt_cache import Entry, PromptCache
from app.engine.prompt_file import BadFile
from app.engine.prompt_store import PromptStore, identity
from app.engine.scheduler import Scheduler
from app.engine.slots import (
    DIGEST,
    PUBLIC,
    RELOCATE_MIN_TOKENS,
    Job,
    Slot,
    cache_scope,
    digest_scope,
)
from app.engine.tokens import common_prefix

log = logging.getLogger(__name__)

HEAD_BYTES = 16 << 20  # a file's identity: its size and its first 16 MiB (its GGUF header)


def file_digest(path: str) -> str:
    """A model file's identity without reading gigabytes: its size and a hash of its first
    16 MiB (the GGUF header, with every tensor's name, type and shape, then the first weights)."""
    h = hashlib.sha256(str(os.path.getsize(path)).encode())
    with open(path, "rb") as f:
        h.update(f.read(HEAD_BYTES))
    return h.hexdigest()


def identity_parts(model: str, mmproj: str | None, build: str,
                   settings: Mapping[str, object]) -> dict[str, str]:
    """What a blob is only valid under: the model's bytes, the projector's (an image's cells),
    llama.cpp's build, and the context settings that shape the cells (the KV types, flash
    attention's V layout)."""
    parts = {"model": file_digest(model), "build": build,
             **{k: str(v) for k, v in sorted(settings.items())}}
    if mmproj:
        parts["mmproj"] = file_digest(mmproj)
    return parts


def open_persist(cfg: EngineConfig, model: str, mmproj: str | None) -> Persist | None:
    """PROMPT_CACHE_DIR's store for this model and its writer thread (None: unset)."""
    if not cfg.prompt_cache_dir:
        return None
    from llama_cpp import __version__ as build

    parts = identity_parts(model, mmproj, f"llama-cpp-python {build}", {
        "type_k": cfg.kv_cache_type_k, "type_v": cfg.kv_cache_type_v,
        "flash_attn": cfg.flash_attn, "format": prompt_file.VERSION})
    store = PromptStore(cfg.prompt_cache_dir, identity(parts), cfg.prompt_cache_disk_mb << 20,
                        emulator_host=cfg.storage_emulator_host)
    persist = Persist(store, cfg.prompt_cache_min_tokens,
                      pending_max=max(cfg.prompt_cache_ram_mb, 1024) << 20)
    persist.start()
    return persist


class Persist:
    """The disk store beside one engine: a writer thread, reads on a miss, the writes at exit."""

    def __init__(self, store: PromptStore, min_tokens: int, pending_max: int):
        self.store = store
        self.min_tokens = min_tokens
        self.pending_max = pending_max  # bytes handed to the writer and not yet written
        self._queue: deque[Entry] = deque()
        self._lock = allocate_lock()
        self._wake = ThreadEvent()
        self._pending = 0
        self._closing = False
        self._done = ThreadEvent()
        self.written = 0
        self.write_failed = 0
        self.dropped = 0  # blobs dropped: the writer was too far behind
        self.read = 0  # files read back into a slot's admission
        self.read_failed = 0

    def start(self) -> None:
        start_native_thread(self._main)

    # ---- the engine thread ------------------------------------------------------------------
    def spill(self, entry: Entry, force: bool = False) -> None:
        """Hand ``entry`` to the writer (never blocks). Dropped when shorter than
        PROMPT_CACHE_MIN_TOKENS, or when the writer is behind by more than ``pending_max``
        (unless ``force``: the writes at exit, which wait for the writer)."""
        if len(entry.tokens) < self.min_tokens:
            return
        with self._lock:
            if self._closing or (not force and self._pending + entry.size > self.pending_max):
                self.dropped += 1
                return
            self._pending += entry.size
            self._queue.append(entry)
        self._wake.set()

    def spill_slots(self, slots: Sequence[Slot], ctx: Any) -> int:
        """Every idle slot's conversation (not the public opening), copied out and handed to
        the writer: before the model sleeps, and at exit. How many."""
        n = 0
        for slot in slots:
            kv = slot.kv
            if slot.job is not None or slot.scope == PUBLIC or slot.scope.startswith(DIGEST) \
                    or len(kv) < self.min_tokens:
                continue
            blob = kv.snapshot(ctx)
            if blob is None:
                continue
            self.spill(Entry(slot.scope, np.asarray(kv.tokens, dtype=np.int32),
                             tuple(kv.marks), kv.n_pos, blob), force=True)
            n += 1
        return n

    def at_sleep(self, slots: Sequence[Slot], ctx: Any, cache: PromptCache | None) -> None:
        """The model is about to be freed (idle sleep): its slots' and RAM cache's prompts
        handed to the writer, so the next request after the wake reads them back."""
        self.spill_slots(slots, ctx)
        for entry in reversed(cache.entries() if cache is not None else []):
            self.spill(entry, force=True)

    def at_exit(self, slots: Sequence[Slot], ctx: Any, cache: PromptCache | None,
                timeout: float) -> None:
        """SIGTERM's drain is over: every slot's conversation, then the RAM cache's entries
        (the most recently kept first), written before the process ends, within ``timeout``
        seconds (a file is whole or absent: each is written aside, then renamed)."""
        t0 = time.monotonic()
        n = self.spill_slots(slots, ctx)
        for entry in reversed(cache.entries() if cache is not None else []):
            self.spill(entry, force=True)
            n += 1
        self.close(max(0.0, timeout - (time.monotonic() - t0)))
        log.info("prompt cache: %d prompt(s) kept in %s for the next start (%d written, "
                 "%d not, in %.1f s)", n, self.store.root, self.written, self.write_failed
                 + self.dropped, time.monotonic() - t0)

    def close(self, timeout: float) -> None:
        """Write what is queued (at most ``timeout`` seconds), then stop the writer."""
        with self._lock:
            self._closing = True
        self._wake.set()
        self._done.wait(timeout)

    # ---- a prep thread ------------------------------------------------------------------------
    def preload(self, job: Job, slots: Sequence[Slot], cache: PromptCache | None) -> None:
        """Read back the file this job's prompt extends most, when it beats every slot and RAM
        entry of its scope by more than a copy's worth (their tokens read from this thread:
        a stale view costs at most a read not needed, or one missed). Off the engine thread:
        only this request waits for the read."""
        req = job.request
        if not req.cache_prompt or req.params.prompt_logprobs is not None:
            return
        scope = cache_scope(req)
        prompt = np.asarray(job.tokens, dtype=np.int32)
        wanted = [span.mark for span in job.images]
        stored, n = self.store.best(scope, prompt, wanted)
        if stored is None or n < self.min_tokens:
            return
        have = 0
        for slot in slots:
            if slot.scope == scope or slot.scope == PUBLIC:
                have = max(have, common_prefix(list(slot.kv.tokens), prompt))
        if cache is not None:
            # the engine thread may change the cache under us (RuntimeError): read anyway
            with contextlib.suppress(RuntimeError):
                have = max(have, cache.best(scope, prompt, wanted)[1])
        if n - have < RELOCATE_MIN_TOKENS:
            return
        entry = self.store.read(stored, scope)
        if entry is None:
            self.read_failed += 1
            return
        self.read += 1
        job.preloaded = entry

    # ---- the writer thread ----------------------------------------------------------------------
    def _main(self) -> None:
        try:  # the files earlier runs kept: their heads, for ``preload`` (off the path to ready)
            found = self.store.scan()
            if found:
                log.info("prompt cache: %d prompt(s) kept in %s by an earlier run",
                         len(found), self.store.root)
        except Exception:  # noqa: BLE001 - an unreadable folder keeps nothing, serves on
            log.exception("prompt cache: scanning %s failed", self.store.root)
        while True:
            with self._lock:
                entry = self._queue.popleft() if self._queue else None
                closing = self._closing
            if entry is None:
                if closing:
                    self._done.set()
                    return
                self._wake.wait(1.0)
                continue
            try:
                ok = self.store.write(entry)
            except Exception:  # noqa: BLE001 - a bug in a write must not end the writer
                log.exception("prompt cache: a write failed")
                ok = False
            with self._lock:
                self._pending -= entry.size
            if ok:
                self.written += 1
            else:
                self.write_failed += 1

    def report(self) -> dict[str, object]:
        return {"disk": {"root": self.store.root, "written": self.written,
                         "write_failed": self.write_failed, "dropped": self.dropped,
                         "read": self.read, "read_failed": self.read_failed,
                         "pending_bytes": self._pending}}


# ---- llama-server's slot actions (POST /slots/{id}?action=...), the engine thread's part -----
SLOT_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def slot_file_name(name: object) -> str:
    """A slot file's name, checked: letters, digits, ``.``, ``_`` and ``-``, no path, at most
    128 characters (the file is confined to PROMPT_CACHE_DIR's folder for this model)."""
    if not isinstance(name, str) or not SLOT_FILE.fullmatch(name) or ".." in name:
        raise BadRequest("'filename' is a file name of letters, digits, '.', '_' and '-' (no "
                         "path, at most 128 characters)", param="filename")
    return name


def _idle(sched: Scheduler, slot_id: int) -> Slot:
    slot = sched.slots[slot_id]
    if slot.job is not None:
        raise BadRequest(f"slot {slot_id} is busy with a request", param="id_slot")
    return slot


def erase_slot(sched: Scheduler, slot_id: int) -> int:
    """The slot's cells dropped; how many tokens they held."""
    slot = _idle(sched, slot_id)
    n = len(slot.kv)
    slot.kv.clear()
    return n


def copy_slot(sched: Scheduler, slot_id: int) -> Entry:
    """The slot's cells copied out, with what they hold."""
    slot = _idle(sched, slot_id)
    if not len(slot.kv):
        raise BadRequest(f"slot {slot_id} holds nothing to save", param="id_slot")
    blob = slot.kv.snapshot(sched.ctx)
    if blob is None:
        raise BadRequest(f"llama.cpp could not copy slot {slot_id}'s cells", param="id_slot")
    return Entry(slot.scope, np.asarray(slot.kv.tokens, dtype=np.int32), tuple(slot.kv.marks),
                 slot.kv.n_pos, blob)


def restore_slot(sched: Scheduler, slot_id: int, entry: Entry) -> int:
    """A file's cells copied into the slot; how many tokens. ``entry.scope`` is the file's
    scope digest: the slot's KV serves only prompts of that key scope (``digest_scope``)."""
    slot = _idle(sched, slot_id)
    if not slot.kv.restore(sched.ctx, entry.blob, entry.tokens, entry.marks, entry.n_pos):
        raise BadRequest("llama.cpp refused the file's cells (another context shape, or too "
                         f"long for slot {slot_id}'s context)", param="filename")
    slot.scope = digest_scope(entry.scope)
    slot.last_used = time.monotonic()
    return len(slot.kv)


def slot_action(persist: Persist | None, on_engine: Callable[[Callable[[Scheduler], Any]], Any],
                slot_id: int, action: str, filename: object) -> dict[str, object]:
    """llama-server's slot actions, in its answers' shapes: the cells copied on the engine
    thread (``on_engine``), the file's I/O on the calling one."""
    t0 = time.perf_counter()
    if action == "erase":
        return {"id_slot": slot_id, "n_erased": on_engine(lambda s: erase_slot(s, slot_id))}
    assert persist is not None
    name = slot_file_name(filename)
    store = persist.store
    if action == "save":
        entry = on_engine(lambda s: copy_slot(s, slot_id))
        try:
            written = store.write_named(name, entry)
        except Exception as exc:  # noqa: BLE001 - the caller gets it as a 500 with its reason
            raise EngineFailure(f"slot file {name} not written: {exc}") from None
        return {"id_slot": slot_id, "filename": name, "n_saved": len(entry.tokens),
                "n_written": written,
                "timings": {"save_ms": round((time.perf_counter() - t0) * 1e3, 3)}}
    try:
        entry, n_read = store.read_named(name)
    except FileNotFoundError:
        raise NotFound(f"no slot file {name}") from None
    except BadFile as exc:
        raise BadRequest(f"slot file {name} refused: {exc}", param="filename") from None
    except Exception as exc:  # noqa: BLE001
        raise EngineFailure(f"slot file {name} not read: {exc}") from None
    n = on_engine(lambda s: restore_slot(s, slot_id, entry))
    return {"id_slot": slot_id, "filename": name, "n_restored": n, "n_read": n_read,
            "timings": {"restore_ms": round((time.perf_counter() - t0) * 1e3, 3)}}
