"""The catalog as ``vertex-gguf models`` prints it: each model, where it comes from, and the
settings in which it differs from the base (the env vars and flags every model starts from)."""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices

from app.model.catalog.spec import Catalog, ModelSpec
from app.settings import Settings
from app.settings.models import keep_alive_text

# shown on their own lines, or the same for every model by construction
_NOT_DIFFS = {"model", "served_model_name", "mmproj", "keep_alive"}


def _env(name: str) -> str:
    alias = Settings.model_fields[name].validation_alias
    return str(alias.choices[0]).upper() if isinstance(alias, AliasChoices) else name.upper()


def _value(settings: Settings, name: str) -> str:
    info = Settings.model_fields[name]
    value: Any = getattr(settings, name)
    if not info.repr and value is not None:
        return "(set)"  # a secret is never shown
    if value is None:
        return "(none)"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def differences(spec: ModelSpec, base: Settings) -> list[str]:
    """``ENV=value (base: value)`` for each setting this model has of its own."""
    out = []
    for name in Settings.model_fields:
        if name in _NOT_DIFFS:
            continue
        mine, theirs = getattr(spec.settings, name), getattr(base, name)
        if mine != theirs:
            out.append(f"{_env(name)}={_value(spec.settings, name)} "
                       f"(base: {_value(base, name)})")
    return out


def _size(size: int | None) -> str:
    if not size:
        return ""
    if size >= 10**8:
        return f" ({size / 1e9:.2f} GB)"
    return f" ({size / 1e6:.1f} MB)" if size >= 10**5 else f" ({size} bytes)"


def render(catalog: Catalog) -> str:
    """The text ``vertex-gguf models`` prints."""
    lines: list[str] = []
    if catalog.single:
        lines.append("1 model: MODEL alone, served as ever (loaded at start; SLEEP_IDLE_SECONDS "
                     "frees it when idle)")
    else:
        most = "no limit" if catalog.max_loaded == 0 else str(catalog.max_loaded)
        cache = ("no bound" if catalog.cache_max_bytes is None
                 else f"{catalog.cache_max_bytes / 1e9:g} GB")
        lines.append(f"{len(catalog.models)} model{'s' * (len(catalog.models) != 1)}: default "
                     f"{catalog.default}; at most {most} loaded at once (MODELS_MAX); "
                     f"KEEP_ALIVE {keep_alive_text(catalog.keep_alive)}; download cache "
                     f"{cache} (MODEL_CACHE_MAX_GB)")
    for spec in catalog.models:
        lines.append("")
        marks = [m for m, on in (("default", spec.name == catalog.default),
                                 ("preload", spec.preload and not catalog.single),
                                 ("pin", spec.pin and not catalog.single)) if on]
        lines.append(f"{spec.name}" + (f"  [{', '.join(marks)}]" if marks else ""))
        lines.append(f"  from:       {spec.origin}" + (f" ({spec.note})" if spec.note else ""))
        lines.append(f"  source:     {spec.source}")
        if len(spec.files) > 1:
            lines.append(f"  shards:     {len(spec.files)}{_size(spec.size)}")
            lines += [f"              {f}" for f in spec.files]
        elif spec.files and spec.files[0] != spec.source:
            lines.append(f"  file:       {spec.files[0]}{_size(spec.size)}")
        elif spec.size:
            lines.append(f"  size:       {_size(spec.size).strip(' ()')}")
        lines.append(f"  projector:  {spec.projector or '(none)'}")
        if spec.aliases:
            lines.append(f"  aliases:    {', '.join(spec.aliases)}")
        lines.append(f"  role:       {spec.role}")
        if not catalog.single:
            lines.append(f"  keep_alive: {keep_alive_text(spec.keep_alive)}")
        if spec.preset_keys:
            lines.append(f"  preset:     {', '.join(spec.preset_keys)}")
        diffs = [] if catalog.single else differences(spec, catalog.base)
        lines += [f"  setting:    {d}" for d in diffs]
    return "\n".join(lines)
