"""vertex-gguf: one container serving a GGUF model behind Vertex AI, Cloud Run and OpenAI APIs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import gevent
from flask import Flask

from app.settings import Settings

log = logging.getLogger(__name__)


def engine_config(settings: Settings):
    from app.engine.llama_engine import EngineConfig

    return EngineConfig(
        ctx_size=settings.ctx_size,
        gpu_layers=settings.gpu_layers,
        threads=settings.threads,
        threads_batch=settings.threads_batch,
        batch_size=settings.batch_size,
        flash_attn=settings.flash_attn,
        max_queue=settings.max_queue,
        parallel=settings.parallel,
        prefill_chunk=settings.prefill_chunk,
        served_model_name=settings.served_model_name,
        chat_template=_template_text(settings.chat_template),
        verbose=settings.log_level == "debug",
        max_prompt_bytes=settings.max_prompt_bytes,
        grammar_max_step_ms=settings.grammar_max_step_ms,
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


def create_app(
    settings: Settings,
    engine=None,
    on_fatal: Callable[[str], None] | None = None,
) -> Flask:
    """The WSGI app. Without ``engine``, starts loading the configured model in the background
    (the port is already bound by then: health answers 503 until the model is warm)."""
    from app import api, grammar, routes
    from app.core.plan import PlanOptions
    from app.core.service import Service
    from app.settings import slots_per_request

    if engine is None:
        from app import model_source
        from app.engine.llama_engine import LlamaEngine
        from app.state import LoadState

        engine = LlamaEngine(
            engine_config(settings),
            LoadState(),
            partial(model_source.resolve, settings),
            on_fatal=on_fatal,
        )
        engine.start()
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.json.sort_keys = False
    app.json.ensure_ascii = False
    options = PlanOptions(
        reasoning_format=settings.reasoning_format,
        tool_format=settings.tool_format,
        limits=grammar.Limits.from_settings(settings),
        protect_messages=settings.special_tokens_in_messages == "text",
        timeout=settings.request_timeout or None,
        slots_per_request=slots_per_request(settings),
    )
    service = Service(engine, options, prepare_timeout=settings.prepare_timeout)
    app.extensions["vertex_gguf"] = service
    app.extensions["vertex_gguf_settings"] = settings
    gevent.spawn(service.warm)
    api.register(app, settings, service)
    routes.register(app, settings.health_route)
    return app
