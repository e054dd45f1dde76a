"""Golden transcripts of Ollama's NDJSON streams and the Gemini API's streams (SSE with
alt=sse, and the JSON array), byte for byte, as for the other APIs (tests/data/golden/; set
UPDATE_GOLDEN=1 to write them anew after a deliberate change). Times and ids are fixed so the
bytes are the same on every run."""

from __future__ import annotations

import itertools
import os

import pytest

from app.api import gemini as gemini_api
from app.api.gemini import stream as gemini_stream
from app.api.ollama import stream as ollama_stream
from app.core import service
from app.engine.fake import FakeEngine
from tests.support.app import make_client
from tests.support.server import DATA

GOLDEN = DATA / "golden"
CALL_REPLY = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
OLLAMA_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}}}]
GEMINI_TOOLS = [{"functionDeclarations": [{"name": "get_weather", "parameters": {
    "type": "OBJECT", "properties": {"city": {"type": "STRING"}}, "required": ["city"]}}]}]
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
CONTENTS = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
GEMINI = "/v1beta/models/fake-model:streamGenerateContent"

CASES = {
    # name: (engine reply, settings, path, body)
    "ollama_chat": ("Hello there.", {}, "/api/chat", CHAT),
    "ollama_chat_tool": (CALL_REPLY, {}, "/api/chat", {**CHAT, "tools": OLLAMA_TOOLS}),
    "ollama_chat_think": ("<think>Easy.</think>Hi.", {"reasoning_format": "parsed"}, "/api/chat",
                          {**CHAT, "think": True}),
    "ollama_generate_length": ("one two three four", {}, "/api/generate",
                               {"model": "fake-model", "prompt": "hi",
                                "options": {"num_predict": 2}}),
    "ollama_error": ("one two", {}, "/api/chat",
                     {**CHAT, "messages": [{"role": "user", "content": "FAIL_AFTER"}]}),
    "gemini_sse": ("Hello there.", {}, GEMINI + "?alt=sse", CONTENTS),
    "gemini_array": ("Hello there.", {}, GEMINI, CONTENTS),
    "gemini_call": (CALL_REPLY, {}, GEMINI + "?alt=sse", {**CONTENTS, "tools": GEMINI_TOOLS,
                                                          "toolConfig": {
        "functionCallingConfig": {"mode": "ANY"}}}),
    "gemini_thought": ("<think>Easy.</think>Hi.", {"reasoning_format": "parsed"},
                       GEMINI + "?alt=sse", {**CONTENTS, "generationConfig": {
                           "thinkingConfig": {"includeThoughts": True}}}),
    "gemini_error": ("one two", {}, GEMINI + "?alt=sse",
                     {"contents": [{"role": "user", "parts": [{"text": "FAIL_AFTER"}]}]}),
}


@pytest.fixture
def fixed(monkeypatch):
    clock = itertools.count(1_000_000, 1_000)  # the request, its first token, its end
    monkeypatch.setattr(ollama_stream, "now_ns", lambda: next(clock))
    monkeypatch.setattr(service, "now_ns", lambda: next(clock))
    monkeypatch.setattr(ollama_stream, "timestamp", lambda: "2026-01-01T00:00:00.000000Z")
    monkeypatch.setattr(gemini_api.Gemini, "new_id", lambda self: "resp-1")
    call = gemini_stream.function_call
    monkeypatch.setattr(gemini_stream, "function_call", lambda cid, name, args:
                        call("call_1", name, args))


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_streams(name, fixed):
    reply, settings, path, body = CASES[name]
    client = make_client(FakeEngine(reply=reply), stream_heartbeat_seconds=0, **settings)
    resp = client.post(path, json=body)
    assert resp.status_code == 200
    got = resp.get_data()  # bytes: the JSON array's separators are CRLF, kept as sent
    golden = GOLDEN / f"{name}.{'ndjson' if name.startswith('ollama') else 'txt'}"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_bytes(got)
    assert got == golden.read_bytes(), f"{name} differs from {golden}"
