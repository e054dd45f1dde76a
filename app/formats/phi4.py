"""Phi-4-mini (Microsoft): ``<|tool_call|>[{"name": ..., "arguments": {...}}, ...]<|/tool_call|>``; the
model also writes the calls without the list (one object, or several joined by commas) and
leaves the closing marker out at the end of a reply: the scanner reads all of these.

Microsoft's template renders each message's text only, and the tools from the system message's
``tools`` key, between ``<|tool|>`` and ``<|/tool|>``: the server puts them there (with
Microsoft's default system text when the request has none), writes an earlier call into the
turn's text as the model wrote it, and a tool result as a ``tool_response`` turn. llama.cpp's
copy of the template renders the ``tools`` variable, the calls and the results itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from app.formats.base import MarkerFormat, T, load_args, rest_is
from app.formats.gbnf import call_schema, schema_rules
from app.formats.partial_json import Found, call_object, ws
from app.formats.spec import ReplySpec, Tool
from app.grammar.gate import Limits

TOOL_CALL, END_TOOL_CALL = "<|tool_call|>", "<|/tool_call|>"
TOOL, END_TOOL = "<|tool|>", "<|/tool|>"
SYSTEM = "You are a helpful assistant with some tools."  # Microsoft's, for a request with none


class Phi4(MarkerFormat):
    name = "phi4"
    summary = "`<|tool_call|>` JSON"
    triggers = (TOOL_CALL,)
    markers = (TOOL_CALL, END_TOOL_CALL)

    def detect(self, template: str) -> bool:
        return (TOOL in template and END_TOOL in template) or END_TOOL_CALL in template

    def for_template(self, template: str) -> Phi4:
        return self if "tool_calls" in template else _Phi4Text()

    def history(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Arguments as objects; never ``None`` text."""
        out = super().history(messages)
        for m in out:
            if m.get("content") is None:
                m["content"] = ""
        return out

    def calls(self, tools: list[Tool], *, parallel: bool, template: str,
              limits: Limits) -> tuple[list[str], str]:
        call = call_schema(tools, "arguments")
        defs = call.pop("$defs", None)
        many: dict[str, Any] = {"type": "array", "items": call, "minItems": 1}
        if not parallel:
            many["maxItems"] = 1
        if defs:
            many["$defs"] = defs
        return [schema_rules(many, "c-", limits)], f'"{TOOL_CALL}" c-root "{END_TOOL_CALL}"'

    def block(self, body: str, i: int, marker: str, spec: ReplySpec,
              final: bool) -> tuple[list[Found], int | None]:
        j = ws(body, i + len(marker))
        if j >= len(body):
            return [], None
        listed = body[j] == "["
        if not listed and body[j] != "{":
            return [], -1
        found, end = _objects(body, j + 1 if listed else j, listed)
        if end is None or end == -1:
            return found, end
        k = ws(body, end)
        after = rest_is(body, k, END_TOOL_CALL)
        if after is None:
            return found, (len(body) if final else None)
        return found, (end if after == -1 else after)  # a missing closing marker is forgiven


class _Phi4Text(Phi4):
    """Phi-4-mini as Microsoft's template takes it: the tools in the system message's ``tools``,
    the calls written into the text, results as ``tool_response`` turns."""

    def offer(self, messages: list[dict[str, Any]], extra: dict[str, Any], tools: list[Tool],
              required: bool, protect: Callable[[T], T]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        listed = protect(json.dumps([{"name": t.name, "description": t.description,
                                      "parameters": t.parameters} for t in tools],
                                    ensure_ascii=False))
        if messages and messages[0].get("role") == "system":
            return [{**messages[0], "tools": listed}, *messages[1:]], extra
        return [{"role": "system", "content": SYSTEM, "tools": listed}, *messages], extra

    def history(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for m in messages:
            m = dict(m)
            text = m.get("content") if isinstance(m.get("content"), str) else ""
            if m.get("role") == "assistant" and m.get("tool_calls"):
                calls = [{"name": (c.get("function") or {}).get("name"),
                          "arguments": load_args((c.get("function") or {}).get("arguments"))}
                         for c in m.pop("tool_calls")]
                text += TOOL_CALL + json.dumps(calls, ensure_ascii=False) + END_TOOL_CALL
            elif m.get("role") == "tool":
                m["role"] = "tool_response"
            m["content"] = text
            out.append(m)
        return out


def _objects(body: str, j: int, listed: bool) -> tuple[list[Found], int | None]:
    """Call objects joined by commas, from ``j`` (past ``[`` when ``listed``): (calls, where they
    end: past ``]``, or past the last object when not listed)."""
    found: list[Found] = []
    end: int | None = j
    while True:
        k = ws(body, j)
        if k >= len(body):
            return found, None
        if listed and body[k] == "]":
            return found, k + 1
        if body[k] == "," and found:
            j = k + 1
            continue
        if body[k] != "{":
            return found, (-1 if listed else end)
        call, end = call_object(body, k)
        found.append(call)
        if end is None or end == -1:
            return found, end
        j = end
