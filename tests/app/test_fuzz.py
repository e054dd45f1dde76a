"""Property-based fuzzing of every request parser (issue 26): bodies drawn from each API's own
schema (tests/support/schema_strategy.py), then made hostile (a field swapped for any JSON, an unknown
field, any JSON at all). The property: every input gets an answer in the right status class and
the API's own error shape, never a 500, and the server still answers.

In process over the fake engine, FUZZ_EXAMPLES examples per API (CI: 60). A longer run, as a
command: ``FUZZ_EXAMPLES=5000 python -m pytest tests/app/test_fuzz.py``. The same bodies against a
real gunicorn worker: test_the_worker_survives_what_the_parsers_are_fed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.api.anthropic.parsing import CountTokensRequest, MessagesRequest
from app.api.embeddings import OpenAIEmbeddingsRequest, VertexInstance
from app.api.responses.parsing import ResponsesRequest
from app.engine.fake import FakeEngine
from app.engine.fake_embed import FakeEmbedder
from app.protocol.introspect import DetokenizeRequest, TokenizeRequest
from app.protocol.openai import ChatRequest, CompletionRequest
from tests.support.app import make_client
from tests.support.schema_strategy import JSON, hostile
from tests.support.server import ServerProcess

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get(
    "FUZZ_RANDOM"), suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


def openai_error(body: Any) -> bool:
    err = body.get("error") if isinstance(body, dict) else None
    return isinstance(err, dict) and isinstance(err.get("message"), str) and "type" in err


def anthropic_error(body: Any) -> bool:
    return (isinstance(body, dict) and body.get("type") == "error"
            and isinstance(body.get("error"), dict) and "message" in body["error"])


def vertex_answer(body: Any) -> bool:
    """An envelope's answer (per-instance errors in their slots) or a whole-request error."""
    return openai_error(body) or (isinstance(body, dict) and "predictions" in body)


# path -> (the model whose schema draws the body, the error shape its answers must have)
ROUTES: dict[str, tuple[Any, Callable[[Any], bool]]] = {
    "/v1/chat/completions": (ChatRequest, openai_error),
    "/v1/completions": (CompletionRequest, openai_error),
    "/v1/responses": (ResponsesRequest, openai_error),
    "/v1/responses/input_tokens": (ResponsesRequest, openai_error),
    "/v1/messages": (MessagesRequest, anthropic_error),
    "/v1/messages/count_tokens": (CountTokensRequest, anthropic_error),
    "/v1/embeddings": (OpenAIEmbeddingsRequest, openai_error),
    "/tokenize": (TokenizeRequest, openai_error),
    "/detokenize": (DetokenizeRequest, openai_error),
    "/v1/streams/lookup": ({"type": "object", "properties": {
        "conversation_ids": {"type": "array", "items": {"type": "string"}}}}, openai_error),
}


def schema_of(model: Any) -> dict[str, Any]:
    return model if isinstance(model, dict) else model.model_json_schema()


def envelopes() -> st.SearchStrategy[Any]:
    """Vertex predict bodies: instances of any API (or embeddings), parameters, or junk."""
    instance = st.one_of([hostile(schema_of(m)) for m, _ in ROUTES.values()]
                         + [hostile(VertexInstance.model_json_schema())])
    return st.one_of(
        st.fixed_dictionaries({"instances": st.lists(instance, max_size=3)},
                              optional={"parameters": JSON}),
        hostile(ChatRequest.model_json_schema()),  # a raw body (rawPredict)
        JSON)


@pytest.fixture(scope="module")
def client():
    engine = FakeEngine()
    engine.embedder = FakeEmbedder()  # type: ignore[attr-defined]
    return make_client(engine, stream_heartbeat_seconds=0)


def check(resp: Any, shape: Callable[[Any], bool]) -> None:
    """The property, on one answer (read to its end)."""
    data = resp.get_data()
    resp.close()
    assert answered_well(resp.status_code), (resp.status_code, data[:500])
    kind = resp.headers.get("Content-Type", "")
    if resp.status_code >= 400:
        assert kind.startswith("application/json"), kind
        assert shape(json.loads(data)), data[:500]
    elif resp.status_code == 204:
        assert data == b""
    else:
        assert kind.startswith(("application/json", "text/event-stream")), kind


def answered_well(status: int) -> bool:
    """A success, the client's fault, or a deliberate refusal (501: not served here, 503: not
    ready): never a 500, the server's own failure."""
    return status < 300 or 400 <= status < 500 or status in (501, 503)


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_every_body_gets_an_answer_in_the_apis_shape(client, path):
    model, shape = ROUTES[path]

    @FUZZ
    @given(body=hostile(schema_of(model)))
    def run(body: Any) -> None:
        check(client.post(path, json=body), shape)

    run()


def test_every_envelope_gets_an_answer(client):
    @FUZZ
    @given(body=envelopes())
    def run(body: Any) -> None:
        check(client.post("/predict", json=body), vertex_answer)

    run()


def test_the_stream_routes_take_any_id_and_offset(client):
    @FUZZ
    @given(conv=st.text(max_size=200), start=st.one_of(st.text(max_size=30),
                                                       st.integers(-10, 2**70).map(str)))
    def run(conv: str, start: str) -> None:
        query = {"conv_id": conv, "from": start}
        check(client.get("/v1/stream", query_string=query), openai_error)
        check(client.delete("/v1/stream", query_string={"conv_id": conv}), openai_error)

    run()


def test_bodies_that_are_not_json_objects(client):
    @FUZZ
    @given(path=st.sampled_from(sorted(ROUTES)), raw=st.binary(max_size=200))
    def run(path: str, raw: bytes) -> None:
        resp = client.post(path, data=raw, content_type="application/json")
        check(resp, ROUTES[path][1])

    run()


def test_the_worker_survives_what_the_parsers_are_fed():
    """A sample of the same bodies through a real gunicorn master and worker (the fake engine):
    none is a 500, the worker is never replaced, and health answers after each."""
    srv = ServerProcess({"STREAM_HEARTBEAT_SECONDS": "0"}, module="tests.support.crash_server")
    try:
        srv.wait_ready()
        session = requests.Session()

        @settings(max_examples=max(10, EXAMPLES // 3), deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(path=st.sampled_from(sorted(ROUTES)), data=st.data())
        def run(path: str, data: st.DataObject) -> None:
            body = data.draw(hostile(schema_of(ROUTES[path][0])))
            r = session.post(srv.url(path), json=body, timeout=30)
            assert answered_well(r.status_code), (r.status_code, r.text[:500])
            assert session.get(srv.url("/health"), timeout=10).status_code == 200

        run()
        assert srv.logs().count("Booting worker") == 1
        assert "Traceback" not in srv.logs()
    finally:
        srv.stop()
