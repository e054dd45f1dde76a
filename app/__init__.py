"""vertex-gguf: one container serving a GGUF model behind Vertex AI, Cloud Run and OpenAI APIs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

# First, before anything loads C++ code (gevent's greenlet, then llama.cpp): one C++ runtime
# for the whole process, its locale numbered before any other copy can (app.base.cxx_runtime).
# Nothing heavier is imported here: an engine process (app.engine.child) imports this package
# too, and must load neither gevent nor Flask (create_app imports them when it is called).
from app.base import cxx_runtime

cxx_runtime.pin()

if TYPE_CHECKING:
    from flask import Flask

    from app.base.boot import Boot
    from app.core.models import Models
    from app.core.plan import PlanOptions
    from app.core.service import Service
    from app.engine.config import EngineConfig
    from app.model.catalog import Catalog
    from app.model.catalog.pooled import MakeEngine, PooledModels
    from app.settings import Settings

log = logging.getLogger(__name__)


def engine_config(settings: Settings) -> EngineConfig:
    """The engine's settings, taken by name; only the derived fields are spelled out."""
    from app import formats
    from app.core.plan import opening
    from app.engine.config import EngineConfig
    from app.settings import from_settings

    return from_settings(
        EngineConfig,
        settings,
        chat_template=_template_text(settings.chat_template),
        verbose=settings.log_level == "debug",
        preserved_tokens=formats.preserved_tokens(),
        opening=opening,
    )


def plan_options(settings: Settings) -> PlanOptions:
    """The planner's settings, taken by name; only the derived fields are spelled out."""
    from dataclasses import replace

    from app.core.decode_budget import DecodeBudget
    from app.core.media import MediaLimits
    from app.core.plan import PlanOptions
    from app.core.video import VideoLimits
    from app.grammar import gate
    from app.model.remote import Fetcher
    from app.settings import from_settings, max_tokens_default, slots_per_request

    fetch = Fetcher.from_settings(settings)

    return from_settings(
        PlanOptions,
        settings,
        limits=gate.Limits.from_settings(settings),
        protect_messages=settings.special_tokens_in_messages == "text",
        timeout=settings.request_timeout or None,
        slots_per_request=slots_per_request(settings),
        max_tokens_default=max_tokens_default(settings),
        media=MediaLimits(settings.images_per_request, settings.image_max_bytes,
                          settings.image_max_pixels, settings.image_max_side,
                          fetch=fetch,
                          max_audio_seconds=settings.audio_max_seconds,
                          budget=DecodeBudget(settings.image_decode_budget,
                                              settings.prepare_timeout / 2),
                          video=VideoLimits(settings.video_fps, settings.video_max_frames,
                                            settings.video_max_side, settings.video_max_bytes,
                                            settings.video_timeout, settings.image_max_pixels,
                                            ffmpeg=settings.video_ffmpeg),
                          fetch_video=replace(fetch, max_bytes=settings.video_max_bytes,
                                              limit_name="VIDEO_MAX_BYTES")),
    )


def _template_text(value: str | None) -> str | None:
    """CHAT_TEMPLATE is a file path when such a file exists, else the template itself."""
    if value is None:
        return None
    from pathlib import Path

    path = Path(value)
    if "{" not in value and path.is_file():
        return path.read_text(encoding="utf-8")
    return value


def _engine(settings: Settings, boot: Boot, on_fatal: Callable[[str], None] | None,
            launch: Any = None) -> Any:
    """The llama.cpp engine for the configured model: in this process, or in a process of its
    own (ENGINE_PROCESS=on: app.engine.remote, the crash guard's rules per engine process).
    ``launch``: how its engine processes start (a pool's spares; default: spawned fresh)."""
    from app.base.state import LoadState
    from app.engine.llama_engine import LlamaEngine
    from app.model import source

    config = engine_config(settings)
    extra: dict[str, Any] = {}
    make: Any = LlamaEngine
    if settings.engine_process == "on":
        from app.engine.remote import RemoteEngine
        from app.process.crash_guard import CrashGuard, safe_changes

        make = RemoteEngine
        if launch is not None:
            extra["launch"] = launch
        extra["guard"] = CrashGuard(settings.crash_limit, settings.crash_window,
                                    safe_changes(config), settings.crash_backoff_max,
                                    what="engine process")
    return make(
        config,
        LoadState(boot.record),
        partial(source.resolve, settings),
        on_fatal=on_fatal,
        resolve_projector=partial(source.resolve_projector, settings),
        resolve_draft=partial(source.resolve_draft, settings),
        resolve_adapters=partial(source.resolve_adapters, settings),
        **extra,
    )


def _pool(catalog: Catalog, make_engine: MakeEngine | None, metrics: Any,
          on_fatal: Callable[[str], None] | None, boot: Boot) -> PooledModels:
    """The catalog's models in a pool: each model's engine in a process of its own (its own
    crash guard, its load state its own: the worker's load record is the preloads'), one
    Service per model with its own plan options. ``on_fatal``: a preload that failed."""
    from app.base.boot import Boot
    from app.core.service import Service
    from app.model import gcs
    from app.model.catalog import memory
    from app.model.catalog.pooled import PooledModels

    if any(gcs.names_gcs(spec.source, spec.settings.mmproj, spec.settings.draft_model,
                         spec.settings.lora_adapters) for spec in catalog.models):
        gcs.import_client_library()  # now, not under the interpreter lock of a load's thread

    def make_service(engine: Any, settings: Settings) -> Service:
        return Service(engine, plan_options(settings), prepare_timeout=settings.prepare_timeout,
                       metrics=metrics.for_model(engine.pool_name),  # counted by model
                       settings=settings)

    def on_ready() -> None:
        boot.record("ready", "")  # what the crash guard reads of this worker

    spares = None
    if make_engine is None:  # llama.cpp's engines: the next one's process started ahead
        from app.engine.spare import Spares

        spares = Spares()
    make = make_engine or (lambda settings, fatal: _engine(settings, Boot(), fatal, spares))
    room = memory.measure(catalog.base, catalog.models)  # once, now: the room for models
    budget = room.budget
    return PooledModels(catalog, make, make_service, on_fatal=on_fatal, on_ready=on_ready,
                        spares=spares, estimate=partial(memory.estimate, config_of=engine_config,
                                         gpus=room.gpus),
                        budget=None if budget is None else lambda: budget)


def create_app(
    settings: Settings,
    engine=None,
    on_fatal: Callable[[str], None] | None = None,
    boot: Boot | None = None,
    models: Callable[[Service], Models] | None = None,
    catalog: Catalog | None = None,
    make_engine: MakeEngine | None = None,
) -> Flask:
    """The WSGI app. Without ``engine``, starts loading the configured model in the background
    (the port is already bound by then: health answers 503 until the model is warm). ``boot``:
    what this worker inherits from the crash guard (app.process.crash_guard), and where its load stages
    are recorded. ``models``: the models the APIs lease per request, made from the engine's
    service (the default model's, which the routes that name no model use); default: that
    one model (app.core.models.OneModel). ``catalog``: the models the settings name
    (app.model.catalog.build); one that is not ``single`` serves them all from a pool
    (app.model.catalog.pooled), each model's engine made by ``make_engine(settings, on_fatal)``
    (default: llama.cpp in an engine process of its own)."""
    import gevent
    from flask import Flask
    from prometheus_client import CollectorRegistry

    from app import api
    from app.api import webui
    from app.base.boot import Boot
    from app.base.metrics import PREDICT, Metrics
    from app.base.metrics import install as install_metrics
    from app.core.models import OneModel
    from app.core.service import Service
    from app.edge import auth, logs, routes
    from app.protocol.stream_policy import policy_of
    from app.settings import stream_max_live
    from app.streams import Streams

    boot = boot or Boot()
    pooled = catalog is not None and not catalog.single and engine is None and models is None
    if engine is None and not pooled:
        engine = _engine(settings, boot, on_fatal)
        engine.start()
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.json.sort_keys = False
    app.json.ensure_ascii = False
    # this app's own registry: tests build many apps in one process; labelled by model in a pool
    metrics = Metrics(CollectorRegistry(), by_model=pooled)
    app.extensions["vertex_gguf_metrics"] = metrics
    pool = None
    if pooled:
        assert catalog is not None
        pool = _pool(catalog, make_engine, metrics, on_fatal, boot)
        app.extensions["vertex_gguf_pool"] = pool
        engine = pool.default_engine  # a view of the default model's engine, loaded or not
        metrics.watch_pool(pool.statuses, pool.pool.engine, boot)  # every model's, by model
    else:
        metrics.watch(engine, boot)
    if pool is not None:
        service = pool.default_service
        served: Models = pool
    else:
        service = Service(engine, plan_options(settings),
                          prepare_timeout=settings.prepare_timeout, metrics=metrics,
                          settings=settings)
        served = (models or OneModel)(service)
    app.extensions["vertex_gguf"] = service  # the default model's: /health, /props, cards
    app.extensions["vertex_gguf_models"] = served
    app.extensions["vertex_gguf_settings"] = settings
    app.extensions["vertex_gguf_boot"] = boot
    # resumable streams (X-Conversation-Id): this replica's sessions, mirrored to STREAM_STORE
    app.extensions["vertex_gguf_streams"] = Streams(
        settings.stream_buffer_bytes, settings.stream_session_ttl,
        policy_of(settings).heartbeat_seconds, settings.stream_store,
        max_live=stream_max_live(settings), unread_timeout=settings.stream_unread_timeout)
    gevent.spawn(service.warm)
    apis = api.register(app, settings, served)
    routes.register(app, settings.health_route)
    if pool is not None:
        from app.edge import pool_routes

        pool_routes.register(app)  # GET /models, POST /models/load and /models/unload
        pool.start()  # the preloads, in the background; the keep_alive sweeper
    webui.register(app, settings)  # the playground page at / (WEBUI)
    # GET /metrics; every API route's requests counted and timed (a 401 included)
    endpoints = {rule.endpoint: a.label for rule in app.url_map.iter_rules() for a in apis
                 if rule.rule in a.paths and rule.endpoint.startswith(f"{a.name}.")}
    endpoints["predict"] = PREDICT
    install_metrics(app, metrics, endpoints)
    auth.register(app, settings)  # API keys: before every route but health (and public /metrics)
    # request ids, trace and the access log around everything (streams included)
    app.wsgi_app = logs.RequestLog(app.wsgi_app, quiet=[settings.health_route])  # type: ignore[method-assign]
    return app
