"""What one HTTP request carries through the server outside Flask's objects: its request id,
its trace (for log correlation), the key's cache scope, and what the access log reports (the
API, tokens, finish reason).

It lives in a context variable: gevent gives every greenlet its own context (greenlet >= 0.4.17),
so each connection's greenlet sees its own request; worker threads and spawned greenlets get it
through :func:`carry` (a copy of the caller's context). The object is shared, not copied, so a
predict envelope's instances add their tokens to the same request.
"""

from __future__ import annotations

import contextvars
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

REQUEST_ID_HEADER = "X-Request-Id"
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_CLOUD_TRACE = re.compile(r"([0-9a-fA-F]{32})(?:/(\d{1,20}))?(?:;o=([01]))?")
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


@dataclass
class RequestInfo:
    request_id: str
    trace_id: str | None = None  # 32 hex digits
    span_id: str | None = None  # 16 hex digits
    sampled: bool | None = None
    scope: str = ""  # the API key's cache scope (never the key): "" without keys
    api: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    model: str | None = None  # the model it leased first (a server of several models)


_current: contextvars.ContextVar[RequestInfo | None] = contextvars.ContextVar(
    "vertex_gguf_request", default=None
)


def current() -> RequestInfo | None:
    return _current.get()


def begin(info: RequestInfo) -> contextvars.Token:
    return _current.set(info)


def end(token: contextvars.Token) -> None:
    try:
        _current.reset(token)
    except ValueError:  # reset from another context (a generator closed elsewhere)
        _current.set(None)


def cache_scope() -> str:
    info = _current.get()
    return info.scope if info is not None else ""


def carry(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` run in a copy of the calling context (for a worker thread or a new greenlet, so
    its log lines carry the request id and its generations the key's cache scope)."""
    ctx = contextvars.copy_context()

    def run(*args: Any, **kwargs: Any) -> T:
        return ctx.run(fn, *args, **kwargs)

    return run


def request_id(headers: Mapping[str, str]) -> str:
    """The client's X-Request-Id when it is a sane one (at most 128 of [A-Za-z0-9._:-]), else
    a new one."""
    given = headers.get(REQUEST_ID_HEADER)
    if given and _REQUEST_ID.fullmatch(given):
        return given
    return uuid.uuid4().hex


def parse_trace(headers: Mapping[str, str]) -> tuple[str | None, str | None, bool | None]:
    """(trace id, span id in 16 hex, sampled) from X-Cloud-Trace-Context
    (``TRACE_ID/SPAN_ID;o=1``, the span id in decimal) or W3C traceparent
    (``00-TRACE-SPAN-FLAGS``); Nones when neither is usable."""
    cloud = headers.get("X-Cloud-Trace-Context")
    if cloud:
        m = _CLOUD_TRACE.fullmatch(cloud.strip())
        if m and int(m.group(1), 16):
            span = None
            if m.group(2) and 0 < int(m.group(2)) < 1 << 64:
                span = f"{int(m.group(2)):016x}"
            sampled = None if m.group(3) is None else m.group(3) == "1"
            return m.group(1).lower(), span, sampled
    parent = headers.get("traceparent")
    if parent:
        m = _TRACEPARENT.fullmatch(parent.strip().lower())
        if m and m.group(1) != "ff" and int(m.group(2), 16) and int(m.group(3), 16):
            return m.group(2), m.group(3), bool(int(m.group(4), 16) & 1)
    return None, None, None


def from_headers(headers: Mapping[str, str]) -> RequestInfo:
    trace, span, sampled = parse_trace(headers)
    return RequestInfo(request_id(headers), trace, span, sampled)


def note_api(name: str) -> None:
    """The API serving this request (the first one named wins: a predict route's API)."""
    info = _current.get()
    if info is not None and info.api is None:
        info.api = name


def note_run(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None,
             finish_reason: str | None) -> None:
    """A finished (or ended) generation's counts, added to the request's (an envelope has
    several)."""
    info = _current.get()
    if info is None:
        return
    info.prompt_tokens = (info.prompt_tokens or 0) + prompt_tokens
    info.completion_tokens = (info.completion_tokens or 0) + completion_tokens
    if cached_tokens is not None:
        info.cached_tokens = (info.cached_tokens or 0) + cached_tokens
    if finish_reason is not None:
        info.finish_reason = finish_reason
