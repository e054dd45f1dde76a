"""A tool's JSON Schema as a grammar of Gemma 4's argument syntax (app.formats.gemma4_args).

JSON Schema converters write JSON; Gemma 4 writes ``{key:<|"|>text<|"|>,n:3}``, so its forced
call needs a converter of its own. It holds what a call's reader checks: an object's declared
keys (a required one exactly once, an optional one at most once, no other), each value of its
schema's type (enums and constants exactly, nested objects and arrays, ``$ref`` into shared
definitions, ``anyOf`` / ``oneOf``, type lists, OpenAPI's ``nullable``). A string is any text up
to its closing ``<|"|>`` (its length, pattern and format are not held, as Qwen3-Coder's free-text
values are not), numbers have at most 16 digits a part (as llama.cpp's converter writes them).

Keys come in the order the chat template writes them, sorted (its ``dictsort``): the order of
the tool declarations and the past calls the model reads in its prompt.
"""

from __future__ import annotations

from typing import Any

from app.formats.gbnf import lit, until
from app.formats.gemma4_args import QUOTE, gemma_key, to_gemma
from app.grammar.gate import GrammarTooComplex, Limits

_DEPTH = 64  # schema nesting converted at most (deeper is refused, as the JSON converter does)
_PARAM = "tools"
_BASE = {
    "g-str": f"{lit(QUOTE)} g-s0",
    "g-int": '"-"? ( "0" | [1-9] [0-9]{0,15} )',
    "g-num": 'g-int ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,16} )?',
    "g-bool": '"true" | "false"',
    "g-key": "[A-Za-z_] [A-Za-z0-9_]{0,31}",
    "g-any": 'g-str | g-num | g-bool | "null" | g-anyo | g-anya',
    "g-anyo": '"{" ( g-key ":" g-any ( "," g-key ":" g-any )* )? "}"',
    "g-anya": '"[" ( g-any ( "," g-any )* )? "]"',
}
_NEEDS = {"g-num": ("g-int",), "g-any": ("g-str", "g-num", "g-bool", "g-anyo", "g-anya"),
          "g-anyo": ("g-key", "g-any"), "g-anya": ("g-any",)}
_SIMPLE = {"string": "g-str", "integer": "g-int", "number": "g-num", "boolean": "g-bool"}


def _sort_key(key: str) -> tuple[str, str]:
    return key.lower(), key  # Jinja's dictsort: case-insensitive


class SchemaGrammar:
    """Rules (named ``g-*``) for the values of several schemas sharing ``defs``; ``value``
    returns the expression of one schema's value."""

    def __init__(self, defs: dict[str, Any], limits: Limits):
        self.defs = defs
        self.limits = limits
        self.rules: dict[str, str] = {}
        self.refs: dict[str, str] = {}
        self.size = 0
        self.properties = 0
        self.count = 0

    def text(self) -> list[str]:
        """The rules, GBNF lines."""
        lines = [f"{name} ::= {body}" for name, body in self.rules.items()]
        if "g-str" in self.rules:
            lines.append(until("g-s", QUOTE))
        return lines

    def _add(self, name: str, body: str) -> str:
        self.rules[name] = body
        self.size += len(name) + len(body) + 6
        if self.size > self.limits.max_bytes:
            raise GrammarTooComplex(f"{_PARAM}: the tools' grammar is over the limit of "
                                    f"{self.limits.max_bytes} bytes (GRAMMAR_MAX_BYTES)",
                                    param=_PARAM)
        return name

    def _base(self, name: str) -> str:
        if name not in self.rules:
            self._add(name, _BASE[name])
            for need in _NEEDS.get(name, ()):
                self._base(need)
        return name

    def _new(self, kind: str) -> str:
        self.count += 1
        return f"g-{kind}{self.count}"

    def value(self, schema: Any, depth: int = 0) -> str:
        """The expression of a value ``schema`` allows."""
        if depth > _DEPTH:
            raise GrammarTooComplex(f"{_PARAM}: a schema nested deeper than {_DEPTH}",
                                    param=_PARAM)
        if not isinstance(schema, dict):
            return self._base("g-any")
        ref = schema.get("$ref")
        if isinstance(ref, str):
            return self._ref(ref, depth)
        if "const" in schema:
            return lit(to_gemma(schema["const"]))
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            if len(enum) > self.limits.max_alternatives:
                raise GrammarTooComplex(
                    f"{_PARAM}: an enum of {len(enum)} values, over the limit of "
                    f"{self.limits.max_alternatives} (GRAMMAR_MAX_ALTERNATIVES)", param=_PARAM)
            return _alts(dict.fromkeys(lit(to_gemma(v)) for v in enum))
        for key in ("anyOf", "oneOf", "allOf"):
            subs = schema.get(key)
            if isinstance(subs, list) and subs:
                rest = {k: v for k, v in schema.items() if k != key}
                if key == "allOf" and len(subs) > 1:
                    return self._base("g-any")  # an intersection is not held
                return _alts(dict.fromkeys(
                    self.value({**rest, **s} if isinstance(s, dict) else s, depth + 1)
                    for s in subs))
        kind = schema.get("type")
        if isinstance(kind, list):
            expr = _alts(dict.fromkeys(self.value({**schema, "type": k}, depth + 1)
                                       for k in kind if isinstance(k, str)))
        elif kind in _SIMPLE:
            expr = self._base(_SIMPLE[kind])
        elif kind == "null":
            expr = '"null"'
        elif kind == "object" or (kind is None and "properties" in schema):
            expr = self._object(schema, depth)
        elif kind == "array" or (kind is None and "items" in schema):
            expr = self._array(schema, depth)
        else:
            expr = self._base("g-any")
        return f'( {expr} | "null" )' if schema.get("nullable") is True else expr

    def _ref(self, ref: str, depth: int) -> str:
        if ref in self.refs:
            return self.refs[ref]
        for prefix in ("#/$defs/", "#/definitions/"):
            if ref.startswith(prefix) and ref[len(prefix):] in self.defs:
                name = self.refs[ref] = self._new("d")  # before its body: it may recur
                return self._add(name, self.value(self.defs[ref[len(prefix):]], depth + 1))
        return self._base("g-any")

    def _array(self, schema: dict[str, Any], depth: int) -> str:
        item = self.value(schema.get("items", {}), depth + 1)
        items = f"{item} ( \",\" {item} )*"
        least = schema.get("minItems")
        body = f'"[" {items} "]"' if isinstance(least, int) and least > 0 else f'"[" ( {items} )? "]"'
        return self._add(self._new("a"), body)

    def _object(self, schema: dict[str, Any], depth: int) -> str:
        props = schema.get("properties")
        if not isinstance(props, dict):
            extra = schema.get("additionalProperties")
            if not isinstance(extra, dict):
                return self._base("g-anyo")
            kv = f'g-key ":" {self.value(extra, depth + 1)}'
            self._base("g-key")
            return self._add(self._new("m"), f'"{{" ( {kv} ( "," {kv} )* )? "}}"')
        required = {r for r in schema.get("required") or () if isinstance(r, str)}
        keys = sorted(props, key=_sort_key)
        self.properties += len(keys)
        if self.properties > self.limits.max_properties:
            raise GrammarTooComplex(f"{_PARAM}: more than {self.limits.max_properties} "
                                    "properties (GRAMMAR_MAX_PROPERTIES)", param=_PARAM)
        optional = sum(k not in required for k in keys)
        if optional > self.limits.max_optional_properties:
            raise GrammarTooComplex(
                f"{_PARAM}: an object with {optional} optional properties, over the limit of "
                f"{self.limits.max_optional_properties} (GRAMMAR_MAX_OPTIONAL_PROPERTIES)",
                param=_PARAM)
        name = self._new("o")
        kvs = [f"{lit(gemma_key(k) + ':')} {self.value(props[k], depth + 1)}" for k in keys]
        n = len(keys)

        def after(j: int) -> str:  # the members from j on, each after a comma
            return f" {name}-r{j}" if j < n else ""

        for j in range(n - 1, 0, -1):
            one = f'"," {kvs[j]}'
            self._add(f"{name}-r{j}", (one if keys[j] in required else f"( {one} )?") + after(j + 1))
        # the first member written: any optional one before the first required, or that one
        first = next((j for j in range(n) if keys[j] in required), n)
        alts = [kvs[j] + after(j + 1) for j in range(min(first + 1, n))]
        if not alts:
            return self._add(name, '"{" "}"')
        body = " | ".join(alts)
        return self._add(name, f'"{{" ( {body} ){"?" if first == n else ""} "}}"')


def _alts(exprs: dict[str, None]) -> str:
    """Alternatives, once each."""
    items = list(exprs)
    return items[0] if len(items) == 1 else "( " + " | ".join(items) + " )"
