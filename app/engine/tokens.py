"""Token lists and llama_batch rows, for the model's scheduler (app.engine.scheduler) and the
draft model (app.engine.speculative) alike: the one prefix rule, and how a token goes into a
batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class Mark(NamedTuple):
    """An image (or a sound) in a token list: ``n`` placeholder ids from ``start``, and the
    full digest of its content. The ids carry only 28 bits of it (they must fit an int32 and
    stay negative), so equal ids are the same image only when the digests say so."""

    start: int
    n: int
    digest: str


def common_prefix(cached: list[int], prompt: np.ndarray | list[int],
                  held: Sequence[Mark] = (), wanted: Sequence[Mark] = ()) -> int:
    """How many leading tokens a slot's cache shares with a prompt, or a reply with its
    prediction (vectorised: a Python loop over 8 slots of 128k tokens stalled the engine
    thread ~50 ms per admission). ``held`` and ``wanted``: the images in ``cached`` and in
    ``prompt``; the prefix stops at the first of the prompt's images the cache does not hold
    with the same digest (a colliding pair of 28-bit ids is found in 0.1 s)."""
    n = min(len(cached), len(prompt))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(cached[:n], dtype=np.int32) != prompt[:n])
    n = int(diff[0]) if len(diff) else n
    if wanted:
        have = {(m.start, m.n): m.digest for m in held}
        n = min([m.start for m in wanted
                 if m.start < n and have.get((m.start, m.n)) != m.digest], default=n)
    return n


def put(batch, i: int, token: int, pos: int, seq_id: int, logits: bool) -> None:
    """Row ``i`` of ``batch``: ``token`` at position ``pos`` of sequence ``seq_id``, with its
    logits computed when ``logits`` (llama.cpp's ``common_batch_add``, at a given row)."""
    batch.token[i] = token
    batch.pos[i] = pos
    batch.n_seq_id[i] = 1
    batch.seq_id[i][0] = seq_id
    batch.logits[i] = logits
