"""Runs the app under gunicorn (gevent worker) with settings already parsed."""

from __future__ import annotations

import logging
from typing import Any

from gunicorn.app.base import BaseApplication

from app.base import cxx_runtime
from app.base.boot import Boot
from app.edge import auth
from app.process.crash_guard import CrashGuard, apply_safe_mode, apply_safe_mode_to_models
from app.process.gunicorn_conf import exit_worker_on_load_failure, options
from app.settings import Settings

log = logging.getLogger(__name__)


class Server(BaseApplication):
    def __init__(self, settings: Settings, catalog: Any = None):
        self.settings = settings
        self.catalog = catalog  # several models (app.model.catalog), or None: MODEL alone
        # in the master: its workers' deaths (a forked worker reads what it inherits)
        self.guard = CrashGuard.from_settings(settings)
        super().__init__()

    def load_config(self) -> None:
        for key, value in options(self.settings, self.guard).items():
            if value is not None:
                self.cfg.set(key, value)

    def load(self) -> Any:
        # Runs in the worker after fork and after gevent's monkey-patching.
        from app import create_app

        boot = self.guard.start_worker()
        settings = apply_safe_mode(self.settings, boot)
        if self.catalog is not None:
            return create_app(settings, engine=self.make_engine(settings, boot),
                              on_fatal=exit_worker_on_load_failure, boot=boot,
                              catalog=apply_safe_mode_to_models(self.catalog, boot))
        return create_app(settings, engine=self.make_engine(settings, boot),
                          on_fatal=exit_worker_on_load_failure, boot=boot)

    def make_engine(self, settings: Settings, boot: Boot) -> Any:
        """The engine (None: create_app's llama.cpp engine); tests put a crashing one here."""
        return None


def serve(settings: Settings, catalog: Any = None) -> None:
    """Run the server; ``catalog``: several models (app.model.catalog), None: MODEL alone."""
    s = settings
    try:
        auth.load_keys(s)  # a bad key file stops the server here, before it binds
    except ValueError as exc:
        raise SystemExit(f"vertex-gguf: {exc}") from None
    log.info(
        "vertex-gguf starting on %s:%d (health %s, predict %s, model %s)",
        s.host, s.port, s.health_route, s.predict_route, s.model or "default",
    )
    log.info("%s", cxx_runtime.runtime().line())  # pinned by app/__init__ (docs/crashes.md)
    if s.aip_mode:
        log.info(
            "Vertex AI: AIP_MODE=%s endpoint=%s deployed_model=%s",
            s.aip_mode, s.aip_endpoint_id, s.aip_deployed_model_id,
        )
    if catalog is not None:
        log.info("serving %d models (default %s, preloaded: %s, at most %s loaded)",
                 len(catalog.models), catalog.default,
                 ", ".join(m.name for m in catalog.models if m.preload) or "none",
                 catalog.max_loaded or "any number")
    Server(settings, catalog).run()
