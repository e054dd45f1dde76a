"""One error hierarchy for everything a client can be told went wrong, free of any wire format.

These are domain errors: what happened (a bad request, a full queue, a context overflow, a
timeout), a neutral ``code`` and the request field at fault. They carry no HTTP status and no
API's vocabulary: each API module (app.api) maps them to its own status, type names and body
shape, the way TGI maps its ``InferError`` at the edge. The engine raises them too, so the
engine package imports nothing of Flask or HTTP.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class ModelLoadError(Exception):
    """The model could not be fetched or loaded; the message names the model and the cause.

    Not a request error: it ends the process (see app.process.gunicorn_conf), so the platform reports a
    failed deployment.
    """


class ServiceError(Exception):
    """Something a client is told: a message, a neutral code, and the field at fault."""

    code: str | None = None
    retry_after: int | None = None  # seconds a client should wait before trying again

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def __reduce__(self) -> tuple:
        """Pickled whole, whatever its class's ``__init__`` takes (an engine process sends its
        errors to the web process: app.engine.wire): the class, the args, every attribute."""
        return _rebuild, (type(self), self.args, dict(self.__dict__))


def _rebuild(cls: type[ServiceError], args: tuple, state: dict) -> ServiceError:
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


class Internal(ServiceError):
    """An unexpected failure; the message carries no internals."""


class BadRequest(ServiceError):
    """The request is malformed or asks for something this server refuses."""


class ContextOverflow(BadRequest):
    """A prompt (with the tokens asked for) that cannot fit the context. The counts, when
    known, let an API word it as its own service does (Anthropic's clients read theirs)."""

    code = "context_length_exceeded"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 tokens: int | None = None, limit: int | None = None,
                 requested: int | None = None):
        super().__init__(message, param=param, code=code)
        self.tokens = tokens  # the prompt's tokens
        self.limit = limit  # the context's
        self.requested = requested  # the tokens asked for beside them, when they overflowed


class Unauthorized(ServiceError):
    """No API key, or a wrong one (the message never carries what was sent)."""

    code = "invalid_api_key"


class Forbidden(ServiceError):
    """A route only the operator's key may call (ADMIN_API_KEY), called without it."""

    code = "forbidden"


class NotFound(ServiceError):
    code = "not_found"


class ModelNotFound(NotFound):
    """A request named a model this server does not serve (STRICT_MODEL_NAME, or a name that
    is no model of the catalog); the message names the models there are."""

    code = "model_not_found"


class EmbeddingOnly(BadRequest):
    """A generation asked of a model that only embeds (an embedding GGUF, EMBEDDINGS=only) or
    only reranks (a reranker GGUF)."""

    code = "model_not_supported"

    def __init__(self, reranks: bool = False) -> None:
        super().__init__(
            "this model only reranks (a reranker GGUF, pooling type rank): use /v1/rerank, "
            "/v2/rerank or /score" if reranks else
            "this model only embeds (an embedding GGUF, or EMBEDDINGS=only): use /v1/embeddings")


class NotSupported(ServiceError):
    """A feature this server was configured without (llama-server's 501 not_supported_error)."""

    code = "not_supported"


class MethodNotAllowed(BadRequest):
    code = "method_not_allowed"


class RequestTimeout(BadRequest):
    """The client took too long to send its request body."""

    code = "request_timeout"


class UnsupportedMediaType(BadRequest):
    code = "unsupported_media_type"


class PayloadTooLarge(BadRequest):
    code = "payload_too_large"


class ClientGone(ServiceError):
    """The client hung up before its answer was ready (nobody reads this one)."""

    code = "client_gone"


class QueueFull(ServiceError):
    code = "queue_full"
    retry_after = 1


class TooManyStreams(QueueFull):
    """An API key already runs as many resumable generations as it may (429)."""

    code = "too_many_streams"
    retry_after = 5


class Unavailable(ServiceError):
    """The server cannot take this request now; another replica (or a retry) can."""

    code = "unavailable"
    retry_after = 1


class ModelNotReady(Unavailable):
    code = "model_loading"
    retry_after = 5


class PoolBusy(Unavailable):
    """Too many requests already wait for this model (its load, or room to load it): the
    request is turned away at once with when to come back, rather than queueing unbounded."""

    code = "model_busy"

    def __init__(self, message: str, *, retry_after: int = 5) -> None:
        super().__init__(message, param="model")
        self.retry_after = retry_after


class ModelTooLarge(Unavailable):
    """A model that cannot load even with every model that may be unloaded gone (its
    estimated footprint past the memory budget, or every MODELS_MAX place pinned): the
    message says what it needs and what is free. Retrying does not help until that changes."""

    code = "model_too_large"
    retry_after = None


class ModelLoadFailed(Unavailable):
    """The model's load failed, or its engine died for good; the message says why. The next
    request tries the load again."""

    code = "model_load_failed"
    retry_after = None


class Overloaded(Unavailable):
    code = "overloaded"


class ShuttingDown(Unavailable):
    code = "shutting_down"
    retry_after = None


class GenerationTimeout(ServiceError):
    code = "generation_timeout"


class EngineFailure(Internal):
    code = "engine_error"


def as_service_error(exc: BaseException) -> ServiceError:
    """Any exception as a ServiceError; unexpected ones become Internal without internals."""
    if isinstance(exc, ServiceError):
        return exc
    log.exception("unexpected error", exc_info=exc)
    return Internal("internal server error")
