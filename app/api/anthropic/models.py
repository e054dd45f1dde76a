"""The model as Anthropic's Models API shows it (``GET /v1/models`` with an
``anthropic-version`` header, as Anthropic's SDKs and Claude Code send): one entry per name the
model answers to, so a client that checks its configured model against the list finds it.
A server of several models lists every model of its catalog that way, loaded or not
(:func:`listed_models`; an unloaded model's ``created_at`` is the epoch: its file is not read)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from app.core.models import Listed
from app.engine.types import ModelInfo

VERSION_HEADER = "anthropic-version"


def card(name: str, created: int) -> dict[str, Any]:
    stamp = datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"type": "model", "id": name, "display_name": name, "created_at": stamp}


def model_card(info: ModelInfo, name: str) -> dict[str, Any]:
    return card(name, info.created)


def page(data: list[dict[str, Any]]) -> dict[str, Any]:
    return {"data": data, "has_more": False, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}


def models_list(info: ModelInfo) -> dict[str, Any]:
    return page([model_card(info, name) for name in info.names])


def listed_card(item: Listed, name: str) -> dict[str, Any]:
    """A pool's model under ``name`` (its name or an alias), loaded or not."""
    return card(name, item.info.created if item.info is not None else 0)


def listed_models(items: list[Listed]) -> dict[str, Any]:
    """Every model of a pool, one entry per name it answers to (its name, then its aliases)."""
    return page([listed_card(item, name) for item in items for name in (item.name, *item.aliases)])
