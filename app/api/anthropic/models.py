"""The model as Anthropic's Models API shows it (``GET /v1/models`` with an
``anthropic-version`` header, as Anthropic's SDKs and Claude Code send): one entry per name the
model answers to, so a client that checks its configured model against the list finds it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from app.engine.types import ModelInfo

VERSION_HEADER = "anthropic-version"


def model_card(info: ModelInfo, name: str) -> dict[str, Any]:
    created = datetime.fromtimestamp(info.created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"type": "model", "id": name, "display_name": name, "created_at": created}


def models_list(info: ModelInfo) -> dict[str, Any]:
    data = [model_card(info, name) for name in info.names]
    return {"data": data, "has_more": False, "first_id": data[0]["id"], "last_id": data[-1]["id"]}
