"""Gemma 4's argument syntax, read into JSON as it streams and written from JSON values.

Gemma 4 writes a call's arguments as ``{key:value,...}`` (its chat template's
``format_argument``): keys bare, a string between two ``<|"|>`` with nothing escaped inside,
numbers, ``true``, ``false`` and ``null`` as JSON writes them, objects and arrays nested the same
way. ``read_args`` turns that into JSON text that only ever grows as the reply does (a stream's
argument deltas concatenate to the final JSON), so a call's arguments reach every API as JSON.

The reader forgives what a model writes beside the grammar: a key between ``<|"|>``, spaces, a
trailing comma, a JSON-quoted string, Python's ``True`` / ``False`` / ``None`` (the template
writes a None value that way), and a bare word (read as a string).
"""

from __future__ import annotations

import json
import re
from typing import Any

from app.engine.text import held_suffix
from app.formats import memo
from app.formats.partial_json import string, ws

QUOTE = '<|"|>'  # opens and closes a string
_Q = len(QUOTE)
BARE_KEY = re.compile(r'[^\s:{}\[\],<"]+')  # a key written without quotes
_SCALAR = re.compile(r"[^,:{}\[\]<\"]+")  # a number, true/false/null, or a bare word
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_PYTHON = {"True": "true", "False": "false", "None": "null"}
_MEMO, _STRING = "gemma4-args", "gemma4-string"

# (JSON so far, containers open, what comes next, a comma owed before the next member)
State = tuple[str, tuple[str, ...], str, bool]


def to_gemma(value: Any) -> str:
    """A JSON value as Gemma writes it (the template's ``format_argument`` without escaped
    keys): for grammar literals and tests."""
    if isinstance(value, str):
        return QUOTE + value + QUOTE
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "{" + ",".join(f"{gemma_key(k)}:{to_gemma(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(to_gemma(v) for v in value) + "]"
    return json.dumps(value)


def gemma_key(key: str) -> str:
    """A key as Gemma writes it: bare where the reader can tell where it ends, else quoted."""
    return key if BARE_KEY.fullmatch(key) else QUOTE + key + QUOTE


def _escaped(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _scalar(token: str) -> str | None:
    """A scalar's JSON: JSON's own literals as they are, Python's mapped, a bare word a string."""
    token = token.strip()
    if not token:
        return None
    if _NUMBER.fullmatch(token) or token in ("true", "false", "null"):
        return token
    return _PYTHON.get(token) or json.dumps(token, ensure_ascii=False)


def read_args(s: str, i: int, final: bool = False) -> tuple[str, int | None]:
    """The Gemma object at ``s[i]`` (its ``{``) as JSON: (the JSON so far, where the object
    ends: None while it is open, -1 when the text is not Gemma's syntax). The JSON so far is a
    prefix of the JSON of any longer text; a string value streams as it is written."""
    kept = memo.resume(_MEMO, s, i)  # a stream: go on where the last parse stopped
    if kept is not None:
        j, (done, stack_t, state, comma) = kept
        out, stack = [done], list(stack_t)
    else:
        j, out, stack, state, comma = i, [], [], "value", False
    n = len(s)

    def wait(at: int, partial: str = "") -> tuple[str, None]:
        """The text ends inside the token at ``at``: keep the state before it."""
        done = "".join(out)
        memo.keep(_MEMO, s, i, at, (done, tuple(stack), state, comma))
        return done + partial, None

    while True:
        j = ws(s, j)
        if j >= n:
            return wait(j)
        c = s[j]
        sep = ", " if comma else ""
        if state == "after":  # a value ended: a comma or the container's close
            if c == ",":
                comma, state, j = True, ("key" if stack[-1] == "{" else "value"), j + 1
                continue
            if c != ("}" if stack[-1] == "{" else "]"):
                return "".join(out), -1
        if c in "}]" and stack and c == ("}" if stack[-1] == "{" else "]") and (
                state == "after" or state == ("key" if c == "}" else "value")):
            out.append(c)  # a close (after a trailing comma, too: forgiven)
            stack.pop()
            comma, state, j = False, "after", j + 1
            if not stack:
                return "".join(out), j
            continue
        if state == "key":
            if s.startswith(QUOTE, j):
                k = s.find(QUOTE, j + _Q)
                if k == -1:
                    return wait(j)
                key, after = s[j + _Q : k], k + _Q
            elif QUOTE.startswith(s[j:]):
                return wait(j)
            else:
                m = BARE_KEY.match(s, j)
                if m is None:
                    return "".join(out), -1
                key, after = m.group(), m.end()
            colon = ws(s, after)
            if colon >= n:
                return wait(j)
            if s[colon] != ":":
                return "".join(out), -1
            out.append(sep + json.dumps(key, ensure_ascii=False) + ": ")
            comma, state, j = False, "value", colon + 1
            continue
        # a value (the object itself first)
        if not stack and c != "{":
            return "".join(out), -1
        if c in "{[":
            out.append(sep + c)
            stack.append(c)
            comma, state, j = False, ("key" if c == "{" else "value"), j + 1
            continue
        if s.startswith(QUOTE, j):
            start = j + _Q
            open_ = memo.resume(_STRING, s, start)  # (searched up to, (its escaping, of chars))
            k = s.find(QUOTE, max(start, open_[0] - _Q + 1) if open_ else start)
            if k == -1:  # escaping is per character: each piece is escaped once
                done, n_done = open_[1] if open_ else ("", 0)
                cut = len(s) - (0 if final else held_suffix(s, (QUOTE,)))
                done += _escaped(s[start + n_done : cut])
                memo.keep(_STRING, s, start, n, (done, cut - start))
                return wait(j, sep + '"' + done)
            out.append(sep + '"' + _escaped(s[start:k]) + '"')
            comma, state, j = False, "after", k + _Q
            continue
        if QUOTE.startswith(s[j:]):
            return wait(j)
        if c == '"':  # a JSON string
            try:
                text, end, closed = string(s, j)
            except ValueError:
                return "".join(out), -1
            if not closed:
                return wait(j, sep + '"' + _escaped(text))
            out.append(sep + json.dumps(text, ensure_ascii=False))
            comma, state, j = False, "after", end
            continue
        m = _SCALAR.match(s, j)
        if m is None:
            return "".join(out), -1
        if m.end() >= n and not final:
            return wait(j)  # a number may go on
        value = _scalar(m.group())
        if value is None:
            return "".join(out), -1
        out.append(sep + value)
        comma, state, j = False, "after", m.end()
