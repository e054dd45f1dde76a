"""Log probabilities of tokens, on the engine thread: log-softmax over the whole vocabulary of
one logits row, before any sampling transform (penalties, logit bias, top-k/p, temperature and
grammars change what is sampled, not what is reported), and the likeliest tokens of that row.

A row costs a few passes over ``n_vocab`` floats (tens of microseconds for 50k tokens), paid
only by the requests that ask. Scoring a prompt needs a row at every prompt position, so a step
scores at most :data:`STEP_LOGITS` floats' worth of positions (:func:`rows_per_step`): that
bounds llama.cpp's output buffer (it grows to the most rows one ``llama_decode`` returns, and
stays) and the engine thread's time per step, whatever the prompt's length.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from app.engine.types import TokenScore

# Logits scored per engine step at most, over all prompt positions (16 MiB of float32).
STEP_LOGITS = 1 << 22
# JSON has no -inf: a token the model gives no probability at all is reported at this floor
# (vLLM's choice too).
FLOOR = -9999.0


def rows_per_step(n_vocab: int, prefill_chunk: int) -> int:
    """How many prompt positions one step may score: at least one, at most a prompt chunk."""
    return max(1, min(prefill_chunk, STEP_LOGITS // max(n_vocab, 1)))


def _finite(value: float) -> float:
    return value if value > FLOOR else FLOOR  # -inf and NaN (NaN > x is False) to the floor


def score(row: np.ndarray, token: int, top_n: int, vocab: Any, offset: int = 0) -> TokenScore:
    """``token``'s log probability under the logits ``row``, with the ``top_n`` likeliest
    tokens (``vocab.piece`` spells them)."""
    peak = float(row.max())
    # float64 for the sum: 256k exponentials summed in float32 lose the digits that matter
    lse = peak + math.log(float(np.exp(row - peak).sum(dtype=np.float64)))
    top: tuple[tuple[int, bytes, float], ...] = ()
    if top_n == 1:
        best = int(row.argmax())
        top = ((best, vocab.piece(best), _finite(float(row[best]) - lse)),)
    elif top_n > 1:
        k = min(top_n, len(row))
        ids = np.argpartition(row, len(row) - k)[len(row) - k:]
        ids = ids[np.argsort(-row[ids], kind="stable")]
        top = tuple((int(t), vocab.piece(int(t)), _finite(float(row[t]) - lse)) for t in ids)
    return TokenScore(token, vocab.piece(token), _finite(float(row[token]) - lse), top, offset)


def logits_row(ll: Any, ctx: Any, i: int, n_vocab: int) -> np.ndarray:
    """The logits llama.cpp computed at batch index ``i`` (a view: read before the next
    ``llama_decode``)."""
    return np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, i), shape=(n_vocab,))


def chars(data: bytes | bytearray) -> int:
    """How many characters UTF-8 ``data`` starts (every byte but a continuation byte)."""
    return sum(1 for b in data if b & 0xC0 != 0x80)
