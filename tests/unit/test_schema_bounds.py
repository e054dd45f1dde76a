"""What converting a schema may cost (security review 3: H1, M1), in process, no model.

The JSON Schema converter's work and output are bounded before they are spent (rule names do not
grow with the names above them; conversion stops at GRAMMAR_MAX_BYTES; a definition is converted
once), neither grammar cache keeps an over-limit text or any text as a key, and Gemini's schema
reader builds a node's path only for its error and counts properties before converting them.
Costs are asserted by structure: what was allocated, what was visited, what the caches hold.
"""

from __future__ import annotations

import gc
import re
import sys
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from app.api.gemini import parsing as gemini
from app.base.errors import BadRequest
from app.grammar import gate, json_schema
from app.settings import Settings

LIMITS = gate.Limits.from_settings(Settings())
SMALL = replace(LIMITS, max_bytes=64 << 10)
DIGEST = 32  # bytes of a sha256


def peak_of(work: Callable[[], Any]) -> int:
    """The most memory ``work`` held at once (Python's allocations), whatever it raised."""
    tracemalloc.start()
    try:
        work()
    except BadRequest:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def wide(name: str, children: int) -> dict[str, Any]:
    """The review's shape: one long property name over many required children."""
    kids = [f"p{i}" for i in range(children)]
    return {"type": "object", "required": [name], "properties": {name: {
        "type": "object", "properties": {k: {"type": "integer"} for k in kids}, "required": kids}}}


def rule_names(gbnf: str) -> list[str]:
    return [line.split(" ::= ", 1)[0] for line in gbnf.splitlines()]


# ---- the JSON Schema converter -------------------------------------------------------------------


def test_conversion_stops_at_the_byte_limit():
    """A 20 KB name over 1000 children made an 80 MB grammar before the size was looked at."""
    schema = wide("k" * 20_000, 1000)
    with pytest.raises(gate.GrammarTooComplex) as info:
        json_schema.from_schema(schema, "response_format", SMALL)
    assert info.value.param == "response_format" and "GRAMMAR_MAX_BYTES" in info.value.message
    assert peak_of(lambda: json_schema.from_schema(schema, "response_format", SMALL)) < 16 << 20


def test_rule_names_do_not_grow_with_the_names_above_them():
    name = "k" * 2000
    gbnf = json_schema.from_schema(wide(name, 50), "s", LIMITS)
    assert max(len(n) for n in rule_names(gbnf)) <= 64
    # the long name is written once, as the property's literal: each child costs the same
    assert gbnf.count(name) == 1
    assert len(gbnf) < len(name) + 50 * 400 + len(json_schema.from_schema(wide("k", 0), "s", LIMITS))


def test_a_shortened_name_keeps_its_end_and_differs_by_its_digest():
    one = json_schema.from_schema(wide("a" * 100 + "first", 1), "s", LIMITS)
    two = json_schema.from_schema(wide("a" * 100 + "second", 1), "s", LIMITS)
    ones = {n for n in rule_names(one) if n.startswith("aaaa")}
    twos = {n for n in rule_names(two) if n.startswith("aaaa")}
    assert ones and twos and not ones & twos
    assert any(n.endswith("first-kv") for n in ones)


def test_a_definition_is_converted_once_however_often_it_is_used():
    """The library converted a definition again at every use when its name needs escaping."""
    visits: list[str] = []
    real = json_schema._converter

    def spy(*args: Any) -> Any:
        conv = real(*args)
        inner = conv.visit

        def visit(schema: Any, name: str) -> str:
            if isinstance(schema, dict) and schema.get("title") == "the definition":
                visits.append(name)
            return inner(schema, name)

        conv.visit = visit
        return conv

    definition = {"title": "the definition", "type": "object",
                  "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    uses = [f"q{i}" for i in range(20)]
    schema = {"$defs": {"a.b": definition}, "type": "object", "required": uses,
              "properties": {q: {"$ref": "#/$defs/a.b"} for q in uses}}
    json_schema._converter = spy
    try:
        gbnf = json_schema.from_schema(schema, "s", LIMITS)
    finally:
        json_schema._converter = real
    assert len(visits) == 1
    gate.check(gbnf, "s", LIMITS)


def test_a_recursive_definition_still_refers_to_itself():
    node = {"type": "object", "properties": {"next": {"$ref": "#/$defs/a.b"}}}
    gbnf = json_schema.from_schema({"$defs": {"a.b": node}, "type": "object", "required": ["head"],
                                    "properties": {"head": {"$ref": "#/$defs/a.b"}}}, "s", LIMITS)
    gate.check(gbnf, "s", LIMITS)
    assert re.search(r"^a-b ::= .*\ba-b-next-kv\b", gbnf, re.M) and "a-b-next ::= a-b" in gbnf


def test_the_converter_keeps_no_grammar_over_the_limit_in_bytes():
    """Conversion counts characters; a grammar within them but over in bytes is refused after
    (a pattern's literal is written as it is: here 300 characters of 3 bytes)."""
    schema = {"type": "string", "pattern": "^" + "中" * 300 + "$"}
    gbnf = json_schema.from_schema(schema, "s", LIMITS)
    chars, size = len(gbnf), len(gbnf.encode())
    assert chars < size
    tight = replace(LIMITS, max_bytes=(chars + size) // 2)
    with pytest.raises(gate.GrammarTooComplex, match=f"{size} bytes.*GRAMMAR_MAX_BYTES"):
        json_schema.from_schema(schema, "s", tight)
    assert all(k[1] != tight for k in json_schema._CACHE)


def test_the_converter_cache_is_keyed_by_a_digest():
    json_schema.from_schema({"type": "string", "description": "d" * 10_000}, "s", LIMITS)
    assert all(isinstance(k[0], bytes) and len(k[0]) == DIGEST for k in json_schema._CACHE)
    assert max(len(v) for v in json_schema._CACHE.values()) <= LIMITS.max_bytes


# ---- the gate's verdict cache --------------------------------------------------------------------


@pytest.mark.parametrize("body", [
    "undefined-rule",  # refused: its error once held the text through its traceback
    '"ok"',  # accepted
])
def test_the_verdict_cache_holds_no_reference_to_the_text(body):
    text = f"root ::= {body}\n# {'z' * 10_000} {id(body)}"
    gc.collect()
    before = sys.getrefcount(text)
    for param in ("first", "second"):  # the second answer comes from the cache
        try:
            gate.check(text, param, LIMITS)
        except gate.GrammarError as err:
            assert err.param == param and err.message.startswith(f"{param}: ")
    gc.collect()
    assert sys.getrefcount(text) == before
    assert all(isinstance(k[0], bytes) and len(k[0]) == DIGEST for k in gate._VERDICTS)


def test_an_over_limit_text_is_refused_before_it_is_cached():
    size = len(gate._VERDICTS)
    text = "root ::= " + '"a"' * 100_000
    with pytest.raises(gate.GrammarTooComplex, match="GRAMMAR_MAX_BYTES"):
        gate.check(text, "grammar", LIMITS)
    assert len(gate._VERDICTS) <= size


# ---- Gemini's schema reader ----------------------------------------------------------------------


def test_gemini_paths_are_built_only_for_an_error():
    """A chain of long names: every level's path held the names above it (quadratic)."""
    schema: dict[str, Any] = {"type": "STRING"}
    for level in range(300):
        schema = {"type": "OBJECT", "properties": {f"{level}" + "n" * 2000: schema}}
    assert peak_of(lambda: gemini.json_schema(schema, "generationConfig.responseSchema")) < 8 << 20


def test_gemini_errors_still_name_the_path():
    bad = {"properties": {"a": {"items": {"anyOf": [{}, 5]}}}}
    with pytest.raises(BadRequest) as info:
        gemini.json_schema(bad, "generationConfig.responseSchema")
    where = "generationConfig.responseSchema.properties.a.items.anyOf.1"
    assert info.value.param == where and info.value.message.startswith(f"{where}: ")


class Counting(dict):
    """A schema that counts how often it is read (converted)."""

    reads = 0

    def items(self):  # type: ignore[override]
        Counting.reads += 1
        return super().items()


def test_gemini_counts_properties_before_converting_them():
    Counting.reads = 0
    schema = {"type": "OBJECT", "properties": {f"p{i}": Counting(type="STRING") for i in range(11)}}
    with pytest.raises(gate.GrammarTooComplex) as info:
        gemini.json_schema(schema, "tools.0.functionDeclarations.0.parameters", max_properties=10)
    assert info.value.param == "tools.0.functionDeclarations.0.parameters"
    assert "GRAMMAR_MAX_PROPERTIES" in info.value.message and Counting.reads == 0
    assert gemini.json_schema(schema, "x", max_properties=11)["properties"]["p0"] == {"type": "string"}


def test_gemini_reads_a_deep_schema_without_recursion():
    schema: dict[str, Any] = {"type": "STRING"}
    for _ in range(5000):
        schema = {"type": "ARRAY", "items": schema}
    out = gemini.json_schema(schema, "generationConfig.responseSchema")
    for _ in range(5000):
        assert out["type"] == "array"
        out = out["items"]
    assert out == {"type": "string"}
