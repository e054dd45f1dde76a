"""MODELS_PRESET: per-model settings in an INI file, in llama-server's --models-preset format
(common/preset.cpp): a ``[section]`` per model, a ``[*]`` section whose keys every model takes
first, ``key = value`` lines, ``;`` and ``#`` comments (anywhere: a value cannot hold them),
``version = 1`` read and ignored.

A key is one of this server's settings, spelled as its env var, its flag or its field
(``CTX_SIZE``, ``ctx-size``, ``ctx_size``: any case), a bool one also as ``no-<flag>``; or one
of llama-server's own names for the same setting (``c``, ``ngl``, ``temp``...: LLAMA_KEYS); or a
key of the model itself: ``model`` (its source), ``aliases``, ``pin``, ``preload``
(llama-server's ``load-on-startup``). Anything else stops the server, naming the file, the
section and the key; so does a key set twice, and a setting that cannot differ per model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import AliasChoices

from app.model.catalog.spec import CatalogError
from app.settings import Settings
from app.settings.models import CATALOG_FIELDS
from app.settings.serving import ServingSettings

GLOBAL = "*"
# llama-server's preset keys (its flags without dashes, short forms included) that mean what
# one of this server's settings means, normalized as keys are (lower case, "-" as "_")
LLAMA_KEYS = {
    "c": "ctx_size", "ngl": "gpu_layers", "n_gpu_layers": "gpu_layers", "np": "parallel",
    "b": "batch_size", "ub": "n_ubatch", "ubatch_size": "n_ubatch", "fa": "flash_attn",
    "ctk": "kv_cache_type_k", "cache_type_k": "kv_cache_type_k", "ctv": "kv_cache_type_v",
    "cache_type_v": "kv_cache_type_v", "t": "threads", "tb": "threads_batch",
    "sm": "split_mode", "ts": "tensor_split", "mg": "main_gpu", "ot": "override_tensor",
    "cmoe": "cpu_moe", "ncmoe": "n_cpu_moe", "md": "draft_model", "model_draft": "draft_model",
    "spec_draft_model": "draft_model", "draft_max": "spec_draft_max",
    "spec_draft_n_max": "spec_draft_max", "draft_min": "spec_draft_min",
    "spec_draft_n_min": "spec_draft_min", "draft_p_min": "spec_p_min",
    "spec_draft_p_min": "spec_p_min", "temp": "default_temperature",
    "temperature": "default_temperature", "top_k": "default_top_k", "top_p": "default_top_p",
    "min_p": "default_min_p", "chat_template_file": "chat_template", "tags": "model_tags",
    "pooling": "embedding_pooling",
}
# keys of the model itself, not settings
MODEL_KEYS = {"model": "model", "m": "model", "aliases": "aliases", "alias": "aliases",
              "pin": "pin", "preload": "preload", "load_on_startup": "preload"}

_SHARED = "shared by every model: set it as an env var or a flag"
SERVER_WIDE: dict[str, str] = {
    **{f: f"the HTTP server's, {_SHARED}" for f in ServingSettings.model_fields},
    **{f: f"the catalog's own, {_SHARED}" for f in CATALOG_FIELDS if f != "keep_alive"},
    **{f: f"the download cache's, {_SHARED}" for f in (
        "model_cache_dir", "download_workers", "download_slice_mb", "storage_emulator_host")},
    **{f: f"the HTTP server's, {_SHARED}" for f in (
        "admin_api_key", "slots_endpoint", "strict_model_name")},
    **{f: f"read before a request's model is known, {_SHARED}" for f in (
        "max_json_depth", "body_timeout", "header_timeout", "client_timeout")},
    # also each request's cap on its n choices: one value, so the envelope's and n's agree
    "slots_per_request": "read before a request's model is known (a Vertex envelope's "
                         f"instances, which may name several models, run under it), {_SHARED}",
    **{f: f"where images may come from and the memory decoding them takes, {_SHARED}" for f in (
        "image_buckets", "image_url_hosts", "image_url_networks", "image_fetch_timeout",
        "image_decode_budget")},
    "watchdog_seconds": f"the container's health, {_SHARED}",
    **{f: "set by Vertex AI for the container" for f in (
        "aip_mode", "aip_deployed_model_id", "aip_endpoint_id")},
    "served_model_name": "a model's names are its section's name and its aliases key",
}
TRUE = {"true", "1", "on", "enabled", "yes"}  # llama.cpp's truthy words, and pydantic's
FALSE = {"false", "0", "off", "disabled", "no"}


def _key_table() -> dict[str, str]:
    """Every spelling of every setting, normalized, to its field name."""
    out: dict[str, str] = dict(LLAMA_KEYS)
    for name, info in Settings.model_fields.items():
        out[name] = name
        alias = info.validation_alias
        for env in alias.choices if isinstance(alias, AliasChoices) else ():
            out.setdefault(str(env).lower(), name)
    return out


KEYS = _key_table()
BOOLS = {n for n, i in Settings.model_fields.items() if i.annotation is bool}


@dataclass
class Section:
    """One section: each setting it gives (a field name: its value and the key as written)."""

    name: str
    line: int
    values: dict[str, Any] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)  # field or model key -> key as written
    lines: dict[str, int] = field(default_factory=dict)
    source: str | None = None
    aliases: tuple[str, ...] = ()
    pin: bool | None = None
    preload: bool | None = None


@dataclass
class Preset:
    path: str
    star: Section | None
    sections: list[Section]

    def where(self, section: Section, key: str | None = None) -> str:
        """A place in the file, as every message names it."""
        place = f"MODELS_PRESET {self.path}, section [{section.name}]"
        if key is None:
            return place
        return f"{place}, key {section.keys.get(key, key)} (line {section.lines.get(key)})"


_HEADER = re.compile(r"[ \t]*\[[ \t]*([^\]]*?)[ \t]*\][ \t]*(?:[;#].*)?")
_KEY_LINE = re.compile(r"[ \t]*([A-Za-z_][A-Za-z0-9_.-]*)[ \t]*=[ \t]*(.*)")
_VALUE = re.compile(r"(?:(?![ \t]*(?:[;#]|$)).)*")  # up to a comment or the end, blanks dropped
_SKIP = re.compile(r"[ \t]*(?:[;#].*)?")


def read(path: Path) -> Preset:
    """The file, parsed and every key resolved; CatalogError naming the line at fault."""
    shown = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CatalogError(f"MODELS_PRESET {shown}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(f"MODELS_PRESET {shown}: cannot be read: {exc}") from None
    preset = Preset(shown, None, [])
    current: Section | None = None
    seen: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if _SKIP.fullmatch(line):
            continue
        if m := _HEADER.fullmatch(line):
            name = m.group(1)
            if name in seen:
                raise CatalogError(f"MODELS_PRESET {shown}, line {n}: section [{name}] again "
                                   f"(first on line {seen[name]}): one section per model")
            seen[name] = n
            current = Section(name, n)
            if name == GLOBAL:
                preset.star = current
            else:
                preset.sections.append(current)
            continue
        m = _KEY_LINE.fullmatch(line)
        if not m:
            raise CatalogError(f"MODELS_PRESET {shown}, line {n}: neither [section], key = "
                               f"value nor a comment: {line.strip()[:80]!r}")
        key, value = m.group(1), _VALUE.match(m.group(2)).group(0)
        if key.lower() == "version":  # llama-server's, reserved: read and ignored
            continue
        if current is None:
            raise CatalogError(f"MODELS_PRESET {shown}, line {n}: key {key} before any "
                               "[section] (only version = 1 may stand there)")
        _put(preset, current, key, value, n)
    return preset


def _put(preset: Preset, section: Section, key: str, value: str, line: int) -> None:
    norm = key.lower().replace("-", "_")
    target, negate = MODEL_KEYS.get(norm) or KEYS.get(norm), False
    if target is None and norm.startswith("no_") and KEYS.get(norm[3:]) in BOOLS:
        target, negate = KEYS[norm[3:]], True
    where = f"MODELS_PRESET {preset.path}, section [{section.name}], key {key} (line {line})"
    if target is None:
        raise CatalogError(f"{where}: unknown: not a setting of this server (its env var, "
                           "flag or field name), nor model, aliases, pin, preload or keep_alive "
                           "(docs/models.md)")
    if target in section.keys:
        raise CatalogError(f"{where}: sets what key {section.keys[target]} (line "
                           f"{section.lines[target]}) already set")
    if target in SERVER_WIDE:
        raise CatalogError(f"{where}: cannot differ per model: it is {SERVER_WIDE[target]}")
    section.keys[target], section.lines[target] = key, line
    if target in ("pin", "preload") or target in BOOLS:
        flag = _bool(value, where)
        flag = not flag if negate else flag
        if target in ("pin", "preload"):
            setattr(section, target, flag)
        else:
            section.values[target] = flag
    elif target == "model":
        if section.name == GLOBAL:
            raise CatalogError(f"{where}: [*] cannot give a source: it names one model")
        if not value:
            raise CatalogError(f"{where}: empty: a source is a path, file:// or gs:// URI")
        section.source = value
    elif target == "aliases":
        if section.name == GLOBAL:
            raise CatalogError(f"{where}: [*] cannot give aliases: they name one model")
        parts = [p.strip() for p in value.split(",")]
        if any(not p for p in parts):
            raise CatalogError(f"{where}: {value!r}: a comma-separated list with an empty name")
        section.aliases = tuple(dict.fromkeys(parts))
    else:
        section.values[target] = value


def _bool(value: str, where: str) -> bool:
    word = value.strip().lower()
    if word in TRUE or word in FALSE:
        return word in TRUE
    raise CatalogError(f"{where}: {value!r} is not true or false (true, 1, on, enabled / false, "
                       "0, off, disabled)")
