"""API keys: API_KEY (comma-separated) and API_KEY_FILE (one a line), checked before every
route but the health routes (and /metrics with METRICS_PUBLIC, and the playground page's
static files with WEBUI=on).

A request passes when any key it presents (``Authorization: Bearer <key>`` as the openai SDK
sends it, ``x-api-key: <key>`` as the anthropic SDK does, ``x-goog-api-key: <key>`` as the
Google Gen AI SDK does; never a query string) equals a configured key. Keys are
compared as SHA-256 digests with ``hmac.compare_digest``, against every key, so neither the
time taken nor an early exit tells how much of a guess was right. The check runs in a Flask
``before_request``, so a 401 is rendered by the error handler of the API the path belongs to
(Anthropic's ``authentication_error`` on /v1/messages, OpenAI's ``invalid_api_key`` elsewhere).

The key a request passed with becomes its prefix-cache scope (a digest, never the key): a
generation only reuses KV that a request with the same key wrote.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from pathlib import Path

from flask import Flask, request

from app.base import reqctx
from app.base.errors import Forbidden, Unauthorized
from app.settings import Settings

log = logging.getLogger(__name__)


def load_keys(settings: Settings) -> tuple[str, ...]:
    """The configured keys (none: no check). A key file that cannot be read, or holds no key,
    is an error: a server meant to be guarded never starts open."""
    keys: list[str] = []
    if settings.api_key is not None:
        keys += [k.strip() for k in settings.api_key.split(",") if k.strip()]
        if not keys:
            raise ValueError("API_KEY is set but holds no key")
    if settings.api_key_file is not None:
        path = Path(settings.api_key_file)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"API_KEY_FILE {path}: cannot be read ({type(exc).__name__})") from None
        found = [ln.strip() for ln in text.splitlines()]
        found = [k for k in found if k and not k.startswith("#")]
        if not found:
            raise ValueError(f"API_KEY_FILE {path}: no key in it")
        keys += found
    return tuple(dict.fromkeys(keys))


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def is_admin(settings: Settings) -> bool:
    """Whether the request presents ADMIN_API_KEY (False when none is set): compared as a
    digest in constant time, as every key is."""
    if settings.admin_api_key is None:
        return False
    want = _digest(settings.admin_api_key)
    return any(hmac.compare_digest(_digest(k), want) for k in KeyCheck.presented_keys())


def require_operator(settings: Settings, route: str) -> None:
    """``route`` answers the operator's key (ADMIN_API_KEY) only: a 403 naming why otherwise
    (no such key set: the route is off)."""
    if settings.admin_api_key is None:
        raise Forbidden(f"{route} is off: the operator sets ADMIN_API_KEY to turn it on")
    if not is_admin(settings):
        raise Forbidden(f"{route} takes the operator's key (ADMIN_API_KEY) only")


def scope_of(key: str) -> str:
    """The cache scope of a key: a digest of it (16 hex digits; the key cannot be read back)."""
    return hashlib.sha256(b"vertex-gguf cache scope\0" + key.encode()).hexdigest()[:16]


class KeyCheck:
    def __init__(self, keys: tuple[str, ...], exempt: set[str]):
        self._digests = [(_digest(k), scope_of(k)) for k in keys]
        self.exempt = frozenset(exempt)

    def presented(self) -> list[str]:
        return self.presented_keys()

    @staticmethod
    def presented_keys() -> list[str]:
        """The keys the request presents (either header, or both)."""
        out: list[str] = []
        auth = request.headers.get("Authorization", "")
        scheme, _, value = auth.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            out.append(value.strip())
        for header in ("x-api-key", "x-goog-api-key"):  # Anthropic's SDK, Google's Gen AI SDK
            api_key = request.headers.get(header, "").strip()
            if api_key:
                out.append(api_key)
        return out

    def match(self, given: str) -> str | None:
        """The scope of the configured key ``given`` equals, else None; compares with every
        key whatever the outcome."""
        digest = _digest(given)
        found: str | None = None
        for key_digest, scope in self._digests:
            if hmac.compare_digest(digest, key_digest) and found is None:
                found = scope
        return found

    def __call__(self) -> None:
        if request.path in self.exempt:
            return
        given = self.presented()
        if not given:
            raise Unauthorized(
                "Missing API key: send it as 'Authorization: Bearer <key>', 'x-api-key: <key>' "
                "or 'x-goog-api-key: <key>'"
            )
        for key in given:
            scope = self.match(key)
            if scope is not None:
                info = reqctx.current()
                if info is not None:
                    info.scope = scope
                return
        raise Unauthorized("Incorrect API key provided")


def register(app: Flask, settings: Settings) -> KeyCheck | None:
    keys = load_keys(settings)
    if not keys:
        return None
    if settings.admin_api_key is not None:  # the operator's key passes the door too
        keys = (*keys, settings.admin_api_key)
    exempt = {"/health", settings.health_route}
    if settings.metrics_public:
        exempt.add("/metrics")
    if settings.webui == "on":  # the page loads without a key, then asks for one
        from app.api import webui

        exempt |= webui.public_paths()
    check = KeyCheck(keys, exempt)
    app.before_request(check)
    log.info("API keys: %d configured; every route but %s needs one", len(keys),
             ", ".join(sorted(exempt)))
    return check
