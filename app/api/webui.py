"""The playground page (WEBUI=on): ``GET /`` and its static files under ``/webui/``.

The files ship in the package (app/webui/) and are read once, when the app is built: a fixed
list, so no request path ever reaches the file system. Every answer carries a strict
Content-Security-Policy (scripts, styles and connections from this origin only; no inline
script or style, no frames), ``no-cache`` with a strong ETag (a reload revalidates, a 304 when
nothing changed), and ``nosniff``. The page itself needs no API key (auth exempts these paths);
it asks for one and sends it on its API calls.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

from flask import Flask, Response, request

from app.base.errors import NotFound
from app.settings import Settings

PREFIX = "/webui/"

# name -> content type; only these files are served
FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "chat.js": "text/javascript; charset=utf-8",
    "markdown.js": "text/javascript; charset=utf-8",
    "sse.js": "text/javascript; charset=utf-8",
    "store.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "icon.svg": "image/svg+xml",
}

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self' data:; manifest-src 'self'; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")

HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


def load() -> dict[str, Asset]:
    """Every file of the page, read from the package."""
    root = resources.files("app").joinpath("webui")
    out = {}
    for name, ctype in FILES.items():
        body = root.joinpath(name).read_bytes()
        out[name] = Asset(body, ctype, hashlib.sha256(body).hexdigest()[:32])
    return out


def public_paths() -> set[str]:
    """The paths the page is served on (auth lets them through without a key)."""
    return {"/", *(PREFIX + name for name in FILES if name != "index.html")}


def page_size() -> int:
    """Bytes of every file the page is made of."""
    return sum(len(a.body) for a in load().values())


def _answer(asset: Asset) -> Response:
    resp = Response(asset.body, content_type=asset.content_type)
    resp.set_etag(asset.etag)
    resp.headers.update(HEADERS)
    return resp.make_conditional(request)  # a 304 when If-None-Match has the ETag


def register(app: Flask, settings: Settings) -> None:
    if settings.webui != "on":
        return  # "/" stays a 404
    assets = load()

    def index() -> Response:
        return _answer(assets["index.html"])

    def asset(name: str) -> Response:
        found = assets.get(name)
        if found is None or name == "index.html":
            raise NotFound(f"No such file: {PREFIX}{name[:100]}")
        return _answer(found)

    app.add_url_rule("/", "webui", index, methods=["GET"])
    app.add_url_rule(PREFIX + "<name>", "webui_asset", asset, methods=["GET"])
