"""Choosing each sequence's next token, with grammars that can never take the process down.

llama.cpp aborts the whole process (``GGML_ABORT``, or a C++ exception thrown through ctypes)
when a grammar sampler is asked to accept a token it refused: that happens with a grammar that
admits nothing (every logit -inf, the sampler picks one anyway), and with lazy grammars whose
trigger is followed by text the grammar does not expect. So a sequence's grammar is kept out of
its sampler chain, and a token reaches the grammar's ``accept`` only after the grammar's own
``apply`` said it is allowed:

1. sample with the chain alone (penalties, logit bias, top-k/p, min-p, temperature) and check
   that one token against the grammar: an O(stacks) check that passes for most tokens of a model
   following its grammar (what llama.cpp's common sampler does; exact for greedy decoding);
2. otherwise find the allowed tokens (the grammar applied to the vocabulary, prefiltered by the
   first byte of each token's text: a token whose first byte no grammar stack accepts is refused
   without asking; 100-200x fewer candidates for typical grammars, same result), and sample
   among them; none allowed ends the request with :class:`GrammarDeadEnd`.

Lazy grammars (tool calls under ``tool_choice: auto``) are lazy here, not in llama.cpp: the
sequence samples freely until a trigger word appears in its text, then the text from the trigger
on is fed to the grammar one byte token at a time, each checked first; text the grammar cannot
take means it was not a call, and the grammar is dropped. Grammar work per sampled token is
measured in the engine thread's own CPU time (``time.thread_time``), so a machine busy with other
work does not make a grammar look slow. A grammar whose first step is over ``max_step_ms`` is
refused before admission (:class:`GrammarTooSlow`, a 400: the grammar's own cost); a later step
over it ends that request with :class:`GrammarStepTooSlow`, a retryable server error (503, or a
server-type error event mid-stream): the engine thread is shared by every sequence, and a grammar
that passed its probe is not the caller's fault.
"""

from __future__ import annotations

import ctypes
import secrets
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from app.base.errors import BadRequest, Unavailable
from app.engine.types import SamplingParams

TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])  # llama_token_data
_NO_BYTE = 256  # first byte of an empty piece


class GrammarDeadEnd(BadRequest):
    """The grammar admits no token here (and the end of text is not allowed either)."""

    code = "grammar_dead_end"


class GrammarTooSlow(BadRequest):
    """The grammar's first step, probed before admission, took more engine CPU than allowed."""

    code = "grammar_too_slow"


class GrammarStepTooSlow(Unavailable):
    """A later step under a grammar that passed its probe took more engine CPU than allowed: the
    request ends, as a server error the caller may retry (never an invalid request)."""

    code = "grammar_too_slow"
    retry_after = 1


class Vocab:
    """Tables about the vocabulary, built once when the model loads."""

    def __init__(self, ll: Any, vocab: Any):
        self.ll = ll
        self.ptr = vocab
        n = ll.llama_vocab_n_tokens(vocab)
        self.n = n
        first = np.full(n, _NO_BYTE, dtype=np.int16)
        byte_token: dict[int, int] = {}
        eog: list[int] = []
        control: list[str] = []
        user_defined: list[str] = []
        longest = 1
        buf = ctypes.create_string_buffer(512)
        control_attrs = ll.LLAMA_TOKEN_ATTR_CONTROL | ll.LLAMA_TOKEN_ATTR_UNKNOWN
        pieces: list[bytes] = []
        for tok in range(n):
            k = ll.llama_token_to_piece(vocab, tok, buf, 512, 0, True)
            piece = buf.raw[: max(k, 0)] if k >= 0 else self._long_piece(tok, -k)
            pieces.append(piece)
            longest = max(longest, len(piece))
            if ll.llama_vocab_is_eog(vocab, tok):
                eog.append(tok)
            elif piece:
                first[tok] = piece[0]
                if len(piece) == 1 and piece[0] not in byte_token:
                    byte_token[piece[0]] = tok
            attrs = ll.llama_vocab_get_attr(vocab, tok)
            if attrs & control_attrs and piece:
                control.append(piece.decode("utf-8", "replace"))
            elif attrs & ll.LLAMA_TOKEN_ATTR_USER_DEFINED and len(piece) >= 2:
                user_defined.append(piece.decode("utf-8", "replace"))
        self.first_byte = first
        # every token's text (control tokens spelled out) in one buffer: the logprobs' token
        # strings, read on the engine thread without a call into llama.cpp
        self._blob = b"".join(pieces)
        self._starts = np.concatenate(([0], np.cumsum([len(p) for p in pieces]))).astype(np.int64)
        self.byte_token = byte_token
        self.rep_ids = np.array(sorted(byte_token.values()), dtype=np.int32)
        self.rep_bytes = np.array([first[t] for t in self.rep_ids], dtype=np.int16)
        # bytes no single token spells: tokens starting with them are always candidates
        self.unrepresented = np.array([b for b in range(256) if b not in byte_token], dtype=np.int16)
        self.eog_ids = np.array(eog, dtype=np.int32)
        self.longest_piece = longest
        self.control_texts = tuple(sorted(set(control), key=len, reverse=True))
        # user-defined tokens: llama.cpp matches their text even in text tokenized as plain
        # text (GPT-OSS's <|channel|>, <|message|> ... are such tokens)
        self.user_defined_texts = frozenset(user_defined)
        self.all_ids = np.arange(n, dtype=np.int32)
        self.scratch = np.zeros(n, dtype=TOKEN_DATA)  # engine thread only

    def piece(self, tok: int) -> bytes:
        """A token's text, control tokens spelled out (as llama-server's pieces show them)."""
        return self._blob[int(self._starts[tok]): int(self._starts[tok + 1])]

    def _long_piece(self, tok: int, size: int) -> bytes:
        buf = ctypes.create_string_buffer(size)
        k = self.ll.llama_token_to_piece(self.ptr, tok, buf, size, 0, True)
        return buf.raw[: max(k, 0)]


def _as_array(arr: np.ndarray, ll: Any) -> Any:
    return ll.llama_token_data_array(
        arr.ctypes.data_as(ctypes.POINTER(ll.llama_token_data)), len(arr), -1, False
    )


@dataclass
class GrammarSpec:
    """A grammar as the engine compiles it (on a prep thread)."""

    text: str
    triggers: tuple[str, ...] = ()
    takes_injection: bool = False
    prefilter: bool = True  # False when the grammar has token items (<[id]>)
    param: str = "grammar"  # the request field it came from, for errors


def sized(params: SamplingParams, n_ctx: int, n_vocab: int) -> SamplingParams:
    """``params`` with every field that sizes native work held to what it can mean: llama.cpp
    allocates the penalties' ring of ``penalty_last_n`` tokens per choice up front (2^31-1 asked
    for 8 GiB, and the worker died), and ctypes cuts an int to 32 bits without a word (top_k
    2^32+1 became 1). A sequence never holds more than ``n_ctx`` tokens, so a longer window is
    the context (-1 too, llama.cpp's "the context"; other negatives are off, as llama.cpp reads
    them); a top_k of the vocabulary or more keeps every token, so it is off. The APIs refuse
    or resolve these first; this holds for any caller."""
    window = params.penalty_last_n
    window = n_ctx if window == -1 or window > n_ctx else max(window, 0)
    top_k = params.top_k
    if top_k is not None and not 0 < top_k < n_vocab:
        top_k = 0
    if (window, top_k) == (params.penalty_last_n, params.top_k):
        return params
    return replace(params, penalty_last_n=window, top_k=top_k)


def compile_grammar(vocab: Vocab, text: str) -> Any:
    """A llama.cpp grammar sampler for ``text`` (already checked by app.grammar.gate), or None."""
    ptr = vocab.ll.llama_sampler_init_grammar(vocab.ptr, text.encode("utf-8"), b"root")
    return ptr or None


class Sampler:
    """One sequence's sampling: its chain, and its grammar held apart from the chain."""

    def __init__(
        self,
        vocab: Vocab,
        params: SamplingParams,
        index: int = 0,
        grammar: Any = None,
        spec: GrammarSpec | None = None,
        max_step_s: float = 0.1,
    ):
        self.vocab = vocab
        self.ll = vocab.ll
        self.chain = self._chain(params, index)
        self.grammar = grammar
        self.spec = spec
        self.triggers = tuple(t.encode() for t in spec.triggers) if spec else ()
        self.armed = grammar is not None and not self.triggers
        self._scanned = 0
        self.max_step_s = max_step_s
        self._one = np.zeros(1, dtype=TOKEN_DATA)
        self.grammar_seconds = 0.0

    @property
    def _param(self) -> str:
        return self.spec.param if self.spec else "grammar"

    # ---- building ---------------------------------------------------------------------------
    def _chain(self, p: SamplingParams, index: int) -> Any:
        ll, v = self.ll, self.vocab
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        add = ll.llama_sampler_chain_add
        bias = dict(p.logit_bias)
        if p.ignore_eos:
            bias.update({int(t): float("-inf") for t in v.eog_ids})
        if bias:
            arr = (ll.llama_logit_bias * len(bias))(*[ll.llama_logit_bias(t, b) for t, b in bias.items()])
            add(chain, ll.llama_sampler_init_logit_bias(v.n, len(bias), arr))
        if p.repeat_penalty != 1.0 or p.frequency_penalty or p.presence_penalty:
            add(chain, ll.llama_sampler_init_penalties(
                v.n, p.penalty_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty))
        if p.temperature <= 0:
            add(chain, ll.llama_sampler_init_greedy())
            return chain
        if p.top_k > 0:
            add(chain, ll.llama_sampler_init_top_k(p.top_k))
        if p.top_p < 1.0:
            add(chain, ll.llama_sampler_init_top_p(p.top_p, 1))
        if p.min_p > 0:
            add(chain, ll.llama_sampler_init_min_p(p.min_p, 1))
        add(chain, ll.llama_sampler_init_temp(p.temperature))
        seed = p.seed + index if p.seed is not None else secrets.randbits(32)
        add(chain, ll.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        return chain

    def free(self) -> None:
        if self.chain is not None:
            self.ll.llama_sampler_free(self.chain)
            self.chain = None
        self._drop_grammar()

    def _drop_grammar(self) -> None:
        if self.grammar is not None:
            self.ll.llama_sampler_free(self.grammar)
            self.grammar = None
        self.armed = False

    # ---- the grammar, safely ----------------------------------------------------------------
    def allows(self, tok: int) -> bool:
        """Whether the grammar accepts ``tok`` now (an apply over one candidate)."""
        one = self._one
        one["id"][0] = tok
        one["logit"][0] = 0.0
        self.ll.llama_sampler_apply(self.grammar, ctypes.byref(_as_array(one, self.ll)))
        return bool(np.isfinite(one["logit"][0]))

    def allowed(self, logits: np.ndarray | None, scratch: np.ndarray | None = None) -> np.ndarray:
        """The tokens the grammar allows now, with their logits (zeros without ``logits``)."""
        v, ll = self.vocab, self.ll
        if self.spec is None or self.spec.prefilter:
            reps = np.zeros(len(v.rep_ids), dtype=TOKEN_DATA)
            reps["id"] = v.rep_ids
            ll.llama_sampler_apply(self.grammar, ctypes.byref(_as_array(reps, ll)))
            ok = np.zeros(_NO_BYTE + 1, dtype=bool)
            ok[v.rep_bytes[np.isfinite(reps["logit"])]] = True
            ok[v.unrepresented] = True
            ids = np.union1d(np.flatnonzero(ok[v.first_byte]).astype(np.int32), v.eog_ids)
        else:
            ids = v.all_ids
        cand = scratch[: len(ids)] if scratch is not None else np.zeros(len(ids), dtype=TOKEN_DATA)
        cand["id"] = ids
        cand["logit"] = 0.0 if logits is None else logits[ids]
        cand["p"] = 0.0
        ll.llama_sampler_apply(self.grammar, ctypes.byref(_as_array(cand, ll)))
        return cand[np.isfinite(cand["logit"])].copy()

    def probe(self) -> None:
        """Before admission: a grammar that admits nothing at its start, or whose first full
        step is over the time limit, is refused now (a 400, not an error mid-stream)."""
        t0 = time.thread_time()
        if len(self.allowed(None)) == 0:
            raise GrammarDeadEnd(f"{self._param}: the grammar admits no output at all", param=self._param)
        spent = time.thread_time() - t0
        if spent > self.max_step_s:
            raise GrammarTooSlow(self._too_slow(spent, "its first sampling step"),
                                 param=self._param)

    def _too_slow(self, spent: float, step: str) -> str:
        return (f"{self._param}: {step} under this grammar took {spent * 1000:.0f} ms of CPU, "
                f"over the limit of {self.max_step_s * 1000:.0f} ms (GRAMMAR_MAX_STEP_MS)")

    def feed(self, data: bytes) -> bool:
        """Move the grammar over ``data``, one byte token at a time, each checked first; False
        (grammar state undefined) when some byte is not allowed or has no token of its own."""
        for b in data:
            tok = self.vocab.byte_token.get(b)
            if tok is None or not self.allows(tok):
                return False
            self.ll.llama_sampler_accept(self.grammar, tok)
        return True

    # ---- per step ---------------------------------------------------------------------------
    def sample(self, ctx: Any, i: int) -> int:
        """The next token from the logits at batch index ``i``; accepted by the chain (and the
        grammar). Raises GrammarDeadEnd / GrammarTooSlow."""
        ll = self.ll
        if not self.armed:
            return ll.llama_sampler_sample(self.chain, ctx, i)
        t0 = time.thread_time()  # this thread's CPU: other work on the machine does not count
        v = self.vocab
        logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, i), shape=(v.n,))
        arr = v.scratch
        arr["id"] = v.all_ids
        arr["logit"] = logits
        arr["p"] = 0.0
        cur = _as_array(arr, ll)
        ll.llama_sampler_apply(self.chain, ctypes.byref(cur))
        tok = int(arr["id"][cur.selected])
        if not self.allows(tok):
            allowed = self.allowed(logits, arr)
            if len(allowed) == 0:
                raise GrammarDeadEnd(
                    f"{self._param}: the grammar admits no continuation here (the output so far "
                    "cannot be completed)",
                    param=self._param,
                )
            cur = _as_array(allowed, ll)
            ll.llama_sampler_apply(self.chain, ctypes.byref(cur))
            tok = int(allowed["id"][cur.selected])
        ll.llama_sampler_accept(self.grammar, tok)
        ll.llama_sampler_accept(self.chain, tok)
        spent = time.thread_time() - t0
        self.grammar_seconds += spent
        if spent > self.max_step_s:
            raise GrammarStepTooSlow(self._too_slow(spent, "a sampling step"), param=self._param)
        return tok

    def accept_injected(self, tokens: list[int]) -> None:
        """Tokens inserted into the sequence (reasoning control): the chain's history takes
        them, and the grammar too when it was built to (each checked first)."""
        for tok in tokens:
            self.ll.llama_sampler_accept(self.chain, tok)
        if self.armed and self.spec is not None and self.spec.takes_injection:
            for tok in tokens:
                if not self.allows(tok):
                    raise GrammarDeadEnd(
                        f"{self._param}: the grammar does not take the injected text", param=self._param
                    )
                self.ll.llama_sampler_accept(self.grammar, tok)

    def observe(self, text: bytes | bytearray) -> None:
        """After new text: a lazy grammar looks for its trigger in ``text`` (everything the
        sequence generated), and takes hold from there."""
        if self.armed or self.grammar is None or not self.triggers:
            return
        longest = max(len(t) for t in self.triggers)
        start = max(0, self._scanned - longest + 1)
        hits = [i for i in (text.find(t, start) for t in self.triggers) if i != -1]
        self._scanned = len(text)
        if not hits:
            return
        if self.feed(bytes(text[min(hits):])):
            self.armed = True
        else:  # what follows the trigger is not a call the grammar knows: leave it be
            self._drop_grammar()
