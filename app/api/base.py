"""What every API shares: reading the body, noticing a client that hung up, and the flow from
a wire request through the core to a wire answer. An API subclasses :class:`Api`, says how to
parse its request, render the core's result and events, and shape its errors; the rest is here.
"""

from __future__ import annotations

import copy
import json
import logging
import secrets
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from functools import partial
from typing import Any, ClassVar

from flask import Blueprint, Response, current_app, jsonify, request
from gevent import select
from werkzeug.exceptions import HTTPException

from app import streams
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
from app.core.events import Event, Result, fold
from app.core.input import ChatInput, TextInput
from app.core.media import Collected
from app.core.service import Run, Service
from app.protocol import jsonbody, validate
from app.protocol.http_status import HttpStatusError, headers_of, status_of
from app.protocol.sse import HEADERS, comment, policy_of
from app.settings import Settings

log = logging.getLogger(__name__)

Answer = dict[str, Any] | Iterator[bytes]
CONVERSATION_HEADER = "X-Conversation-Id"  # opts a stream in to resuming (app.streams)


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


class Api:
    """One wire API over the core. Subclasses set the class attributes and implement
    ``parse``, ``render``, ``render_stream`` and ``error_body``."""

    name: ClassVar[str]  # also a @requestFormat value
    paths: ClassVar[tuple[str, ...]]  # the POST routes that serve it
    request_formats: ClassVar[tuple[str, ...]] = ()  # other @requestFormat names (lower case)
    id_prefix: ClassVar[str] = "req"
    answers_many: ClassVar[bool] = False  # a predict envelope's instances go in one call
    keepalive: ClassVar[bytes] = comment()  # what its streams send when quiet
    # any Content-Type from a caller that is not a browser (see read_body)
    lenient_content_type: ClassVar[bool] = False
    stream_headers: ClassVar[dict[str, str]] = HEADERS  # a stream's (SSE unless overridden)

    def __init__(self, settings: Settings, service: Service):
        self.settings = settings
        self.service = service
        # seconds without an event before a stream sends its keep-alive (None: never)
        self.heartbeat = policy_of(settings).heartbeat_seconds or None
        self.label = API_LABELS.get(self.name, self.name)  # the metrics' ``api`` label

    def images(self) -> Collected:
        """A collector for one request's images (IMAGE_MAX_BYTES each)."""
        return Collected(self.settings.image_max_bytes)

    def relabelled(self, label: str) -> Api:
        """This API under another metrics label (the predict route's)."""
        other = copy.copy(self)
        other.label = label
        return other

    # ---- what an API says ---------------------------------------------------------------
    def looks_like(self, body: dict[str, Any]) -> bool:
        """Whether a raw Vertex body (no @requestFormat) is this API's request."""
        return False

    def wants_stream(self, body: Any) -> bool:
        return validate.wants_stream(body)

    def parse(self, body: Any) -> tuple[ChatInput | TextInput, Any]:
        """The core's input and whatever the renderers need of the request. Runs on a worker
        thread (validation can be costly)."""
        raise NotImplementedError

    def render(self, req: Any, run: Run, result: Result) -> dict[str, Any]:
        raise NotImplementedError

    def render_stream(self, req: Any, run: Run, headers: Mapping[str, str]) -> Iterator[bytes]:
        raise NotImplementedError

    def error_body(self, err: ServiceError) -> dict[str, Any]:
        raise NotImplementedError

    def answer_many(self, bodies: list[Any],
                    gone: Callable[[], bool] | None) -> list[dict[str, Any]]:
        """Answers (or error bodies) for all of a predict envelope's instances of this API at
        once; only for an API that sets ``answers_many`` (it batches them better itself)."""
        raise NotImplementedError

    def blueprint(self, bp: Blueprint) -> None:
        """Routes beyond ``paths`` (count_tokens, retrieval): none by default."""

    # ---- the flow ---------------------------------------------------------------------------
    def new_id(self) -> str:
        return f"{self.id_prefix}_{secrets.token_hex(12)}"

    def start(self, body: Any) -> tuple[Any, Run]:
        """Parse and plan off the hub, submit, wait for acceptance: every error up to here
        comes before the first byte."""
        parsed: list[Any] = []

        def build() -> ChatInput | TextInput:
            inp, req = self.parse(body)
            parsed.append(req)
            return inp

        reqctx.note_api(self.name)
        plan = self.service.prepare(build)
        # the API key's scope: a generation reuses only KV its own key wrote
        plan.generation = replace(plan.generation, cache_scope=reqctx.cache_scope())
        return parsed[0], self.service.start(plan, self.new_id(), self.label)

    def answer(self, body: Any, gone: Callable[[], bool] | None = None) -> dict[str, Any]:
        """The whole answer. ``gone`` tells whether the client hung up (then it is cancelled)."""
        req, run = self.start(body)
        try:
            return self.render(req, run, fold(self.watch(run.events(gone=gone), run, req), run.n))
        finally:
            note_run(run)

    def watch(self, events: Iterator[Event], run: Run, req: Any) -> Iterator[Event]:
        """The events on their way to the fold: an API that notes something as they pass
        (when the thought ended, when the first token came) overrides this."""
        return events

    def stream(self, body: Any, headers: Mapping[str, str]) -> Iterator[bytes]:
        """The stream's bytes. With ``X-Conversation-Id`` the generation is produced into a
        resumable session that outlives this connection, and this is its first reader."""
        conv = streams.conversation_id(headers.get(CONVERSATION_HEADER))
        if conv is None:
            return self._stream(body, headers)
        hub: streams.Streams = current_app.extensions["vertex_gguf_streams"]
        scope = reqctx.cache_scope()
        hub.replace(conv, scope)
        hub.admit(scope)  # 429 past the key's cap, before the generation starts
        quiet = copy.copy(self)
        quiet.heartbeat = None  # heartbeats are per connection: each reader sends its own
        return hub.produce(conv, scope, quiet._stream(body, headers), self.keepalive)

    def _stream(self, body: Any, headers: Mapping[str, str]) -> Iterator[bytes]:
        req, run = self.start(body)
        try:
            frames = self.render_stream(req, run, headers)
        except BaseException:
            run.close()
            raise
        return _Closing(frames, run)

    def serve(self, body: Any, gone: Callable[[], bool] | None,
              headers: Mapping[str, str]) -> Answer:
        if self.wants_stream(body):
            return self.stream(body, headers)
        return self.answer(body, gone)

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
        return self.respond(self.serve(read_body(self.lenient_content_type), gone_probe(),
                                       request.headers))

    def make_blueprint(self) -> Blueprint:
        """The API's routes, with its own error shape for everything raised in them."""
        bp = Blueprint(self.name, __name__)
        for path in self.paths:
            bp.add_url_rule(path, f"{self.name}:{path}", self.view, methods=["POST"])
        self.blueprint(bp)
        bp.register_error_handler(Exception, self.error_response)
        return bp


class _Closing:
    """The frames; however the response ends (the client gone, a stream stopped before its
    first byte was asked for), ``close`` closes the run: a generator's own ``finally`` would not
    run if it was never started."""

    def __init__(self, frames: Iterator[bytes], run: Run):
        self.frames = frames
        self.run = run
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        return self

    @property
    def ending(self) -> bool:
        """The generation has ended: the frames left are its closing ones (a resumable
        session writes them together with its end, app.streams)."""
        return self.run.over

    def __next__(self) -> bytes:
        try:
            return next(self.frames)
        except BaseException:  # the end, or a failure: the run is over now (the access line
            self.close()       # is written after this, with its tokens)
            raise

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            close = getattr(self.frames, "close", None)
            if close is not None:
                close()
        finally:
            self.run.close()
            note_run(self.run)


def note_run(run: Run) -> None:
    """The run's tokens and finish reason, for the request's access-log line."""
    reqctx.note_run(run.prompt_tokens, run.completion_tokens, run.cached_tokens,
                    run.finish_reason)
