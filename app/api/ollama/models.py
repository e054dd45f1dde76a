"""Ollama's model routes over the one model this server serves: ``GET /api/tags`` (what is
there), ``POST /api/show`` (its details, template and capabilities), ``GET /api/ps`` (what is
loaded), ``GET /api/version``; and model management (``pull``, ``push``, ``create``, ``copy``,
``delete``, blobs), which answers a clear 501: the model is the one the server was started with.

Each name the model answers to is listed as Ollama lists models, with its tag (``:latest``
unless the name has one), so a client that lists the models and sends the name back is served.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

from flask import Blueprint, Response, jsonify

from app.api.base import read_body
from app.base.errors import BadRequest, ModelNotFound, NotSupported
from app.core.models import Listed
from app.core.service import Service
from app.engine.types import ModelInfo
from app.formats import detect_reasoning

FOREVER = "9999-12-31T23:59:59Z"  # never unloaded (idle sleep off)


def tagged(name: str) -> str:
    return name if ":" in name else f"{name}:latest"


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def size_label(n_params: int) -> str:
    """A parameter count as Ollama shows it: 135M, 8.0B."""
    if n_params >= 1e9:
        return f"{n_params / 1e9:.1f}B"
    return f"{round(n_params / 1e6)}M"


def details(info: ModelInfo) -> dict[str, Any]:
    return {"parent_model": "", "format": "gguf", "family": info.architecture,
            "families": [info.architecture] if info.architecture else None,
            "parameter_size": size_label(info.n_params),
            "quantization_level": info.quantization}


def entry(info: ModelInfo, name: str) -> dict[str, Any]:
    return {"name": tagged(name), "model": tagged(name), "modified_at": rfc3339(info.created),
            "size": info.size, "details": details(info)}


def listed_entry(item: Listed) -> dict[str, Any]:
    """A model of several as /api/tags lists it: what its engine says once it is loaded, else
    what the catalog knows (its files' size)."""
    if item.info is not None:
        return entry(item.info, item.name)
    name = tagged(item.name)
    return {"name": name, "model": name, "modified_at": rfc3339(_mtime(item.path)),
            "size": item.size or 0,
            "details": {"parent_model": "", "format": "gguf", "family": "", "families": None,
                        "parameter_size": "", "quantization_level": ""}}


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except (OSError, ValueError):
        return 0.0


def capabilities(info: ModelInfo, embeds: bool) -> list[str]:
    """What the model can do here: every chat model takes tools (in its own format, or the
    generic one); thinking where its template has a thought."""
    caps = ["completion", "tools"]
    if detect_reasoning(info.chat_template) is not None:
        caps.append("thinking")
    if embeds:
        caps.append("embedding")
    return caps


def register(bp: Blueprint, api: Any) -> None:
    """The model routes, on the chat API's blueprint (its error shape is Ollama's), over the
    default model's service (asked at each request: the models may change)."""

    def svc() -> Service:
        return api.models.default_service

    def named(body: Any) -> str:
        name = body.get("model") or body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            raise BadRequest("model: field required", param="model")
        if api.models.pooled:
            if api.models.canonical(name.removesuffix(":latest")) is None:
                raise ModelNotFound(f"model '{name}' not found")
            return name
        info = svc().info()
        if name.removesuffix(":latest") not in info.names and name not in info.names:
            raise ModelNotFound(f"model '{name}' not found")
        return name

    def tags() -> Response:
        if api.models.pooled:
            return jsonify({"models": [listed_entry(i) for i in api.models.listing()]})
        info = svc().info()
        return jsonify({"models": [entry(info, name) for name in info.names]})

    def show() -> Response:
        body = read_body(lenient=True)
        name = named(body)
        service = svc()
        if api.models.pooled:  # its details are its engine's: loaded for the answer
            with api.models.lease(name.removesuffix(":latest")) as lease:
                service = lease.service
                info = service.info()
                embeds = getattr(service.engine, "embedder", None) is not None
        else:
            info = service.info()
            embeds = getattr(service.engine, "embedder", None) is not None
        arch = info.architecture or "llama"
        return jsonify({
            "modelfile": f"# served by vertex-gguf\nFROM {info.path.rsplit('/', 1)[-1]}\n",
            "parameters": "",
            "template": info.chat_template or "",
            "details": details(info),
            "model_info": {"general.architecture": arch,
                           "general.parameter_count": info.n_params,
                           f"{arch}.context_length": info.n_ctx_train,
                           f"{arch}.embedding_length": info.n_embd},
            "capabilities": capabilities(info, embeds),
            "modified_at": rfc3339(info.created),
            "name": name,
        })

    def ps() -> Response:
        if api.models.pooled:
            return jsonify({"models": [
                {**entry(i.info, i.name), "size_vram": i.info.size if i.info.gpu_offload else 0,
                 "expires_at": rfc3339(i.expires_at) if i.expires_at is not None else FOREVER}
                for i in api.models.listing()
                if i.info is not None and i.status.status == "loaded"]})
        service = svc()
        info = service.info()
        idle = api.model_settings(service).sleep_idle_seconds  # its engine's
        expires = rfc3339(time.time() + idle) if idle else FOREVER
        return jsonify({"models": [{**entry(info, name), "expires_at": expires,
                                    "size_vram": info.size if info.gpu_offload else 0}
                                   for name in info.names]})

    def version() -> Response:
        try:
            ours = metadata.version("vertex-gguf")
        except metadata.PackageNotFoundError:
            ours = "0.0.0"
        return jsonify({"version": ours})

    def manage(**_: Any) -> Response:
        raise NotSupported("this server serves the one model it was started with (MODEL or "
                           "AIP_STORAGE_URI): models are not pulled, pushed, created, copied "
                           "or deleted through it")

    bp.add_url_rule("/api/tags", "ollama:tags", tags, methods=["GET"])
    bp.add_url_rule("/api/show", "ollama:show", show, methods=["POST"])
    bp.add_url_rule("/api/ps", "ollama:ps", ps, methods=["GET"])
    bp.add_url_rule("/api/version", "ollama:version", version, methods=["GET"])
    for route, methods in (("/api/pull", ["POST"]), ("/api/push", ["POST"]),
                           ("/api/create", ["POST"]), ("/api/copy", ["POST"]),
                           ("/api/delete", ["DELETE"]),
                           ("/api/blobs/<path:digest>", ["HEAD", "POST"])):
        bp.add_url_rule(route, f"ollama:{route}", manage, methods=methods)
