"""GBNF pieces the formats' grammars are built from: literals, a tool's call as a JSON Schema,
several schemas in one grammar, and "any text up to a tag"."""

from __future__ import annotations

import json
import re
from typing import Any

from app.formats.spec import Tool
from app.grammar import gate, json_schema

_GBNF_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|([A-Za-z][A-Za-z0-9-]*)')


def lit(text: str) -> str:
    """``text`` as a GBNF string literal."""
    return json.dumps(text, ensure_ascii=False)


def schema_rules(schema: dict[str, Any], prefix: str, limits: gate.Limits) -> str:
    """A JSON Schema's grammar with every rule renamed ``prefix + name`` (so several can live
    in one grammar); its start rule is ``prefix + "root"``."""
    gbnf = json_schema.from_schema(schema, "tools", limits)
    return _GBNF_TOKEN.sub(lambda m: prefix + m.group(1) if m.group(1) else m.group(0), gbnf)


def until(name: str, tag: str) -> str:
    """Rules ``{name}0``: any text that does not contain ``tag``, then ``tag`` (a matcher with
    one state per character matched; exact because the tag's first character does not recur)."""

    def cls(c: str) -> str:
        return "\\" + c if c in "\\]^-[" else c

    rules = [f"{name}0 ::= [^{cls(tag[0])}] {name}0 | {lit(tag[0])} {name}1"]
    for k in range(1, len(tag)):
        nxt = f" {name}{k + 1}" if k + 1 < len(tag) else ""
        rules.append(
            f"{name}{k} ::= {lit(tag[k])}{nxt} | {lit(tag[0])} {name}1"
            f" | [^{cls(tag[k])}{cls(tag[0])}] {name}0"
        )
    return "\n".join(rules)


def hoist_defs(tools: list[Tool]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each tool's parameters with its ``$defs`` (or ``definitions``) moved into one shared
    table, so that references still resolve once the parameters sit inside a larger schema
    (pydantic writes nested models this way). A name two tools define differently is renamed
    for the second, its references rewritten."""
    shared: dict[str, Any] = {}
    out = []
    for i, t in enumerate(tools):
        params = dict(t.parameters)
        local = {**(params.pop("definitions", None) or {}), **(params.pop("$defs", None) or {})}
        renames = {n: (f"{n}_{i}" if n in shared and shared[n] != s else n) for n, s in local.items()}

        def fix(node: Any, renames: dict[str, str] = renames) -> Any:
            if isinstance(node, list):
                return [fix(v) for v in node]
            if not isinstance(node, dict):
                return node
            new = {k: fix(v) for k, v in node.items()}
            ref = node.get("$ref")
            for prefix in ("#/$defs/", "#/definitions/"):
                if isinstance(ref, str) and ref.startswith(prefix) and ref[len(prefix):] in renames:
                    new["$ref"] = "#/$defs/" + renames[ref[len(prefix):]]
            return new

        for name, schema in local.items():
            shared[renames[name]] = fix(schema)
        out.append(fix(params))
    return out, shared


def call_schema(tools: list[Tool], key: str) -> dict[str, Any]:
    """One call: ``{"name": <one of the tools>, key: <its parameters>}``, definitions hoisted."""
    params, defs = hoist_defs(tools)
    call: dict[str, Any] = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, key: p},
                "required": ["name", key],
                "additionalProperties": False,
            }
            for t, p in zip(tools, params, strict=True)
        ]
    }
    if defs:
        call["$defs"] = defs
    return call
