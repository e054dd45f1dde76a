"""response_format on the real model: json_object / json_schema constrain generation with a llama.cpp grammar."""

from __future__ import annotations

import json

import pytest
import requests

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
