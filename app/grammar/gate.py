"""The grammar gate: every grammar the engine sees passes :func:`check` first.

A grammar llama.cpp would build too big or too deep can kill the process or stall every
sequence, so the gate measures it first (:mod:`app.grammar.gbnf_parse`, the GBNF parsed the way
llama.cpp parses it, without recursion) and refuses, with a 400 naming the field and the limit,
any grammar over one of :class:`Limits`: text size, rules after expansion, symbols after
expansion, nesting depth, a repetition bound, alternatives in one rule, optional items in a row.
Verdicts are cached: clients send the same schemas and tools again and again. What limits cannot
prove (the cost of one sampling step) the engine measures: see ``app.engine.sampling``.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, fields
from typing import Any

from app.base.bridge import allocate_lock
from app.base.errors import BadRequest
from app.grammar.gbnf_parse import Malformed, OverLimit, Stats, measure


class GrammarError(BadRequest):
    """A grammar that does not parse, or that is over a limit."""

    code = "invalid_grammar"


class GrammarTooComplex(GrammarError):
    code = "grammar_too_complex"


@dataclass(frozen=True)
class Limits:
    """What a grammar may cost. Each field is the setting ``grammar_<field>`` (its default,
    bounds and description live in app.settings)."""

    max_bytes: int
    max_rules: int
    max_symbols: int
    max_depth: int
    max_repetition: int
    max_alternatives: int
    max_optionals: int
    max_step_ms: float
    max_properties: int
    max_optional_properties: int

    @classmethod
    def from_settings(cls, settings: Any) -> Limits:
        return cls(**{f.name: getattr(settings, f"grammar_{f.name}") for f in fields(cls)})


_CACHE_SIZE = 256
_CACHE_LOCK = allocate_lock()  # the gate runs on several worker threads

# a digest of the text and the limits -> the verdict: the stats, or the error's class and message
# (not the error itself: its traceback holds the frames that hold the text)
_VERDICTS: OrderedDict[tuple[bytes, Limits], Stats | tuple[type[GrammarError], str]] = OrderedDict()


def check(text: str, param: str, limits: Limits) -> Stats:
    """Parse ``text`` as llama.cpp would and enforce ``limits``; a 400 naming ``param``.

    Verdicts are cached by a digest of the text (clients send the same schemas and tools again
    and again); a text over ``GRAMMAR_MAX_BYTES`` is refused first, and nothing of it is kept.
    """
    data = text.encode("utf-8", "surrogatepass")
    if len(data) > limits.max_bytes:
        raise GrammarTooComplex(
            f"{param}: the grammar is {len(data)} bytes, over the limit of {limits.max_bytes} "
            "(GRAMMAR_MAX_BYTES)", param=param)
    key = (hashlib.sha256(data).digest(), limits)
    del data
    with _CACHE_LOCK:
        verdict = _VERDICTS.get(key)
        if verdict is not None:
            _VERDICTS.move_to_end(key)
    if verdict is None:
        try:
            verdict = _check(text, limits)
        except GrammarError as exc:
            verdict = (type(exc), exc.message)
        with _CACHE_LOCK:
            _VERDICTS[key] = verdict
            while len(_VERDICTS) > _CACHE_SIZE:
                _VERDICTS.popitem(last=False)
    if isinstance(verdict, tuple):
        kind, message = verdict
        raise kind(f"{param}: {message}", param=param)
    return verdict


def _check(text: str, limits: Limits) -> Stats:
    """The verdict on a grammar within ``GRAMMAR_MAX_BYTES``, whichever field it came from
    (``check`` names the field)."""
    if "\x00" in text:
        raise GrammarError("the grammar contains a NUL character")
    try:
        return measure(text, limits)
    except OverLimit as exc:
        raise GrammarTooComplex(f"the grammar is too complex: {exc} ({exc.setting})") from None
    except Malformed as exc:
        raise GrammarError(f"the grammar does not parse: {exc}") from None
