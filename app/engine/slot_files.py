"""llama-server's slot actions (POST /slots/{id}?action=save|restore|erase): a slot's KV as a
named file of PROMPT_CACHE_DIR (app.engine.prompt_store's format and checks), read back into a
slot, or dropped. The cells are copied on the engine thread, between steps; the file's I/O runs
on the calling thread."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from app.base.errors import BadRequest, EngineFailure, NotFound
from app.engine.prompt_cache import Entry
from app.engine.prompt_file import BadFile, digest_scope
from app.engine.prompt_store import PromptStore
from app.engine.scheduler import Scheduler
from app.engine.slots import Slot

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


def slot_action(store: PromptStore | None,
                on_engine: Callable[[Callable[[Scheduler], Any]], Any],
                slot_id: int, action: str, filename: object) -> dict[str, object]:
    """llama-server's slot actions, in its answers' shapes: the cells copied on the engine
    thread (``on_engine``), the file's I/O on the calling one."""
    t0 = time.perf_counter()
    if action == "erase":
        return {"id_slot": slot_id, "n_erased": on_engine(lambda s: erase_slot(s, slot_id))}
    assert store is not None
    name = slot_file_name(filename)
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
