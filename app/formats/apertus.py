"""Apertus (Swiss AI): ``<|tools_prefix|>[{"get_weather": {"city": "Paris"}}, ...]<|tools_suffix|>``, each
call an object whose one key is the tool's name, after any ``<|inner_prefix|>...<|inner_suffix|>``
thought. The template turns thinking on with ``enable_thinking`` ("Deliberation: enabled"; off
unless set, on in llama.cpp unless the request turns it off).

Its templates differ: Swiss AI's reads the tools flat (``tool.name``) and adds an earlier call's
arguments to a string (JSON text), llama.cpp's copy reads them in OpenAI's shape
(``tool.function.name``) and applies ``tojson`` to the arguments (an object). The tools are
offered in both shapes at once; the arguments' form follows the template.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.formats.base import MarkerFormat, T, load_args, rest_is, template_tools
from app.formats.gbnf import hoist_defs, schema_rules
from app.formats.partial_json import Found, Incomplete, expect, string, value_end, ws
from app.formats.spec import ReplySpec, Tool
from app.formats.think import ReasoningFormat
from app.grammar.gate import Limits

PREFIX, SUFFIX = "<|tools_prefix|>", "<|tools_suffix|>"
INNER, OUTER = "<|inner_prefix|>", "<|inner_suffix|>"


@dataclass(frozen=True)
class ApertusThought(ReasoningFormat):
    """``<|inner_prefix|>...<|inner_suffix|>``, switched by ``enable_thinking``."""

    def controls(self, variables: dict[str, Any], effort: str | None,
                 thinking: bool | None) -> dict[str, Any]:
        on = thinking if thinking is not None else effort != "none"
        return {"enable_thinking": on, **variables}


APERTUS_THOUGHT = ApertusThought("apertus", INNER, OUTER)


class Apertus(MarkerFormat):
    name = "apertus"
    summary = "`<|tools_prefix|>` name-keyed JSON list"
    triggers = (PREFIX,)
    markers = (PREFIX, SUFFIX)
    args_as_text = True  # an earlier call's arguments: JSON text (Swiss AI's template)

    def detect(self, template: str) -> bool:
        return "<|system_start|>" in template and PREFIX in template

    def for_template(self, template: str) -> Apertus:
        """llama.cpp's copy applies ``tojson`` to an earlier call's arguments: objects there."""
        if "arguments|tojson" in template.replace(" ", ""):
            return _ApertusObjects()
        return self

    def offer(self, messages: list[dict[str, Any]], extra: dict[str, Any], tools: list[Tool],
              required: bool, protect: Callable[[T], T]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Each tool in OpenAI's shape with its name, description and parameters at the top too:
        the templates read either."""
        shaped = [{**t, **t["function"]} for t in template_tools(tools)]
        return messages, {**extra, "tools": protect(shaped)}

    def history(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = super().history(messages)
        for m in out:
            if m.get("role") == "assistant" and m.get("tool_calls") and self.args_as_text:
                m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.dumps(
                    load_args(c["function"].get("arguments")), ensure_ascii=False)}}
                    for c in m["tool_calls"]]
        return out

    def calls(self, tools: list[Tool], *, parallel: bool, template: str,
              limits: Limits) -> tuple[list[str], str]:
        params, defs = hoist_defs(tools)
        items = [{"type": "object", "properties": {t.name: p}, "required": [t.name],
                  "additionalProperties": False} for t, p in zip(tools, params, strict=True)]
        many: dict[str, Any] = {"type": "array", "minItems": 1,
                                "items": items[0] if len(items) == 1 else {"anyOf": items}}
        if not parallel:
            many["maxItems"] = 1
        if defs:
            many["$defs"] = defs
        return [schema_rules(many, "c-", limits)], f'"{PREFIX}" c-root "{SUFFIX}"'

    def block(self, body: str, i: int, marker: str, spec: ReplySpec,
              final: bool) -> tuple[list[Found], int | None]:
        j = ws(body, i + len(marker))
        if j >= len(body):
            return [], None
        if body[j] != "[":
            return [], -1
        found: list[Found] = []
        j += 1
        while True:
            j = ws(body, j)
            if j >= len(body):
                return found, None
            if body[j] == "]":
                break
            if body[j] == ",":
                j += 1
                continue
            call, end = _keyed_call(body, j)
            found.append(call)
            if end is None or end == -1:
                return found, end
            j = end
        k = ws(body, j + 1)
        after = rest_is(body, k, SUFFIX)
        if after is None:
            return found, (len(body) if final else None)
        return found, (j + 1 if after == -1 else after)  # a missing suffix is forgiven


class _ApertusObjects(Apertus):
    """Apertus as llama.cpp's copy of its template takes an earlier call: arguments as objects."""

    args_as_text = False


def _keyed_call(body: str, j: int) -> tuple[Found, int | None]:
    """``{"NAME": {arguments}}`` from its ``{``: the call so far and where it ends (None: not
    yet; -1: malformed)."""
    name: str | None = None
    args = ""
    try:
        i = expect(body, j, "{")
        key, i, closed = string(body, ws(body, i))
        if not closed:
            raise Incomplete
        name = key
        start = ws(body, expect(body, i, ":"))
        end, complete = value_end(body, start)
        args = body[start:end]
        if not complete:
            raise Incomplete
        if not args.startswith("{"):
            return (name, "", False), -1
        close = expect(body, end, "}")
    except Incomplete:
        return (name, args if args.startswith("{") else "", False), None
    except ValueError:
        return (name, args, False), -1
    try:
        json.loads(args)
    except json.JSONDecodeError:
        return (name, args, False), -1
    return (name, args, True), close
