"""The engine's last word on request fields that size native work (app.engine.sampling.sized):
whatever an API let through, the penalties' window is at most the context and top_k is a count
below the vocabulary, before any value reaches ctypes (which cuts ints to 32 bits silently)."""

from __future__ import annotations

import pytest

from app.engine.sampling import sized
from app.engine.types import SamplingParams

N_CTX, N_VOCAB = 1024, 49152


@pytest.mark.parametrize("asked, window", [
    (64, 64), (0, 0), (N_CTX, N_CTX), (N_CTX + 1, N_CTX), (2**31 - 1, N_CTX),
    (2**32 + 2**31 - 1, N_CTX),  # 2^31-1 once ctypes has cut it to 32 bits
    (10**300, N_CTX), (-1, N_CTX), (-2, 0), (-2**31, 0),
])
def test_the_penalty_window_is_at_most_the_context(asked, window):
    assert sized(SamplingParams(penalty_last_n=asked), N_CTX, N_VOCAB).penalty_last_n == window


@pytest.mark.parametrize("asked, top_k", [
    (40, 40), (0, 0), (None, None), (N_VOCAB - 1, N_VOCAB - 1), (N_VOCAB, 0), (2**31 - 1, 0),
    (2**32 + 1, 0),  # ctypes would have made it 1: greedy, silently
    (10**300, 0), (-5, 0),
])
def test_top_k_keeping_the_whole_vocabulary_is_off(asked, top_k):
    assert sized(SamplingParams(top_k=asked), N_CTX, N_VOCAB).top_k == top_k


def test_params_within_bounds_are_kept_as_they_are():
    params = SamplingParams(top_k=40, penalty_last_n=64, seed=2**80)
    assert sized(params, N_CTX, N_VOCAB) is params
