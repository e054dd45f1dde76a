"""Gunicorn configuration for the server: one gevent worker, so the model is loaded once.

``options(settings)`` is what ``vertex-gguf`` runs with. The module also works as a plain
gunicorn config file (``gunicorn -c python:app.gunicorn_conf app.wsgi:app``): it then reads the
same Settings from the environment.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import time
from typing import Any

import gevent
from gunicorn.workers.ggevent import GeventWorker

from app import logs
from app.crash_guard import EXIT_CODE, CrashGuard
from app.settings import Settings

# gunicorn's arbiter halts the whole server (exit code 4) when a worker exits with this code:
# a model that cannot load must fail the deployment, not leave it answering 503 for ever.
APP_LOAD_ERROR = EXIT_CODE
# seconds before the graceful timeout ends at which requests still running are ended with an
# error (their streams get an error event), so the worker exits before it is killed
GRACE_MARGIN = 1.5


class DrainingGeventWorker(GeventWorker):
    """gunicorn's gevent worker, but a SIGTERM drain ends when the last request in flight ends.

    The stock worker waits until every connection is closed, so one idle keep-alive connection
    (every load balancer holds some) keeps a stopping worker alive for the whole graceful timeout.
    Here a request in flight is what counts: when none is left, the worker quits at once.
    """

    in_flight = 0
    client_timeout: float | None = None  # set from CLIENT_TIMEOUT (see options)
    _quitting = False

    def handle_request(self, listener_name, req, sock, addr):
        if self.client_timeout:
            # a client that stops reading (or sending) is cut after this long, not held forever
            sock.settimeout(self.client_timeout)
        self.in_flight += 1
        try:
            return super().handle_request(listener_name, req, sock, addr)
        finally:
            self.in_flight -= 1
            if not self.alive and not self._busy():
                self._quit()

    def handle_exit(self, sig, frame):
        super().handle_exit(sig, frame)
        service = _service(self)
        if service is not None:
            # new requests on kept-alive connections get a 503 the load balancer retries
            # elsewhere; whatever still runs near the end of the graceful timeout is ended with
            # an error event, not cut mid-stream by the worker's exit
            service.engine.drain()
            grace = max(0.0, self.cfg.graceful_timeout - GRACE_MARGIN)
            gevent.spawn_later(grace, service.engine.abort, "server is shutting down")
        if not self._busy():
            self._quit()
        else:
            gevent.spawn(self._quit_when_idle)

    def _busy(self) -> bool:
        """A request in flight, or a resumable stream still generating with no request on it
        (its client went away: it runs on into its session, and ends before the worker)."""
        hub = _streams(self)
        return self.in_flight > 0 or (hub is not None and hub.live() > 0)

    def _quit_when_idle(self) -> None:
        deadline = time.monotonic() + self.cfg.graceful_timeout
        while self._busy() and time.monotonic() < deadline:
            gevent.sleep(0.1)
        self._quit()

    def _quit(self) -> None:
        # the worker's own SIGQUIT handler exits cleanly (worker_exit still runs)
        if not self._quitting:
            self._quitting = True
            os.kill(os.getpid(), signal.SIGQUIT)


def bind_address(settings: Settings) -> str:
    host = settings.host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{settings.port}"


def _extension(worker: Any, name: str) -> Any:
    """The worker's app's ``extensions[name]`` (None before the app is loaded)."""
    app = getattr(worker, "wsgi", None)
    return getattr(app, "extensions", {}).get(name) if app else None


def _service(worker: Any) -> Any:
    return _extension(worker, "vertex_gguf")


def _streams(worker: Any) -> Any:
    return _extension(worker, "vertex_gguf_streams")


def worker_exit(guard: CrashGuard, server: Any, worker: Any) -> None:
    """Stop the engine thread and free the model before the worker process ends (a clean exit:
    the crash guard counts no death, whatever happens during the teardown)."""
    guard.worker_exit()
    hub = _streams(worker)
    if hub is not None:
        hub.close()
    service = _service(worker)
    if service is not None:
        service.engine.shutdown()


def exit_worker_on_load_failure(message: str) -> None:
    """Called from the engine thread when the model cannot load."""
    time.sleep(0.5)  # let health and /models/sse watchers see the failure
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(APP_LOAD_ERROR)


def options(settings: Settings, guard: CrashGuard | None = None) -> dict[str, Any]:
    """gunicorn's configuration; ``guard`` is the master's crash guard (app.crash_guard), whose
    hooks see every worker forked and every worker gone."""
    DrainingGeventWorker.client_timeout = settings.client_timeout
    guard = guard or CrashGuard.from_settings(settings)
    return {
        "bind": [bind_address(settings)],
        "workers": 1,
        "worker_class": "app.gunicorn_conf.DrainingGeventWorker",
        "worker_connections": settings.worker_connections,
        "graceful_timeout": math.ceil(settings.graceful_timeout),
        "timeout": 120,
        "keepalive": 75,
        "loglevel": settings.log_level,
        # gunicorn's own lines through the app's formatter (LOG_FORMAT), to stderr
        "logconfig_dict": logs.logconfig(settings),
        "accesslog": None,  # app.logs writes the access line (path only, never a query string)
        "preload_app": False,
        "worker_exit": lambda server, worker: worker_exit(guard, server, worker),
        "pre_fork": lambda server, worker: guard.before_fork(worker),
        # a worker gone while the master is stopping (no listeners left) is no crash loop
        "child_exit": lambda server, worker: guard.child_exit(worker, not server.LISTENERS),
        "on_exit": lambda server: guard.exiting(),
        "proc_name": "vertex-gguf",
        # gunicorn 27 opens a control socket under $HOME by default: not wanted in a container.
        "control_socket_disable": True,
    }


_module_options: dict[str, Any] = {}
_module_guard: list[CrashGuard] = []


def shared_guard(settings: Settings) -> CrashGuard:
    """The crash guard of ``gunicorn -c python:app.gunicorn_conf`` (one per master; a worker
    forked from it finds its own records in it: app.wsgi)."""
    if not _module_guard:
        _module_guard.append(CrashGuard.from_settings(settings))
    return _module_guard[0]


def __getattr__(name: str) -> Any:
    """Module-level config values for ``gunicorn -c python:app.gunicorn_conf``."""
    if not _module_options:
        settings = Settings()
        _module_options.update(options(settings, shared_guard(settings)))
    if name in _module_options:
        return _module_options[name]
    raise AttributeError(name)
