"""Scans a stream's parse leaves unfinished, kept for the next parse of its longer text.

A stream parses its whole reply again after every piece (app.core.decode), which keeps the
parsers pure functions of the text; without this, a long open construct (a tool call's
arguments, a thought) is read from its start again at every piece, a cost per token that grows
with the reply. Inside ``resuming`` (one memo per stream) a parser keeps where an unfinished scan
stopped, keyed by what it scanned and from where, and the next parse resumes from there. A kept
scan is used only when the new text starts with the text it scanned; outside ``resuming``
nothing is kept and every scan starts afresh.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

Memo = dict[tuple[str, int], tuple[str, int, Any]]  # (scan, start) -> (text, stop, state)
_memo: ContextVar[Memo | None] = ContextVar("scan_memo", default=None)


@contextlib.contextmanager
def resuming(memo: Memo) -> Iterator[None]:
    """Unfinished scans go into ``memo`` and resume from it (one memo per growing text)."""
    token = _memo.set(memo)
    try:
        yield
    finally:
        _memo.reset(token)


def resume(kind: str, s: str, i: int) -> tuple[int, Any] | None:
    """Where a kept ``kind`` scan of ``s`` from ``i`` stopped, and its state; None: afresh."""
    memo = _memo.get()
    if memo is None:
        return None
    kept = memo.get((kind, i))
    if kept is None or not (kept[0] is s or s.startswith(kept[0])):
        return None
    return kept[1], kept[2]


def keep(kind: str, s: str, i: int, stop: int, state: Any = None) -> None:
    """Keep a ``kind`` scan of ``s`` from ``i`` that stopped at ``stop`` unfinished."""
    memo = _memo.get()
    if memo is not None:
        memo[(kind, i)] = (s, stop, state)
