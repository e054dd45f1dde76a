"""The one typed configuration object.

Every setting ``foo_bar`` is the flag ``--foo-bar`` and the env var ``FOO_BAR``; the platform
variables (``AIP_*`` from Vertex AI, ``PORT`` from Cloud Run) are read under the names the
platforms give them. Flags win over env vars. Settings are read once, at start-up, into a frozen
object that is passed down; nothing else reads the environment. The class is made of one part
per consumer, each in its own file beside this one; the values resolved from several settings
are here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from pydantic_settings import BaseSettings, SettingsConfigDict

from app.settings.fields import DEFAULT_CACHE_DIR, UNQUANTIZED_KV, KvCacheType, ToolFormatName
from app.settings.inputs import InputSettings
from app.settings.limits import LimitSettings
from app.settings.llama import LlamaSettings
from app.settings.model import ModelSettings, lora_entries
from app.settings.models import CatalogSettings
from app.settings.serving import ServingSettings

__all__ = ["DEFAULT_CACHE_DIR", "UNQUANTIZED_KV", "KvCacheType", "Settings", "ToolFormatName",
           "lora_entries"]

C = TypeVar("C")


# Each part is one consumer's settings (its own file); pydantic takes the fields of the bases
# last to first, so the parts stand here in reverse: the model's come first in help and docs,
# then the several models' (MODELS, MODELS_DIR, ...: docs/models.md).
class Settings(LimitSettings, ServingSettings, InputSettings, LlamaSettings, CatalogSettings,
               ModelSettings, BaseSettings):
    """Server configuration: model, llama.cpp, HTTP and Vertex AI contract."""

    model_config = SettingsConfigDict(
        frozen=True,
        populate_by_name=True,
        case_sensitive=False,
        extra="ignore",
        env_ignore_empty=True,
    )


def max_tokens_default(settings: Settings) -> int | None:
    """The limit of a request that names none: DEFAULT_MAX_TOKENS, else MAX_TOKENS_LIMIT, else
    None (to the end of the context)."""
    return settings.default_max_tokens or settings.max_tokens_limit or None


def max_tokens_bounds(settings: Settings) -> tuple[int | None, int | None]:
    """(the limit of a request that names none, the most a request may ask for), as /props
    and /v1/models show them; None: the end of the context."""
    return max_tokens_default(settings), settings.max_tokens_limit or None


def slots_per_request(settings: Settings) -> int:
    """SLOTS_PER_REQUEST, resolved (0 means half the slots)."""
    return settings.slots_per_request or max(1, settings.parallel // 2)


def stream_max_live(settings: Settings) -> int:
    """STREAM_MAX_LIVE_PER_KEY, resolved (0 means half the slots)."""
    return settings.stream_max_live_per_key or max(1, settings.parallel // 2)


def name_list(value: str | None) -> tuple[str, ...]:
    """SERVED_MODEL_NAME or MODEL_TAGS as its names (the validator has normalized it)."""
    return tuple(value.split(",")) if value else ()


def api_key_configured(settings: Settings) -> bool:
    """Whether the server requires an API key (API_KEY or API_KEY_FILE set: a file without a
    key stops the server at start, so a configured file always means keys)."""
    return settings.api_key is not None or settings.api_key_file is not None


def log_json(settings: Settings) -> bool:
    """LOG_FORMAT, resolved: auto is json on Cloud Run (K_SERVICE) and Vertex AI (AIP_MODE)."""
    if settings.log_format == "auto":
        return bool(settings.k_service or settings.aip_mode)
    return settings.log_format == "json"


def slots_endpoint_on(settings: Settings) -> bool:
    """SLOTS_ENDPOINT, resolved: auto is on unless an API key is configured (/slots shows
    how long the prompts in flight are)."""
    if settings.slots_endpoint == "auto":
        return not api_key_configured(settings)
    return settings.slots_endpoint == "on"


def setting_default(name: str) -> Any:
    """Setting ``name``'s default, as a consumer's dataclass field default: the default lives
    here only, so a config built without settings (tests, benches) cannot drift from it."""
    return Settings.model_fields[name].default


def from_settings(cls: type[C], settings: Settings, **derived: Any) -> C:
    """Dataclass ``cls`` with each field taken from the setting of the same name (vLLM's
    ``from_cli_args`` move), so no consumer copies settings by hand; ``derived`` gives the
    fields computed from settings (a file's text, a resolved value). A field that is neither a
    setting nor derived is an error, not a silent default."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in derived:
            continue
        if f.name not in Settings.model_fields:
            raise TypeError(f"{cls.__name__}.{f.name} is not a setting: pass it as derived")
        values[f.name] = getattr(settings, f.name)
    return cls(**values, **derived)
