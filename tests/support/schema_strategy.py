"""Hypothesis strategies from a request model's JSON Schema (what pydantic's
``model_json_schema()`` writes: types, properties, ``anyOf``, enums, bounds, ``$ref``), and the
hostile variations of a valid body: any JSON at all, a field swapped for any JSON value, an
unknown field. For tests/app/test_fuzz.py: every parser is driven from its own schema, so a field
added to a model is fuzzed without anyone remembering to."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

MAX_DEPTH = 4  # how deep $ref chains are followed before plain JSON values stand in

# any JSON value, small: the hostile stand-in for a field, or a whole body
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                max_size=4),
    max_leaves=12,
)


def from_schema(schema: dict[str, Any], defs: dict[str, Any] | None = None,
                depth: int = 0) -> st.SearchStrategy[Any]:
    """Values the schema allows (mostly: a bound the schema states is kept, sizes are small)."""
    defs = schema.get("$defs", {}) if defs is None else defs
    if depth > MAX_DEPTH:
        return JSON
    if "$ref" in schema:
        target = defs[schema["$ref"].rsplit("/", 1)[-1]]
        return st.deferred(lambda: from_schema(target, defs, depth + 1))
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([from_schema(s, defs, depth + 1) for s in schema[key]])
    if "allOf" in schema:
        return from_schema(schema["allOf"][0], defs, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([from_schema({**schema, "type": k}, defs, depth) for k in kind])
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        return st.integers(_bound(schema, "minimum", "exclusiveMinimum", 1, -(2**40)),
                           _bound(schema, "maximum", "exclusiveMaximum", -1, 2**40))
    if kind == "number":
        return st.floats(schema.get("minimum", schema.get("exclusiveMinimum")),
                         schema.get("maximum", schema.get("exclusiveMaximum")),
                         allow_nan=False, allow_infinity=False,
                         exclude_min="exclusiveMinimum" in schema,
                         exclude_max="exclusiveMaximum" in schema)
    if kind == "string":
        return st.text(min_size=schema.get("minLength", 0),
                       max_size=min(schema.get("maxLength", 40), 40))
    if kind == "array":
        items = from_schema(schema.get("items", {}), defs, depth + 1)
        return st.lists(items, min_size=min(schema.get("minItems", 0), 4),
                        max_size=min(schema.get("maxItems", 4), 4))
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        if not props:
            return st.dictionaries(st.text(max_size=10), JSON, max_size=3)
        required = set(schema.get("required", ()))
        return st.fixed_dictionaries(
            {k: from_schema(v, defs, depth + 1) for k, v in props.items() if k in required},
            optional={k: from_schema(v, defs, depth + 1) for k, v in props.items()
                      if k not in required})
    return JSON


def _bound(schema: dict[str, Any], inclusive: str, exclusive: str, step: int,
           default: int) -> int:
    if inclusive in schema:
        return int(schema[inclusive])
    if exclusive in schema:
        return int(schema[exclusive]) + step
    return default


@st.composite
def hostile(draw: st.DrawFn, schema: dict[str, Any]) -> Any:
    """A body as a client might send it: valid by the schema, one field swapped for any JSON
    value, an unknown field added, or any JSON at all."""
    how = draw(st.sampled_from(("valid", "swapped", "unknown", "any")))
    if how == "any":
        return draw(JSON)
    body = draw(from_schema(schema))
    if not isinstance(body, dict):
        return body
    if how == "swapped" and body:
        body[draw(st.sampled_from(sorted(body)))] = draw(JSON)
    elif how == "unknown":
        body[draw(st.text(min_size=1, max_size=10))] = draw(JSON)
    return body
