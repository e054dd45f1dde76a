"""One error hierarchy, and the one place that turns errors into status codes and bodies.

Every error a client can see is an :class:`ApiError`. Routes raise them; the Flask error
handlers (``register``) and the predict envelope's per-instance slots both render them with
:func:`error_body`, so the OpenAI shape ``{"error": {"message", "type", "param", "code"}}`` is
written in exactly one place.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, jsonify
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)


class ModelLoadError(Exception):
    """The model could not be fetched or loaded; the message names the model and the cause.

    Not an API error: it ends the process (see app.gunicorn_conf), so the platform reports a
    failed deployment.
    """


class ApiError(Exception):
    """An error with an HTTP status and an OpenAI-style type/code."""

    status = 500
    type = "internal_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def headers(self) -> dict[str, str]:
        return {}


class BadRequest(ApiError):
    status = 400
    type = "invalid_request_error"


class ContextOverflow(BadRequest):
    code = "context_length_exceeded"


class NotFound(ApiError):
    status = 404
    type = "not_found_error"
    code = "not_found"


class MethodNotAllowed(ApiError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class RequestTimeout(ApiError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class UnsupportedMediaType(ApiError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


class ClientGone(ApiError):
    """The client hung up before its answer was ready (nobody reads this one)."""

    status = 499
    type = "client_closed_request"
    code = "client_gone"


class PayloadTooLarge(ApiError):
    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class QueueFull(ApiError):
    status = 429
    type = "rate_limit_error"
    code = "queue_full"

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1"}


class ModelNotReady(ApiError):
    status = 503
    type = "service_unavailable"
    code = "model_loading"

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "5"}


class Overloaded(ApiError):
    status = 503
    type = "service_unavailable"
    code = "overloaded"

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1"}


class ShuttingDown(ApiError):
    status = 503
    type = "service_unavailable"
    code = "shutting_down"


class GenerationTimeout(ApiError):
    status = 504
    type = "timeout"
    code = "generation_timeout"


class EngineFailure(ApiError):
    status = 500
    type = "internal_error"
    code = "engine_error"


def error_body(err: ApiError) -> dict[str, Any]:
    """The OpenAI error object for ``err``."""
    return {
        "error": {
            "message": err.message,
            "type": err.type,
            "param": err.param,
            "code": err.code if err.code is not None else err.status,
        }
    }


def as_api_error(exc: BaseException) -> ApiError:
    """Any exception as an ApiError; unexpected ones become a 500 without internals."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, HTTPException):
        return _from_http(exc)
    log.exception("unexpected error", exc_info=exc)
    return ApiError("internal server error")


def _from_http(exc: HTTPException) -> ApiError:
    status = exc.code or 500
    if status == 404:
        return NotFound("no such route")
    if status == 405:
        return MethodNotAllowed("method not allowed on this route")
    if status == 413:
        return PayloadTooLarge("request body is larger than the server accepts")
    if 400 <= status < 500:
        err: ApiError = BadRequest(exc.description or "bad request")
        err.status = status
        return err
    return ApiError(exc.description or "internal server error")


def error_response(exc: BaseException) -> Response:
    err = as_api_error(exc)
    resp = jsonify(error_body(err))
    resp.status_code = err.status
    resp.headers.update(err.headers())
    return resp


def register(app: Flask) -> None:
    """Route every error through :func:`error_response`."""
    app.register_error_handler(ApiError, error_response)
    app.register_error_handler(HTTPException, error_response)
    app.register_error_handler(Exception, error_response)
