"""response_format on the real model: json_object / json_schema constrain generation with a llama.cpp grammar."""

from __future__ import annotations

import json

import pytest
import requests

from tests.support.bodies import ADD
from tests.support.bodies import PERSON_CHAT as CHAT
from tests.support.bodies import PERSON_SCHEMA as SCHEMA
from tests.support.server import ServerProcess, running_server


@pytest.fixture(scope="module")
def server(default_model) -> ServerProcess:
    with running_server({"PARALLEL": "2", "STREAM_HEARTBEAT_SECONDS": "0"}) as srv:
        yield srv


def test_json_schema_output_validates_on_the_real_model(server):
    body = {**CHAT, "max_tokens": 200, "temperature": 0.7, "seed": 1,
            "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}}
    for stream in (False, True):
        r = requests.post(server.url("/v1/chat/completions"), json={**body, "stream": stream}, timeout=120, stream=stream)
        if stream:
            text = "".join(json.loads(ln[6:])["choices"][0]["delta"].get("content") or ""
                           for ln in r.iter_lines() if ln.startswith(b"data: {"))
        else:
            choice = r.json()["choices"][0]
            assert choice["finish_reason"] == "stop"
            text = choice["message"]["content"]
        obj = json.loads(text)
        assert set(obj) == {"name", "age"}
        assert isinstance(obj["name"], str) and isinstance(obj["age"], int)


def test_json_object_output_parses(server):
    r = requests.post(server.url("/v1/chat/completions"), json={**CHAT, "max_tokens": 120, "temperature": 0,
                      "response_format": {"type": "json_object"}}, timeout=120)
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)
    else:  # cut by max_tokens mid-object: still a JSON prefix
        assert choice["message"]["content"].lstrip().startswith("{")


# ---- tools beside the format (issue 27, item 4) ---------------------------------------------------

FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}


def _person(text: str) -> None:
    obj = json.loads(text)
    assert set(obj) == {"name", "age"} and isinstance(obj["age"], int)


@pytest.mark.parametrize("choice", ["auto", "required", "named", "none"])
def test_tools_beside_a_json_schema_format_on_the_real_model(server, choice):
    """Each tool_choice: 200; a forced choice is a call, none is the format's JSON, auto either."""
    tool_choice = ({"type": "function", "function": {"name": "add_two_numbers"}}
                   if choice == "named" else choice)
    body = {**CHAT, "max_tokens": 200, "temperature": 0, "tools": [ADD], "tool_choice": tool_choice,
            "response_format": FORMAT}
    r = requests.post(server.url("/v1/chat/completions"), json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice_ = r.json()["choices"][0]
    calls = choice_["message"].get("tool_calls") or []
    if choice in ("required", "named"):
        assert calls and calls[0]["function"]["name"] == "add_two_numbers"
        assert set(json.loads(calls[0]["function"]["arguments"])) == {"a", "b"}
    elif choice == "none" or not calls:
        assert choice_["finish_reason"] == "stop"
        _person(choice_["message"]["content"])


def test_a_forced_tool_beside_text_format_on_responses(server):
    """instructor's RESPONSES_TOOLS request shape: a named tool with text.format json_schema."""
    body = {"input": "Add 3 and 4.", "max_output_tokens": 200, "temperature": 0,
            "tools": [{"type": "function", **ADD["function"]}],
            "tool_choice": {"type": "function", "name": "add_two_numbers"},
            "text": {"format": {"type": "json_schema", "name": "person", "schema": SCHEMA}}}
    r = requests.post(server.url("/v1/responses"), json=body, timeout=120)
    assert r.status_code == 200, r.text
    calls = [o for o in r.json()["output"] if o["type"] == "function_call"]
    assert calls and calls[0]["name"] == "add_two_numbers"
