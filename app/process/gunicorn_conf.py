"""Gunicorn configuration for the server: one gevent worker, so the model is loaded once.

``options(settings)`` is what ``vertex-gguf`` runs with. The module also works as a plain
gunicorn config file (``gunicorn -c python:app.process.gunicorn_conf app.process.wsgi:app``): it then reads the
same Settings from the environment.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from typing import Any

from app.edge import logs
from app.process.crash_guard import EXIT_CODE, CrashGuard
from app.process.worker import DrainingGeventWorker, pool_of, service_of, streams_of
from app.settings import Settings

# gunicorn's arbiter halts the whole server (exit code 4) when a worker exits with this code:
# a model that cannot load must fail the deployment, not leave it answering 503 for ever.
APP_LOAD_ERROR = EXIT_CODE


def bind_address(settings: Settings) -> str:
    host = settings.host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{settings.port}"


def worker_exit(guard: CrashGuard, server: Any, worker: Any) -> None:
    """Stop the engine thread and free the model before the worker process ends (a clean exit:
    the crash guard counts no death, whatever happens during the teardown)."""
    guard.worker_exit()
    hub = streams_of(worker)
    if hub is not None:
        hub.close()
    pool = pool_of(worker)
    if pool is not None:  # several models: the sweeper stopped, every engine process ended
        pool.shutdown()
        return
    service = service_of(worker)
    if service is not None:
        service.engine.shutdown()


def request_ended(guard: CrashGuard, worker: Any, req: Any) -> None:
    """A request's end, in the crash guard's record, with the generations requests left running:
    resumable streams whose client left, and work the engine still holds (a cancelled stream
    unwinds at its next step). A death while one runs followed requests too."""
    hub = streams_of(worker)
    service = service_of(worker)
    left = hub.live() if hub is not None else 0
    if service is not None:
        stats = service.engine.stats()
        left = max(left, int(stats.get("running", 0)) + int(stats.get("waiting", 0)))
    guard.request_ended(req, left)


def exit_worker_on_load_failure(message: str) -> None:
    """Called from the engine thread when the model cannot load."""
    time.sleep(0.5)  # let health and /models/sse watchers see the failure
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(APP_LOAD_ERROR)


def options(settings: Settings, guard: CrashGuard | None = None) -> dict[str, Any]:
    """gunicorn's configuration; ``guard`` is the master's crash guard (app.process.crash_guard), whose
    hooks see every worker forked and every worker gone."""
    DrainingGeventWorker.client_timeout = settings.client_timeout
    DrainingGeventWorker.header_timeout = settings.header_timeout
    guard = guard or CrashGuard.from_settings(settings)
    return {
        "bind": [bind_address(settings)],
        "workers": 1,
        "worker_class": "app.process.worker.DrainingGeventWorker",
        "worker_connections": settings.worker_connections,
        "graceful_timeout": math.ceil(settings.graceful_timeout),
        "timeout": 120,
        "keepalive": 75,
        "loglevel": settings.log_level,
        # gunicorn's own lines through the app's formatter (LOG_FORMAT), to stderr
        "logconfig_dict": logs.logconfig(settings),
        "accesslog": None,  # app.edge.logs writes the access line (path only, never a query string)
        "preload_app": False,
        "worker_exit": lambda server, worker: worker_exit(guard, server, worker),
        "pre_fork": lambda server, worker: guard.before_fork(worker),
        # a worker gone while the master is stopping (no listeners left) is no crash loop
        "child_exit": lambda server, worker: guard.child_exit(worker, not server.LISTENERS),
        "on_exit": lambda server: guard.exiting(),
        # the requests in flight, so the guard tells a request's crash from a broken model's
        "pre_request": lambda worker, req: guard.request_started(req),
        "post_request": lambda worker, req, environ, resp: request_ended(guard, worker, req),
        "proc_name": "vertex-gguf",
        # gunicorn 27 opens a control socket under $HOME by default: not wanted in a container.
        "control_socket_disable": True,
    }


_module_options: dict[str, Any] = {}
_module_guard: list[CrashGuard] = []


def shared_guard(settings: Settings) -> CrashGuard:
    """The crash guard of ``gunicorn -c python:app.process.gunicorn_conf`` (one per master; a worker
    forked from it finds its own records in it: app.process.wsgi)."""
    if not _module_guard:
        _module_guard.append(CrashGuard.from_settings(settings))
    return _module_guard[0]


def __getattr__(name: str) -> Any:
    """Module-level config values for ``gunicorn -c python:app.process.gunicorn_conf``."""
    if not _module_options:
        settings = Settings()
        _module_options.update(options(settings, shared_guard(settings)))
    if name in _module_options:
        return _module_options[name]
    raise AttributeError(name)
