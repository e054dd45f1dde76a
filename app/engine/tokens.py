"""Token lists and llama_batch rows, for the model's scheduler (app.engine.llama_batch) and the
draft model (app.engine.speculative) alike: the one prefix rule, and how a token goes into a
batch."""

from __future__ import annotations

import numpy as np


def common_prefix(cached: list[int], prompt: np.ndarray | list[int]) -> int:
    """How many leading tokens a slot's cache shares with a prompt, or a reply with its
    prediction (vectorised: a Python loop over 8 slots of 128k tokens stalled the engine
    thread ~50 ms per admission)."""
    n = min(len(cached), len(prompt))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(cached[:n], dtype=np.int32) != prompt[:n])
    return int(diff[0]) if len(diff) else n


def put(batch, i: int, token: int, pos: int, seq_id: int, logits: bool) -> None:
    """Row ``i`` of ``batch``: ``token`` at position ``pos`` of sequence ``seq_id``, with its
    logits computed when ``logits``."""
    batch.token[i] = token
    batch.pos[i] = pos
    batch.n_seq_id[i] = 1
    batch.seq_id[i][0] = seq_id
    batch.logits[i] = logits
