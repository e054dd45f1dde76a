"""Strict request validation shared by every API: pydantic models whose 400 names the field.

An unknown field set to null is dropped (it asks for nothing); any other unknown field is
refused with a hint (each API passes its own table of fields clients send that it does not do),
never silently ignored. Only the fields an API names as ignored on purpose (fields its official
API defines whose effect a client cannot miss here: another service's moderation, billing or
workspace) are dropped whatever their value; each is listed in that API's docs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from app.base.errors import BadRequest


def parse(model: type[BaseModel], body: Any, unsupported: Mapping[str, str] | None = None,
          hint: str = "see docs/api.md, Request fields",
          ignored: Mapping[str, str] | None = None) -> Any:
    """Validate a request body; the 400 names the first offending field. ``ignored``: fields
    accepted and dropped, with why."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    # a field's wire name: its alias where it has one (llama-server's "speculative.n_max")
    known = {f.alias or name for name, f in model.model_fields.items()}
    if ignored and any(k in ignored and k not in known for k in body):
        body = {k: v for k, v in body.items() if k in known or k not in ignored}
    unknown = [k for k in body if k not in known]
    if unknown:
        body = {k: v for k, v in body.items() if k in known or v is not None}
        for k in unknown:
            if k in body:
                why = (unsupported or {}).get(k, hint)
                raise BadRequest(f"{k}: this server does not support this field ({why})", param=k)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"] if not str(p).startswith("function-"))
        msg = first["msg"]
        if first["type"] == "missing":
            msg = "field required"
        elif first["type"] == "extra_forbidden":
            msg = "this server does not support this field"
        raise BadRequest(f"{loc}: {msg}" if loc else msg, param=loc or None) from None


def wants_stream(body: Any) -> bool:
    """Whether a body asks to stream: ``stream`` must be a boolean (or absent)."""
    if not isinstance(body, dict):
        return False
    value = body.get("stream")
    if value is None or isinstance(value, bool):
        return bool(value)
    raise BadRequest("stream: must be true or false", param="stream")
