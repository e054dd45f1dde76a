"""response_format: json_object / json_schema constrain generation with a llama.cpp grammar."""

from __future__ import annotations

import pytest

from tests.support.bodies import PERSON_CHAT as CHAT
from tests.support.bodies import PERSON_SCHEMA as SCHEMA


def test_json_schema_becomes_a_grammar(client, fake_engine):
    resp = client.post("/v1/chat/completions", json={**CHAT, "response_format": {
        "type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}})
    assert resp.status_code == 200
    grammar = fake_engine.requests[-1].params.grammar
    assert grammar and "root" in grammar and "age" in grammar
    client.post("/v1/chat/completions", json={**CHAT, "response_format": {"type": "json_object"}})
    assert "root" in fake_engine.requests[-1].params.grammar
    client.post("/v1/chat/completions", json={**CHAT, "response_format": {"type": "text"}})
    assert fake_engine.requests[-1].params.grammar is None


@pytest.mark.parametrize("fmt, param", [
    ({"type": "xml"}, "response_format"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": "nope"}}, "response_format.json_schema.schema"),
])
def test_bad_response_format_is_400(client, fmt, param):
    resp = client.post("/v1/chat/completions", json={**CHAT, "response_format": fmt})
    assert resp.status_code == 400
    assert resp.get_json()["error"]["param"] == param




@pytest.mark.parametrize("schema", [{}, {"description": "anything"},
                                    {"type": "object", "properties": {"a": {"description": "x"}},
                                     "required": ["a"]}])
def test_an_untyped_schema_is_any_value_not_a_400(client, fake_engine, schema):
    resp = client.post("/v1/chat/completions", json={**CHAT, "response_format": {
        "type": "json_schema", "json_schema": {"name": "any", "schema": schema}}})
    assert resp.status_code == 200, resp.get_json()
    grammar = fake_engine.requests[-1].params.grammar
    assert "value ::= object | array | string | number | boolean | null" in grammar
    assert "\\x00-\\x1F" in grammar  # strings without raw control characters
