"""What a catalog is: the models a container serves, each with its own settings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from app.settings import Settings


class CatalogError(ValueError):
    """A configuration that names no servable set of models; the message says which setting,
    file, section or key is at fault, and why."""


@dataclass(frozen=True)
class ModelSpec:
    """One model as the server would serve it.

    ``settings`` is the whole Settings of this model, validated by the Settings class: the
    base (env vars and flags) with the preset's ``[*]`` and own section applied, ``model`` set
    to ``source`` and ``served_model_name`` to the name and aliases, so a single-model server
    given it serves exactly this model.
    """

    name: str
    source: str  # as MODEL takes it: a file (the first shard of a split one) or a folder
    origin: str  # where it was named: MODEL, MODELS, MODELS_DIR <folder>, MODELS_PRESET <file>
    settings: Settings
    files: tuple[str, ...] = ()  # the GGUF files the source resolves to: one, or every shard
    projector: str | None = None  # the vision projector it pairs with, if any
    size: int | None = None  # bytes of ``files``, where listing told them
    aliases: tuple[str, ...] = ()
    pin: bool = False  # never unloaded to make room for another model
    preload: bool = False  # loaded at start; /health waits for it
    keep_alive: float = 300.0  # seconds after its last request before it unloads; inf: never
    preset_keys: tuple[str, ...] = ()  # the preset keys applied to it, as written
    note: str = ""  # a remark for people (the embedded default model not yet fetched)
    # what safe mode changed of ``settings`` (a worker died while loading: app.process
    # .crash_guard); /props and /health say it per model
    safe_mode: dict[str, str] = field(default_factory=dict)

    @property
    def role(self) -> str:
        """What it serves, as its settings say: rerank, embeddings, chat, chat+embeddings, or
        auto (the GGUF's metadata decides at load: an embedding model embeds only)."""
        s = self.settings
        if s.embedding_pooling == "rank":
            return "rerank"
        return {"only": "embeddings", "off": "chat", "on": "chat+embeddings"}.get(
            s.embeddings, "auto")

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


@dataclass(frozen=True)
class Catalog:
    """The models of a container. ``single``: MODEL alone (or the embedded default model) and
    none of the catalog settings, served exactly as before several models existed."""

    base: Settings
    models: tuple[ModelSpec, ...]
    default: str
    max_loaded: int  # MODELS_MAX; 0: no limit
    keep_alive: float  # KEEP_ALIVE, the default of every model
    cache_max_bytes: int | None = None  # MODEL_CACHE_MAX_GB
    single: bool = False
    _by_name: dict[str, ModelSpec] = field(default_factory=dict, init=False, repr=False,
                                           compare=False)

    def __post_init__(self) -> None:
        for spec in self.models:
            for name in spec.names:
                self._by_name[name] = spec
                self._by_name.setdefault(name.lower(), spec)

    def get(self, name: str | None) -> ModelSpec | None:
        """The model a request's ``model`` names: by name or alias, exactly, else ignoring case
        (Ollama's names compare that way); None: the default model."""
        if name is None:
            return self._by_name[self.default]
        return self._by_name.get(name) or self._by_name.get(name.lower())

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.models)

    def in_safe_mode(self, changes_of: Callable[[Settings], dict[str, str]]) -> Catalog:
        """The catalog with what ``changes_of`` says safe mode changes applied to every
        model's own settings (its engine process starts from them) and to the base, each
        model's changes kept on its spec."""
        models = []
        for spec in self.models:
            changes = changes_of(spec.settings)
            models.append(replace(spec, settings=spec.settings.model_copy(update=changes),
                                  safe_mode=changes) if changes else spec)
        base = self.base.model_copy(update=changes_of(self.base))
        return replace(self, base=base, models=tuple(models))
