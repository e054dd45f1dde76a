"""JSON Schema -> GBNF, for ``response_format`` and tool schemas.

Through llama-cpp-python's converter, with its cost bounded: rule naming is O(1) per rule
instead of O(rules) (3000 property names that escape to the same rule name took seconds), a rule
name is at most ``_NAME_MAX`` characters (the library names a child ``parent-prop``, so a long
name was copied into every descendant's name and every reference to it: a 200 KB property name
over 1000 children made a 400 MB grammar), a ``$ref`` is converted once, not at every use, and
conversion stops as soon as the grammar passes ``GRAMMAR_MAX_BYTES``. The schema is checked
before conversion (only local ``$ref``, bounded property counts; a
``minLength`` / ``minItems`` over ``max_repetition`` is refused, and a ``maxLength`` /
``maxItems`` allowing more than half of it is not enforced, as llama.cpp itself does for
``{m,n}`` above 2000: the converter nests two rules per optional repetition, and llama.cpp
refuses a group of over 2000 rules). What it makes still passes the gate (app.grammar.gate).

Two of the library's rules are replaced here, as llama.cpp's current converter has them:

- a string's character (``char``, and the ``.`` of a ``pattern``) is never a raw control
  character (U+0000-U+001F, or DEL): RFC 8259 forbids them unescaped in a string, and the
  library's ``[^"\\]`` let a model write a raw newline or tab into a tool call's arguments.
  Escapes stay; a ``\\u`` escape is one character: a surrogate only as a high-low pair, so
  ``minLength`` / ``maxLength`` count what a JSON parser reads, and no lone surrogate is written;
- a constant, an enum value or a property name is written as exactly its JSON text (the
  library let llama.cpp read JSON's escapes as GBNF's: ``"\\u001f"`` became a raw U+001F);
- a schema with nothing to enforce (``{}``, ``{"description": ...}``, no ``type``) means any
  JSON value, as JSON Schema says (the library asserted, a 400; ``{}`` was an object only).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from typing import Any

from app.base.bridge import allocate_lock
from app.base.errors import BadRequest
from app.grammar.gate import GrammarError, GrammarTooComplex, Limits

_CACHE_SIZE = 256
_NAME_MAX = 64  # a rule name's most characters (see _short)
_CACHE_LOCK = allocate_lock()  # conversions run on several worker threads


_BOUNDS_MIN = ("minLength", "minItems")
_BOUNDS_MAX = ("maxLength", "maxItems")
_QUANTIFIER = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def _prepare_schema(schema: Any, param: str, limits: Limits) -> Any:
    """A copy of ``schema`` the converter can take cheaply, or a 400 saying why not."""
    properties = 0
    # the converter nests two rules per optional repetition, and llama.cpp refuses a group
    # holding over 2000 rules: a span (max - min) above half the limit is not enforced
    enforce_up_to = limits.max_repetition // 2
    root: Any = None
    # iterative copy: (source, parent container, key in parent)
    todo: list[tuple[Any, Any, Any]] = [(schema, None, None)]
    while todo:
        node, parent, key = todo.pop()
        if isinstance(node, dict):
            copy: Any = {}
            ref = node.get("$ref")
            if ref is not None and (not isinstance(ref, str) or not ref.startswith("#")):
                raise BadRequest(
                    f"{param}: only local $ref ('#/...') is supported, not {str(ref)[:100]!r}",
                    param=param,
                )
            props = node.get("properties")
            if isinstance(props, dict):
                properties += len(props)
                required = node.get("required")
                if isinstance(required, list) and not all(isinstance(r, str) for r in required):
                    raise BadRequest(f"{param}: 'required' must list property names", param=param)
                n_required = len({r for r in required if r in props}) if isinstance(required, list) else 0
                if len(props) - n_required > limits.max_optional_properties:
                    raise GrammarTooComplex(
                        f"{param}: an object with {len(props) - n_required} optional properties, "
                        f"over the limit of {limits.max_optional_properties} "
                        "(GRAMMAR_MAX_OPTIONAL_PROPERTIES)",
                        param=param,
                    )
            enum = node.get("enum")
            if isinstance(enum, list) and len(enum) > limits.max_alternatives:
                raise GrammarTooComplex(
                    f"{param}: an enum of {len(enum)} values, over the limit of "
                    f"{limits.max_alternatives} (GRAMMAR_MAX_ALTERNATIVES)",
                    param=param,
                )
            for k, v in node.items():
                if k in _BOUNDS_MIN and isinstance(v, int) and v > limits.max_repetition:
                    raise GrammarTooComplex(
                        f"{param}: {k} {v} is over the limit of {limits.max_repetition} "
                        "(GRAMMAR_MAX_REPETITION)",
                        param=param,
                    )
                low = node.get("minLength" if k == "maxLength" else "minItems", 0)
                low = low if isinstance(low, int) else 0
                if k in _BOUNDS_MAX and isinstance(v, int) and v - low > enforce_up_to:
                    continue  # not enforced (as llama.cpp does with {m,n} over its threshold)
                if k == "pattern" and isinstance(v, str):
                    _check_pattern(v, param, limits)
                copy[k] = None  # the slot, in order; filled when the value is copied
                todo.append((v, copy, k))
        elif isinstance(node, list):
            copy = [None] * len(node)
            todo.extend((v, copy, i) for i, v in enumerate(node))
        else:
            copy = node
        if parent is None:
            root = copy
        else:
            parent[key] = copy
        if properties > limits.max_properties:
            raise GrammarTooComplex(
                f"{param}: more than {limits.max_properties} properties "
                "(GRAMMAR_MAX_PROPERTIES)",
                param=param,
            )
    return root


def _check_pattern(pattern: str, param: str, limits: Limits) -> None:
    for m in _QUANTIFIER.finditer(pattern):
        bound = max(int(m.group(1)), int(m.group(2) or 0))
        if bound > limits.max_repetition:
            raise GrammarTooComplex(
                f"{param}: the pattern repeats {bound} times, over the limit of "
                f"{limits.max_repetition} (GRAMMAR_MAX_REPETITION)",
                param=param,
            )


# one character of a JSON string's text, as GBNF: any code point but '"', '\\', DEL and the
# C0 controls, or an escape; a \\u escape of a surrogate only as a high-low pair
_HEX = "[0-9a-fA-F]"
_U_ESCAPE = (
    f'"u" ([0-9a-cA-CeEfF] {_HEX} {_HEX} {_HEX} | [dD] [0-7] {_HEX} {_HEX}'
    f' | [dD] [89abAB] {_HEX} {_HEX} "\\\\u" [dD] [c-fC-F] {_HEX} {_HEX})'
)
JSON_CHAR = f'[^"\\\\\\x7F\\x00-\\x1F] | "\\\\" (["\\\\/bfnrt] | {_U_ESCAPE})'
# a pattern's "." inside a JSON string: a character as above but for a line break (\\n, \\r)
JSON_DOT = f'[^"\\\\\\x7F\\x00-\\x1F] | "\\\\" (["\\\\/bft] | {_U_ESCAPE})'

# what tells the converter what to build; a schema with none of it (and no type) is any value
_STRUCTURE = ("$ref", "oneOf", "anyOf", "allOf", "const", "enum", "properties", "items",
              "prefixItems", "pattern")


def _is_untyped(schema: dict[str, Any], formats: Any) -> bool:
    if schema.get("type") is not None or any(k in schema for k in _STRUCTURE):
        return False
    if "additionalProperties" in schema and schema["additionalProperties"] is not True:
        return False
    fmt = schema.get("format")
    return not (isinstance(fmt, str) and (re.match(r"^uuid[1-5]?$", fmt)
                                          or f"{fmt}-string" in formats))


def _short(name: str) -> str:
    """``name``, or its start, a digest and its end when it is over ``_NAME_MAX`` characters: a
    child's rule name starts with its parent's, so names must not grow with the names above."""
    if len(name) <= _NAME_MAX:
        return name
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()
    return f"{name[:24]}-{digest}-{name[-(_NAME_MAX - 38):]}"  # the end: the child's own name


class _TooBig(Exception):
    """The grammar being built passed ``GRAMMAR_MAX_BYTES``: conversion stops there."""


def _converter_class() -> type:
    from llama_cpp import llama_grammar as lg

    # the library's builtin rules, with the string character replaced (matched by identity:
    # the library passes the rule object, sometimes under another name, such as "root")
    ours = dict(lg.PRIMITIVE_RULES)
    ours["char"] = lg.BuiltinRule(JSON_CHAR, [])
    replaced = {id(lg.PRIMITIVE_RULES[k]): v for k, v in ours.items()}
    library_dots = (lg.DOT, lg.DOTALL)

    class Converter(lg.SchemaConverter):
        """llama-cpp-python's converter, with rule naming in O(1) (the library probes
        ``name0, name1, ...`` from 0 on every collision: quadratic in colliding names), short
        rule names, each ``$ref`` converted once, a budget of ``max_bytes`` characters of
        grammar, JSON strings without raw control characters, and untyped schemas as any
        value."""

        def __init__(self, max_bytes: int) -> None:
            super().__init__(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
            self._key_of: dict[tuple[str, str], str] = {}
            self._next: dict[str, int] = {}
            self._resolved: dict[str, str] = {}
            self._max_bytes = max_bytes
            # format_grammar's length so far: "name ::= rule" per rule, a newline between two
            self._size = sum(len(k) + len(r) + 6 for k, r in self._rules.items()) - 1

        def visit(self, schema: Any, name: str) -> str:
            name = _short(name)  # before the library builds its children's names from it
            if schema is True:
                schema = {}
            if not isinstance(schema, dict):
                raise ValueError(f"not a schema the converter can enforce: {str(schema)[:100]}")
            items = schema.get("items")
            if items is True or items == {}:  # any items: the library reads {} as "no items"
                schema = {**schema, "items": {"$comment": "any value"}}
            if _is_untyped(schema, lg.STRING_FORMAT_RULES):
                rule_name = name + "-" if name in lg.RESERVED_NAMES else name or "root"
                return self._add_rule(rule_name, self._add_primitive("value", ours["value"]))
            return super().visit(schema, name)

        def _format_literal(self, literal: str) -> str:
            # the library calls this with JSON text only (a const, an enum value, a property
            # name, each through json.dumps) and escaped only '"' and line breaks, so JSON's
            # own escapes ("\\u001f", "\\\\") were read by llama.cpp as GBNF escapes and
            # written as the raw character (a raw control character, a lone backslash):
            # every backslash is escaped too, so the output is exactly that JSON text
            escaped = (literal.replace("\\", "\\\\").replace('"', '\\"')
                       .replace("\r", "\\r").replace("\n", "\\n"))
            return f'"{escaped}"'

        def _add_primitive(self, name: str, rule: Any) -> str:
            rule = replaced.get(id(rule), rule)
            key = self._add_rule(name, rule.content)
            for dep in rule.deps:
                dep_rule = ours.get(dep) or lg.STRING_FORMAT_RULES.get(dep)
                if dep_rule is None:
                    raise ValueError(f"unknown builtin rule {dep}")
                if dep not in self._rules:
                    self._add_primitive(dep, dep_rule)
            return key

        def _resolve_ref(self, ref: str) -> str:
            # the library converts a definition again at every use unless its name is a rule
            # name as written (no escape, no shortening), and reads a rule of the same name
            # (a property's) as the definition: here each is converted once, by its reference
            done = self._resolved.get(ref)
            if done is not None:
                return done
            name = lg.INVALID_RULE_CHARS_RE.sub("-", _short(ref.split("/")[-1]))
            if ref in self._refs_being_resolved:  # recursive: the name it is being given
                return name + "-" if name in lg.RESERVED_NAMES else name
            self._refs_being_resolved.add(ref)
            key = self.visit(self._refs[ref], name)
            self._refs_being_resolved.discard(ref)
            self._resolved[ref] = key
            return key

        def _add_rule(self, name: str, rule: str) -> str:
            if name == "dot" and rule in library_dots:
                rule = JSON_DOT  # a pattern's "." is a character of a JSON string
            esc = lg.INVALID_RULE_CHARS_RE.sub("-", _short(name))
            if esc not in self._rules or self._rules[esc] == rule:
                key = esc
            else:
                found = self._key_of.get((esc, rule))
                if found is None:
                    i = self._next.get(esc, 0)
                    while f"{esc}{i}" in self._rules and self._rules[f"{esc}{i}"] != rule:
                        i += 1
                    found = f"{esc}{i}"
                    self._next[esc] = i + 1
                key = found
            if key not in self._rules:
                # characters count no more than bytes: over in characters is over in bytes
                self._size += len(key) + len(rule) + 6
                if self._size > self._max_bytes:
                    raise _TooBig
            self._rules[key] = rule
            self._key_of[(esc, rule)] = key
            return key

    return Converter


_CONVERTER: type | None = None
_CACHE: OrderedDict[tuple[bytes, Limits], str] = OrderedDict()  # digest, limits -> grammar


def _converter(max_bytes: int) -> Any:
    global _CONVERTER
    if _CONVERTER is None:
        _CONVERTER = _converter_class()
    return _CONVERTER(max_bytes)


def _too_big(param: str, limits: Limits, size: int | None = None) -> GrammarTooComplex:
    """The 400 for a grammar over ``GRAMMAR_MAX_BYTES`` (with its size when it was finished)."""
    what = f"{size} bytes, over the limit of {limits.max_bytes}" if size is not None else (
        f"over the limit of {limits.max_bytes} bytes")
    return GrammarTooComplex(f"{param}: the schema's grammar is {what} (GRAMMAR_MAX_BYTES)",
                             param=param)


def from_schema(schema: dict[str, Any], param: str, limits: Limits) -> str:
    """A JSON Schema as GBNF; a schema over the limits or the converter rejects is a 400.

    Pure Python and CPU-bound: callers run it off the request hub (see app.base.bridge.offload).
    Converted grammars are cached by a digest of the schema's text and the limits (agents send
    the same schemas again); only grammars within ``GRAMMAR_MAX_BYTES`` are kept.
    """
    try:
        text = json.dumps(schema, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise BadRequest(f"{param} is not a JSON Schema: {exc}", param=param) from None
    key = (hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest(), limits)
    del text
    with _CACHE_LOCK:
        cached = _CACHE.get(key)
        if cached is not None:
            _CACHE.move_to_end(key)
            return cached
    prepared = _prepare_schema(schema, param, limits)
    try:
        conv = _converter(limits.max_bytes)
        resolved = conv.resolve_refs(prepared, "input")
        conv.visit(resolved, "")
        gbnf = conv.format_grammar()
    except _TooBig:
        raise _too_big(param, limits) from None
    except RecursionError:
        raise GrammarTooComplex(f"{param}: the schema nests too deeply to convert", param=param) from None
    except GrammarError:
        raise
    except Exception as exc:  # noqa: BLE001 - the converter raises assorted errors (asserts too)
        raise BadRequest(f"{param} cannot be enforced: {exc}", param=param) from None
    size = len(gbnf.encode("utf-8", "surrogatepass"))
    if size > limits.max_bytes:  # within the budget in characters, not in bytes: not kept
        raise _too_big(param, limits, size)
    with _CACHE_LOCK:
        _CACHE[key] = gbnf
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return gbnf


def json_object() -> str:
    """The grammar of any JSON object (``response_format: json_object``)."""
    from llama_cpp.llama_grammar import JSON_GBNF

    return JSON_GBNF
