"""Log lines: text for a terminal, or one Cloud Logging structured entry a line (LOG_FORMAT),
each carrying the request id (and trace) of the request it was written for; and the access log,
one line per request, written when its response is over (a stream: when it closes).

JSON entries use Cloud Logging's special fields (severity, message, time, httpRequest,
logging.googleapis.com/trace and spanId); anything else stays in jsonPayload. A stack trace goes
into the message of the ERROR entry, where Error Reporting finds it. gunicorn's own loggers are
configured the same way (app.process.gunicorn_conf passes :func:`logconfig` as its logconfig_dict).
"""

from __future__ import annotations

import json
import logging
import logging.config
import re
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from app.base import reqctx
from app.settings import Settings, log_json

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(request_tag)s: %(message)s"
SEVERITY = {"WARN": "WARNING", "FATAL": "CRITICAL"}
TRACE = "logging.googleapis.com/trace"
SPAN = "logging.googleapis.com/spanId"
SAMPLED = "logging.googleapis.com/trace_sampled"
access_log = logging.getLogger("vertex_gguf.access")


class RequestFilter(logging.Filter):
    """Puts the current request's id and trace on every record written while it is served
    (in its greenlet, or in a worker thread that :func:`reqctx.carry` runs)."""

    def filter(self, record: logging.LogRecord) -> bool:
        info = reqctx.current()
        if not hasattr(record, "request_id"):
            record.request_id = info.request_id if info else None
            record.trace_id = info.trace_id if info else None
            record.span_id = info.span_id if info else None
            record.trace_sampled = info.sampled if info else None
        record.request_tag = f" [{record.request_id}]" if record.request_id else ""
        return True


# what may not reach a text log raw: a newline in a URL path would start a forged line
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_controls(text: str) -> str:
    """Control characters as escapes (``\\n``, ``\\x1b``, ``\\u2028``): one record, one line."""
    return _CONTROL.sub(lambda m: _NAMED.get(m.group()) or (
        f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}"),
        text)


class TextFormatter(logging.Formatter):
    """One line per record, whatever its message holds (control characters escaped); a stack
    trace follows on lines that each start with a tab, so no line of it reads as a record."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        if not hasattr(record, "request_tag"):
            RequestFilter().filter(record)
        record.message = escape_controls(record.getMessage())
        record.asctime = self.formatTime(record, self.datefmt)
        line = self.formatMessage(record)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        extra = [t for t in (record.exc_text, record.stack_info and self.formatStack(
            record.stack_info)) if t]
        for text in extra:
            line += "".join("\n\t" + escape_controls(part) for part in text.splitlines())
        return line


class JsonFormatter(logging.Formatter):
    """One Cloud Logging structured entry (a JSON object on one line) per record."""

    def __init__(self, project: str | None = None) -> None:
        super().__init__()
        self.project = project

    def format(self, record: logging.LogRecord) -> str:
        if not hasattr(record, "request_tag"):
            RequestFilter().filter(record)
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            message = f"{message}\n{record.exc_text}"
        if record.stack_info:
            message = f"{message}\n{self.formatStack(record.stack_info)}"
        level = SEVERITY.get(record.levelname, record.levelname)
        entry: dict[str, Any] = {
            "severity": level if level in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}
            else "DEFAULT",
            "message": message,
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="microseconds").replace("+00:00", "Z"),
            "logger": record.name,
        }
        request_id = getattr(record, "request_id", None)
        if request_id:
            entry["request_id"] = request_id
        trace = getattr(record, "trace_id", None)
        if trace:
            entry[TRACE] = f"projects/{self.project}/traces/{trace}" if self.project else trace
            span = getattr(record, "span_id", None)
            if span:
                entry[SPAN] = span
            sampled = getattr(record, "trace_sampled", None)
            if sampled is not None:
                entry[SAMPLED] = sampled
        fields = getattr(record, "json_fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        return json.dumps(entry, ensure_ascii=False, default=str)


def formatter(settings: Settings) -> logging.Formatter:
    return JsonFormatter(settings.google_cloud_project) if log_json(settings) else TextFormatter()


def logconfig(settings: Settings) -> dict[str, Any]:
    """The logging configuration, as ``logging.config.dictConfig`` takes it (and gunicorn's
    logconfig_dict): every logger, gunicorn's included, writes to stderr through one formatter."""
    if log_json(settings):
        fmt: dict[str, Any] = {"()": JsonFormatter, "project": settings.google_cloud_project}
    else:
        fmt = {"()": TextFormatter}
    level = settings.log_level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request": {"()": RequestFilter}},
        "formatters": {"app": fmt},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "app",
                "filters": ["request"],
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"level": level, "handlers": ["stderr"]},
        "loggers": {
            "gunicorn.error": {"level": level, "handlers": [], "propagate": True},
            # gunicorn's own access line is off: it would log a query string and a Basic user
            # (where a key sent the wrong way would show); vertex_gguf.access replaces it
            "gunicorn.access": {"level": "WARNING", "handlers": [], "propagate": False},
        },
    }


def setup(settings: Settings) -> None:
    logging.config.dictConfig(logconfig(settings))


# ---- the access log --------------------------------------------------------------------------

QUIET_PATHS = frozenset({"/health", "/metrics"})  # probes and scrapes: logged at DEBUG


class RequestLog:
    """WSGI middleware: gives each request its :class:`reqctx.RequestInfo` (request id, trace),
    returns ``X-Request-Id`` on every response (streams included: the header goes out with
    the status), and writes one access-log entry when the response is over."""

    def __init__(self, app: Callable, quiet: Iterable[str] = ()):
        self.app = app
        self.quiet = QUIET_PATHS | frozenset(quiet)

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        start_time = time.monotonic()
        headers = _EnvironHeaders(environ)
        info = reqctx.from_headers(headers)
        token = reqctx.begin(info)
        status: list[int] = [0]

        def start(status_line: str, response_headers: list, exc_info: Any = None) -> Any:
            status[0] = int(status_line.split(" ", 1)[0])
            response_headers = [(k, v) for k, v in response_headers
                                if k.lower() != reqctx.REQUEST_ID_HEADER.lower()]
            response_headers.append((reqctx.REQUEST_ID_HEADER, info.request_id))
            return start_response(status_line, response_headers, exc_info)

        try:
            body = self.app(environ, start)
        except BaseException:
            reqctx.end(token)
            raise
        return _Logged(body, self, environ, info, status, start_time, token)

    def log(self, environ: dict[str, Any], info: reqctx.RequestInfo, status: int, size: int,
            seconds: float) -> None:
        path = environ.get("PATH_INFO", "")
        level = logging.DEBUG if path in self.quiet and status < 400 else logging.INFO
        if not access_log.isEnabledFor(level):
            return
        http: dict[str, Any] = {
            "requestMethod": environ.get("REQUEST_METHOD", ""),
            "requestUrl": path,
            "status": status,
            "responseSize": str(size),
            "latency": f"{seconds:.3f}s",
            "userAgent": environ.get("HTTP_USER_AGENT", ""),
            "remoteIp": environ.get("REMOTE_ADDR", ""),
            "protocol": environ.get("SERVER_PROTOCOL", ""),
        }
        if environ.get("CONTENT_LENGTH"):
            http["requestSize"] = str(environ["CONTENT_LENGTH"])
        fields: dict[str, Any] = {"httpRequest": http}
        extra = {"api": info.api, "model": info.model, "prompt_tokens": info.prompt_tokens,
                 "completion_tokens": info.completion_tokens,
                 "cached_tokens": info.cached_tokens, "finish_reason": info.finish_reason}
        fields.update({k: v for k, v in extra.items() if v is not None})
        words = " ".join(f"{k}={v}" for k, v in extra.items() if v is not None)
        access_log.log(
            level, "%s %s %d %dB %.3fs%s", http["requestMethod"], path, status, size, seconds,
            f" {words}" if words else "", extra={"json_fields": fields},
        )


class _Logged:
    """The response body, counted; closing it writes the access line and ends the request's
    context (a stream closes when it ends or its client goes away)."""

    def __init__(self, body: Iterable[bytes], owner: RequestLog, environ: dict[str, Any],
                 info: reqctx.RequestInfo, status: list[int], start: float, token: Any):
        self.body = body
        self.owner = owner
        self.environ = environ
        self.info = info
        self.status = status
        self.start = start
        self.token = token
        self.size = 0
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.body:
            self.size += len(chunk)
            yield chunk

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            close = getattr(self.body, "close", None)
            if close is not None:
                close()
        finally:
            try:
                self.owner.log(self.environ, self.info, self.status[0], self.size,
                               time.monotonic() - self.start)
            finally:
                reqctx.end(self.token)


class _EnvironHeaders:
    """The request headers a WSGI environ holds, by name (case-insensitive)."""

    def __init__(self, environ: dict[str, Any]):
        self.environ = environ

    def get(self, name: str, default: Any = None) -> Any:
        return self.environ.get("HTTP_" + name.upper().replace("-", "_"), default)
