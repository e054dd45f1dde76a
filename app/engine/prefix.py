"""How much of a sequence's cached tokens a new token list shares: the one prefix rule, for
the target's slots (app.engine.llama_batch) and the draft model's sequences
(app.engine.speculative)."""

from __future__ import annotations

import numpy as np


def common_prefix(cached: list[int], prompt: np.ndarray) -> int:
    """How many leading tokens a slot's cache shares with a prompt (vectorised: a Python loop
    over 8 slots of 128k tokens stalled the engine thread ~50 ms per admission)."""
    n = min(len(cached), len(prompt))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(cached[:n], dtype=np.int32) != prompt[:n])
    return int(diff[0]) if len(diff) else n
