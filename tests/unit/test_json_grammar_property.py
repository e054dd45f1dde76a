"""Grammar-held JSON always parses: for random schemas and random sampling, every finished output
is strict JSON (no raw control character in a string, no NaN / Infinity) that its schema accepts.

No decoding: the model is loaded vocab-only and the engine's own Sampler is driven with random
logits of our own (a fake ``llama_get_logits_ith``), under the grammar a ``response_format``
json_schema request gets (app.core.plan.output_grammar, then the gate). JSON_GRAMMAR_EXAMPLES
sets how many schemas are tried (40 by default).
"""

from __future__ import annotations

import json
import os
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import formats
from app.core.input import OutputFormat
from app.core.plan import output_grammar
from app.grammar import gate, json_schema
from app.protocol.tools import validate_tools
from app.settings import Settings
from tests.support.sampling import closers_of, grammar_sampler, sample_once, token_pieces

LIMITS = gate.Limits.from_settings(Settings())
EXAMPLES = int(os.environ.get("JSON_GRAMMAR_EXAMPLES", "40"))
MAX_TOKENS = 400  # an output still unfinished here is skipped, not judged
TRIES = 2  # samplings per schema


@pytest.fixture(scope="module")
def pieces(vocab) -> list[bytes]:
    return token_pieces(vocab)


def grammar_of(schema: dict[str, Any]) -> str:
    """The grammar a response_format json_schema request gets, through the gate as the plan does."""
    made = output_grammar(OutputFormat("json_schema", schema, "response_format"), LIMITS)
    assert made is not None
    gate.check(made[0], made[1], LIMITS)
    return made[0]


# ---- random schemas -----------------------------------------------------------------------------
_SCALAR = st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=6)
_LEAVES = st.one_of(
    st.just({"type": "string"}),
    st.integers(0, 6).map(lambda n: {"type": "string", "maxLength": n}),
    st.integers(0, 3).map(lambda n: {"type": "string", "minLength": n, "maxLength": n + 3}),
    st.just({"type": "number"}),
    st.just({"type": "integer"}),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.lists(_SCALAR, min_size=1, max_size=4).map(lambda v: {"enum": v}),
    st.just({}),
    st.text(max_size=12).map(lambda d: {"description": d}),
)


def _object(children: st.SearchStrategy) -> st.SearchStrategy:
    def build(props: dict[str, Any], draw_required: list[bool]) -> dict[str, Any]:
        required = [k for k, r in zip(props, draw_required, strict=False) if r]
        return {"type": "object", "properties": props, "required": required}

    props = st.dictionaries(st.text(min_size=1, max_size=6), children, max_size=3)
    return st.builds(build, props, st.lists(st.booleans(), min_size=3, max_size=3))


def _array(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.builds(
        lambda items, bound: {"type": "array", "items": items, **bound},
        children, st.sampled_from([{}, {"maxItems": 2}, {"minItems": 1, "maxItems": 3}]))


SCHEMAS = st.recursive(_LEAVES, lambda inner: _object(inner) | _array(inner), max_leaves=6)


# ---- sampling -----------------------------------------------------------------------------------
def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_json(data: bytes) -> Any:
    text = data.decode("utf-8")  # strict: invalid UTF-8 raises
    # strict=True (the default) refuses a raw U+0000-U+001F inside a string
    return json.loads(text, strict=True, parse_constant=_refuse)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schema=SCHEMAS, seed=st.integers(0, 2**31))
def test_every_finished_output_is_strict_json_its_schema_accepts(vocab, pieces, schema, seed):
    text = grammar_of(schema)
    closers = closers_of(pieces)
    validator = jsonschema.Draft202012Validator(schema)
    for k in range(TRIES):
        data = sample_once(vocab, pieces, closers, text, seed + k, MAX_TOKENS)
        if data is None:
            continue  # cut by the bound: not a finished output
        value = strict_json(data)
        errors = [e.message for e in validator.iter_errors(value)]
        assert not errors, (schema, data, errors)


# ---- focused ------------------------------------------------------------------------------------
def _controls(vocab, pieces) -> list[int]:
    return [t for t, p in enumerate(pieces) if any(b < 0x20 for b in p) and t not in vocab.eog_ids]


def test_a_raw_line_feed_or_tab_cannot_be_sampled_inside_a_string(vocab, pieces):
    s = grammar_sampler(vocab, grammar_of({"type": "object", "properties": {"a": {"type": "string"}},
                                   "required": ["a"]}))
    assert s.feed(b'{"a": "x')
    for byte in (0x0A, 0x09, 0x00, 0x1F, 0x0D):
        assert not s.allows(vocab.byte_token[byte]), byte
    allowed = set(s.allowed(None)["id"].tolist())
    assert allowed and not allowed & set(_controls(vocab, pieces))
    s.free()


def test_a_tool_calls_arguments_take_no_raw_line_feed_either(vocab):
    tools = validate_tools([{"type": "function", "function": {"name": "get", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}}}}])
    text = formats.get("hermes").grammar(tools, parallel=False, limits=LIMITS)
    s = grammar_sampler(vocab, text, triggers=("<tool_call>",))
    s.observe(b'<tool_call>\n{"name": "get", "arguments": {"q": "a')
    assert s.armed
    assert not s.allows(vocab.byte_token[0x0A]) and not s.allows(vocab.byte_token[0x09])
    assert s.feed(b'\\n\\tb"}}')
    s.free()


@pytest.mark.parametrize("escaped", [
    rb"\n", rb"\t", rb"\"", rb"\\", rb"\/", rb"\b\f\r", rb"\u00e9", rb"\u000A", rb"\ud83d\ude00",
])
def test_escaped_forms_still_work(vocab, escaped):
    s = grammar_sampler(vocab, grammar_of({"type": "string"}))
    assert s.feed(b'"a' + escaped + b'b"')
    assert s.allows(int(vocab.eog_ids[0]))
    s.free()


@pytest.mark.parametrize("bad", [rb"\ud83d", rb"\ude00", rb"\ud83dx", rb"\x", rb"\u12"])
def test_a_lone_surrogate_or_a_bad_escape_is_refused(vocab, bad):
    s = grammar_sampler(vocab, grammar_of({"type": "string"}))
    assert not s.feed(b'"' + bad + b'"')
    s.free()


def test_max_length_counts_an_escape_or_a_pair_as_one_character(vocab):
    text = grammar_of({"type": "string", "maxLength": 2})
    for ok in (rb'"\u00e9\n"', rb'"\ud83d\ude00x"'):
        s = grammar_sampler(vocab, text)
        assert s.feed(ok) and json.loads(ok) and len(json.loads(ok)) == 2
        s.free()
    s = grammar_sampler(vocab, text)
    assert not s.feed(rb'"ab\n"')
    s.free()


ANY = [b"1", b"-0.5e3", b'"s"', b"true", b"null", b'[1, {"a": null}]', b'{"k": [false, "x"]}', b"{}"]


@pytest.mark.parametrize("schema", [{}, {"description": "x"}, {"title": "t", "description": "d"}])
@pytest.mark.parametrize("value", ANY)
def test_an_untyped_schema_takes_any_json_value(vocab, schema, value):
    s = grammar_sampler(vocab, grammar_of(schema))
    assert s.feed(value) and s.allows(int(vocab.eog_ids[0])), value
    s.free()


@pytest.mark.parametrize("value", ANY)
def test_untyped_properties_and_items_take_any_json_value(vocab, value):
    schema = {"type": "object", "properties": {
        "a": {"description": "anything"}, "b": {"type": "array", "items": {}}}, "required": ["a", "b"]}
    s = grammar_sampler(vocab, grammar_of(schema))
    assert s.feed(b'{"a": ' + value + b', "b": [' + value + b", " + value + b"]}"), value
    assert s.allows(int(vocab.eog_ids[0]))
    s.free()


def test_additional_properties_true_takes_any_value():
    text = json_schema.from_schema({"type": "object", "properties": {"a": {"type": "integer"}},
                                    "additionalProperties": True}, "s", LIMITS)
    assert "additional-value ::= value" in text


def test_constants_and_property_names_are_written_as_their_json_text(vocab):
    """JSON's escapes in a const, an enum value or a name were read as GBNF escapes (a raw
    U+001F, a lone backslash): now the output is exactly json.dumps' text."""
    name, value = "k\x1f\\\"\n", "a\\b\t\U0001F600"
    schema = {"type": "object", "properties": {name: {"enum": [value]}}, "required": [name]}
    s = grammar_sampler(vocab, grammar_of(schema))
    text = ("{" + json.dumps(name) + ":" + json.dumps(value) + "}").encode()
    assert s.feed(text) and s.allows(int(vocab.eog_ids[0]))
    assert strict_json(text) == {name: value}
    s.free()
