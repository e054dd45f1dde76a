"""Calls as a JSON list after a marker, ``[{"name": ..., "arguments": {...}}, ...]``, optionally
closed by a marker of its own: IBM Granite 3's ``<|tool_call|>[...]`` and Nemotron Nano v2's
``<TOOLCALL>[...]</TOOLCALL>`` (Mistral Nemo's ``[TOOL_CALLS][...]`` is the same shape)."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from app.engine.text import held_suffix
from app.formats.base import MarkerFormat, load_args, rest_is
from app.formats.gbnf import call_schema, lit, schema_rules
from app.formats.partial_json import Found, call_object, ws
from app.formats.spec import ReplySpec, Tool
from app.grammar.gate import Limits


def call_list(body: str, j: int) -> tuple[list[Found], int | None]:
    """The calls of a JSON list from just past its ``[``: (calls, where the list ends: None not
    yet, -1 malformed)."""
    found: list[Found] = []
    while True:
        j = ws(body, j)
        if j >= len(body):
            return found, None
        if body[j] == "]":
            return found, j + 1
        if body[j] == ",":
            j += 1
            continue
        if body[j] != "{":
            return found, -1
        call, end = call_object(body, j)
        found.append(call)
        if end is None or end == -1:
            return found, end
        j = end


def written(calls: list[dict[str, Any]]) -> str:
    """OpenAI tool calls as the JSON list these models write."""
    return json.dumps([{"name": (c.get("function") or {}).get("name"),
                        "arguments": load_args((c.get("function") or {}).get("arguments"))}
                       for c in calls], ensure_ascii=False)


class JsonList(MarkerFormat):
    """``open`` then a JSON list of calls (a lone call object is taken too), then ``close`` when
    the family has one."""

    open: ClassVar[str]
    close: ClassVar[str] = ""

    def calls(self, tools: list[Tool], *, parallel: bool, template: str,
              limits: Limits) -> tuple[list[str], str]:
        call = call_schema(tools, "arguments")
        defs = call.pop("$defs", None)
        many = {"type": "array", "items": call, "minItems": 1,
                **({} if parallel else {"maxItems": 1})}
        if defs:
            many["$defs"] = defs
        end = f" {lit(self.close)}" if self.close else ""
        return [schema_rules(many, "c-", limits)], f"{lit(self.open)} c-root{end}"

    def block(self, body: str, i: int, marker: str, spec: ReplySpec,
              final: bool) -> tuple[list[Found], int | None]:
        j = ws(body, i + len(marker))
        if j >= len(body):
            return [], None
        if body[j] == "[":
            found, end = call_list(body, j + 1)
        elif body[j] == "{":
            call, end = call_object(body, j)
            found = [call]
        else:
            return [], -1
        if end is None or end == -1 or not self.close:
            return found, end
        k = ws(body, end)
        after = rest_is(body, k, self.close)
        if after is None:
            return found, None
        return found, (after if after != -1 else end)  # a missing close is forgiven

    def scan(self, body: str, spec: ReplySpec, final: bool, add: Any) -> str:
        content = super().scan(body, spec, final, add)
        if not self.close:
            return content
        # a stray close (after a list the grammar ended, or written twice) is never shown
        keep = 0 if final else held_suffix(content, (self.close,))
        return content[: len(content) - keep].replace(self.close, "")
