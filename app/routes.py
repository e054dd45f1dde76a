"""HTTP routes: parse the body, call the service, wrap the result. Nothing else."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Flask, Response, current_app, jsonify, request

from app.errors import BadRequest, NotFound
from app.protocol import openai
from app.protocol.sse import HEADERS
from app.service import Service


def _service() -> Service:
    return current_app.extensions["vertex_gguf"]


def _body() -> Any:
    raw = request.get_data(cache=False)  # enforces MAX_CONTENT_LENGTH (413)
    if not raw:
        raise BadRequest("request body is empty; expected a JSON object")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None


def _reply(result: dict[str, Any] | Iterator[bytes]) -> Response:
    if isinstance(result, dict):
        return jsonify(result)
    return Response(result, headers=HEADERS, direct_passthrough=True)


def health() -> tuple[Response, int]:
    state = _service().engine.state
    body = state.snapshot()
    info = _service().engine.info
    if info is not None:
        body["model"] = info.name
    body["queue"] = _service().engine.queue_depth()
    return jsonify(body), 200 if state.ready else 503


def _done_header() -> str | None:
    return request.headers.get("X-Stream-Done")


def models_sse() -> Response:
    """The load stages as server-sent events, until the model is loaded or has failed."""
    return Response(_service().load_events(), headers=HEADERS, direct_passthrough=True)


def predict() -> Response:
    return _reply(_service().predict(_body(), _done_header()))


bp = Blueprint("openai", __name__)


def _openai(kind: str) -> Response:
    body = _body()
    svc = _service()
    if isinstance(body, dict) and body.get("stream") is True:
        return _reply(svc.stream(kind, body, _done_header()))
    return _reply(svc.complete(kind, body))


@bp.post("/v1/chat/completions")
def chat_completions() -> Response:
    return _openai("chat")


@bp.post("/v1/completions")
def completions() -> Response:
    return _openai("completion")


@bp.post("/v1/chat/completions/control")
def chat_control() -> Response:
    return jsonify(_service().control(_body()))


@bp.get("/v1/models")
def models() -> Response:
    return jsonify(openai.models_list(_service().info()))


@bp.get("/v1/models/<path:model_id>")
def model(model_id: str) -> Response:
    info = _service().info()
    if model_id != info.name:
        raise NotFound(f"model {model_id!r} does not exist (this server serves {info.name!r})")
    return jsonify(openai.model_card(info))


def register(app: Flask, health_route: str, predict_route: str) -> None:
    """Mount the routes; the Vertex routes come verbatim from settings (colons and all)."""
    app.register_blueprint(bp)
    for route in dict.fromkeys(["/health", health_route]):
        app.add_url_rule(route, f"health:{route}", health, methods=["GET"])
    app.add_url_rule(predict_route, "predict", predict, methods=["POST"])
    app.add_url_rule("/models/sse", "models_sse", models_sse, methods=["GET"])
