"""Vertex AI predict envelopes, as pure functions.

``{"instances": [...], "parameters": {...}}`` becomes a list of API requests (top-level
parameters are defaults, instance keys win); the answers go back as ``{"predictions": [...]}``,
one per instance, in order, with a failing instance's error in its own slot. A body without
``instances`` is a raw API request (what rawPredict and streamRawPredict forward). Which API an
instance or raw body speaks comes from its ``@requestFormat`` or, without one, from its fields.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.base.errors import BadRequest, ServiceError


@dataclass(frozen=True)
class Instance:
    api: str  # the name of the API that serves it
    body: dict[str, Any]


@dataclass(frozen=True)
class Formats:
    """How to tell which API a body speaks: ``names`` maps each @requestFormat value (lower
    case) to an API name; ``detect`` reads a body without one (None: no API recognises it)."""

    names: dict[str, str]
    detect: Callable[[dict[str, Any]], str | None]
    hint: str  # the @requestFormat values to suggest in errors


def api_of(body: dict[str, Any], formats: Formats, where: str = "body") -> str:
    """Which API a dict is a request of, from @requestFormat or its fields."""
    fmt = body.get("@requestFormat")
    if fmt is not None:
        name = formats.names.get(fmt.strip().lower()) if isinstance(fmt, str) else None
        if name is None:
            raise BadRequest(
                f"{where}: unknown @requestFormat {fmt!r} (use {formats.hint})",
                param="@requestFormat",
            )
        return name
    name = formats.detect(body)
    if name is None:
        raise BadRequest(
            f"{where}: expected a chat request ('messages'), a completion request ('prompt'), "
            "a Responses request ('input'), an embedding instance ('content'), a rerank "
            "request ('query' and 'documents') or a score request ('text_1' and 'text_2'); or "
            "name the API with @requestFormat",
        )
    return name


def is_envelope(body: Any) -> bool:
    return isinstance(body, dict) and "instances" in body


def parse_envelope(
    body: dict[str, Any], max_instances: int, formats: Formats
) -> list[Instance | ServiceError]:
    """Instances of a valid envelope (a bad instance is an error in its slot); 400 otherwise."""
    instances = body.get("instances")
    if not isinstance(instances, list):
        raise BadRequest("'instances' must be a list", param="instances")
    if not instances:
        raise BadRequest("'instances' is empty", param="instances")
    if len(instances) > max_instances:
        raise BadRequest(
            f"{len(instances)} instances in one request; at most {max_instances} are accepted",
            param="instances",
        )
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest("'parameters' must be an object", param="parameters")
    out: list[Instance | ServiceError] = []
    for i, inst in enumerate(instances):
        where = f"instances[{i}]"
        if not isinstance(inst, dict):
            out.append(BadRequest(f"{where}: an instance must be a JSON object"))
            continue
        merged = {**params, **inst}
        try:
            name = api_of(merged, formats, where)
        except ServiceError as err:
            out.append(err)
            continue
        merged.pop("@requestFormat", None)
        out.append(Instance(name, merged))
    return out


def strip_format(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "@requestFormat"}


def predictions(slots: list[dict[str, Any]]) -> dict[str, Any]:
    """The response envelope: one answer (or error body) per instance, in order."""
    return {"predictions": slots}
