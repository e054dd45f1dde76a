"""llama-server's introspection routes, for tools built on it: POST /tokenize, POST
/detokenize, GET /props and GET /slots (shapes: app.protocol.introspect). Errors are in
OpenAI's shape, as llama-server's are.

Tokenizing (and encoding a long answer) runs on a worker thread, never on the hub, where a
10 MB body would stall every stream, nor on the engine thread, which only decodes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, current_app, jsonify, request

from app.api.base import read_body
from app.base.errors import NotSupported, Unavailable
from app.core.service import Service
from app.protocol import introspect, openai
from app.settings import Settings, max_tokens_bounds, slots_endpoint_on


def _service() -> Service:
    return current_app.extensions["vertex_gguf"]


def _settings() -> Settings:
    return current_app.extensions["vertex_gguf_settings"]


def _off_hub(svc: Service, answer: Callable[[], dict[str, Any]]) -> Response:
    """``answer`` computed and JSON-encoded on a worker thread (within PREPARE_TIMEOUT)."""
    data = svc.offload(
        lambda: json.dumps(answer(), ensure_ascii=False, separators=(",", ":")).encode())
    return Response(data, mimetype="application/json")


def tokenize() -> Response:
    """``{"content", "add_special"?, "parse_special"?, "with_pieces"?}`` -> ``{"tokens"}``."""
    body = read_body()
    svc = _service()

    def answer() -> dict[str, Any]:
        req = introspect.parse_tokenize(body)
        svc.model_name(req.model)
        tokens = svc.engine.tokenize(req.content, req.add_special, req.parse_special)
        if not req.with_pieces:
            return introspect.tokenize_answer(tokens, None)
        introspect.check_pieces(len(tokens))
        return introspect.tokenize_answer(tokens, svc.engine.pieces(tokens))

    return _off_hub(svc, answer)


def detokenize() -> Response:
    """``{"tokens": [...]}`` -> ``{"content"}``; an id outside the vocabulary is a 400."""
    body = read_body()
    svc = _service()

    def answer() -> dict[str, Any]:
        req = introspect.parse_detokenize(body)
        svc.model_name(req.model)
        return introspect.detokenize_answer(svc.engine.pieces(req.tokens))

    return _off_hub(svc, answer)


def props() -> Response:
    svc = _service()
    info = svc.info()
    total = len(svc.engine.slots())
    boot = current_app.extensions.get("vertex_gguf_boot")
    settings = _settings()
    length = max_tokens_bounds(settings)
    return jsonify(introspect.props(info, openai.model_meta(info, length), total, settings,
                                    boot.report() if boot is not None else {}))


def slots() -> Response:
    """Each slot's state; a 501 when SLOTS_ENDPOINT is off (llama-server's --no-slots), a 503
    with ``?fail_on_no_slot`` when every slot is busy (as llama-server's)."""
    if not slots_endpoint_on(_settings()):
        raise NotSupported("This server does not support slots endpoint (SLOTS_ENDPOINT is off)")
    svc = _service()
    svc.info()
    rows = svc.engine.slots()
    if "fail_on_no_slot" in request.args and all(r["is_processing"] for r in rows):
        raise Unavailable("no slot available")
    return jsonify(rows)


def register(app: Flask) -> None:
    app.add_url_rule("/tokenize", "tokenize", tokenize, methods=["POST"])
    app.add_url_rule("/detokenize", "detokenize", detokenize, methods=["POST"])
    app.add_url_rule("/props", "props", props, methods=["GET"])
    app.add_url_rule("/slots", "slots", slots, methods=["GET"])
