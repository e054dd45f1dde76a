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
from dataclasses import dataclass
from types import TracebackType

from app.base.errors import NotSupported
from app.core.pool import ModelStatus
from app.core.service import Service
from app.engine.types import ModelInfo


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


@dataclass(frozen=True)
class Listed:
    """A model of a pool as the listings show it (/v1/models, /api/tags, /api/ps): its pool
    status, and its ModelInfo while an engine has one. ``expires_at``: wall-clock seconds when
    idleness unloads it (None: not expiring)."""

    name: str
    aliases: tuple[str, ...]
    status: ModelStatus
    info: ModelInfo | None
    size: int | None  # bytes of its files, where the catalog's listing told them
    path: str
    expires_at: float | None


class Models(ABC):
    """The models a server serves, as the APIs see them."""

    pooled = False  # several models loaded on demand (listing, load and unload answer)

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

    def listing(self) -> list[Listed]:
        """Every model with its status (a pool's); one model has no such list."""
        raise NotSupported("this server serves one model")

    def load(self, name: str | None, keep_alive: float | None = None) -> str:
        """Load the model now (llama-server's POST /models/load, Ollama's empty generate)."""
        raise NotSupported("this server serves one model, always loaded")

    def unload(self, name: str | None) -> str:
        """Unload the model (POST /models/unload, Ollama's keep_alive 0)."""
        raise NotSupported("this server serves one model, always loaded")

    def canonical(self, name: str | None) -> str | None:
        """The name of the model ``name`` names (None: no such model)."""
        return name


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
