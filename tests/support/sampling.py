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


def token_pieces(vocab: Any) -> list[bytes]:
    """Every token's bytes, special tokens' text included."""
    buf = ctypes.create_string_buffer(512)
    out = []
    for tok in range(vocab.n):
        k = vocab.ll.llama_token_to_piece(vocab.ptr, tok, buf, 512, 0, True)
        out.append(buf.raw[:k] if k >= 0 else vocab._long_piece(tok, -k))
    return out


def grammar_sampler(vocab: Any, text: str, seed: int = 0, triggers: tuple[str, ...] = ()) -> Any:
    """The engine's own Sampler under grammar ``text`` (lazy on ``triggers``), hot enough to
    wander: what random weights would write, held by the grammar."""
    from app.engine.sampling import GrammarSpec, Sampler, compile_grammar
    from app.engine.types import SamplingParams

    ptr = compile_grammar(vocab, text)
    assert ptr is not None
    params = SamplingParams(grammar=text, grammar_triggers=triggers, temperature=1.5, seed=seed)
    # the step limit is the engine's guard against slow grammars, not what these tests measure
    return Sampler(vocab, params, 0, ptr, GrammarSpec(text, triggers), max_step_s=30.0)


def closers_of(pieces: list[bytes], ends: tuple[bytes, ...] = (b"}", b"]", b",")
               ) -> tuple[np.ndarray, np.ndarray]:
    """Tokens that can end a string, and those that start with one of ``ends`` (what ends a
    container or a value): favoured so that outputs finish."""
    return (np.array([p[:1] == b'"' for p in pieces]),
            np.array([p[:1] in ends for p in pieces]))


def tag_paths(pieces: list[bytes], tags: tuple[bytes, ...]) -> dict[bytes, np.ndarray]:
    """For each proper prefix of each tag, the tokens that continue it along the tag: what to
    favour so that a closing tag (``</parameter>``) is written to its end once begun."""
    out: dict[bytes, list[int]] = {}
    for tag in tags:
        for k in range(len(tag)):
            rest = tag[k:]
            out.setdefault(tag[:k], []).extend(
                t for t, p in enumerate(pieces) if p and rest.startswith(p))
    return {k: np.array(sorted(set(v)), dtype=np.int64) for k, v in out.items()}


def sample_once(vocab: Any, pieces: list[bytes], closers: tuple[np.ndarray, np.ndarray],
                text: str, seed: int, max_tokens: int,
                paths: dict[bytes, np.ndarray] | None = None) -> bytes | None:
    """One output under grammar ``text`` from random logits, or None when ``max_tokens`` cut it.
    ``paths`` (tag_paths): a tag begun is favoured to its end, and one begins now and then."""
    rng = np.random.default_rng(seed)
    s = grammar_sampler(vocab, text, seed)
    fake = OwnLogits(vocab.ll, vocab.n)
    s.ll = fake
    eog = int(vocab.eog_ids[0])
    boost = rng.uniform(8.0, 14.0)
    out = bytearray()
    try:
        s.probe()
        for _ in range(max_tokens):
            if s.allows(eog) and rng.random() < 0.3:
                return bytes(out)
            fake.logits[:] = rng.standard_normal(vocab.n).astype(np.float32) * 2.0
            fake.logits[closers[0]] += boost
            fake.logits[closers[1]] += boost / 2
            for begun, toks in (paths or {}).items():
                if begun and out.endswith(begun):
                    fake.logits[toks] += 3 * boost
                elif not begun and rng.random() < 0.2:
                    fake.logits[toks] += boost
            tok = s.sample(None, 0)
            if tok in vocab.eog_ids:
                return bytes(out)
            out += pieces[tok]
        return None
    finally:
        s.free()
