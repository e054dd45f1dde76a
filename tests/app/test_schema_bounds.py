"""Every route that takes a JSON Schema shares the converter's bounds (security review 3, H1).

A schema with a long property name over many children once cost O(name length x children) to
convert, before GRAMMAR_MAX_BYTES was checked (a 20 KB name over 1000 children built an 80 MB
grammar), and both grammar caches kept the text. Each route here sends such a schema and gets a
400 in its API's own shape naming the field and the setting, while what the request allocated
stays small (conversion stopped at the limit) and neither cache holds the text.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from app.engine.fake import FakeEngine
from app.grammar import gate, json_schema
from tests.support.app import make_client

MODEL = "fake-model"
NAME = "k" * 20_000
CHILDREN = [f"p{i}" for i in range(1000)]
# as a JSON Schema and as Gemini's OpenAPI Schema alike
HOSTILE = {"type": "object", "required": [NAME], "properties": {NAME: {
    "type": "object", "properties": {p: {"type": "integer"} for p in CHILDREN},
    "required": CHILDREN}}}
# the most a refused request may allocate: the old conversion built an 80 MB grammar
PEAK_BYTES = 32 << 20
# the grammar this schema makes now is about 220 KB: over this limit, yet (unlike before) in
# reach of the default one
MAX_BYTES = 64 << 10


def openai_message(body: Any) -> str:
    err = body["error"]
    assert set(err) >= {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    return f'{err["param"]} {err["message"]}'


def anthropic_message(body: Any) -> str:
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    return body["error"]["message"]


def gemini_message(body: Any) -> str:
    err = body["error"]
    assert err["code"] == 400 and err["status"] == "INVALID_ARGUMENT"
    return err["message"]


def ollama_message(body: Any) -> str:
    assert set(body) == {"error", "request_id"}
    return body["error"]


def fn(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "description": "d", "parameters": schema}}


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
ANTHROPIC = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
GEMINI = f"/v1beta/models/{MODEL}:generateContent"
CONTENTS = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
ANY = {"toolConfig": {"functionCallingConfig": {"mode": "ANY"}}}

# route -> (path, body, the error's reader, the field the error names)
ROUTES: dict[str, tuple[str, dict[str, Any], Callable[[Any], str], str]] = {
    "chat.response_format": ("/v1/chat/completions", {**CHAT, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": HOSTILE}}},
        openai_message, "response_format.json_schema.schema"),
    "chat.tools": ("/v1/chat/completions", {**CHAT, "tools": [fn(HOSTILE)],
                                            "tool_choice": "required"}, openai_message, "tools"),
    "anthropic.tools": ("/v1/messages", {**ANTHROPIC, "tool_choice": {"type": "any"}, "tools": [
        {"name": "f", "description": "d", "input_schema": HOSTILE}]}, anthropic_message, "tools"),
    "anthropic.output_config": ("/v1/messages", {**ANTHROPIC, "output_config": {"format": {
        "type": "json_schema", "schema": HOSTILE}}}, anthropic_message,
        "output_config.format.schema"),
    "gemini.functionDeclarations.parameters": (GEMINI, {**CONTENTS, **ANY, "tools": [
        {"functionDeclarations": [{"name": "f", "description": "d", "parameters": HOSTILE}]}]},
        gemini_message, "tools"),
    "gemini.functionDeclarations.parametersJsonSchema": (GEMINI, {**CONTENTS, **ANY, "tools": [
        {"functionDeclarations": [{"name": "f", "description": "d",
                                   "parametersJsonSchema": HOSTILE}]}]}, gemini_message, "tools"),
    "gemini.responseSchema": (GEMINI, {**CONTENTS, "generationConfig": {
        "responseMimeType": "application/json", "responseSchema": HOSTILE}}, gemini_message,
        "generationConfig.response"),
    "gemini.responseJsonSchema": (GEMINI, {**CONTENTS, "generationConfig": {
        "responseMimeType": "application/json", "responseJsonSchema": HOSTILE}}, gemini_message,
        "generationConfig.responseJsonSchema"),
    "ollama.chat.format": ("/api/chat", {**CHAT, "stream": False, "format": HOSTILE},
                           ollama_message, "format"),
    "ollama.generate.format": ("/api/generate", {"model": MODEL, "prompt": "hi", "stream": False,
                                                 "format": HOSTILE}, ollama_message, "format"),
    "ollama.chat.tools": ("/api/chat", {**CHAT, "stream": False, "tools": [fn(HOSTILE)]},
                          ollama_message, "tools"),
    "responses.text.format": ("/v1/responses", {"model": MODEL, "input": "hi", "text": {"format": {
        "type": "json_schema", "name": "x", "schema": HOSTILE}}}, openai_message,
        "text.format.schema"),
    "responses.tools": ("/v1/responses", {"model": MODEL, "input": "hi", "tool_choice": "required",
                                          "tools": [{"type": "function", "name": "f",
                                                     "parameters": HOSTILE}]},
                        openai_message, "tools"),
}


def caches_hold_no_text() -> None:
    """Neither grammar cache keeps a grammar over the limit, nor any text as a key."""
    assert all(len(g.encode()) <= MAX_BYTES for g in json_schema._CACHE.values())
    assert all(isinstance(k[0], bytes) and len(k[0]) == 32 for k in json_schema._CACHE)
    assert all(isinstance(k[0], bytes) and len(k[0]) == 32 for k in gate._VERDICTS)


@pytest.mark.parametrize("route", list(ROUTES))
def test_a_long_name_over_many_children_is_a_cheap_400_on_every_route(route):
    path, body, message_of, field = ROUTES[route]
    # a context the tools' text fits in, so their schema is converted (not refused as a prompt)
    client = make_client(FakeEngine(n_ctx=1 << 16), grammar_max_bytes=MAX_BYTES)
    tracemalloc.start()
    try:
        resp = client.post(path, json=body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert resp.status_code == 400, resp.get_data(as_text=True)[:500]
    message = message_of(resp.get_json())
    assert field in message and "GRAMMAR_MAX_BYTES" in message, message
    assert peak < PEAK_BYTES, f"{peak >> 20} MiB allocated: conversion did not stop at the limit"
    caches_hold_no_text()


@pytest.mark.parametrize("where, body", [
    ("generationConfig.responseSchema", lambda s: {**CONTENTS, "generationConfig": {
        "responseMimeType": "application/json", "responseSchema": s}}),
    ("tools.0.functionDeclarations.0.parameters", lambda s: {**CONTENTS, **ANY, "tools": [
        {"functionDeclarations": [{"name": "f", "description": "d", "parameters": s}]}]}),
])
def test_gemini_counts_properties_as_it_reads_a_schema(where, body):
    """Gemini's own schema form is refused as its properties are counted, naming its field."""
    schema = {"type": "OBJECT", "properties": {f"p{i}": {"type": "STRING"} for i in range(11)}}
    resp = make_client(FakeEngine(), grammar_max_properties=10).post(GEMINI, json=body(schema))
    assert resp.status_code == 400
    message = gemini_message(resp.get_json())
    assert message.startswith(f"{where}: ") and "GRAMMAR_MAX_PROPERTIES" in message, message

