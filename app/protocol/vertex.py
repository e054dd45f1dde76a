"""Vertex AI predict envelopes, as pure functions.

``{"instances": [...], "parameters": {...}}`` becomes a list of OpenAI requests (top-level
parameters are defaults, instance keys win); the answers go back as ``{"predictions": [...]}``,
one per instance, in order, with a failing instance's error in its own slot. A body without
``instances`` is a raw OpenAI request (what rawPredict and streamRawPredict forward).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from app.errors import ApiError, BadRequest, error_body

Kind = Literal["chat", "completion"]

_FORMATS: dict[str, Kind] = {
    "chatcompletions": "chat",
    "chat": "chat",
    "/v1/chat/completions": "chat",
    "/chat/completions": "chat",
    "completions": "completion",
    "completion": "completion",
    "/v1/completions": "completion",
    "/completions": "completion",
}


@dataclass(frozen=True)
class Instance:
    kind: Kind
    body: dict[str, Any]


def kind_of(body: dict[str, Any], where: str = "body") -> Kind:
    """Which OpenAI request a dict is, from @requestFormat or its keys."""
    fmt = body.get("@requestFormat")
    if fmt is not None:
        kind = _FORMATS.get(str(fmt).strip().lower()) if isinstance(fmt, str) else None
        if kind is None:
            raise BadRequest(
                f"{where}: unknown @requestFormat {fmt!r} (use 'chatCompletions', "
                "'completions', '/v1/chat/completions' or '/v1/completions')",
                param="@requestFormat",
            )
        return kind
    if "messages" in body:
        return "chat"
    if "prompt" in body:
        return "completion"
    raise BadRequest(
        f"{where}: expected a chat request ('messages') or a completion request ('prompt')",
    )


def is_envelope(body: Any) -> bool:
    return isinstance(body, dict) and "instances" in body


def parse_envelope(body: dict[str, Any], max_instances: int) -> list[Instance | ApiError]:
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
    out: list[Instance | ApiError] = []
    for i, inst in enumerate(instances):
        where = f"instances[{i}]"
        if not isinstance(inst, dict):
            out.append(BadRequest(f"{where}: an instance must be a JSON object"))
            continue
        merged = {**params, **inst}
        try:
            kind = kind_of(merged, where)
        except ApiError as err:
            out.append(err)
            continue
        merged.pop("@requestFormat", None)
        out.append(Instance(kind, merged))
    return out


def strip_format(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "@requestFormat"}


def predictions(results: list[dict[str, Any] | ApiError]) -> dict[str, Any]:
    """The response envelope; errors fill their own slot."""
    return {
        "predictions": [error_body(r) if isinstance(r, ApiError) else r for r in results]
    }
