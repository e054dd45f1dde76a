"""Prompts kept across restarts (PROMPT_CACHE_DIR), as the engine runs the disk store.

Cloud Run scales to zero and every rollout restarts replicas: a restarted replica would decode
every long prompt it had cached again (an agent's 10-20k-token system prompt and history). So
the prompt cache's entries that leave host RAM for room, the slots' conversations when the model
falls asleep, and at SIGTERM's drain every slot's and every RAM entry's, are written to files
(app.engine.prompt_store: checked, never trusted, when read back); a prompt that extends a file
more than any slot or RAM entry does has it read back before the engine thread admits it.

Two threads of their own: a writer (the engine thread only hands it blobs, so a step never
waits for a disk or Cloud Storage; what it has not written yet is bounded in bytes, past the
bound a blob is dropped, counted) and a reader (a prep thread hands it the job whose prompt
extends a file and goes on preparing others; the job reaches the engine once its file is in).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from app.base.threads import ThreadEvent, allocate_lock, original_sleep, start_native_thread
from app.engine import prompt_file
from app.engine.config import EngineConfig, n_threads
from app.engine.prompt_cache import Entry, PromptCache
from app.engine.prompt_store import PromptStore, Stored, identity
from app.engine.slots import PUBLIC, RELOCATE_MIN_TOKENS, Job, Slot, cache_scope, reuse_rule
from app.engine.tokens import common_prefix

log = logging.getLogger(__name__)

HEAD_BYTES = 16 << 20  # a file's identity: its size, its first 16 MiB (the GGUF header) ...
SAMPLES, SAMPLE_BYTES = 16, 1 << 20  # ... and 16 MiB spread over the rest (a fine-tune's
# weights differ everywhere, its header and first tensors maybe not)
MIN_PENDING = 256 << 20  # the writer's backlog bound when the RAM cache's is smaller
SLEEP_WRITE_SECONDS = 30.0  # at sleep, the most the writes may take (nobody waits for them)


def file_digest(path: str) -> str:
    """A model file's identity without reading gigabytes: its size, its first 16 MiB, and
    1 MiB at each of 16 offsets spread to its end."""
    size = os.path.getsize(path)
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(HEAD_BYTES))
        if size > HEAD_BYTES:
            step = (size - HEAD_BYTES) // SAMPLES
            for k in range(1, SAMPLES + 1):
                f.seek(max(HEAD_BYTES, min(size - SAMPLE_BYTES, HEAD_BYTES + k * step - 1)))
                h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


def identity_parts(model: str, mmproj: str | None, adapters: Sequence[str], build: str,
                   settings: Mapping[str, object]) -> dict[str, str]:
    """What a blob is only valid under: the model's bytes, the projector's (an image's cells),
    the LoRA adapters' (a request's adapter set is part of its scope by index: another file
    at an index makes other KV), llama.cpp's build, and the context settings that shape the
    cells (the KV types, flash attention's V layout, the slots: one KV stream each)."""
    parts = {"model": file_digest(model), "build": build,
             **{k: str(v) for k, v in sorted(settings.items())}}
    if mmproj:
        parts["mmproj"] = file_digest(mmproj)
    for i, path in enumerate(adapters):
        parts[f"adapter{i}"] = file_digest(path)
    return parts


def open_persist(cfg: EngineConfig, model: str, mmproj: str | None, adapters: Sequence[str],
                 cache: PromptCache | None, n_vocab: int) -> Persist | None:
    """PROMPT_CACHE_DIR's store for this model, and its writer and reader (None: unset)."""
    if not cfg.prompt_cache_dir:
        return None
    from llama_cpp import __version__ as build

    parts = identity_parts(model, mmproj, adapters, f"llama-cpp-python {build}", {
        "type_k": cfg.kv_cache_type_k, "type_v": cfg.kv_cache_type_v,
        "flash_attn": cfg.flash_attn, "parallel": cfg.parallel, "kv_unified": False,
        "format": prompt_file.VERSION,
        # DETERMINISTIC keeps only cells cut at multiples of PREFILL_CHUNK, and its bytes hold
        # only under the settings that shape the numbers: not another's
        **({"deterministic": cfg.prefill_chunk, "n_ubatch": cfg.n_ubatch,
            "threads": n_threads(cfg),
            "threads_batch": cfg.threads_batch, "gpu_layers": cfg.gpu_layers}
           if cfg.deterministic else {})})
    whole_only = cache is not None and cache.whole_only
    store = PromptStore(cfg.prompt_cache_dir, identity(parts), cfg.prompt_cache_disk_mb << 20,
                        emulator_host=cfg.storage_emulator_host, whole_only=whole_only)
    bound = max(cache.max_bytes if cache is not None else 0, MIN_PENDING)
    persist = Persist(store, cfg.prompt_cache_min_tokens, pending_max=bound, n_vocab=n_vocab)
    persist.start()
    return persist


class Persist:
    """The disk store beside one engine: a writer thread, reads on a miss, the writes at exit."""

    def __init__(self, store: PromptStore, min_tokens: int, pending_max: int, n_vocab: int = 0):
        self.store = store
        self.min_tokens = min_tokens
        # bytes handed to the writer and not yet written, and the largest file read back (an
        # entry alone over it is still taken when nothing waits: one blob in flight at most)
        self.pending_max = pending_max
        self.n_vocab = n_vocab  # a file's tokens are checked against it (0: not checked)
        self._queue: deque[Entry] = deque()
        self._reads: deque[tuple[Job, Stored, Callable[[Job], None]]] = deque()
        self._lock = allocate_lock()
        self._wake = ThreadEvent()
        self._read_wake = ThreadEvent()
        self._pending = 0
        self._closing = False
        self._done = ThreadEvent()
        self._last: tuple[str, Entry] | None = None  # the reader's last file: turns share it
        self._reading = 0  # jobs handed to the reader and not yet delivered
        self.written = 0
        self.write_failed = 0
        self.skipped = 0  # a file of its scope already held these tokens or more
        self.dropped = 0  # blobs dropped: the writer was too far behind
        self.read = 0  # files read back into a slot's admission
        self.read_failed = 0

    def start(self) -> None:
        start_native_thread(self._write_main)
        start_native_thread(self._read_main)

    # ---- the engine thread ------------------------------------------------------------------
    def spill(self, entry: Entry, force: bool = False) -> bool:
        """Hand ``entry`` to the writer (never blocks). Dropped when shorter than
        PROMPT_CACHE_MIN_TOKENS, or when the writer is behind by more than ``pending_max``
        (unless nothing waits, or ``force``). Whether it was taken."""
        if len(entry.tokens) < self.min_tokens:
            return False
        with self._lock:
            if self._closing or (not force and self._pending
                                 and self._pending + entry.size > self.pending_max):
                self.dropped += 1
                return False
            self._pending += entry.size
            self._queue.append(entry)
        self._wake.set()
        return True

    def _spill_slots(self, slots: Sequence[Slot], ctx: Any, deadline: float) -> int:
        """Every idle slot's conversation (not the public opening), copied out and written one
        at a time (one slot's KV in host RAM at once, not the whole cache's): before the model
        sleeps, and at exit. How many."""
        n = 0
        for slot in slots:
            kv = slot.kv
            # (a slot restored from a file keeps the file's scope digest: written under it)
            if slot.job is not None or slot.scope == PUBLIC or len(kv) < self.min_tokens:
                continue
            if not self._wait_written(deadline):
                break
            blob = kv.snapshot(ctx)
            if blob is not None and self.spill(Entry(
                    slot.scope, np.asarray(kv.tokens, dtype=np.int32), tuple(kv.marks),
                    kv.n_pos, blob), force=True):
                n += 1
        return n

    def _wait_written(self, deadline: float) -> bool:
        """Wait until the writer has written all it was handed (False: ``deadline`` passed)."""
        while self._pending and time.monotonic() < deadline:
            original_sleep(0.01)
        return not self._pending

    def _spill_entries(self, cache: PromptCache | None) -> int:
        """The RAM cache's entries, the most recently kept first (they are in RAM already)."""
        entries = list(reversed(cache.entries())) if cache is not None else []
        return sum(self.spill(e, force=True) for e in entries)

    def at_sleep(self, slots: Sequence[Slot], ctx: Any, cache: PromptCache | None) -> None:
        """The model is about to be freed (idle sleep): its slots' and RAM cache's prompts
        written, so the next request after the wake reads them back."""
        deadline = time.monotonic() + SLEEP_WRITE_SECONDS
        self._spill_slots(slots, ctx, deadline)
        self._spill_entries(cache)

    def at_exit(self, slots: Sequence[Slot], ctx: Any, cache: PromptCache | None,
                timeout: float) -> None:
        """SIGTERM's drain is over: every slot's conversation, then the RAM cache's entries,
        written before the process ends, within ``timeout`` seconds (a file is whole or
        absent: each is written aside, then renamed, or uploaded in one request)."""
        t0 = time.monotonic()
        n = self._spill_slots(slots, ctx, t0 + timeout) + self._spill_entries(cache)
        self.close(max(0.0, timeout - (time.monotonic() - t0)))
        log.info("prompt cache: %d prompt(s) kept in %s for the next start (%d written, "
                 "%d already there, %d not, in %.1f s)", n, self.store.root, self.written,
                 self.skipped, self.write_failed + self.dropped, time.monotonic() - t0)

    def close(self, timeout: float) -> None:
        """Write what is queued (at most ``timeout`` seconds), then stop the writer and the
        reader (jobs waiting for a read go on without it)."""
        with self._lock:
            self._closing = True
        self._wake.set()
        self._read_wake.set()
        self._done.wait(timeout)

    # ---- a prep thread ------------------------------------------------------------------------
    def wanted(self, job: Job, slots: Sequence[Slot], cache: PromptCache | None) -> Stored | None:
        """The file this job's prompt extends most, when it beats every slot and RAM entry of
        its scope by more than a copy's worth (their tokens read from this thread: a stale view
        costs at most a read not needed, or one missed), and is not over the read bound."""
        req = job.request
        if not req.cache_prompt or req.params.prompt_logprobs is not None or self._closing:
            return None
        scope = cache_scope(req)
        prompt = np.asarray(job.tokens, dtype=np.int32)
        wanted = [span.mark for span in job.images]
        stored, n = self.store.best(scope, prompt, wanted)
        if stored is None or n < self.min_tokens:
            return None
        if self.store.whole_only and n >= len(prompt):
            return None  # a recurrent model keeps at most the prompt less one token
        have = 0
        may_reuse = reuse_rule(scope, req.lora)  # the scheduler's rule
        for slot in slots:
            if may_reuse(slot.scope):
                have = max(have, common_prefix(list(slot.kv.tokens), prompt))
        if cache is not None:
            # the engine thread may change the cache under us (RuntimeError): read anyway
            with contextlib.suppress(RuntimeError):
                have = max(have, cache.best(scope, prompt, wanted)[1])
        if n - have < RELOCATE_MIN_TOKENS:
            return None
        if stored.blob_size > self.pending_max:
            log.info("prompt file %s not read: %d bytes, over the read bound (%d)",
                     stored.name, stored.blob_size, self.pending_max)
            return None
        return stored

    def read_for(self, job: Job, stored: Stored, deliver: Callable[[Job], None]) -> None:
        """Have the reader read ``stored`` into ``job.preloaded``, then ``deliver(job)``
        (whatever the read gives: the job goes on without it)."""
        with self._lock:
            closing = self._closing
            if not closing:
                self._reads.append((job, stored, deliver))
                self._reading += 1
        if closing:
            deliver(job)
        else:
            self._read_wake.set()

    # ---- the reader thread --------------------------------------------------------------------
    def _next(self, queue: deque, wake: ThreadEvent) -> tuple[Any, bool]:
        """A thread's next item (None: none yet, after a wait), and whether the store closes."""
        with self._lock:
            item = queue.popleft() if queue else None
            closing = self._closing
        if item is None and not closing:
            wake.wait(1.0)
        return item, closing

    def _read_main(self) -> None:
        while True:
            item, closing = self._next(self._reads, self._read_wake)
            if item is None:
                if closing:
                    return
                continue
            job, stored, deliver = item
            try:
                if not closing and not job.cancelled:
                    job.preloaded = self._read(stored, cache_scope(job.request))
            except Exception:  # noqa: BLE001 - the job goes on, decoding its whole prompt
                log.exception("prompt cache: reading %s failed", stored.name)
            deliver(job)
            with self._lock:
                self._reading -= 1
                if not self._reads:
                    self._last = None  # no turn queued behind it: its blob is the job's alone

    @property
    def reading(self) -> bool:
        """Jobs are with the reader (a drain waits for them to reach the engine)."""
        return self._reading > 0

    def _read(self, stored: Stored, scope: str) -> Entry | None:
        """The file's entry, checked (and its tokens against the vocabulary); a file llama.cpp
        later refuses is deleted (``Entry.on_refused``)."""
        last = self._last
        if last is not None and last[0] == stored.name and last[1].scope == scope:
            return last[1]  # the same conversation's turns, queued together: read once
        entry = self.store.read(stored, scope)
        if entry is not None and not self._in_vocab(entry):
            log.warning("prompt file %s refused and deleted: a token outside the vocabulary",
                        stored.name)
            self.store.remove(stored)
            entry = None
        if entry is None:
            self.read_failed += 1
            return None
        self.read += 1
        entry.on_refused = lambda: self._refused(stored)
        self._last = (stored.name, entry)
        return entry

    def _in_vocab(self, entry: Entry) -> bool:
        """Every token a vocabulary id, but an image's placeholders (negative, inside its
        marks): a draft model decodes the tokens it has not seen."""
        tokens = entry.tokens
        outside = np.ones(len(tokens), dtype=bool)
        for m in entry.marks:
            outside[m.start:m.start + m.n] = False
        text = tokens[outside]
        return not ((text < 0).any() or (self.n_vocab and (text >= self.n_vocab).any()))

    def _refused(self, stored: Stored) -> None:
        """llama.cpp refused a file's cells (another context shape, a crafted blob): it goes,
        or every prompt extending it would read it again."""
        log.warning("prompt file %s deleted: llama.cpp refused its cells", stored.name)
        self._last = None
        self.read_failed += 1
        self.store.remove(stored)

    # ---- the writer thread ----------------------------------------------------------------------
    def _write_main(self) -> None:
        try:  # the files earlier runs kept: their heads (off the path to ready)
            found = self.store.scan()
            if found:
                log.info("prompt cache: %d prompt(s) kept in %s by an earlier run",
                         len(found), self.store.root)
        except Exception:  # noqa: BLE001 - an unreadable folder keeps nothing, serves on
            log.exception("prompt cache: scanning %s failed", self.store.root)
        while True:
            entry, closing = self._next(self._queue, self._wake)
            if entry is None:
                if closing:
                    self._done.set()
                    return
                continue
            try:
                done = self.store.save(entry)
                if done == "held":
                    self.skipped += 1
                elif done == "written":
                    self.written += 1
                else:
                    self.write_failed += 1
            except Exception:  # noqa: BLE001 - a bug in a write must not end the writer
                log.exception("prompt cache: a write failed")
                self.write_failed += 1
            finally:
                with self._lock:
                    self._pending -= entry.size

    def report(self) -> dict[str, object]:
        return {"disk": {"root": self.store.root, "written": self.written,
                         "skipped": self.skipped, "write_failed": self.write_failed,
                         "dropped": self.dropped, "read": self.read,
                         "read_failed": self.read_failed, "pending_bytes": self._pending}}
