"""Llama 3.x: the reply is ``{"name": ..., "parameters": {...}}`` (after an optional
``<|python_tag|>``), several separated by ``;``. A JSON reply naming none of the offered tools
is an answer, not a call."""

from __future__ import annotations

from app.formats.base import ToolFormat
from app.formats.gbnf import call_schema, schema_rules
from app.formats.partial_json import Incomplete, call_object, expect, string, ws
from app.formats.spec import Add, ReplySpec, Tool
from app.grammar.gate import Limits

PYTHON_TAG = "<|python_tag|>"


class Llama3(ToolFormat):
    name = "llama3"
    summary = "JSON with `parameters`"
    triggers = (PYTHON_TAG,)
    markers = (PYTHON_TAG,)

    def detect(self, template: str) -> bool:
        return PYTHON_TAG in template or ("<|start_header_id|>" in template and '"parameters"' in template)

    def calls(self, tools: list[Tool], *, parallel: bool, template: str,
              limits: Limits) -> tuple[list[str], str]:
        return [schema_rules(call_schema(tools, "parameters"), "c-", limits)], '( "<|python_tag|>" )? c-root'

    def scan(self, body: str, spec: ReplySpec, final: bool, add: Add) -> str:
        i = ws(body, 0)
        if body.startswith(PYTHON_TAG, i):
            i = ws(body, i + len(PYTHON_TAG))
        elif not final and body[i:] and PYTHON_TAG.startswith(body[i:]):
            return ""
        looks = _looks_like_call(body[i:], spec.names)
        if looks == "maybe" and not final:
            return ""
        if looks != "yes":
            return body
        while True:
            found, end = call_object(body, i)
            add(*found)
            if end is None or end == -1:
                return ""
            k = ws(body, end)
            if k < len(body) and body[k] in ";,":
                k = ws(body, k + 1)
            if k >= len(body):
                return ""
            if body[k] != "{":
                return body[end:]  # words after the calls
            i = k


def _looks_like_call(rest: str, names: frozenset[str]) -> str:
    """Whether a Llama 3 reply is a JSON tool call: "yes", "no" or "maybe" (too short to say).
    It is when it opens with ``"name"`` naming an offered tool (any, if none are known), or with
    ``"type": "function"``."""
    if not rest:
        return "maybe"
    if rest[0] != "{":
        return "no"
    try:
        key, i, closed = string(rest, ws(rest, 1))
        if not closed:
            return "maybe" if any(k.startswith(key) for k in ("name", "type")) else "no"
        if key not in ("name", "type"):
            return "no"
        value, i, closed = string(rest, expect(rest, i, ":"))
    except Incomplete:
        return "maybe"
    except ValueError:
        return "no"
    wanted = {"function"} if key == "type" else names
    if not wanted:
        return "yes" if closed or key == "name" else "maybe"
    if closed:
        return "yes" if value in wanted else "no"
    return "maybe" if any(w.startswith(value) for w in wanted) else "no"
