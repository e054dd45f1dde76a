"""Gunicorn configuration for the server: one gevent worker, so the model is loaded once.

``options(settings)`` is what ``vertex-gguf`` runs with. The module also works as a plain
gunicorn config file (``gunicorn -c python:app.gunicorn_conf app.wsgi:app``): it then reads the
same Settings from the environment.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from typing import Any

from app.settings import Settings

# gunicorn's arbiter halts the whole server (exit code 4) when a worker exits with this code:
# a model that cannot load must fail the deployment, not leave it answering 503 for ever.
APP_LOAD_ERROR = 4


def bind_address(settings: Settings) -> str:
    host = settings.host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{settings.port}"


def worker_exit(server: Any, worker: Any) -> None:
    """Stop the engine thread and free the model before the worker process ends."""
    app = getattr(worker, "wsgi", None)
    service = getattr(app, "extensions", {}).get("vertex_gguf") if app else None
    if service is not None:
        service.engine.shutdown()


def exit_worker_on_load_failure(message: str) -> None:
    """Called from the engine thread when the model cannot load."""
    time.sleep(0.5)  # let health and /models/sse watchers see the failure
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(APP_LOAD_ERROR)


def options(settings: Settings) -> dict[str, Any]:
    return {
        "bind": [bind_address(settings)],
        "workers": 1,
        "worker_class": "gevent",
        "worker_connections": settings.worker_connections,
        "graceful_timeout": math.ceil(settings.graceful_timeout),
        "timeout": 120,
        "keepalive": 75,
        "loglevel": settings.log_level,
        "accesslog": "-" if settings.log_level == "debug" else None,
        "preload_app": False,
        "worker_exit": worker_exit,
        "proc_name": "vertex-gguf",
        # gunicorn 27 opens a control socket under $HOME by default: not wanted in a container.
        "control_socket_disable": True,
    }


def __getattr__(name: str) -> Any:
    """Module-level config values for ``gunicorn -c python:app.gunicorn_conf``."""
    opts = options(Settings())
    if name in opts:
        return opts[name]
    raise AttributeError(name)
