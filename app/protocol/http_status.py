"""HTTP statuses for the domain errors: the one table every API shares (each API keeps its own
type names and body shape; the status of a queue-full or a bad request is the same in all)."""

from __future__ import annotations

from app.base.errors import (
    BadRequest,
    ClientGone,
    Forbidden,
    GenerationTimeout,
    Internal,
    MethodNotAllowed,
    NotFound,
    NotSupported,
    PayloadTooLarge,
    QueueFull,
    RequestTimeout,
    ServiceError,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
)

STATUS: dict[type[ServiceError], int] = {
    BadRequest: 400,
    Unauthorized: 401,
    Forbidden: 403,
    NotFound: 404,
    MethodNotAllowed: 405,
    RequestTimeout: 408,
    PayloadTooLarge: 413,
    UnsupportedMediaType: 415,
    QueueFull: 429,
    ClientGone: 499,  # nginx's "client closed request": nobody reads it
    Internal: 500,
    NotSupported: 501,
    Unavailable: 503,
    GenerationTimeout: 504,
    ServiceError: 500,
}


class HttpStatusError(BadRequest):
    """A status the HTTP layer itself produced (werkzeug), kept as it was."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def status_of(err: ServiceError) -> int:
    if isinstance(err, HttpStatusError):
        return err.status
    for cls in type(err).__mro__:
        if cls in STATUS:
            return STATUS[cls]  # type: ignore[index]
    return 500


def headers_of(err: ServiceError) -> dict[str, str]:
    headers = {"Retry-After": str(err.retry_after)} if err.retry_after is not None else {}
    if isinstance(err, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    return headers


def lookup(table: dict[type[ServiceError], str], err: ServiceError, default: str) -> str:
    """An API's name for ``err``: the entry of its nearest class in ``table``."""
    for cls in type(err).__mro__:
        if cls in table:
            return table[cls]  # type: ignore[index]
    return default
