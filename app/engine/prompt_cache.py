"""Prompts kept when their slot is taken: a host-RAM cache of sequences' KV (PROMPT_CACHE_RAM_MB).

A slot keeps its last conversation's KV for that conversation's next turn, but with more
conversations than slots each new one takes a slot from an older one, whose next turn then
decodes its whole prompt again (on this project's CPU, seconds per thousand tokens; on a GPU,
the agent's 20k-token prompt again at every turn). Before a slot's cells are overwritten, the
scheduler copies them out (``llama_state_seq_get_data``: a memory copy of the sequence's cells)
into this cache with the tokens they hold; a later prompt that extends a cached one more than
any slot does has them copied back (``llama_state_seq_set_data``) and decodes only the rest, as
llama-server's ``--cache-ram`` does.

The cache is pure bookkeeping: entries by key scope (an API key's, with the adapter set: the
same partition as the slots' prefix reuse, so a cache hit tells no key about another's prompts),
bounded in bytes, least recently used out first. An entry restored goes back into a slot and
leaves the cache (the slot holds it now; it is saved again when that slot is taken). Blobs are
only valid for the context that made them: the cache lives and dies with one context.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from app.engine.kv import KvSeq
from app.engine.tokens import Mark, common_prefix


@dataclass(eq=False)
class Entry:
    """One sequence's cells, copied out: the tokens (and images) they hold, the position the
    next token takes, and llama.cpp's blob of the cells."""

    scope: str
    tokens: np.ndarray  # int32
    marks: tuple[Mark, ...]
    n_pos: int
    blob: Any  # a ctypes uint8 array, as llama_state_seq_get_data filled it
    size: int = field(default=0)
    # what to do when llama.cpp refuses the blob (a file read back: delete it, or every
    # request extending it would read it again)
    on_refused: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        self.size = self.size or len(self.blob)


class Held(Protocol):
    """What a kept prompt (or a sequence) says of itself: the tokens and images its cells
    hold."""

    @property
    def tokens(self) -> Sequence[int]: ...

    @property
    def marks(self) -> Sequence[Mark]: ...


H = TypeVar("H", bound=Held)


def holds(have: Held, tokens: np.ndarray, marks: Sequence[Mark] = ()) -> bool:
    """Whether ``have`` holds ``tokens`` with the same images (or more after them): what makes
    a kept prompt not worth keeping again, and one another extends not worth keeping."""
    n = len(tokens)
    return len(have.tokens) >= n and common_prefix(have.tokens, tokens, have.marks, marks) == n


def longest(candidates: Iterable[H], prompt: np.ndarray, wanted: Sequence[Mark],
            whole_only: bool) -> tuple[H | None, int]:
    """The candidate sharing the longest prefix with ``prompt``, and how long (None, 0 when
    none shares a token); with ``whole_only`` (a recurrent model), only one the prompt holds
    whole counts."""
    best: H | None = None
    n_best = 0
    for c in candidates:
        n = common_prefix(c.tokens, prompt, c.marks, wanted)
        if whole_only and n < len(c.tokens):
            continue
        if n > n_best:
            best, n_best = c, n
    return best, n_best


@dataclass
class CacheStats:
    """Counters since the context opened (for /health and /metrics)."""

    saved: int = 0  # entries put in
    restored: int = 0  # entries copied back into a slot
    restored_tokens: int = 0  # prompt tokens those restores spared a decode
    evicted: int = 0  # entries dropped for room (least recently used first)
    failed: int = 0  # copies llama.cpp refused (the entry is dropped)


class PromptCache:
    """Entries by scope, at most ``max_bytes`` of blobs in all, least recently used first out."""

    def __init__(self, max_bytes: int, min_tokens: int = 64, whole_only: bool = False):
        self.max_bytes = max_bytes
        # a recurrent (or hybrid) model's memory cannot drop a suffix: an entry serves only a
        # prompt that holds all of it
        self.whole_only = whole_only
        # a sequence shorter than this is not worth a copy: decoding it again costs about as
        # much (and a full cache of tiny entries would be a long list to search)
        self.min_tokens = min_tokens
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # oldest use first
        self.bytes = 0
        self.tokens = 0
        self.stats = CacheStats()
        # where an entry goes when it leaves for room (or is too big to stay): the disk
        # (PROMPT_CACHE_DIR), on the engine thread, so this must not block
        self.on_evict: Callable[[Entry], None] | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[Entry]:
        """Least recently used first."""
        return list(self._entries.values())

    def best(self, scope: str, prompt: np.ndarray, wanted: Sequence[Mark] = (),
             also: Entry | None = None) -> tuple[Entry | None, int]:
        """The entry of ``scope`` that shares the longest prefix with ``prompt``, and how long
        (None, 0 when none shares a token); ``also``: one more to weigh (read from disk)."""
        extra = [also] if also is not None else []
        return longest([e for e in [*self._entries.values(), *extra] if e.scope == scope],
                       prompt, wanted, self.whole_only)

    def covers(self, scope: str, tokens: Sequence[int], marks: Sequence[Mark] = ()) -> bool:
        """Whether an entry of ``scope`` already holds ``tokens`` (or more after them), with
        the same images."""
        arr = np.asarray(tokens, dtype=np.int32)
        return any(e.scope == scope and holds(e, arr, marks) for e in self._entries.values())

    def put(self, entry: Entry) -> bool:
        """Keep ``entry``, making room by dropping the least recently used ones; entries of its
        scope it extends go (it holds all they do). False when it alone is over the bound."""
        if entry.size > self.max_bytes:
            if self.on_evict is not None:
                self.on_evict(entry)
            return False
        for key, old in list(self._entries.items()):
            if old.scope == entry.scope and holds(entry, old.tokens, old.marks):
                self._drop(key)
        while self.bytes + entry.size > self.max_bytes and self._entries:
            old = self._drop(next(iter(self._entries)))
            self.stats.evicted += 1
            if old is not None and self.on_evict is not None:
                self.on_evict(old)
        self._entries[id(entry)] = entry
        self.bytes += entry.size
        self.tokens += len(entry.tokens)
        self.stats.saved += 1
        return True

    def take(self, entry: Entry) -> None:
        """``entry`` leaves the cache (copied back into a slot, or refused by llama.cpp)."""
        self._drop(id(entry))

    def clear(self) -> None:
        for key in list(self._entries):
            self._drop(key)

    def _drop(self, key: int) -> Entry | None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.bytes -= entry.size
            self.tokens -= len(entry.tokens)
        return entry

    def report(self) -> dict[str, object]:
        """For /health and /metrics (any thread: counters only, no walk of the entries)."""
        s = self.stats
        return {"prompt_cache": {
            "entries": len(self._entries), "bytes": self.bytes, "max_bytes": self.max_bytes,
            "tokens": self.tokens,
            "saved": s.saved, "restored": s.restored, "restored_tokens": s.restored_tokens,
            "evicted": s.evicted, "failed": s.failed}}


def keep_aside(cache: PromptCache, ctx: Any, kv: KvSeq, scope: str, kept: int,
               others: Sequence[tuple[str, KvSeq]]) -> bool:
    """Before a sequence's cells are overwritten (all but their first ``kept`` tokens), copy
    them into ``cache`` when that saves a later prompt a decode worth the copy: at least
    ``min_tokens`` lost (an agent's conversations share a long system prompt: what one loses
    to the next is its own history), and the tokens not already held by the cache or by
    another sequence of the same scope (``others``: (scope, KV) of the other slots). Whether
    it did."""
    n = len(kv)
    if n - kept < cache.min_tokens or kv.drafted:
        return False
    tokens = np.asarray(kv.tokens, dtype=np.int32)
    marks = tuple(kv.marks)
    if cache.covers(scope, tokens, marks) or any(
            s == scope and holds(o, tokens, marks) for s, o in others if o is not kv):
        return False
    blob = kv.snapshot(ctx)
    if blob is None:
        cache.stats.failed += 1
        return False
    return cache.put(Entry(scope, tokens, marks, kv.n_pos, blob))


def bring_back(cache: PromptCache, ctx: Any, kv: KvSeq, entry: Entry) -> bool:
    """``entry``'s cells copied back into ``kv`` (replacing what it held); it leaves the cache
    either way. False if llama.cpp refused it (``kv`` is then empty)."""
    cache.take(entry)
    if kv.restore(ctx, entry.blob, entry.tokens, entry.marks, entry.n_pos):
        cache.stats.restored += 1
        return True
    cache.stats.failed += 1
    if entry.on_refused is not None:
        entry.on_refused()
    return False
