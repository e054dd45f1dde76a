"""APIS: the wire APIs a server offers. An API left out has no routes, and the predict route
does not dispatch to it; the default serves every one."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.api import APIS, FAMILIES, served
from app.engine.fake import FakeEngine
from app.settings import Settings
from tests.support.app import make_client

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
ROUTES = {
    "openai": ("/v1/chat/completions", CHAT),
    "responses": ("/v1/responses", {"input": "hi"}),
    "anthropic": ("/v1/messages", {"max_tokens": 4, **CHAT}),
    "gemini": ("/v1beta/models/m:generateContent",
               {"contents": [{"parts": [{"text": "hi"}]}]}),
    "ollama": ("/api/chat", {"model": "fake-model", "stream": False, **CHAT}),
}


def test_every_api_has_a_family_and_all_are_served_by_default():
    assert set(FAMILIES) == set(APIS)
    assert served(Settings()) == APIS


@pytest.mark.parametrize("only", sorted(ROUTES))
def test_only_the_apis_asked_for(only):
    client = make_client(FakeEngine(), apis=only)
    for family, (path, body) in ROUTES.items():
        status = client.post(path, json=body).status_code
        assert (status == 200) == (family == only), (family, status)


def test_the_predict_route_dispatches_only_to_served_apis():
    client = make_client(FakeEngine(), apis="openai,ollama")
    ok = client.post("/predict", json={"instances": [{"@requestFormat": "chat", **CHAT}]})
    assert ok.status_code == 200 and "choices" in ok.get_json()["predictions"][0]
    off = client.post("/predict", json={"instances": [
        {"@requestFormat": "messages", "max_tokens": 4, **CHAT}]})
    err = off.get_json()["predictions"][0]["error"]
    assert err["param"] == "@requestFormat" and "unknown @requestFormat 'messages'" in err["message"]


def test_unknown_names_are_refused_at_start():
    with pytest.raises(ValidationError, match="APIS takes all"):
        Settings(apis="openai,grpc")
    assert Settings(apis=" ollama , openai ").apis == "ollama,openai"
