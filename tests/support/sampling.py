"""Driving the engine's sampler without a context: the model loaded vocab-only, and logits of
the test's own making."""

from __future__ import annotations

import ctypes
import time
from typing import Any

import numpy as np


class OwnLogits:
    """llama.cpp's module, but ``llama_get_logits_ith`` hands out ``logits`` (set them between
    steps), after an optional wall-clock nap (time that costs no CPU: a machine busy elsewhere)."""

    def __init__(self, ll: Any, n: int, nap: float = 0.0):
        self._ll, self._nap = ll, nap
        self.logits = np.zeros(n, dtype=np.float32)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ll, name)

    def llama_get_logits_ith(self, ctx: Any, i: int) -> Any:
        if self._nap:
            time.sleep(self._nap)
        return self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
