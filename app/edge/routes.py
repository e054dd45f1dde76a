"""The routes that belong to no API: health, the model list, load progress, reasoning control,
llama-server's introspection (app.api.introspect), and the error shape for requests no API
route took (no such route, wrong method)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import gevent
from flask import Flask, Response, current_app, jsonify, request

from app.api import base, introspect, speaker, streams
from app.api.base import read_body
from app.base import bridge, reqctx
from app.base.errors import BadRequest, ModelNotFound
from app.base.state import LoadState
from app.core.service import Service
from app.edge import auth, pool_routes
from app.protocol import openai, sse, validate
from app.protocol.sse import HEADERS
from app.settings import max_tokens_bounds

log = logging.getLogger(__name__)

SLOT_FILE_SECONDS = 600.0  # a slot file's save or restore, its I/O included


def _service() -> Service:
    """The default model's; with several models, the one ``?model=`` names (never loaded
    here: 503 model_not_ready while it is not)."""
    pool = current_app.extensions.get("vertex_gguf_pool")
    if pool is not None and request.args.get("model"):
        return pool.service_named(request.args["model"])
    return current_app.extensions["vertex_gguf"]


_last_stall_log = [0.0]


def _server_facts() -> dict[str, Any]:
    """What health says of this web process whatever its models: the resumable streams, and
    earlier workers' deaths and safe mode (app.process.crash_guard; absent when nothing
    happened)."""
    facts: dict[str, Any] = {}
    hub = current_app.extensions.get("vertex_gguf_streams")
    if hub is not None:
        facts["streams"] = hub.stats()
    boot = current_app.extensions.get("vertex_gguf_boot")
    if boot is not None:
        facts.update(boot.report())
    return facts


def health() -> tuple[Response, int]:
    """200 once the model is ready; 503 while loading, and when the engine is stuck (a step or
    a request's preparation running past WATCHDOG_SECONDS, or every request-preparation thread
    held that long), so the platform restarts it. Several models: app.edge.pool_routes."""
    pool = pool_routes.pooled()
    if pool is not None:
        return pool_routes.health(pool, _server_facts())
    engine = _service().engine
    state = engine.state
    body = state.snapshot()
    info = engine.info
    if info is not None:
        body["model"] = info.name
        body["modalities"] = info.modalities
    body["queue"] = engine.queue_depth()
    body["engine"] = engine.stats()
    body["sleeping"] = bool(getattr(engine, "sleeping", False))  # still 200: it wakes on demand
    warnings = [context_warning(info)] if info is not None and info.beyond_training else []
    if info is not None and info.cuda:
        warnings += info.cuda["problems"]  # a GPU build that cannot use its GPU, said here too
    if warnings:
        body["warnings"] = warnings
    embedder = getattr(engine, "embedder", None)
    if embedder is not None:
        body["embeddings"] = embedder.stats()
    body.update(_server_facts())
    ok = state.ready
    limit = current_app.extensions["vertex_gguf_settings"].watchdog_seconds
    body["prep_threads"], pool_stall = bridge.prep_threads(limit)  # stray: callers had a 503
    stall = (engine.stalled(limit) or pool_stall) if ok else None
    if stall:
        ok = False
        body["status"] = "stalled"
        body["reason"] = stall
        now = time.monotonic()
        if now - _last_stall_log[0] > 10:
            _last_stall_log[0] = now
            log.error("health answers 503: the engine looks stuck: %s", stall)
    return jsonify(body), 200 if ok else 503


def context_warning(info) -> str:
    return (f"the context ({info.n_ctx} tokens per slot) is longer than the model was trained "
            f"for ({info.n_ctx_train}): replies past that length may degrade")


def model_status(snapshot: dict[str, Any], model: str | None) -> dict[str, Any]:
    """The ``model_status`` event body for a load-state snapshot."""
    stage = snapshot["stage"]
    status = {"ready": "loaded", "failed": "failed", "unloaded": "unloaded"}.get(stage, "loading")
    body = {"status": status, "stage": stage}
    body.update({k: snapshot[k] for k in ("progress", "detail", "error", "elapsed_s")
                 if k in snapshot})
    if model is not None:
        body["model"] = model
    return body


def load_events(state: LoadState, model: Callable[[], str | None], poll: float = 0.25,
                heartbeat: float = 15.0) -> Iterator[bytes]:
    """``download_progress`` and ``model_status`` SSE events while the model loads; ends once
    it is loaded or has failed. Polls the state's version (the loader is another thread)."""
    seen = -1
    last_sent = time.monotonic()
    while True:
        if state.version != seen:
            seen = state.version
            snap = state.snapshot()
            if snap["stage"] == "downloading" and "download" in snap:
                yield sse.event("download_progress", snap["download"])
            body = model_status(snap, model())
            yield sse.event("model_status", body)
            last_sent = time.monotonic()
            if body["status"] != "loading":
                return
        elif time.monotonic() - last_sent >= heartbeat:
            yield sse.comment()
            last_sent = time.monotonic()
        gevent.sleep(poll)


def models_sse() -> Response:
    """The load stages as server-sent events, until the model is loaded or has failed."""
    engine = _service().engine

    def name() -> str | None:
        info = engine.info
        return info.name if info else None

    return Response(load_events(engine.state, name), headers=HEADERS, direct_passthrough=True)


def _length() -> openai.Length:
    return max_tokens_bounds(current_app.extensions["vertex_gguf_settings"])


def models() -> Response:
    """The model list in the shapes of the API the caller speaks (api.speaker: Anthropic's to
    a caller that sends ``anthropic-version``, Gemini's to Google's Gen AI SDK, which asks for
    ``/v1/models`` beside a custom base URL), else OpenAI's. Several models: every one, with
    its status (app.edge.pool_routes)."""
    pool = pool_routes.pooled()
    api = speaker(request.headers)
    if pool is not None:
        if api is None:
            return pool_routes.models_list(pool)
        return jsonify(api.listed_list(pool.listing()))  # every model, in its API's shape
    info = _service().info()
    if api is not None:
        return jsonify(api.model_list(info))
    return jsonify(openai.models_list(info, _length()))


def model(model_id: str) -> Response:
    """The model's card under any of its aliases, in the shapes of the API the caller speaks
    (OpenAI's card keeps the id as its id, and has LoRA adapters' cards; the others show the
    name asked for)."""
    pool = pool_routes.pooled()
    api = speaker(request.headers)
    if pool is not None:
        if api is None:
            return pool_routes.model_card(pool, model_id)
        return _listed_card(api, pool, api.model_name(model_id))
    info = _service().info()
    name = api.model_name(model_id) if api is not None else model_id
    if api is None and any(name == a for a, _ in info.adapters):
        return jsonify(openai.adapter_card(info, name))
    if name not in info.names:
        err = ModelNotFound(f"The model {name[:100]!r} does not exist: this server serves "
                            f"{', '.join(repr(n) for n in info.names)}")
        if api is None:
            raise err
        resp = jsonify(api.error_body(err))
        resp.status_code = 404
        return resp
    if api is not None:
        return jsonify(api.model_card(info, name))
    return jsonify(openai.model_card(info, _length()))


def _listed_card(api: Any, pool: Any, name: str) -> Response:
    """A pool's model's card in the shape of the API the caller speaks (a 404 in its shape)."""
    item = base.listed_item(pool, name)
    if item is None:
        err = ModelNotFound(f"The model {name[:100]!r} does not exist: the models are "
                            f"{', '.join(pool.catalog.names)}", param="model")
        resp = jsonify(api.error_body(err))
        resp.status_code = 404
        return resp
    return jsonify(api.listed_card(item, base.shown_name(item, name)))


def lora_adapters() -> Response:
    """GET: the LoRA adapters (llama-server's list: id and the scale a request naming none
    gets, with each adapter's name and its scale when named). POST (ADMIN_API_KEY only): the
    scales a request naming none gets, as a list of {id, scale}; adapters not listed get 0."""
    svc = _service()
    adapters = svc.info().adapters
    if request.method == "POST":
        auth.require_operator(current_app.extensions["vertex_gguf_settings"],
                              "POST /lora-adapters")
        body = read_body()
        if not isinstance(body, list):
            raise BadRequest("the body is a list of {\"id\", \"scale\"}")
        entries = [validate.parse(openai.LoraEntry, e, {}) for e in body]
        scales = {}
        for e in entries:
            if not 0 <= e.id < len(adapters):
                raise BadRequest(f"no adapter with id {e.id} (this server has {len(adapters)})",
                                 param="id")
            scales[e.id] = e.scale
        svc.lora_defaults = {i: s for i, s in scales.items() if s != 0}
        log.info("LoRA default scales set: %s", svc.lora_defaults or "none (the base model)")
    return jsonify([{"id": i, "name": name, "scale": svc.lora_defaults.get(i, 0.0),
                     "scale_when_named": scale} for i, (name, scale) in enumerate(adapters)])


def slot_action(id_slot: int) -> Response:
    """llama-server's POST /slots/{id}?action=save|restore|erase (``{"filename"}`` for the
    first two): a slot's KV written to a file of PROMPT_CACHE_DIR, read back, or dropped. The
    operator's key (ADMIN_API_KEY) only: a slot holds another key's conversation."""
    auth.require_operator(current_app.extensions["vertex_gguf_settings"], "POST /slots")
    action = request.args.get("action")
    if action not in ("save", "restore", "erase"):
        raise BadRequest("action is one of save, restore and erase", param="action")
    filename = None
    if action != "erase":
        body = read_body()
        if not isinstance(body, dict):
            raise BadRequest("the body is {\"filename\": ...}", param="filename")
        filename = body.get("filename")
    svc = _service()
    svc.info()  # 503 while the model is not loaded
    # a multi-GB slot file on Cloud Storage takes longer than PREPARE_TIMEOUT's prompt work
    return jsonify(bridge.offload(lambda: svc.engine.slot_action(id_slot, action, filename),
                                  timeout=SLOT_FILE_SECONDS))


def control() -> Response:
    """``{"id", "action": "reasoning_end"}``: end a running stream's thought now (any API's
    response id)."""
    body = read_body()
    if not isinstance(body, dict) or not isinstance(body.get("id"), str):
        raise BadRequest("'id' (the id of a running response) is required", param="id")
    if body.get("action") != "reasoning_end":
        raise BadRequest("action must be 'reasoning_end'", param="action")
    pool = pool_routes.pooled()
    if pool is not None:  # several models: the run is on whichever model started it
        found = any(svc.control(body["id"], reqctx.cache_scope())
                    for svc in pool.services.values())
        return jsonify({"success": found})
    return jsonify({"success": _service().control(body["id"], reqctx.cache_scope())})


def error_response(exc: BaseException) -> Response:
    """Errors no API route took (no such route, wrong method): in the shape of the API whose
    path the request is under (``/v1/messages/batches`` answers as Messages would), else
    OpenAI's."""
    for api in current_app.extensions.get("vertex_gguf_apis", ()):
        if any(request.path.startswith(path) for path in api.paths):
            return api.error_response(exc)
    return base.error_response(exc, openai.error_body)


def register(app: Flask, health_route: str) -> None:
    for route in dict.fromkeys(["/health", health_route]):
        app.add_url_rule(route, f"health:{route}", health, methods=["GET"])
    app.add_url_rule("/models/sse", "models_sse", models_sse, methods=["GET"])
    app.add_url_rule("/v1/models", "models", models, methods=["GET"])
    app.add_url_rule("/v1/models/<path:model_id>", "model", model, methods=["GET"])
    app.add_url_rule("/v1/chat/completions/control", "control", control, methods=["POST"])
    app.add_url_rule("/lora-adapters", "lora_adapters", lora_adapters, methods=["GET", "POST"])
    app.add_url_rule("/slots/<int:id_slot>", "slot_action", slot_action, methods=["POST"])
    introspect.register(app)
    streams.register(app)
    app.register_error_handler(Exception, error_response)
