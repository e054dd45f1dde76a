"""What every API shares, whatever it serves: reading the body, noticing a client that hung up,
its routes and error shape, and the facts a request brings beside its body (:class:`Facts`).

Two seams stand on :class:`Api`: generation (app.api.generation: parse, plan, run, render whole
or through the one stream loop) and embeddings (app.api.embeddings: parse, embed, render).
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, ClassVar

from flask import Blueprint, Response, current_app, jsonify, request
from gevent import select
from werkzeug.exceptions import HTTPException

from app.base import bridge, reqctx
from app.base.errors import (
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    ServiceError,
    UnsupportedMediaType,
    as_service_error,
)
from app.base.metrics import API_LABELS
from app.core.models import Listed, ModelLease, Models
from app.core.service import Service
from app.engine.types import ModelInfo
from app.protocol import jsonbody
from app.protocol.http_status import HttpStatusError, headers_of, status_of
from app.protocol.sse import HEADERS
from app.settings import Settings

log = logging.getLogger(__name__)

Answer = dict[str, Any] | Iterator[bytes]


def read_body(lenient: bool = False) -> Any:
    """The JSON body. Only ``application/json`` (or ``+json``) is read: the content types a web
    page may send cross-site without asking (text/plain, forms, none) get a 415, so a page a user
    visits cannot drive a server on their machine. ``lenient`` (Ollama's routes, whose clients
    and documented curl lines send no JSON type) reads any type from a caller that is not a
    browser: browsers send ``Origin`` with every cross-site POST, and such a request is still
    held to JSON (Ollama's own server checks Origin the same way)."""
    mimetype = request.mimetype or ""
    json_type = mimetype == "application/json" or mimetype.endswith("+json")
    if not json_type and not (lenient and "Origin" not in request.headers):
        raise UnsupportedMediaType(
            f"Content-Type must be application/json, not {request.content_type or 'missing'!r}"
        )
    settings: Settings = current_app.extensions["vertex_gguf_settings"]
    with bridge.deadline(settings.body_timeout, "reading the request body"):
        raw = request.get_data(cache=False)  # enforces MAX_CONTENT_LENGTH (413)
    return jsonbody.parse(raw, settings.max_json_depth)


def gone_probe() -> Callable[[], bool] | None:
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


def from_http(exc: HTTPException) -> ServiceError:
    """Werkzeug's own errors (no route, wrong method, body too large) as domain errors."""
    status = exc.code or 500
    if status == 404:
        return NotFound("no such route")
    if status == 405:
        return MethodNotAllowed("method not allowed on this route")
    if status == 413:
        return PayloadTooLarge("request body is larger than the server accepts")
    return HttpStatusError(exc.description or "request failed", status)


def as_error(exc: BaseException) -> ServiceError:
    if isinstance(exc, HTTPException):
        return from_http(exc)
    return as_service_error(exc)


class LargeAnswer(dict):
    """An answer that may run to megabytes (logprobs of a long prompt, or of many tokens with
    their alternatives): encoded off the hub (``json_off_hub``) wherever it is sent."""


def json_off_hub(body: Any) -> Response:
    """A JSON answer encoded on a worker thread: megabytes of floats (an envelope of
    embeddings) would hold the hub, and every stream with it, for a noticeable time."""
    text = bridge.offload(partial(json.dumps, ensure_ascii=False), body)
    return Response(text, mimetype="application/json")


def error_response(exc: BaseException,
                   render: Callable[[ServiceError], dict[str, Any]]) -> Response:
    """Any exception as an HTTP error: its status and headers from the shared table, its body
    in the shape ``render`` writes."""
    err = as_error(exc)
    body = render(err)
    info = reqctx.current()
    if info is not None:
        body["request_id"] = info.request_id
    resp = jsonify(body)
    resp.status_code = status_of(err)
    resp.headers.update(headers_of(err))
    return resp


def listed_item(models: Models, name: str) -> Listed | None:
    """The model of a pool's listing that ``name`` names (a name or an alias, as a request
    would name it), or None."""
    canonical = models.canonical(name)
    return next((i for i in models.listing() if i.name == canonical), None)


def shown_name(item: Listed, asked: str) -> str:
    """The name a card shows: the one asked for when it is one of the model's names, else
    the model's own (an alias matched ignoring case)."""
    return asked if asked in (item.name, *item.aliases) else item.name


@dataclass(frozen=True)
class Facts:
    """What one request brings beside its body, passed down the seam with it: the route it came
    through says its metrics label and its own parameters (Gemini's model and method are in its
    path), the connection its headers, whether it has hung up, and how often a quiet stream
    sends its keep-alive; once the request's model is leased (:meth:`Api.lease`), the service
    that runs it. The predict route, a resumable session and Gemini's JSON-array stream each
    change one of them (``dataclasses.replace``), never the Api."""

    label: str  # the metrics' ``api`` label
    headers: Mapping[str, str] = field(default_factory=dict)
    gone: Callable[[], bool] | None = None  # whether the client hung up (None: not probed)
    heartbeat: float | None = None  # seconds without an event before a keep-alive (None: never)
    params: Mapping[str, Any] = field(default_factory=dict)  # the route's own parameters
    service: Service | None = None  # the leased model's (None: not leased yet)


class Api:
    """One wire API's routes over the core. A seam (GenerationApi, EmbeddingApi) says how a
    body is answered; a subclass sets the class attributes, parses and renders."""

    name: ClassVar[str]  # also a @requestFormat value
    paths: ClassVar[tuple[str, ...]]  # the POST routes that serve it
    request_formats: ClassVar[tuple[str, ...]] = ()  # other @requestFormat names (lower case)
    answers_many: ClassVar[bool] = False  # a predict envelope's instances go in one call
    # any Content-Type from a caller that is not a browser (see read_body)
    lenient_content_type: ClassVar[bool] = False
    stream_headers: ClassVar[dict[str, str]] = HEADERS  # a stream's (SSE unless overridden)

    def __init__(self, settings: Settings, models: Models):
        self.settings = settings
        self.models = models
        self.label = API_LABELS.get(self.name, self.name)  # the metrics' ``api`` label
        self.heartbeat: float | None = None  # see Facts.heartbeat

    def facts(self, headers: Mapping[str, str] | None = None,
              gone: Callable[[], bool] | None = None, **params: Any) -> Facts:
        """The facts of a request on this API's own routes."""
        return Facts(self.label, headers or {}, gone, self.heartbeat, params)

    # ---- which model ------------------------------------------------------------------------
    def requested_model(self, body: Any, facts: Facts) -> str | None:
        """The model a request names, read from the raw body before it is parsed (the model is
        leased first: parsing may need it). Here the body's ``model`` when it is a non-empty
        string; None (the default model) when it is absent or empty. A ``model`` of the wrong
        type is the parser's 400, on the default model. An API whose model is elsewhere (a
        path, a tag to drop) says so; its parser reads it through the same function."""
        model = body.get("model") if isinstance(body, dict) else None
        return model if isinstance(model, str) and model else None

    def keep_alive(self, body: Any) -> float | None:
        """Seconds the request asks its model to stay loaded after it (Ollama's
        ``keep_alive``); None: the model's own setting."""
        return None

    def lease(self, body: Any, facts: Facts) -> tuple[ModelLease, Facts]:
        """The model this request names, held until the lease is released, and the facts
        carrying its service. Errors (no such model, no room to load it) are raised here, so
        they come out in this API's shape before anything is parsed or run."""
        lease = self.models.lease(self.requested_model(body, facts), self.keep_alive(body))
        return lease, replace(facts, service=lease.service)

    def service_of(self, facts: Facts) -> Service:
        """The service of the request's leased model; the default model's for a parse that
        leased none (the introspection routes parse as a chat does)."""
        return facts.service if facts.service is not None else self.models.default_service

    def settings_of(self, facts: Facts) -> Settings:
        """The settings of the request's model (see :meth:`service_of`): a pool's model reads
        its own preset's (sampling defaults, limits, reasoning field...), never the server's."""
        return self.model_settings(self.service_of(facts))

    def model_settings(self, service: Service) -> Settings:
        """The settings ``service``'s model was made with; the server's for a Service made
        without (a test's). ``self.settings`` is for what is read before any model is known."""
        return service.settings if service.settings is not None else self.settings

    # ---- what an API says ---------------------------------------------------------------
    def looks_like(self, body: dict[str, Any]) -> bool:
        """Whether a raw Vertex body (no @requestFormat) is this API's request."""
        return False

    def variant(self, body: Any, headers: Mapping[str, str]) -> str:
        """The name of the API that answers this body: another API sharing this one's path
        (told apart by the body or the client's headers) is named here, so the predict route
        answers it as the path does, whatever @requestFormat named."""
        return self.name

    def wants_stream(self, body: Any, facts: Facts) -> bool:
        return False

    @staticmethod
    def error_body(err: ServiceError) -> dict[str, Any]:
        raise NotImplementedError

    def answer(self, body: Any, facts: Facts) -> dict[str, Any]:
        """The whole answer."""
        raise NotImplementedError

    def serve(self, body: Any, facts: Facts) -> Answer:
        """The answer, or the stream's bytes when the request asks for a stream."""
        return self.answer(body, facts)

    def answer_many(self, bodies: list[Any], facts: Facts) -> list[dict[str, Any]]:
        """Answers (or error bodies) for all of a predict envelope's instances of this API at
        once; only for an API that sets ``answers_many`` (it batches them better itself)."""
        raise NotImplementedError

    def blueprint(self, bp: Blueprint) -> None:
        """Routes beyond ``paths`` (count_tokens, retrieval): none by default."""

    # ---- the model routes every API shares (GET /v1/models, /v1/models/<id>) ------------------
    @classmethod
    def speaks(cls, headers: Mapping[str, str]) -> bool:
        """Whether a request on a route several APIs share comes from this API's clients (its
        SDKs' headers): the edge then answers it in this API's shapes. OpenAI's are the
        edge's own, for a request no API claims."""
        return False

    @classmethod
    def model_name(cls, model_id: str) -> str:
        """The model a model-card path names, as this API's clients write it."""
        return model_id

    @classmethod
    def model_list(cls, info: ModelInfo) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def model_card(cls, info: ModelInfo, name: str) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def listed_list(cls, items: list[Listed]) -> dict[str, Any]:
        """A server of several models' list in this API's shape: every model, loaded or not
        (Models.listing)."""
        raise NotImplementedError

    @classmethod
    def listed_card(cls, item: Listed, name: str) -> dict[str, Any]:
        """One model of such a list, under ``name`` (its name or one of its aliases)."""
        raise NotImplementedError

    # ---- HTTP -------------------------------------------------------------------------------
    def error_response(self, exc: BaseException) -> Response:
        return error_response(exc, self.error_body)

    def respond(self, result: Answer) -> Response:
        if isinstance(result, LargeAnswer):
            return json_off_hub(result)
        if isinstance(result, dict):
            return jsonify(result)
        return Response(result, headers=self.stream_headers, direct_passthrough=True)

    def view(self) -> Response:
        body = read_body(self.lenient_content_type)
        return self.respond(self.serve(body, self.facts(request.headers, gone_probe())))

    def make_blueprint(self) -> Blueprint:
        """The API's routes, with its own error shape for everything raised in them."""
        bp = Blueprint(self.name, __name__)
        for path in self.paths:
            bp.add_url_rule(path, f"{self.name}:{path}", self.view, methods=["POST"])
        self.blueprint(bp)
        bp.register_error_handler(Exception, self.error_response)
        return bp
