"""Hermes 2/3, Qwen 2.5/3: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""

from __future__ import annotations

from app.formats.base import MarkerFormat, rest_is
from app.formats.gbnf import call_schema, schema_rules
from app.formats.partial_json import Found, call_object, ws
from app.formats.spec import ReplySpec, Tool
from app.grammar.gate import Limits

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class Hermes(MarkerFormat):
    name = "hermes"
    summary = "`<tool_call>` JSON"
    triggers = (OPEN,)
    markers = (OPEN, CLOSE)

    def detect(self, template: str) -> bool:
        return OPEN in template

    def calls(self, tools: list[Tool], *, parallel: bool, template: str,
              limits: Limits) -> tuple[list[str], str]:
        rules = [schema_rules(call_schema(tools, "arguments"), "c-", limits)]
        one = '"<tool_call>\\n" c-root "\\n</tool_call>"'
        return rules, (f'{one} ( "\\n" {one} )*' if parallel else one)

    def block(self, body: str, i: int, marker: str, spec: ReplySpec,
              final: bool) -> tuple[list[Found], int | None]:
        j = ws(body, i + len(marker))
        if j >= len(body):
            return [], None
        if body[j] != "{":
            return [], -1
        found, end = call_object(body, j)
        if end is None or end == -1:
            return [found], end
        k = ws(body, end)
        after = rest_is(body, k, CLOSE)
        if after is None:
            return [found], None
        if after != -1:
            return [found], after
        # stray text (a surplus "}") before the closing tag is dropped with it; a missing closing
        # tag is forgiven, but only once no closing tag can still come
        close, again = body.find(CLOSE, k), body.find(OPEN, k)
        if close != -1 and (again == -1 or close < again):
            return [found], close + len(CLOSE)
        return [found], (None if again == -1 and not final else end)
