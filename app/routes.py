"""HTTP routes: parse the body, call the service, wrap the result. Nothing else."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Flask, Response, current_app, jsonify, request
from gevent import select

from app import bridge
from app.errors import NotFound, UnsupportedMediaType
from app.protocol import jsonbody, openai
from app.protocol.sse import HEADERS
from app.service import Service

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HttpLimits:
    """What the routes enforce before a request reaches the service (from Settings)."""

    max_json_depth: int = 64
    body_timeout: float = 60.0
    watchdog_seconds: float = 60.0


def _service() -> Service:
    return current_app.extensions["vertex_gguf"]


def _limits() -> HttpLimits:
    return current_app.extensions["vertex_gguf_http"]


def _body() -> Any:
    """The JSON body. Only ``application/json`` (or ``+json``) is read: the content types a web
    page may send cross-site without asking (text/plain, forms, none) get a 415, so a page a user
    visits cannot drive a server on their machine."""
    mimetype = request.mimetype or ""
    if mimetype != "application/json" and not mimetype.endswith("+json"):
        raise UnsupportedMediaType(
            f"Content-Type must be application/json, not {request.content_type or 'missing'!r}"
        )
    limits = _limits()
    with bridge.deadline(limits.body_timeout, "reading the request body"):
        raw = request.get_data(cache=False)  # enforces MAX_CONTENT_LENGTH (413)
    return jsonbody.parse(raw, limits.max_json_depth)


def _gone_probe() -> Callable[[], bool] | None:
    """Whether the client has hung up (its socket reads as closed); None outside gunicorn."""
    sock = request.environ.get("gunicorn.socket")
    if sock is None:
        return None

    def gone() -> bool:
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    return gone


def _reply(result: dict[str, Any] | Iterator[bytes]) -> Response:
    if isinstance(result, dict):
        return jsonify(result)
    return Response(result, headers=HEADERS, direct_passthrough=True)


_last_stall_log = [0.0]


def health() -> tuple[Response, int]:
    """200 once the model is ready; 503 while loading, and when the engine is stuck (a step or
    a request's preparation running past WATCHDOG_SECONDS), so the platform restarts it."""
    engine = _service().engine
    state = engine.state
    body = state.snapshot()
    info = engine.info
    if info is not None:
        body["model"] = info.name
    body["queue"] = engine.queue_depth()
    body["engine"] = engine.stats()
    ok = state.ready
    stall = engine.stalled(_limits().watchdog_seconds) if ok else None
    if stall:
        ok = False
        body["status"] = "stalled"
        body["reason"] = stall
        now = time.monotonic()
        if now - _last_stall_log[0] > 10:
            _last_stall_log[0] = now
            log.error("health answers 503: the engine looks stuck: %s", stall)
    return jsonify(body), 200 if ok else 503


def _done_header() -> str | None:
    return request.headers.get("X-Stream-Done")


def models_sse() -> Response:
    """The load stages as server-sent events, until the model is loaded or has failed."""
    return Response(_service().load_events(), headers=HEADERS, direct_passthrough=True)


def predict() -> Response:
    return _reply(_service().predict(_body(), _done_header(), _gone_probe()))


bp = Blueprint("openai", __name__)


def _openai(kind: str) -> Response:
    body = _body()
    svc = _service()
    if openai.wants_stream(body):
        return _reply(svc.stream(kind, body, _done_header()))
    return _reply(svc.complete(kind, body, _gone_probe()))


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
