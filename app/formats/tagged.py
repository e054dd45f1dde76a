"""Arguments written as tagged pairs with bare values: GLM's ``<arg_key>K</arg_key><arg_value>V
</arg_value>``, MiniMax's and DeepSeek DSML's ``<parameter name="K">V</parameter>``.

A value the tool types as a string is the text as written (and streams as it is written); any
other is JSON (text that does not parse stays a string). The grammar writes each tool's
parameters in its schema's order, a required one exactly once and an optional one at most once,
a string as text up to the value's closing tag and any other as JSON its schema accepts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from app.engine.text import held_suffix
from app.formats import memo
from app.formats.gbnf import hoist_defs, lit, schema_rules, until
from app.formats.partial_json import Found, ws
from app.formats.spec import NAME_PREFIX_RE, NAME_RE, Tool, string_params
from app.grammar.gate import Limits

# at ``j``: (the key, where its value starts, whether the value is a string as its markup says,
# None: as the schema says); None: not yet known; -1: no parameter starts there
Opened = tuple[str, int, bool | None] | int | None
Opener = Callable[[str, int], Opened]
_NOT_IN_KEY = frozenset('"<>\n')


def escaped(text: str) -> str:
    """``text`` as the inside of a JSON string."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def value_json(text: str, is_string: bool) -> str:
    """A bare value as JSON: a string's text quoted, any other's JSON (text that is not JSON
    stays a string)."""
    if not is_string:
        try:
            return json.dumps(json.loads(text), ensure_ascii=False)
        except json.JSONDecodeError:
            pass
    return json.dumps(text, ensure_ascii=False)


def read_args(body: str, j: int, name: str, strings: frozenset[str], opener: Opener,
              value_close: str, call_close: str) -> tuple[Found, int | None]:
    """The arguments from ``j`` (just past the call's name) to ``call_close``: the call so far
    and where it ends (None: not yet; -1: not this markup). A string value still open streams
    (escaped once per piece: the escaping so far is kept with the stream's memo)."""
    parts = ["{"]
    n = 0
    while True:
        j = ws(body, j)
        if body.startswith(call_close, j):
            return (name, "".join(parts) + "}", True), j + len(call_close)
        got = opener(body, j)
        if got is None or got == -1:
            ends = got is None or call_close.startswith(body[j:])
            return (name, "".join(parts), False), (None if ends else -1)
        assert not isinstance(got, int)
        key, k, as_string = got
        is_string = key in strings if as_string is None else as_string
        head = (", " if n else "") + json.dumps(key, ensure_ascii=False) + ": "
        kept = memo.resume("tagged", body, k)  # an open value searched up to there
        close = body.find(value_close, max(k, kept[0] - len(value_close) + 1) if kept else k)
        if close == -1:
            done = kept[1] if kept else ("", 0)
            if is_string:
                raw = body[k:]
                raw = raw[: len(raw) - held_suffix(raw, (value_close,))]
                done = (done[0] + escaped(raw[done[1]:]), len(raw))
                parts.append(head + '"' + done[0])
            memo.keep("tagged", body, k, len(body), done)
            return (name, "".join(parts), False), None
        parts.append(head + value_json(body[k:close], is_string))
        n += 1
        j = close + len(value_close)


def named(body: str, j: int, tail: str) -> tuple[str | None, int | None]:
    """A tool's name at ``j`` followed by ``tail``: (the name, where ``tail`` ends); (None, None)
    while it may still come, (None, -1) when it is not there."""
    m = NAME_PREFIX_RE.match(body, j)
    k = m.end()
    rest = body[k:k + len(tail)]
    if rest == tail:
        return (m.group(), k + len(tail)) if NAME_RE.fullmatch(m.group()) else (None, -1)
    return (None, None) if tail.startswith(rest) and k + len(rest) == len(body) else (None, -1)


def attr_opener(start: str, typed: bool) -> Opener:
    """Parameters opened ``<start>KEY">`` (``start`` ends in ``name="``), or with ``typed``
    also ``<start>KEY" string="true|false">`` (the attribute says whether it is a string)."""
    kinds = {'">': None, '" string="true">': True, '" string="false">': False}
    if not typed:
        kinds = {'">': None}

    def opener(body: str, j: int) -> Opened:
        rest = body[j:j + len(start)]
        if rest != start:
            return None if start.startswith(rest) and j + len(rest) == len(body) else -1
        k = j + len(start)
        q = k
        while q < len(body) and body[q] not in _NOT_IN_KEY:
            q += 1
        if q == len(body):
            return None
        tail = body[q:q + 20]
        for mark, kind in kinds.items():
            if tail.startswith(mark):
                return (body[k:q], q + len(mark), kind) if q > k else -1
        if any(m.startswith(tail) for m in kinds) and q + len(tail) == len(body):
            return None
        return -1

    return opener


def tool_params(tools: list[Tool], limits: Limits, value_close: str,
                one: Callable[[str, bool, str], str]) -> tuple[list[str], list[str]]:
    """(helper rules, each tool's parameter sequence): parameters in the schema's order, a
    required one once, an optional one at most once; ``one(key, is_string, value)`` writes a
    parameter around ``value``, the grammar of its value and ``value_close``."""
    rules: list[str] = [until("tv", value_close)]
    seqs: list[str] = []
    params, defs = hoist_defs(tools)
    for i, schema in enumerate(params):
        props: dict[str, Any] = schema.get("properties") or {}
        required = set(schema.get("required") or ())
        strings = string_params(schema)
        seq = []
        for j, (key, prop) in enumerate(props.items()):
            choices = _string_choices(prop)
            if key in strings and choices:
                value = f"( {' | '.join(lit(c) for c in choices)} ) {lit(value_close)}"
            elif key in strings:
                value = "tv0"  # the text, then the closing tag
            else:
                sub = {**prop, "$defs": defs} if defs and isinstance(prop, dict) else prop
                rules.append(schema_rules(sub if isinstance(sub, dict) else {}, f"v{i}-{j}-",
                                          limits))
                value = f"v{i}-{j}-root {lit(value_close)}"
            piece = one(key, key in strings, value)
            seq.append(piece if key in required else f"( {piece} )?")
        seqs.append(" ".join(seq))
    return rules, seqs


def _string_choices(prop: Any) -> list[str]:
    """The texts a string parameter may take when its schema lists them (``enum``, ``const``);
    none: any text."""
    if not isinstance(prop, dict):
        return []
    if isinstance(prop.get("const"), str):
        return [prop["const"]]
    enum = prop.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        return list(dict.fromkeys(enum))
    return []
