"""Python literals read as far as they go, as JSON: what pythonic call lists
(``[get_weather(city="Paris", days=3)]``) write as their arguments.

Like app.formats.partial_json, each function takes the whole text so far and an offset, and
returns what the text says up to there or raises ``Incomplete`` (wait for more) or
``ValueError`` (not a literal). Strings (single or double quoted, Python's escapes, and JSON's
``\\/``), numbers, ``True`` / ``False`` / ``None`` (and JSON's ``true`` / ``false`` / ``null``,
which models trained on JSON write too), lists, tuples and dicts with literal keys.
"""

from __future__ import annotations

import json
import re
from typing import Any

from app.formats.memo import keep as _keep
from app.formats.memo import resume as _resume
from app.formats.partial_json import Incomplete, ws

_NUMBER = re.compile(r"[-+]?(?:\d[\d_]*)?(?:\.\d[\d_]*|\.)?(?:[eE][-+]?\d+)?")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WORDS = {"True": True, "False": False, "None": None, "true": True, "false": False, "null": None}
_SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "v": "\v", "a": "\a",
           "\\": "\\", "'": "'", '"': '"', "/": "/", "\n": ""}
_PLAIN = {'"': re.compile(r'[^"\\\n]+'), "'": re.compile(r"[^'\\\n]+")}
_HEX = {"x": 2, "u": 4, "U": 8}
# a value ends at one of these (after spaces): the next argument, the call's end, a container's
_ENDS = ",)]}:"


class BadString(ValueError):
    """A string literal that cannot go on (a raw newline, a bad escape): ``text`` is what it
    said before that."""

    def __init__(self, text: str):
        super().__init__("not a string literal")
        self.text = text


def string(s: str, i: int) -> tuple[str, int, bool]:
    """A string literal from its opening quote: (text so far, end, closed). Stops before an
    escape that is not complete yet, so the text so far only ever grows."""
    quote = s[i]
    if quote not in _PLAIN:
        raise ValueError("expected a string")
    kept = _resume("pystring", s, i)
    j, out = (kept[0], [kept[1]]) if kept is not None else (i + 1, [])
    plain = _PLAIN[quote]
    while j < len(s):
        m = plain.match(s, j)
        if m:
            out.append(m.group())
            j = m.end()
            continue
        c = s[j]
        if c == quote:
            return "".join(out), j + 1, True
        if c == "\n":
            raise BadString("".join(out))
        if j + 1 >= len(s):
            break
        e = s[j + 1]
        if e in _SIMPLE:
            out.append(_SIMPLE[e])
            j += 2
        elif e in _HEX:
            n = _HEX[e]
            if j + 2 + n > len(s):
                break
            try:
                out.append(chr(int(s[j + 2 : j + 2 + n], 16)))
            except ValueError:
                raise BadString("".join(out)) from None
            j += 2 + n
        elif e in "01234567":
            digits = re.match(r"[0-7]{1,3}", s[j + 1 : j + 4])
            assert digits is not None
            if j + 1 + len(digits.group()) >= len(s) and len(digits.group()) < 3:
                break  # more digits may follow
            out.append(chr(int(digits.group(), 8)))
            j += 1 + len(digits.group())
        else:  # Python keeps an unknown escape as it is
            out.append("\\" + e)
            j += 2
    text = "".join(out)
    _keep("pystring", s, i, j, text)
    return text, j, False


def _delimited(s: str, j: int) -> int:
    """``j`` if the text there ends a value (spaces, then a delimiter); Incomplete at the end."""
    k = ws(s, j)
    if k >= len(s):
        raise Incomplete
    if s[k] not in _ENDS:
        raise ValueError("a literal runs into more text")
    return j


def value(s: str, i: int) -> tuple[Any, int]:
    """One complete literal from ``i`` (spaces skipped): (its value, its end). A scalar counts as
    complete only once a delimiter follows it (``12`` may become ``123``)."""
    i = ws(s, i)
    if i >= len(s):
        raise Incomplete
    c = s[i]
    if c in "\"'":
        text, end, closed = string(s, i)
        if not closed:
            raise Incomplete
        return text, end
    if c in "[({":
        return _container(s, i)
    m = _WORD.match(s, i)
    if m:
        if m.group() not in _WORDS:
            if m.end() == len(s) and any(w.startswith(m.group()) for w in _WORDS):
                raise Incomplete
            raise ValueError(f"not a literal: {m.group()}")
        return _WORDS[m.group()], _delimited(s, m.end())
    m = _NUMBER.match(s, i)
    if not m or not m.group() or m.group() in "+-.":
        if m and m.end() == len(s):
            raise Incomplete
        raise ValueError("not a literal")
    end = _delimited(s, m.end())
    text = m.group().replace("_", "")
    if re.fullmatch(r"[-+]?\d+", text):
        return int(text), end
    return float(text), end


def _container(s: str, i: int) -> tuple[Any, int]:
    """A list, tuple or dict from its opening bracket."""
    close = {"[": "]", "(": ")", "{": "}"}[s[i]]
    is_dict = s[i] == "{"
    items: list[Any] = []
    pairs: dict[str, Any] = {}
    j = i + 1
    while True:
        j = ws(s, j)
        if j >= len(s):
            raise Incomplete
        if s[j] == close:
            return (pairs if is_dict else items), j + 1
        if items or pairs:
            if s[j] != ",":
                raise ValueError("expected a comma")
            j = ws(s, j + 1)
            if j >= len(s):
                raise Incomplete
            if s[j] == close:
                return (pairs if is_dict else items), j + 1
        if is_dict:
            key, j = value(s, j)
            if isinstance(key, (dict, list)):
                raise ValueError("a key must be a scalar")
            j = ws(s, j)
            if j >= len(s):
                raise Incomplete
            if s[j] != ":":
                raise ValueError("expected a colon")
            item, j = value(s, j + 1)
            pairs[key if isinstance(key, str) else json.dumps(key)] = item
        else:
            item, j = value(s, j)
            items.append(item)


def dumps(v: Any) -> str:
    """A literal's value as JSON text."""
    return json.dumps(v, ensure_ascii=False, allow_nan=False)


def escaped(text: str) -> str:
    """``text`` as the inside of a JSON string (each character escaped on its own, so the
    escaping of a growing text only grows)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]
