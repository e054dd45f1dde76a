"""Several models in one container: which models (MODELS, MODELS_DIR, MODELS_PRESET), which load
at start and serve requests naming none, how many stay loaded and for how long, and how large the
download cache may grow. One part of app.settings.Settings.

These are read and checked here and by ``vertex-gguf models`` (app/model/catalog/); what needs
the disk or Cloud Storage (a folder's files, the preset file, whether a name is known) is checked
there. The server serves them (app/model/catalog/pooled.py); what is not built yet is refused
(``not_served_yet``), so nothing silently does nothing.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from pydantic import BaseModel, Field, field_validator

from app.settings.fields import env

# A model's name, an alias, an adapter's: safe in a URL path and in an Ollama name
# (``org/name:tag``); the same rule as LORA_ADAPTERS' names, which are model names too.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
NAME_RULE = "letters, digits and ._:/- (starting with a letter or digit, at most 128)"
KEEP_ALIVE_DEFAULT = "5m"  # Ollama's
MODELS_MAX_DEFAULT = 4  # llama-server's --models-max


class CatalogSettings(BaseModel):
    """Which models a container serves, and how they share it."""

    models: str | None = Field(
        None,
        description="Models to serve, comma- or newline-separated name=source: the source as "
        "MODEL takes it (a .gguf path, folder or file:// URI, a gs:// object or folder), the "
        "name what requests call it (letters, digits and ._:/-, e.g. org/name:tag). With MODEL "
        "set too, MODEL's model joins them under its SERVED_MODEL_NAME or file name "
        "(docs/models.md).",
        min_length=1,
        max_length=65536,
        **env("MODELS"),
    )
    models_dir: str | None = Field(
        None,
        description="A local or gs:// folder whose GGUFs are models, as llama-server's "
        "--models-dir: a file is a model named by its file name without .gguf; a sub-folder is "
        "one model named by the folder (its split shards, and an mmproj*.gguf beside it as its "
        "projector). Listed, never downloaded, until a model is loaded.",
        min_length=1,
        max_length=2048,
        **env("MODELS_DIR"),
    )
    models_preset: Path | None = Field(
        None,
        description="An INI file of per-model settings, as llama-server's --models-preset: a "
        "[section] per model, a [*] section for every model; keys are this server's setting "
        "names (CTX_SIZE, ctx-size or ctx_size), model (a source), aliases, pin, preload and "
        "keep_alive. An unknown key stops the server naming the file, section and key.",
        **env("MODELS_PRESET"),
    )
    models_preload: str | None = Field(
        None,
        description="Models loaded at start, comma-separated names; * all of them; none: no "
        "model (each loads on its first request). /health is ready when these are.",
        json_schema_extra={"default_label": "the default model"},
        min_length=1,
        max_length=65536,
        **env("MODELS_PRELOAD"),
    )
    models_default: str | None = Field(
        None,
        description="The model serving requests that name none (or the Vertex AI placeholder).",
        json_schema_extra={"default_label": "MODEL's, else the first"},
        min_length=1,
        max_length=128,
        **env("MODELS_DEFAULT"),
    )
    models_max: int | None = Field(
        None,
        description="Most models loaded at once (llama-server's --models-max); loading one more "
        "unloads the least recently used idle one that is not pinned. 0: no limit.",
        json_schema_extra={"default_label": str(MODELS_MAX_DEFAULT)},
        ge=0,
        le=1024,
        **env("MODELS_MAX"),
    )
    keep_alive: str | None = Field(
        None,
        description="How long a model stays loaded after its last request, in Ollama's syntax "
        "(OLLAMA_KEEP_ALIVE's): a duration (30s, 5m, 1h30m), or a number of seconds; 0 unloads "
        "it after each answer, a negative value keeps it loaded. A preset's keep_alive sets it "
        "per model, a request's keep_alive (Ollama's API) per request.",
        json_schema_extra={"default_label": KEEP_ALIVE_DEFAULT},
        min_length=1,
        max_length=64,
        **env("KEEP_ALIVE"),
    )
    model_cache_max_gb: float | None = Field(
        None,
        description="Most GB (10^9 bytes) the download cache of gs:// models (MODEL_CACHE_DIR) "
        "may hold: before a download, the least recently used cached files that no loaded "
        "model holds are deleted to make room; when the files in use leave none, the load "
        "fails saying what is in use. Unset: no bound.",
        gt=0,
        le=1 << 20,
        **env("MODEL_CACHE_MAX_GB"),
    )

    @field_validator("models")
    @classmethod
    def _model_list(cls, value: str | None) -> str | None:
        model_entries(value)  # raises ValueError naming the bad entry
        return value

    @field_validator("models_preload")
    @classmethod
    def _preload_list(cls, value: str | None) -> str | None:
        preload_names(value)
        return value

    @field_validator("models_default")
    @classmethod
    def _default_name(cls, value: str | None) -> str | None:
        if value is not None:
            check_name(value.strip(), "MODELS_DEFAULT")
            return value.strip()
        return value

    @field_validator("keep_alive")
    @classmethod
    def _keep_alive(cls, value: str | None) -> str | None:
        if value is not None:
            keep_alive_seconds(value)
        return value


CATALOG_FIELDS = tuple(CatalogSettings.model_fields)


def catalog_settings_set(settings: BaseModel) -> list[str]:
    """The env names of the catalog settings given (each is None unless set): any of them means
    the several-models catalog rather than MODEL alone."""
    return [name.upper() for name in CATALOG_FIELDS if getattr(settings, name) is not None]


def not_served_yet(settings: BaseModel) -> str | None:
    """Why the server will not start with these settings (None: it will): what of serving
    several models is not built yet, refused rather than silently ignored."""
    given = catalog_settings_set(settings)
    if not given:
        return None
    if getattr(settings, "engine_process", "auto") == "off":
        return (f"ENGINE_PROCESS=off with {', '.join(given)}: several models each run in an "
                "engine process of their own (one model's crash must not end the others'); "
                "leave ENGINE_PROCESS unset (auto) or on")
    return None


def check_name(name: str, what: str) -> str:
    """``name`` when it is a valid model name, else a ValueError saying whose it is."""
    if not NAME_RE.fullmatch(name):
        raise ValueError(f"{what}: {name!r} is not a valid model name ({NAME_RULE})")
    return name


def split_list(value: str | None) -> list[str]:
    """A comma- or newline-separated list, each part stripped; blank lines are skipped, but an
    empty part between two commas is an error (``a,,b`` is a typo)."""
    out: list[str] = []
    for line in (value or "").splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if any(not p for p in parts):
            raise ValueError(f"{line.strip()!r}: an empty entry in a comma-separated list")
        out += parts
    return out


def model_entries(value: str | None) -> list[tuple[str, str]]:
    """MODELS as (name, source) pairs, in order; names unique (also ignoring case: Ollama
    compares names that way)."""
    out: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    for entry in split_list(value):
        name, eq, source = entry.partition("=")
        name, source = name.strip(), source.strip()
        if not eq or not name or not source:
            raise ValueError(f"{entry!r}: MODELS takes name=source (a path, file:// or gs:// "
                             "URI)")
        check_name(name, "MODELS")
        if name.lower() in seen:
            raise ValueError(f"MODELS names {seen[name.lower()]!r} and {name!r}: names must "
                             "differ (also in case)")
        seen[name.lower()] = name
        out.append((name, source))
    return out


def preload_names(value: str | None) -> list[str] | None:
    """MODELS_PRELOAD as names; ``["*"]`` all; ``[]`` none; None: unset (the default model)."""
    if value is None:
        return None
    names = split_list(value)
    if names in (["*"], ["none"]):
        return [] if names == ["none"] else names
    for name in names:
        if name in ("*", "none"):
            raise ValueError(f"MODELS_PRELOAD: {name} stands alone, not in a list of names")
        check_name(name, "MODELS_PRELOAD")
    return list(dict.fromkeys(names))


# ---- Ollama's durations -----------------------------------------------------------------------

_NS = {"ns": 1, "us": 10**3, "\u00b5s": 10**3, "\u03bcs": 10**3, "ms": 10**6, "s": 10**9,
       "m": 60 * 10**9, "h": 3600 * 10**9}
_DIGITS = "0123456789"
_I64 = 1 << 63


def go_duration_ns(text: str) -> int:
    """Go's time.ParseDuration, in nanoseconds: ``[-+]?([0-9]*(\\.[0-9]*)?[a-z]+)+`` with units
    ns, us (µs), ms, s, m, h, or a bare 0; the same overflow limits. ValueError otherwise."""
    s, neg = text, False
    if s and s[0] in "+-":
        neg, s = s[0] == "-", s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError(f"invalid duration {text!r}")
    total = 0
    while s:
        if s[0] not in _DIGITS + ".":
            raise ValueError(f"invalid duration {text!r}")
        i = 0
        while i < len(s) and s[i] in _DIGITS:
            i += 1
        whole, s = s[:i], s[i:]
        if whole and int(whole) > _I64:
            raise ValueError(f"invalid duration {text!r}")
        frac, scale = 0, 1.0
        post = False
        if s.startswith("."):
            s, i, overflow = s[1:], 0, False
            while i < len(s) and s[i] in _DIGITS:  # Go keeps the digits that fit, drops the rest
                nxt = frac * 10 + int(s[i])
                if not overflow and frac <= (_I64 - 1) // 10 and nxt <= _I64:
                    frac, scale = nxt, scale * 10
                else:
                    overflow = True
                i += 1
            post, s = i > 0, s[i:]
        if not whole and not post:
            raise ValueError(f"invalid duration {text!r}")
        i = 0
        while i < len(s) and s[i] not in _DIGITS + ".":
            i += 1
        if i == 0:
            raise ValueError(f"missing unit in duration {text!r}")
        unit, s = s[:i], s[i:]
        if unit not in _NS:
            raise ValueError(f"unknown unit {unit!r} in duration {text!r}")
        value = int(whole or "0")
        if value > _I64 // _NS[unit]:
            raise ValueError(f"invalid duration {text!r}")
        value *= _NS[unit]
        if frac:
            value += int(float(frac) * (float(_NS[unit]) / scale))
            if value > _I64:
                raise ValueError(f"invalid duration {text!r}")
        total += value
        if total > _I64:
            raise ValueError(f"invalid duration {text!r}")
    if not neg and total > _I64 - 1:
        raise ValueError(f"invalid duration {text!r}")
    return -total if neg else total


def keep_alive_seconds(text: str | None) -> float:
    """KEEP_ALIVE in seconds, parsed as Ollama's envconfig.KeepAlive parses OLLAMA_KEEP_ALIVE:
    spaces then quotes trimmed; a Go duration, else a whole number of seconds; negative means
    forever (math.inf); empty: the default, 5m. Where Ollama would quietly keep its default
    (an unreadable value) or wrap around (seconds past Go's 292 years), this is an error."""
    s = (text if text is not None else KEEP_ALIVE_DEFAULT).strip().strip("\"'")
    if not s:
        s = KEEP_ALIVE_DEFAULT
    try:
        ns = go_duration_ns(s)
    except ValueError:
        if not re.fullmatch(r"[+-]?[0-9]+", s):
            raise ValueError(f"KEEP_ALIVE {text!r}: neither a duration (30s, 5m, 1h30m, 0; "
                             "negative: forever) nor a whole number of seconds") from None
        seconds = int(s)
        if not -_I64 <= seconds * 10**9 < _I64:
            raise ValueError(f"KEEP_ALIVE {text!r}: past the longest duration (about 292 "
                             "years); a negative value keeps a model loaded forever") from None
        ns = seconds * 10**9
    return math.inf if ns < 0 else ns / 1e9


def keep_alive_text(seconds: float) -> str:
    """A keep-alive for people: forever, 0, or Go's own spelling (1h30m0s, 2.5s)."""
    if seconds == math.inf:
        return "forever"
    if seconds == 0:
        return "0 (unloaded after each answer)"
    whole = int(seconds)
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    frac = seconds - whole
    sec = f"{s + frac:.9f}".rstrip("0").rstrip(".")
    if h:
        return f"{h}h{m}m{sec}s"
    return f"{m}m{sec}s" if m else f"{sec}s"
