"""The catalog from the settings: every model named by MODEL, MODELS, MODELS_DIR and
MODELS_PRESET, each with its own Settings, checked as a whole (names, the default, what loads at
start, MODELS_MAX). Folders are listed, on the disk or in Cloud Storage; nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from app.model import gcs
from app.model.catalog import layout
from app.model.catalog.preset import Preset, Section
from app.model.catalog.preset import read as read_preset
from app.model.catalog.spec import Catalog, CatalogError, ModelSpec
from app.model.default import default_model_path
from app.settings import Settings
from app.settings.models import (
    MODELS_MAX_DEFAULT,
    NAME_RE,
    NAME_RULE,
    catalog_settings_set,
    keep_alive_seconds,
    model_entries,
    preload_names,
)

# MODEL's own files and names: the other models do not inherit them (a draft model or an
# adapter fits one vocabulary; a projector, a template, a file choice belong to one model)
MODEL_OWN = ("model_file", "served_model_name", "mmproj", "draft_model", "lora_adapters",
             "chat_template")


@dataclass
class _Entry:
    name: str
    source: str
    origin: str
    aliases: tuple[str, ...] = ()
    is_model: bool = False  # MODEL's own model: it keeps MODEL_OWN settings
    section: Section | None = None
    preset_keys: list[str] = field(default_factory=list)


class _Clients:
    """One Cloud Storage client for every listing, made on first use; each source listed once."""

    def __init__(self, emulator_host: str | None) -> None:
        self.host, self.client = emulator_host, None
        self.listed: dict[tuple[str, str | None, str | None], layout.Files] = {}

    def __call__(self):
        if self.client is None:
            try:
                self.client = gcs.make_client(self.host)
            except Exception as exc:  # noqa: BLE001 - no credentials, most often: say so
                raise CatalogError(f"Cloud Storage: no client: {type(exc).__name__}: "
                                   f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
        return self.client


def build(settings: Settings, flags: Collection[str] = ()) -> Catalog:
    """The catalog ``settings`` describe. ``flags``: the settings given on the command line,
    which win over the preset for every model (llama-server's order: command line, then the
    model's section, then ``[*]``; env vars come below the preset)."""
    clients = _Clients(settings.storage_emulator_host)
    if not catalog_settings_set(settings):
        return _single(settings, clients)
    preset = read_preset(settings.models_preset) if settings.models_preset else None
    entries = _entries(settings, preset, clients)
    if not entries:
        raise CatalogError("no models: set MODELS, MODELS_DIR, sections with a model key in "
                           "MODELS_PRESET, or MODEL")
    own_set = [f.upper() for f in MODEL_OWN if getattr(settings, f) is not None]
    if own_set and not any(e.is_model for e in entries):
        verb = "describes" if len(own_set) == 1 else "describe"
        raise CatalogError(f"{', '.join(own_set)} {verb} MODEL's model, and MODEL is not set: "
                           "give each model its own in a MODELS_PRESET section")
    specs = [_spec(e, settings, preset, flags, clients) for e in entries]
    return _checked(settings, specs)


def _single(settings: Settings, clients: _Clients) -> Catalog:
    """MODEL alone, or the embedded default model: today's server, one model loaded at start."""
    source, note = settings.model, ""
    if source is None:
        path = default_model_path(settings.model_cache_dir)
        source = str(path)
        note = "the embedded default model" + ("" if path.is_file() else
                                                ": not fetched yet (vertex-gguf fetch-default-model)")
        files = layout.Files((source,), None, path.stat().st_size if path.is_file() else None)
    else:
        files = _files("MODEL", source, settings, clients)
    names = tuple(settings.served_model_name.split(",")) if settings.served_model_name else (
        _stem(files.files[0]),)
    spec = ModelSpec(name=names[0], aliases=names[1:], source=source, origin="MODEL",
                     settings=settings, files=files.files, projector=files.projector,
                     size=files.size, pin=True, preload=True, keep_alive=float("inf"), note=note)
    return Catalog(base=settings, models=(spec,), default=spec.name, max_loaded=1,
                   keep_alive=float("inf"), single=True)


def _stem(path: str) -> str:
    base = path.rstrip("/").rsplit("/", 1)[-1]
    return base[: -len(".gguf")] if base.lower().endswith(".gguf") else base


def _files(who: str, source: str, s: Settings, clients: _Clients) -> layout.Files:
    key = (source, s.model_file, s.mmproj)
    try:
        if key not in clients.listed:
            clients.listed[key] = layout.describe(source, s.model_file, s.mmproj, clients,
                                                  s.storage_emulator_host)
        return clients.listed[key]
    except gcs.GcsError as exc:
        raise CatalogError(f"{who}: {exc}") from None
    except CatalogError as exc:
        raise CatalogError(f"{who}: {exc}") from None


def _entries(settings: Settings, preset: Preset | None, clients: _Clients) -> list[_Entry]:
    """Every model named, in order: MODEL, MODELS, MODELS_DIR (by name), then the preset's
    sections that give a source; a section naming a known model adds its settings to it."""
    out: dict[str, _Entry] = {}

    def add(entry: _Entry) -> None:
        clash = out.get(entry.name.lower())
        if clash:
            raise CatalogError(f"model name {entry.name!r} comes twice: {clash.origin} "
                               f"({clash.source}) and {entry.origin} ({entry.source})")
        out[entry.name.lower()] = entry

    if settings.model is not None:
        if settings.served_model_name:
            names = tuple(settings.served_model_name.split(","))
        else:
            names = (_stem(_files("MODEL", settings.model, settings, clients).files[0]),)
        if not NAME_RE.fullmatch(names[0]):
            raise CatalogError(f"MODEL {settings.model}: its name {names[0]!r} is not a valid "
                               f"model name ({NAME_RULE}): set SERVED_MODEL_NAME")
        add(_Entry(names[0], settings.model, "MODEL", names[1:], is_model=True))
    for name, source in model_entries(settings.models):
        add(_Entry(name, source, "MODELS"))
    if settings.models_dir:
        for found in layout.scan(settings.models_dir, clients):
            add(_Entry(found.name, found.source, f"MODELS_DIR {settings.models_dir}"))
    for section in preset.sections if preset else ():
        entry = out.get(section.name.lower())
        if entry is not None and entry.name == section.name:
            if section.source is not None:
                raise CatalogError(f"{preset.where(section, 'model')}: model {section.name} "
                                   f"already has a source ({entry.origin}: {entry.source})")
            entry.section = section
            continue
        if section.source is None:
            hint = (f": did you mean [{entry.name}]?" if entry else
                    f"; the models are {', '.join(e.name for e in out.values()) or 'none'}")
            raise CatalogError(f"{preset.where(section)}: names no model and gives no model key "
                               f"(a source){hint}")
        if not NAME_RE.fullmatch(section.name):
            raise CatalogError(f"{preset.where(section)}: {section.name!r} is not a valid model "
                               f"name ({NAME_RULE})")
        add(_Entry(section.name, section.source, f"MODELS_PRESET {preset.path}",
                   section=section))
    return list(out.values())


def _spec(entry: _Entry, base: Settings, preset: Preset | None, flags: Collection[str],
          clients: _Clients) -> tuple[ModelSpec, bool | None]:
    """The model's spec, and its preload as its preset says (None: MODELS_PRELOAD decides)."""
    values: dict[str, Any] = base.model_dump()
    if not entry.is_model:
        for name in MODEL_OWN:
            values[name] = Settings.model_fields[name].default
    layers = [s for s in (preset.star if preset else None, entry.section) if s is not None]
    origin_of: dict[str, Section] = {}
    for section in layers:
        values.update(section.values)
        origin_of.update(dict.fromkeys(section.values, section))
    for name in flags:  # the command line wins over the preset
        if name in Settings.model_fields and (entry.is_model or name not in MODEL_OWN):
            values[name] = getattr(base, name)
            origin_of.pop(name, None)
    aliases = tuple(dict.fromkeys(a for a in (*entry.aliases, *(
        entry.section.aliases if entry.section else ())) if a != entry.name))
    values["model"] = entry.source
    values["served_model_name"] = ",".join((entry.name, *aliases))
    try:
        settings = Settings.model_validate(values)
    except ValidationError as exc:
        raise CatalogError(_invalid(entry, exc, origin_of, preset)) from None
    files = _files(f"model {entry.name} ({entry.origin})", entry.source, settings, clients)
    pins = [s.pin for s in layers if s.pin is not None]
    loads = [s.preload for s in layers if s.preload is not None]
    spec = ModelSpec(
        name=entry.name, aliases=aliases, source=entry.source, origin=entry.origin,
        settings=settings, files=files.files, projector=files.projector, size=files.size,
        pin=bool(pins and pins[-1]), keep_alive=keep_alive_seconds(settings.keep_alive),
        preset_keys=tuple(k for s in layers for k in s.keys.values()),
    )
    return spec, (loads[-1] if loads else None)


def _invalid(entry: _Entry, exc: ValidationError, origin_of: dict[str, Section],
             preset: Preset | None) -> str:
    """A per-model Settings error, naming the preset key it came from."""
    lines = []
    for err in exc.errors():
        field_name = str(err["loc"][0]) if err["loc"] else None
        msg = err["msg"].removeprefix("Value error, ")
        section = origin_of.get(field_name) if field_name else None
        if section is not None and preset is not None:
            lines.append(f"{preset.where(section, field_name)}: {err['input']!r}: {msg}")
        elif entry.section is not None and preset is not None:
            lines.append(f"{preset.where(entry.section)}: model {entry.name}: {msg}")
        else:
            lines.append(f"model {entry.name} ({entry.origin}): {msg}")
    return "\n".join(lines)


def _checked(base: Settings, pairs: list[tuple[ModelSpec, bool | None]]) -> Catalog:
    """The rules over the whole catalog: names and aliases unique, MODELS_DEFAULT and
    MODELS_PRELOAD known, no more preloaded or pinned than MODELS_MAX, each gs:// model within
    MODEL_CACHE_MAX_GB."""
    specs = [spec for spec, _ in pairs]
    owner: dict[str, ModelSpec] = {}
    for spec in specs:
        for name in spec.names:
            if not NAME_RE.fullmatch(name):
                raise CatalogError(f"model {spec.name}: alias {name!r} is not a valid model "
                                   f"name ({NAME_RULE})")
            other = owner.get(name.lower())
            if other is not None and other is not spec:
                raise CatalogError(f"{name!r} names two models: {other.name} ({other.origin}) "
                                   f"and {spec.name} ({spec.origin})")
            owner[name.lower()] = spec
    known = ", ".join(s.name for s in specs)

    def find(name: str, setting: str) -> ModelSpec:
        if name.lower() not in owner:
            raise CatalogError(f"{setting} names {name}, which is no model here: the models are "
                               f"{known}")
        return owner[name.lower()]

    default = find(base.models_default, "MODELS_DEFAULT") if base.models_default else next(
        (s for s in specs if s.origin == "MODEL"), specs[0])
    chosen = preload_names(base.models_preload)
    if chosen is None:
        wanted = {default.name}
    elif chosen == ["*"]:
        wanted = {s.name for s in specs}
    else:
        wanted = {find(n, "MODELS_PRELOAD").name for n in chosen}
    out = [replace(spec, preload=spec.name in wanted if given is None else given)
           for spec, given in pairs]
    most = MODELS_MAX_DEFAULT if base.models_max is None else base.models_max
    for what, count in (("loaded at start", sum(s.preload for s in out)),
                        ("pinned", sum(s.pin for s in out))):
        if most and count > most:
            raise CatalogError(f"{count} models are {what} but MODELS_MAX is {most}: raise it, "
                               f"or {'preload' if what != 'pinned' else 'pin'} fewer")
    bound = int(base.model_cache_max_gb * 1e9) if base.model_cache_max_gb else None
    for spec in out:
        if bound and spec.source.startswith("gs://") and (spec.size or 0) > bound:
            raise CatalogError(f"model {spec.name} is {spec.size / 1e9:.2f} GB in Cloud Storage, "
                               f"more than MODEL_CACHE_MAX_GB ({base.model_cache_max_gb:g}) lets "
                               "the download cache hold")
    return Catalog(base=base, models=tuple(out), default=default.name, max_loaded=most,
                   keep_alive=keep_alive_seconds(base.keep_alive), cache_max_bytes=bound)

