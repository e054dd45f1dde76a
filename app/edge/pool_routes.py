"""The routes of a server of several models (docs/models.md), where one model's answer would
say too little: /health (ready once the preloaded models are), the model list and cards with
each model's status (llama-server's router's shapes), and llama-server's router's operator
routes GET /models, POST /models/load and POST /models/unload.

A single-model server never reaches this module: app.edge.routes answers it as ever.
"""

from __future__ import annotations

import time
from typing import Any

from flask import Flask, Response, current_app, jsonify, request

from app.api.base import read_body
from app.base import bridge
from app.base.errors import BadRequest, Forbidden, ModelNotFound
from app.core.models import Listed
from app.edge import auth
from app.model.catalog.pooled import PooledModels
from app.protocol import openai
from app.settings import max_tokens_bounds


def pooled() -> PooledModels | None:
    return current_app.extensions.get("vertex_gguf_pool")


def router_status(item: Listed) -> dict[str, Any]:
    """llama-server's router's ``status``: ``value`` loaded, loading or unloaded; ``failed``
    and the reason when its last load failed (or its engine died); ``progress`` (0 to 1)
    while it loads, when the load tells."""
    s = item.status
    if s.status == "failed":
        return {"value": "unloaded", "failed": True, "reason": s.error}
    out: dict[str, Any] = {"value": s.status}
    if s.status == "loading":
        if s.progress is not None:
            out["progress"] = s.progress
        if s.stage:
            out["stage"] = s.stage
    if s.unloading:
        out["unloading"] = True
    return out


def card(item: Listed) -> dict[str, Any]:
    """A model as /v1/models lists it: OpenAI's fields, llama-server's ``aliases`` and the
    router's ``status``; the loaded model's ``meta`` besides."""
    if item.info is not None:
        length = max_tokens_bounds(item_settings(item.name))
        out = openai.model_card(item.info, length)
        out["id"] = item.name
    else:
        out = {"id": item.name, "object": "model", "created": 0, "owned_by": "vertex-gguf",
               "aliases": [item.name, *item.aliases], "tags": []}
    out["status"] = router_status(item)
    if item.status.pinned:
        out["pinned"] = True
    return out


def item_settings(name: str) -> Any:
    pool = pooled()
    assert pool is not None
    spec = pool.catalog.get(name)
    return spec.settings if spec is not None else current_app.extensions[
        "vertex_gguf_settings"]


def health(pool: PooledModels, server_facts: dict[str, Any]) -> tuple[Response, int]:
    """200 once every preloaded model is loaded (Vertex AI and Cloud Run route traffic only
    then), 503 before, and when a preload failed or the web process's preparation threads are
    stuck; every model's status in the body (in safe mode, what it changed of the model's own
    settings), then ``server_facts`` (routes._server_facts).
    A model that failed or restarts after a crash later is its own requests' error, not the
    server's: health stays 200 for the others."""
    statuses = pool.statuses()
    ready = pool.ready()
    body: dict[str, Any] = {
        "status": "ok" if ready else ("failed" if pool.preload_error else "loading"),
        "default": pool.catalog.default,
        "models": {s.name: {k: v for k, v in s.as_dict().items()
                            if k not in ("name", "last_used", "expires_at") and v is not None}
                   for s in statuses},
    }
    safe = server_facts.get("safe_mode")
    for spec in pool.catalog.models:  # safe mode: what it changed of each model's settings
        if safe is not None and spec.safe_mode:
            body["models"][spec.name]["safe_mode"] = {"reason": safe["reason"],
                                                      "changed": dict(spec.safe_mode)}
    limit = current_app.extensions["vertex_gguf_settings"].watchdog_seconds
    for name, model in body["models"].items():  # each engine process's id, and a stall
        engine = pool.pool.engine(name)
        if engine is None:
            continue
        pid = getattr(engine, "pid", None)
        if isinstance(pid, int):
            model["engine_process"] = pid
        if model["status"] == "loaded" and engine.state.ready:
            model["cold_start"] = engine.state.phases()  # what its load cost, phase by phase
            stalled = engine.stalled(limit)  # said, not a 503: the other models serve
            if stalled:
                model["stalled"] = stalled
    if pool.spares is not None:  # the next load's engine process, started ahead
        body["spare_engine_process"] = pool.spares.pid
    if pool.preload_error:
        body["error"] = pool.preload_error
    body.update(server_facts)
    body["prep_threads"], stall = bridge.prep_threads(limit)
    if stall and ready:
        ready = False
        body["status"], body["reason"] = "stalled", stall
    return jsonify(body), 200 if ready else 503


def models_list(pool: PooledModels) -> Response:
    return jsonify({"object": "list", "data": [card(item) for item in pool.listing()]})


def model_card(pool: PooledModels, model_id: str) -> Response:
    name = pool.canonical(model_id.removesuffix(":latest")) or pool.canonical(model_id)
    if name is None:
        raise ModelNotFound(f"The model {model_id[:100]!r} does not exist: the models are "
                            f"{', '.join(pool.catalog.names)}", param="model")
    return jsonify(next(card(i) for i in pool.listing() if i.name == name))


def _operator() -> None:
    """The operator's routes take ADMIN_API_KEY when one is set; without one, whoever passes
    the door (API_KEY, when set) may load and unload, as any request may load a model."""
    settings = current_app.extensions["vertex_gguf_settings"]
    if settings.admin_api_key is not None and not auth.is_admin(settings):
        raise Forbidden(f"{request.path} takes the operator's key (ADMIN_API_KEY) only")


def _named() -> str:
    body = read_body()
    name = body.get("model") if isinstance(body, dict) else None
    if not isinstance(name, str) or not name:
        raise BadRequest("model: the name of a model is required", param="model")
    return name


def models_get() -> Response:
    pool = pooled()
    assert pool is not None
    return models_list(pool)


def load() -> Response:
    """llama-server's router's POST /models/load ``{"model"}``: the model loaded (waiting for
    it, as the router's does not: a 200 means it serves now) -> ``{"success": true}``."""
    _operator()
    pool = pooled()
    assert pool is not None
    started = time.monotonic()
    result = pool.load(_named())
    return jsonify({"success": True, "result": result,
                    "took_s": round(time.monotonic() - started, 3)})


def unload() -> Response:
    """POST /models/unload ``{"model"}``: unloaded now when idle, else once its requests end."""
    _operator()
    pool = pooled()
    assert pool is not None
    return jsonify({"success": True, "result": pool.unload(_named())})


def register(app: Flask) -> None:
    app.add_url_rule("/models", "pool:models", models_get, methods=["GET"])
    app.add_url_rule("/models/load", "pool:load", load, methods=["POST"])
    app.add_url_rule("/models/unload", "pool:unload", unload, methods=["POST"])
