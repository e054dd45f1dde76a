"""Which model serves a request, and for how long it is held: the seam between the APIs and
whatever keeps models loaded.

Every API asks :meth:`Models.lease` for the model its request names (None: the default) before
it parses, and releases the lease when the request stops using the model: a whole answer
rendered, a stream ended however it ended, an embedding or rerank call done. A pool of models
(loading on demand, evicting idle ones, ``keep_alive``) counts its users by these leases, so it
never unloads a model a request still reads from. :class:`OneModel` is today's server: one
model, always loaded, and every lease is it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from types import TracebackType

from app.core.service import Service


class ModelLease:
    """One request's hold on a loaded model: ``service`` runs it until :meth:`release`, which
    may be called any number of times and lets go once (a stream's end and its client's
    hang-up can both reach it). A context manager: the block holds the model."""

    def __init__(self, service: Service, on_release: Callable[[], None] | None = None):
        self.service = service
        self._on_release = on_release
        self.released = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        if self._on_release is not None:
            self._on_release()

    def __enter__(self) -> ModelLease:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


class Models(ABC):
    """The models a server serves, as the APIs see them."""

    @property
    @abstractmethod
    def default_service(self) -> Service:
        """The service of the routes that name no model (/props, /health, the model cards,
        the introspection routes)."""

    @abstractmethod
    def lease(self, name: str | None, keep_alive: float | None = None) -> ModelLease:
        """Hold the model ``name`` names (None: the default one) for one request. Raises a
        ServiceError the calling API renders in its own shape: ModelNotFound (404) for a name
        no model answers to, naming the models there are; an Unavailable with ``retry_after``
        (503) when the model cannot be loaded now. ``keep_alive``: seconds the model stays
        loaded after this request (Ollama's field; 0: unload after it, inf: never), None: the
        model's own setting."""


class OneModel(Models):
    """One model, loaded at start and never unloaded: every name leases it (a name that is
    none of its aliases is the Service's to refuse, under STRICT_MODEL_NAME, as before), and a
    release does nothing."""

    def __init__(self, service: Service):
        self._service = service

    @property
    def default_service(self) -> Service:
        return self._service

    def lease(self, name: str | None, keep_alive: float | None = None) -> ModelLease:
        return ModelLease(self._service)
