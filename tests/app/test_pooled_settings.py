"""Each model of a pool answers by its own settings (its MODELS_PRESET section's), never the
server's: the APIs read the settings of the model the request leased (Api.settings_of), for
what differs per model: the thought's field (REASONING_FIELD), the sampling defaults the
Responses API echoes, MAX_TOOLS, IMAGE_MAX_BYTES, the embeddings' normalization, input limit and
task prefixes.
Every model here differs from the server (the base: every default) and from the other; a
single model's: the tests of each API."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from app import create_app
from app.engine.fake_embed import FakeEmbedder, fake_vector
from app.model.catalog import Catalog, ModelSpec
from app.settings import Settings
from tests.support.pooled_app import HI, Engine, wait_for

PNG = b"\x89PNG\r\n\x1a\n"
REPLY = "<think>\nAdd 3 and 4.</think>\nThe answer is 7."
OWN: dict[str, dict[str, Any]] = {
    "alpha": {"reasoning_format": "parsed", "reasoning_field": "reasoning",
              "default_temperature": 0.3, "default_top_p": 0.4, "max_tools": 1,
              "image_max_bytes": 2048,
              "embedding_normalize": False, "embedding_max_inputs": 2,
              "embedding_task_prefixes": {"RETRIEVAL_QUERY": "alpha asks: "}},
    "beta": {"reasoning_format": "parsed", "reasoning_field": "reasoning_content",
             "default_temperature": 0.7, "default_top_p": 0.8, "max_tools": 2,
             "image_max_bytes": 8192,
             "embedding_normalize": True, "embedding_max_inputs": 3,
             "embedding_task_prefixes": {"RETRIEVAL_QUERY": "beta asks: "}},
}


class Thinker(Engine):
    """A pool's fake engine whose reply has a thought, with an embedder beside it."""

    def __init__(self, settings: Settings, on_fatal: Any) -> None:
        super().__init__(settings, on_fatal)
        self.reply = REPLY
        self.embedder = FakeEmbedder()


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    specs = tuple(ModelSpec(name=n, source=f"/models/{n}.gguf", origin="MODELS_PRESET",
                            settings=Settings(served_model_name=n, **own), size=1000,
                            preload=n == "alpha") for n, own in OWN.items())
    base = Settings()
    app = create_app(base, catalog=Catalog(base=base, models=specs, default="alpha",
                                           max_loaded=0, keep_alive=300.0),
                     make_engine=Thinker)
    app.testing = True
    test_client = app.test_client()
    wait_for(lambda: test_client.get("/health").status_code == 200)
    yield test_client
    app.extensions["vertex_gguf_pool"].shutdown()


def test_a_chats_thought_is_in_its_models_reasoning_field(client):
    for name, own in OWN.items():
        field, other = own["reasoning_field"], {"reasoning", "reasoning_content"} - {
            own["reasoning_field"]}
        body = {"messages": HI, "model": name}
        msg = client.post("/v1/chat/completions", json=body).get_json()["choices"][0]["message"]
        assert msg[field].strip() == "Add 3 and 4." and not other & msg.keys(), (name, msg)
        text = client.post("/v1/chat/completions", json={**body, "stream": True}).get_data(
            as_text=True)
        deltas = [json.loads(b[6:])["choices"][0]["delta"] for b in text.split("\n\n")
                  if b.startswith("data: {")]
        assert "".join(d.get(field) or "" for d in deltas) == msg[field], name
        assert not any(other & d.keys() for d in deltas), name


def test_responses_echo_their_models_sampling_defaults(client):
    for name, own in OWN.items():
        r = client.post("/v1/responses", json={"model": name, "input": "hi"})
        assert r.status_code == 200, r.get_json()
        body = r.get_json()
        assert (body["temperature"], body["top_p"]) == (
            own["default_temperature"], own["default_top_p"]), name
        asked = client.post("/v1/responses", json={"model": name, "input": "hi",
                                                   "temperature": 0.5}).get_json()
        assert asked["temperature"] == 0.5  # the request's own wins


def _function(name: str) -> dict[str, Any]:
    return {"name": name, "description": f"tool {name}",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}


def _with_tools(api: str, model: str, count: int) -> tuple[str, dict[str, Any]]:
    """The path and body of a chat on ``api`` offering ``count`` tools."""
    fns = [_function(f"f{i}") for i in range(count)]
    if api == "openai":
        return "/v1/chat/completions", {"model": model, "messages": HI, "tools": [
            {"type": "function", "function": f} for f in fns]}
    if api == "responses":
        return "/v1/responses", {"model": model, "input": "hi", "tools": [
            {"type": "function", **f} for f in fns]}
    if api in ("anthropic", "anthropic_count"):
        path = "/v1/messages" if api == "anthropic" else "/v1/messages/count_tokens"
        return path, {"model": model, "max_tokens": 16, "messages": HI, "tools": [
            {"name": f["name"], "description": f["description"],
             "input_schema": f["parameters"]} for f in fns]}
    if api == "gemini":
        return f"/v1beta/models/{model}:generateContent", {
            "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "tools": [{"functionDeclarations": fns}]}
    assert api == "ollama"
    return "/api/chat", {"model": model, "messages": HI, "stream": False, "tools": [
        {"type": "function", "function": f} for f in fns]}


@pytest.mark.parametrize("api", ["openai", "responses", "anthropic", "anthropic_count",
                                 "gemini", "ollama"])
def test_max_tools_is_the_models_own(client, api):
    for name, own in OWN.items():
        limit = own["max_tools"]
        path, body = _with_tools(api, name, limit)
        ok = client.post(path, json=body)
        assert ok.status_code == 200, (name, ok.get_json())
        path, body = _with_tools(api, name, limit + 1)
        refused = client.post(path, json=body)
        assert refused.status_code == 400, (name, refused.get_json())
        assert f"at most {limit} tools (MAX_TOOLS)" in refused.get_data(as_text=True), name


def test_an_images_size_limit_is_its_models_own(client):
    """An image over alpha's IMAGE_MAX_BYTES and under beta's: alpha refuses it for its size,
    beta takes it (and says it has no projector to read it with)."""
    data = base64.b64encode(PNG + b"\0" * 4000).decode()
    said = {}
    for name in OWN:
        r = client.post("/v1/chat/completions", json={"model": name, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "what is it?"}, {
                "type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}]}]})
        said[name] = (r.status_code, r.get_json()["error"]["message"])
    assert said["alpha"][0] == 413 and "IMAGE_MAX_BYTES" in said["alpha"][1], said
    assert "IMAGE_MAX_BYTES" not in said["beta"][1], said


def _vector(name: str, text: str) -> np.ndarray:
    raw = fake_vector(text, 16)
    return raw / np.linalg.norm(raw) if OWN[name]["embedding_normalize"] else raw


def test_embeddings_normalize_and_limit_inputs_as_their_model_says(client):
    for name, own in OWN.items():
        most = own["embedding_max_inputs"]
        texts = [f"text number {i}" for i in range(most)]
        r = client.post("/v1/embeddings", json={"model": name, "input": texts})
        assert r.status_code == 200, (name, r.get_json())
        for text, d in zip(texts, r.get_json()["data"], strict=True):
            assert np.allclose(d["embedding"], _vector(name, text), atol=1e-5), name
        over = client.post("/v1/embeddings", json={"model": name, "input": [*texts, "one more"]})
        assert over.status_code == 400 and f"at most {most}" in over.get_json()["error"][
            "message"], name


def test_embedding_task_prefixes_are_the_models_own(client):
    for name, own in OWN.items():
        want = _vector(name, own["embedding_task_prefixes"]["RETRIEVAL_QUERY"] + "where is it")
        r = client.post("/predict", json={"instances": [
            {"content": "where is it", "task_type": "RETRIEVAL_QUERY", "model": name}]})
        got = r.get_json()["predictions"][0]["embeddings"]["values"]
        assert np.allclose(got, want, atol=1e-5), (name, r.get_json())
        r = client.post(f"/v1beta/models/{name}:embedContent", json={
            "content": {"parts": [{"text": "where is it"}]}, "taskType": "RETRIEVAL_QUERY"})
        assert np.allclose(r.get_json()["embedding"]["values"], want, atol=1e-5), name
