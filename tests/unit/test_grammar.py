"""The grammar gate in process: limits, syntax, schema preparation (fast tier, no model)."""

from __future__ import annotations

import json

import pytest
from llama_cpp import llama_grammar as lg

from app.base.errors import BadRequest
from app.grammar import gate, json_schema
from app.protocol.http_status import status_of
from app.settings import Settings

LIMITS = gate.Limits.from_settings(Settings())


def refused(text: str) -> str:
    with pytest.raises(gate.GrammarError) as info:
        gate.check(text, "grammar", LIMITS)
    assert info.value.param == "grammar" and status_of(info.value) == 400
    return info.value.message


def test_limits_come_from_settings_and_are_all_named_there():
    for field in gate.Limits.__dataclass_fields__:
        assert f"grammar_{field}" in Settings.model_fields


@pytest.mark.parametrize("text, setting", [
    ("root ::= " + '"a"' * 100_000, "GRAMMAR_MAX_BYTES"),
    ("root ::= " + "(" * 5000 + '"a"' + ")" * 5000, "GRAMMAR_MAX_DEPTH"),
    ('root ::= "a"{0,2001}', "GRAMMAR_MAX_REPETITION"),
    ('root ::= "a"{0,99999999999999999999}', "GRAMMAR_MAX_REPETITION"),
    ("root ::= " + " | ".join(['"a"'] * 1001), "GRAMMAR_MAX_ALTERNATIVES"),
    ("root ::= " + '"a"? ' * 17 + '"b"', "GRAMMAR_MAX_OPTIONALS"),
    ("root ::= " + " ".join(f'"{c}"{{0,2000}}' for c in "abcdef"), "GRAMMAR_MAX_RULES"),
    ('root ::= ("a"{0,100}){0,100}', "GRAMMAR_MAX_REPETITION"),
    ('root ::= "a" x{40}\nx ::= "b"?', "GRAMMAR_MAX_OPTIONALS"),
    ("root ::= r0\n" + "".join(f'r{i} ::= "a"? r{i + 1}\n' for i in range(40)) + 'r40 ::= "a"',
     "GRAMMAR_MAX_OPTIONALS"),
    ("root ::= r0\n" + "".join(f"r{i} ::= r{i + 1} | r{i + 1}\n" for i in range(20)) + 'r20 ::= "a"',
     "GRAMMAR_MAX_ALTERNATIVES"),
])
def test_each_limit_is_a_400_naming_its_setting(text, setting):
    assert setting in refused(text)


@pytest.mark.parametrize("text, needle", [
    ('root ::= "a"{5,2}', "maximum below its minimum"),
    ('root ::= x\nx ::= x "a" | "b"', "left recursion"),
    ('root ::= ( | "a")* "b"', "left recursion"),
    ('root ::= "x"?*', "left recursion"),
    ('root ::= ""?', "nothing before it"),
    ("root ::= x", "undefined rule"),
    ('x ::= "a"', "no 'root' rule"),
    ('root ::= "a', "unterminated literal"),
    ('root ::= [a', "unterminated character class"),
    ('root ::= "\\q"', "unknown escape"),
    ('root ::= "\\x4"', "hex digits"),
    ('root ::= ("a"', "expecting ')'"),
    ('root ::= "a" )', "newline"),
    ("root ::= \"a\" \x00", "NUL"),
])
def test_malformed_grammars_say_why(text, needle):
    assert needle in refused(text)


def test_the_builtin_grammars_and_typical_ones_pass():
    for text in (lg.JSON_GBNF, 'root ::= [a-z]{0,50} [0-9]{1,10}', 'root ::= ("yes" | "no") "."',
                 "root ::= " + "(" * 4000 + '"a"' + ")" * 4000,
                 "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(9000)) + 'r9000 ::= "a"',
                 'root ::= <[1]> !<[2]>'):
        gate.check(text, "grammar", LIMITS)
    assert gate.check('root ::= <[1]> "a"', "g", LIMITS).has_tokens
    assert not gate.check(lg.JSON_GBNF, "g", LIMITS).has_tokens


def test_schema_bounds():
    text = json_schema.from_schema({"type": "string", "maxLength": 300_000}, "s", LIMITS)
    assert gate.check(text, "s", LIMITS).depth < 10  # not enforced: no 300k nested groups
    text = json_schema.from_schema({"type": "string", "maxLength": 1000}, "s", LIMITS)
    assert gate.check(text, "s", LIMITS).depth > 1000  # enforced
    with pytest.raises(gate.GrammarTooComplex, match="GRAMMAR_MAX_REPETITION"):
        json_schema.from_schema({"type": "string", "minLength": 10**9}, "s", LIMITS)
    with pytest.raises(gate.GrammarTooComplex, match="pattern"):
        json_schema.from_schema({"type": "string", "pattern": "^a{0,5000}$"}, "s", LIMITS)


@pytest.mark.parametrize("schema, needle", [
    ({"$ref": "https://example.com/s.json"}, "only local"),
    ({"enum": list(range(1001))}, "GRAMMAR_MAX_ALTERNATIVES"),
    ({"type": "object", "properties": {f"p{i}": {} for i in range(300)}}, "GRAMMAR_MAX_OPTIONAL_PROPERTIES"),
    ({"type": "object", "properties": {f"p{i}": {} for i in range(5001)}, "required": [f"p{i}" for i in range(5001)]},
     "GRAMMAR_MAX_PROPERTIES"),
    ({"type": "nonsense"}, "cannot be enforced"),
    ({"type": "object", "properties": {"a": {}}, "required": [["a"]]}, "must list property names"),
])
def test_schemas_refused_before_conversion(schema, needle):
    with pytest.raises(BadRequest, match=needle):
        json_schema.from_schema(schema, "s", LIMITS)


def test_rule_naming_is_linear_and_gives_the_library_s_grammar():
    """The library's grammar, rule for rule, but for the string character (no raw controls)
    and the names' JSON escapes, written as JSON text (a backslash, "u4e00"), not read as GBNF's
    escape for the character."""
    props = {chr(0x4E00 + i): {"type": "string"} for i in range(300)}
    schema = {"type": "object", "properties": props, "required": list(props)}
    library = lg.json_schema_to_gbnf(json.dumps(schema)).replace("\\u", "\\\\u").replace(
        "char ::= " + lg.PRIMITIVE_RULES["char"].content, "char ::= " + json_schema.JSON_CHAR)
    assert json_schema.from_schema(schema, "s", LIMITS) == library


def test_schema_key_order_is_kept():
    text = json_schema.from_schema({"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
                                "required": ["b", "a"]}, "s", LIMITS)
    root = next(line for line in text.splitlines() if line.startswith("root ::="))
    assert root.index("b-kv") < root.index("a-kv")
