"""The settings as people read them: each field's flag, env vars, default and bounds in words,
for the command line's help and docs/configuration.md's table (a test keeps it in step). The table
itself is app.settings; this only renders it."""

from __future__ import annotations

from pydantic import AliasChoices
from pydantic.fields import FieldInfo

from app.settings import Settings


def env_names(info: FieldInfo) -> list[str]:
    """The env vars a field reads, in priority order."""
    alias = info.validation_alias
    assert isinstance(alias, AliasChoices)
    return [str(c) for c in alias.choices]


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def default_text(info: FieldInfo) -> str:
    extra = info.json_schema_extra
    if isinstance(extra, dict) and "default_label" in extra:
        return str(extra["default_label"])
    if info.default is None:
        return "(none)"
    if isinstance(info.default, bool):
        return "true" if info.default else "false"
    return str(info.default)


def bounds_text(info: FieldInfo) -> str:
    """The constraints of a field, in words for the help and the docs."""
    parts: list[str] = []
    for meta in info.metadata:
        for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            val = getattr(meta, attr, None)
            if val is not None:
                parts.append(f"{sym} {val}")
        for attr in ("min_length", "max_length"):
            val = getattr(meta, attr, None)
            if val is not None:
                parts.append(f"{attr.replace('_', ' ')} {val}")
        if getattr(meta, "pattern", None):
            parts.append(f"matches `{meta.pattern}`")
    args = getattr(info.annotation, "__args__", ())
    if args and all(isinstance(a, str) for a in args):
        parts.append("one of " + ", ".join(args))
    return "; ".join(parts) or "-"


def settings_table() -> str:
    """docs/configuration.md's settings table, generated from the class (a test keeps them in step)."""
    rows = [
        "| setting | flag | env var(s) | default | bounds | description |",
        "|---|---|---|---|---|---|",
    ]
    for name, info in Settings.model_fields.items():
        envs = ", ".join(f"`{e.upper()}`" for e in env_names(info))
        rows.append(
            f"| {name} | `{flag_name(name)}` | {envs} | `{default_text(info)}` | "
            f"{bounds_text(info)} | {info.description} |"
        )
    return "\n".join(rows)
