"""JSON read as far as it goes: the partial reader the tool-call scanners share.

Every function takes the whole text so far and an offset, and either returns what the text says
up to there or raises ``Incomplete`` (wait for more) or ``ValueError`` (it is not this JSON).
What it returns only ever grows as the text does, which is what lets ``parse_reply`` be a pure
function of the text so far (vLLM uses ``partial_json_parser`` for the same job).

A stream parses its reply again after every piece: a scan of a value or a string that the text
has not finished yet is kept where it stopped (app.formats.memo), and the next parse of the
longer text goes on from there instead of reading the value from its start again (a 4000-token
call argument cost 130 us per piece at its end, 10 at its start).
"""

from __future__ import annotations

import json
import re

from app.formats.memo import keep as _keep
from app.formats.memo import resume as _resume


class Incomplete(Exception):
    """The text ends before the construct does: wait for more."""


_PLAIN = re.compile(r'[^"\\{}\[\],\s]+')
_IN_STRING = re.compile(r'[^"\\]+')


def ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in " \t\r\n":
        i += 1
    return i


def expect(s: str, i: int, lit: str) -> int:
    i = ws(s, i)
    if s.startswith(lit, i):
        return i + len(lit)
    if lit.startswith(s[i:]):
        raise Incomplete
    raise ValueError(f"expected {lit!r} at {i}")


def string(s: str, i: int) -> tuple[str, int, bool]:
    """Decode a JSON string from its opening quote: (text so far, end, closed). Stops before an
    escape that is not complete yet, so the text so far only ever grows."""
    start = i
    kept = _resume("string", s, start)
    if kept is not None:
        i, done = kept
        out = [done]
    else:
        i = ws(s, i)
        if i >= len(s):
            raise Incomplete
        if s[i] != '"':
            raise ValueError("expected a string")
        i += 1
        out = []
    while i < len(s):
        m = _IN_STRING.match(s, i)
        if m:
            out.append(m.group())
            i = m.end()
            continue
        c = s[i]
        if c == '"':
            return "".join(out), i + 1, True
        if i + 1 >= len(s):
            break
        e = s[i + 1]
        if e == "u":
            code = _hex4(s, i + 2)
            if code is None:
                break
            if 0xD800 <= code < 0xDC00:  # a pair: wait for the low half, then join them
                if i + 12 > len(s):
                    break
                low = _hex4(s, i + 8) if s.startswith("\\u", i + 6) else None
                if low is not None and 0xDC00 <= low < 0xE000:
                    out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
                    i += 12
                    continue
                code = 0xFFFD
            out.append("\ufffd" if 0xDC00 <= code < 0xE000 else chr(code))
            i += 6
            continue
        out.append({"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}.get(e, e))
        i += 2
    text = "".join(out)
    _keep("string", s, start, i, text)
    return text, i, False


def _hex4(s: str, i: int) -> int | None:
    """Four hex digits at ``i``; None when the text ends first. Bad digits count as U+FFFD."""
    if i + 4 > len(s):
        return None
    try:
        return int(s[i : i + 4], 16)
    except ValueError:
        return 0xFFFD


def value_end(s: str, i: int) -> tuple[int, bool]:
    """Scan one JSON value from ``i``: (end so far, complete)."""
    start = i
    kept = _resume("value", s, start)
    if kept is not None:
        j, (depth, in_str) = kept
    else:
        j = ws(s, i)
        depth = 0
        in_str = False
    while j < len(s):
        m = (_IN_STRING if in_str else _PLAIN).match(s, j)
        if m:
            j = m.end()
            continue
        c = s[j]
        if in_str:
            if c == "\\":
                j += 2
                continue
            in_str = False  # the closing quote
            if depth == 0:
                return j + 1, True
        elif c == '"':
            in_str = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return j + 1, True
            if depth < 0:
                return j, True
        elif depth == 0:  # a scalar ended at a delimiter
            return j, True
        j += 1
    if depth or in_str:  # inside the value: resumable (a bare scalar is short, and a scan
        _keep("value", s, start, j, (depth, in_str))  # before it starts must skip spaces)
    return min(j, len(s)), False


Found = tuple[str | None, str, bool]  # (name once complete, arguments so far, complete)


def call_object(s: str, i: int, names: tuple[str, ...] = ("name",),
                args_keys: tuple[str, ...] = ("arguments", "parameters")) -> tuple[Found, int | None]:
    """``{"name": ..., "arguments"|"parameters": ...}`` (keys in any order, others skipped) from
    its ``{``: the call so far and where the object ends (None: not yet; -1: malformed).
    ``names`` / ``args_keys``: the keys a family writes them under (Command R7B: ``tool_name``
    and ``parameters``)."""
    name: str | None = None
    args = ""
    args_done = False
    try:
        i = expect(s, i, "{")
        while True:
            i = ws(s, i)
            if i >= len(s):
                raise Incomplete
            if s[i] == "}":
                end = i + 1
                break
            if s[i] == ",":
                i += 1
                continue
            key, i, closed = string(s, i)
            if not closed:
                raise Incomplete
            i = expect(s, i, ":")
            if key in names:
                value, i, closed = string(s, i)
                if not closed:
                    raise Incomplete
                name = value if name is None else name  # a repeated key never renames
                continue
            start = ws(s, i)
            i, complete = value_end(s, start)
            if key in args_keys and not args_done:
                args = s[start:i]
                args_done = complete
            if not complete:
                raise Incomplete
    except Incomplete:
        return (name, "" if args.startswith('"') else args, False), None
    except ValueError:  # garbage after complete arguments still leaves a call
        return (name, _args(args) if args_done else "", args_done and is_json(args)), -1
    return (name, _args(args), is_json(args or "{}")), end


def _args(args: str) -> str:
    """Arguments as sent: the JSON as generated; one written as a string holding the JSON is
    unwrapped; none at all is ``{}``."""
    if args.startswith('"'):
        try:
            decoded = json.loads(args)
            return decoded if isinstance(decoded, str) else args
        except json.JSONDecodeError:
            return args
    return args or "{}"


def is_json(text: str) -> bool:
    """Whether complete arguments are JSON (a call whose arguments are not never counts)."""
    try:
        json.loads(text)
        return True
    except json.JSONDecodeError:
        return False
