"""The resumable-stream routes (llama-server's wire form): replay and follow, stop, look up.

``GET /v1/stream?conv_id=<id>&from=<N>`` (or ``/v1/stream/<id>?from=N``) replays a stream opted
in with ``X-Conversation-Id`` from byte N of its body and follows it to its end;
``DELETE`` on the same paths stops its generation (204, idempotent); ``POST /v1/streams/lookup``
says which of the ids a caller names exist and how far they are. Vertex AI routes only predict to
the container: :func:`predict_form` answers the same requests as predict bodies.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, Response, current_app, jsonify, request

from app import streams
from app.api.base import read_body
from app.base import reqctx
from app.base.errors import BadRequest
from app.protocol.sse import HEADERS

MAX_LOOKUP = 1000  # ids one lookup may name
FORMS = ("stream_resume", "stream_cancel", "stream_lookup")  # the predict-route bodies


def _hub() -> streams.Streams:
    return current_app.extensions["vertex_gguf_streams"]


def _conv(value: Any, param: str) -> str:
    if value is None or value == "":
        raise BadRequest(f"missing conversation id ({param})", param=param)
    if not isinstance(value, str):
        raise BadRequest(f"{param} must be a string", param=param)
    conv = streams.conversation_id(value, param)
    assert conv is not None
    return conv


def replay(conv: str, start: int) -> Response:
    """The stream from byte ``start``; errors (404, 400) before the first byte."""
    frames = _hub().follow(conv, reqctx.cache_scope(), start)
    return Response(frames, headers=HEADERS, direct_passthrough=True)


def lookup(ids: Any) -> Response:
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise BadRequest("conversation_ids must be a list of strings", param="conversation_ids")
    if len(ids) > MAX_LOOKUP:
        raise BadRequest(f"at most {MAX_LOOKUP} conversation_ids per lookup",
                         param="conversation_ids")
    valid = [i for i in ids if streams.session.CONVERSATION_ID.fullmatch(i)]
    found = _hub().lookup(valid, reqctx.cache_scope())
    return jsonify([s.body() for s in found])


def get_stream(conv_id: str | None = None) -> Response:
    conv = _conv(conv_id if conv_id is not None else request.args.get("conv_id"), "conv_id")
    return replay(conv, streams.offset(request.args.get("from")))


def delete_stream(conv_id: str | None = None) -> Response:
    conv = _conv(conv_id if conv_id is not None else request.args.get("conv_id"), "conv_id")
    _hub().cancel(conv, reqctx.cache_scope())
    return Response(status=204)


def lookup_route() -> Response:
    body = read_body()
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object with conversation_ids")
    return lookup(body.get("conversation_ids"))


def predict_form(body: dict[str, Any]) -> Response | None:
    """``{"stream_resume": {"conversation_id", "from"}}``, ``{"stream_cancel":
    {"conversation_id"}}`` or ``{"stream_lookup": {"conversation_ids"}}`` on the predict route;
    None for any other body."""
    forms = [f for f in FORMS if f in body]
    if not forms:
        return None
    form = forms[0]
    if len(body) != 1:
        raise BadRequest(f"a {form} body has {form} and nothing else", param=form)
    args = body[form]
    if not isinstance(args, dict):
        raise BadRequest(f"{form} must be an object", param=form)
    if form == "stream_lookup":
        return lookup(args.get("conversation_ids"))
    conv = _conv(args.get("conversation_id"), f"{form}.conversation_id")
    if form == "stream_cancel":
        _hub().cancel(conv, reqctx.cache_scope())
        return jsonify({"conversation_id": conv, "status": "stopped"})
    return replay(conv, streams.offset(args.get("from")))


def register(app: Flask) -> None:
    app.add_url_rule("/v1/stream", "stream_get", get_stream, methods=["GET"])
    app.add_url_rule("/v1/stream/<conv_id>", "stream_get_path", get_stream, methods=["GET"])
    app.add_url_rule("/v1/stream", "stream_delete", delete_stream, methods=["DELETE"])
    app.add_url_rule("/v1/stream/<conv_id>", "stream_delete_path", delete_stream,
                     methods=["DELETE"])
    app.add_url_rule("/v1/streams/lookup", "streams_lookup", lookup_route, methods=["POST"])
