"""Fuzzing the schema parsers (bounded count, no model): the JSON Schema converter and Gemini's
schema reader, fed random schemas with long and odd names, definitions and references, and
hostile JSON.

The properties: every input is a grammar or a 400 (BadRequest), never another error; a grammar
is within GRAMMAR_MAX_BYTES in bytes, its rule names are short, and it is the grammar the same
conversion makes with names left whole (rule for rule, up to renaming: shortening a name changes
no language); Gemini's reader agrees with a plain recursive reading of the same schema.
SCHEMA_FUZZ_EXAMPLES sets how many of each are tried (200 by default).
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.api.gemini import parsing as gemini
from app.base.errors import BadRequest
from app.grammar import gate, json_schema
from app.settings import Settings
from tests.support.schema_strategy import JSON

LIMITS = replace(gate.Limits.from_settings(Settings()), max_bytes=32 << 10)
EXAMPLES = int(os.environ.get("SCHEMA_FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ---- schemas ------------------------------------------------------------------------------------
NAMES = st.one_of(
    st.text(min_size=1, max_size=12),
    st.text(alphabet="ab.-_ 中\\\"'\n", min_size=50, max_size=160),
    st.sampled_from(["root", "space", "string", "a.b", "x" * 70, "x" * 70 + "y", "中" * 40]),
)
_LEAVES = st.one_of(
    st.sampled_from([{"type": t} for t in ("string", "integer", "number", "boolean", "null")]),
    st.just({}),
    st.integers(0, 4).map(lambda n: {"type": "string", "maxLength": n}),
    st.lists(st.none() | st.integers(-9, 9) | st.text(max_size=20), min_size=1, max_size=4)
    .map(lambda v: {"enum": v}),
    st.text(max_size=20).map(lambda c: {"const": c}),
)


def _object(children: st.SearchStrategy) -> st.SearchStrategy:
    def build(props: dict[str, Any], flags: list[bool]) -> dict[str, Any]:
        return {"type": "object", "properties": props,
                "required": [k for k, f in zip(props, flags, strict=False) if f]}

    return st.builds(build, st.dictionaries(NAMES, children, max_size=4),
                     st.lists(st.booleans(), min_size=4, max_size=4))


SCHEMAS = st.recursive(_LEAVES, lambda inner: st.one_of(
    _object(inner),
    inner.map(lambda s: {"type": "array", "items": s}),
    st.lists(inner, min_size=1, max_size=3).map(lambda s: {"anyOf": s}),
), max_leaves=10)

REF_NAMES = NAMES.filter(lambda n: not set(n) & set("/#~%"))


@st.composite
def with_definitions(draw: st.DrawFn) -> dict[str, Any]:
    """An object whose properties use named definitions (perhaps recursive ones)."""
    names = draw(st.lists(REF_NAMES, min_size=1, max_size=3, unique=True))
    defs = {}
    for name in names:
        body = draw(SCHEMAS)
        if draw(st.booleans()):  # refers to itself, optionally
            body = {"type": "object", "properties": {"next": {"$ref": f"#/$defs/{name}"},
                                                     "value": body}}
        defs[name] = body
    uses = draw(st.lists(st.sampled_from(names), min_size=1, max_size=6))
    props = {f"u{i}-{name}": {"$ref": f"#/$defs/{name}"} for i, name in enumerate(uses)}
    return {"$defs": defs, "type": "object", "properties": props, "required": list(props)}


KEYWORDS = ["type", "properties", "required", "items", "anyOf", "oneOf", "allOf", "enum",
            "const", "$ref", "pattern", "minLength", "maxLength", "minItems", "maxItems",
            "additionalProperties", "prefixItems", "format", "$defs", "nullable"]
HOSTILE = st.recursive(JSON, lambda inner: st.dictionaries(st.sampled_from(KEYWORDS), inner,
                                                           max_size=4), max_leaves=12)


# ---- grammars up to renaming --------------------------------------------------------------------
_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|\{[^}]*\}|([A-Za-z0-9-]+)')


def _rules(gbnf: str) -> dict[str, tuple[str, list[str]]]:
    """Each rule as (its body with references blanked, the references in order)."""
    out = {}
    for line in gbnf.splitlines():
        name, body = line.split(" ::= ", 1)
        refs = [m.group(1) for m in _TOKEN.finditer(body) if m.group(1)]
        out[name] = (_TOKEN.sub(lambda m: "@" if m.group(1) else m.group(0), body), refs)
    return out


def assert_same_up_to_renaming(ours: str, whole: str) -> None:
    """Every rule reached from root matches, token for token, the rule its name stands for in
    ``whole``, references mapped consistently: both grammars accept the same texts."""
    a, b = _rules(ours), _rules(whole)
    mapped = {"root": "root"}
    todo = ["root"]
    while todo:
        x = todo.pop()
        (shape_x, refs_x), (shape_y, refs_y) = a[x], b[mapped[x]]
        assert shape_x == shape_y and len(refs_x) == len(refs_y), (x, mapped[x])
        for rx, ry in zip(refs_x, refs_y, strict=True):
            if rx not in mapped:
                mapped[rx] = ry
                todo.append(rx)
            assert mapped[rx] == ry, (rx, mapped[rx], ry)


def whole_names(schema: dict[str, Any]) -> str:
    """The same conversion with rule names left whole (no cache, a generous byte budget)."""
    short, json_schema._NAME_MAX = json_schema._NAME_MAX, 10**9
    try:
        conv = json_schema._converter(1 << 30)
        conv.visit(conv.resolve_refs(json_schema._prepare_schema(schema, "s", LIMITS), "input"), "")
        return conv.format_grammar()
    finally:
        json_schema._NAME_MAX = short


def check_converted(schema: Any) -> None:
    try:
        gbnf = json_schema.from_schema(schema, "s", LIMITS)
    except BadRequest as err:
        assert err.param == "s" and err.message.startswith("s")
        return
    assert len(gbnf.encode("utf-8", "surrogatepass")) <= LIMITS.max_bytes
    assert all(len(line.split(" ::= ", 1)[0]) <= json_schema._NAME_MAX for line in gbnf.splitlines())
    try:
        gate.check(gbnf, "s", LIMITS)  # every grammar passes the gate: a refusal is a 400 too
    except gate.GrammarError as err:
        assert err.param == "s"
    assert_same_up_to_renaming(gbnf, whole_names(schema))


@FUZZ
@given(schema=st.one_of(SCHEMAS, with_definitions()))
def test_converted_schemas_are_bounded_and_the_same_up_to_names(schema):
    check_converted(schema)


@FUZZ
@given(schema=HOSTILE)
def test_hostile_schemas_are_a_grammar_or_a_400(schema):
    check_converted(schema)


# ---- Gemini's schema reader ---------------------------------------------------------------------
def reference(schema: Any) -> Any:
    """Gemini's Schema read plainly, recursively (the reader's meaning, not its cost)."""
    if not isinstance(schema, dict):
        raise BadRequest("not a schema")
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("propertyOrdering", "property_ordering", "example", "nullable"):
            continue
        name = gemini.camel(key)
        if name == "type" and isinstance(value, str):
            value = value.lower()
            if value == "type_unspecified":
                continue
        elif name == "properties" and isinstance(value, dict):
            value = {k: reference(v) for k, v in value.items()}
        elif name in ("items", "additionalProperties") and isinstance(value, dict):
            value = reference(value)
        elif name in ("anyOf", "oneOf", "allOf") and isinstance(value, list):
            value = [reference(v) for v in value]
        out[name] = value
    if schema.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


GEMINI_KEYS = ["type", "properties", "items", "additionalProperties", "anyOf", "oneOf",
               "allOf", "nullable", "propertyOrdering", "property_ordering", "any_of",
               "description", "enum", "required"]
GEMINI = st.recursive(
    JSON | st.sampled_from(["STRING", "OBJECT", "TYPE_UNSPECIFIED"]).map(lambda t: {"type": t}),
    lambda inner: st.one_of(
        st.dictionaries(st.sampled_from(GEMINI_KEYS), inner, max_size=4),
        st.dictionaries(NAMES, inner, max_size=4).map(lambda p: {"type": "OBJECT", "properties": p}),
        st.lists(inner, max_size=3).map(lambda v: {"anyOf": v, "nullable": True, "type": "STRING"}),
    ), max_leaves=14)


def _count(schema: Any) -> int:
    if isinstance(schema, dict):
        own = len(schema["properties"]) if isinstance(schema.get("properties"), dict) else 0
        return own + sum(_count(v) for v in schema.values())
    if isinstance(schema, list):
        return sum(_count(v) for v in schema)
    return 0


@FUZZ
@given(schema=GEMINI, cap=st.none() | st.integers(0, 6))
def test_gemini_reads_what_a_plain_reading_reads(schema, cap):
    try:
        expected = reference(schema)
    except BadRequest:
        expected = None
    try:
        got = gemini.json_schema(schema, "w", max_properties=cap)
    except gate.GrammarTooComplex as err:
        assert cap is not None and "GRAMMAR_MAX_PROPERTIES" in err.message and err.param == "w"
        return
    except BadRequest as err:
        assert expected is None and err.param.startswith("w")
        return
    assert got == expected
