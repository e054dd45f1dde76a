"""Qwen3-Coder: ``<tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>``.

Parameter values are raw text: a parameter the tool types as a string is that text, any other
is read as JSON when it parses (``ReplySpec.string_params`` says which are strings).
"""

from __future__ import annotations

import json
from typing import ClassVar

from app.engine.text import held_suffix
from app.formats import memo
from app.formats.base import MarkerFormat, rest_is
from app.formats.gbnf import hoist_defs, lit, schema_rules, until
from app.formats.hermes import CLOSE, OPEN
from app.formats.partial_json import Found, ws
from app.formats.spec import NAME_PREFIX_RE, NAME_RE, ReplySpec, Tool, string_params
from app.grammar.gate import Limits

FUNCTION, END_FUNCTION = "<function=", "</function>"
PARAMETER, END_PARAMETER = "<parameter=", "</parameter>"


class Qwen3Coder(MarkerFormat):
    name = "qwen3_coder"
    summary = "`<function=...>` XML"
    triggers = (OPEN,)
    markers = (OPEN, CLOSE, FUNCTION, END_FUNCTION, PARAMETER, END_PARAMETER)
    # the call block's tags, and what a parameter's value sits between (a newline each side,
    # which is not the value's; Seed-OSS, which builds on this, writes its own tags and none)
    block_open: ClassVar[str] = OPEN
    block_close: ClassVar[str] = CLOSE
    nl: ClassVar[str] = "\n"

    @property
    def starts(self) -> tuple[str, ...]:
        return (self.block_open, FUNCTION)  # a function written without the wrapper counts

    def detect(self, template: str) -> bool:
        return OPEN in template and FUNCTION in template and PARAMETER in template

    def calls(self, tools: list[Tool], *, parallel: bool, template: str,
              limits: Limits) -> tuple[list[str], str]:
        """Each tool's parameters in the order its schema declares them: a required one exactly
        once, an optional one at most once; a string's value is its text up to the closing
        tag, any other's is JSON its schema accepts (a parameter the grammar let repeat was
        written over and over until max_tokens, and a required one could go missing)."""
        rules: list[str] = [until("pv", END_PARAMETER)]
        nl = lit(self.nl) if self.nl else ""
        fns = []
        params, defs = hoist_defs(tools)
        for i, (t, schema) in enumerate(zip(tools, params, strict=True)):
            props = schema.get("properties") or {}
            required = set(schema.get("required") or ())
            strings = string_params(schema)
            seq = []
            for j, (key, prop) in enumerate(props.items()):
                head = f'"<parameter=" {lit(key)} ">" {nl}'
                choices = prop.get("enum") if isinstance(prop, dict) else None
                if key in strings and choices and all(isinstance(c, str) for c in choices):
                    # a string enum: one of its values (a text held to nothing ran on)
                    value = f"( {' | '.join(lit(c) for c in choices)} ) {nl} {lit(END_PARAMETER)}"
                elif key in strings:
                    value = "pv0"  # the text, then the closing tag
                else:
                    sub = {**prop, "$defs": defs} if defs and isinstance(prop, dict) else prop
                    rules.append(schema_rules(sub if isinstance(sub, dict) else {}, f"q{i}-{j}-",
                                              limits))
                    value = f"q{i}-{j}-root {nl} {lit(END_PARAMETER)}"
                one = f'{head} {value} "\\n"'
                seq.append(one if key in required else f"( {one} )?")
            fns.append(f'"<function=" {lit(t.name)} ">\\n" {" ".join(seq)} "</function>"')
        opened, closed = lit(self.block_open + "\n"), lit("\n" + self.block_close)
        one = f"{opened} ( " + " | ".join(fns) + f" ) {closed}"
        return rules, (f'{one} ( "\\n" {one} )*' if parallel else one)

    def block(self, body: str, i: int, marker: str, spec: ReplySpec,
              final: bool) -> tuple[list[Found], int | None]:
        if marker == FUNCTION:
            return _function(body, i + len(marker), spec, self.nl)
        found: list[Found] = []
        j = ws(body, i + len(marker))
        while True:  # one or more functions, then </tool_call>
            start = rest_is(body, j, FUNCTION)
            if start is None or start == -1:
                return found, (j if found and start == -1 else start)
            more, end = _function(body, start, spec, self.nl)
            found += more
            if end is None or end == -1:
                return found, end
            j = ws(body, end)
            after = rest_is(body, j, self.block_close)
            if after is None:
                return found, None
            if after != -1:
                return found, after
            if not body.startswith("<", j):
                return found, end  # a missing closing tag is forgiven


def _param_json(value: str, is_string: bool) -> str:
    if not is_string:
        try:
            return json.dumps(json.loads(value), ensure_ascii=False)
        except json.JSONDecodeError:
            pass
    return json.dumps(value, ensure_ascii=False)


def _escaped(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _encode_growing(raw: str, done: tuple[str, int]) -> tuple[str, int]:
    """The JSON escaping of ``raw`` but its last character (which trimming may still drop),
    extending ``done`` (the escaping of its first ``done[1]`` characters): escaping is per
    character, so each piece is escaped once, not the whole value again at every piece."""
    text, n = done
    stable = max(n, len(raw) - 1)
    return text + _escaped(raw[n:stable]), stable


def _trim_newline(value: str, nl: str = "\n") -> str:
    if not nl:
        return value
    value = value[1:] if value.startswith(nl) else value
    return value[:-1] if value.endswith(nl) else value


def _function(body: str, j: int, spec: ReplySpec, nl: str = "\n") -> tuple[list[Found], int | None]:
    """One ``NAME>...</function>`` from just past ``<function=`` (``nl``: what a value sits
    between)."""
    k = body.find(">", j)
    if k == -1:
        return [], (None if NAME_PREFIX_RE.fullmatch(body[j:]) else -1)
    name = body[j:k]
    if not NAME_RE.fullmatch(name):
        return [], -1
    strings = spec.string_params.get(name, frozenset())
    parts = ["{"]
    n = 0
    j = k + 1
    while True:
        j = ws(body, j)
        if body.startswith(END_FUNCTION, j):
            return [(name, "".join(parts) + "}", True)], j + len(END_FUNCTION)
        opened = rest_is(body, j, PARAMETER)
        if opened == -1:
            return [(name, "".join(parts), False)], (None if END_FUNCTION.startswith(body[j:]) else -1)
        k = -1 if opened is None else body.find(">", opened)
        if opened is None or k == -1:
            return [(name, "".join(parts), False)], None
        key = body[opened:k]
        head = (", " if n else "") + json.dumps(key, ensure_ascii=False) + ": "
        kept = memo.resume("parameter", body, k + 1)  # an open value searched up to there
        close = body.find(END_PARAMETER, max(k + 1, kept[0] - len(END_PARAMETER) + 1)
                          if kept else k + 1)
        if close == -1:
            encoded = kept[1] if kept else ("", 0)
            if key in strings:  # a string value streams as it is written
                raw = body[k + 1 :]
                raw = _trim_newline(raw[: len(raw) - held_suffix(raw, (END_PARAMETER,))], nl)
                encoded = _encode_growing(raw, encoded)
                parts.append(head + '"' + encoded[0] + _escaped(raw[encoded[1]:]))
            memo.keep("parameter", body, k + 1, len(body), encoded)
            return [(name, "".join(parts), False)], None
        parts.append(head + _param_json(_trim_newline(body[k + 1 : close], nl), key in strings))
        n += 1
        j = close + len(END_PARAMETER)
