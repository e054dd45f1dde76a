"""Responses tools beyond flat functions, as Codex CLI sends them: ``namespace`` tools (how it
declares each MCP server: ``{"type": "namespace", "name": "mcp__<server>", "tools": [...]}``),
``custom`` tools (free-form text input, such as its ``apply_patch``), and hosted tools this
server cannot run (``web_search`` and the like).

A namespace's tools are offered to the model as functions named ``<namespace>__<name>`` and
their calls go back with their own ``name`` and ``namespace``, as Codex routes them (llama-server
drops namespace tools, so MCP tools vanish there). A custom tool is offered as a function taking
one string, ``input``, and its calls go back as ``custom_tool_call`` items. Hosted tools are left
out, with a line in the log: the turn goes on without them.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from typing import Any

from app.base.errors import BadRequest
from app.formats.spec import NAME_RE

log = logging.getLogger(__name__)

# Tool types OpenAI runs on its side; here they are left out of what the model is offered.
HOSTED = frozenset({
    "web_search", "web_search_preview", "web_search_2025_08_26",
    "web_search_preview_2025_03_11", "file_search", "code_interpreter", "computer_use",
    "computer_use_preview", "image_generation", "local_shell", "shell", "mcp", "tool_search",
    "apply_patch",
})

CUSTOM_PARAMETERS = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The tool's input, as text."}},
    "required": ["input"],
}


@dataclass(frozen=True)
class Wire:
    """How a tool the model knows by a flat name goes back on the wire."""

    name: str  # the tool's own name
    namespace: str | None = None  # the namespace it was declared in
    custom: bool = False  # a custom tool: its call carries ``input`` text, not arguments


def flat_name(namespace: str, name: str) -> str:
    """The one function name a namespaced tool is offered under: ``<namespace>__<name>``, or,
    where that is not a valid function name (too long, odd characters), a shortened form kept
    apart by a hash of both."""
    flat = f"{namespace}__{name}"
    if NAME_RE.fullmatch(flat):
        return flat
    digest = hashlib.sha256(f"{namespace}\0{name}".encode()).hexdigest()[:8]
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", flat)
    return f"{clean[:55]}_{digest}"


def flatten(specs: list[Any]) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, Wire]]:
    """Every function the model is offered, as ``(where, {type: function, name, description,
    parameters, strict})`` (``where``: the field path a 400 names), and how the ones that are
    not plain functions go back on the wire, by their flat name."""
    out: list[tuple[str, dict[str, Any]]] = []
    wires: dict[str, Wire] = {}
    for i, spec in enumerate(specs):
        where = f"tools.{i}"
        if not isinstance(spec, dict):
            raise BadRequest(f"{where}: a tool must be an object", param=where)
        kind = spec.get("type")
        if kind == "function":
            out.append((where, spec))
        elif kind == "namespace":
            namespace = spec.get("name")
            inner = spec.get("tools")
            if not isinstance(namespace, str) or not namespace:
                raise BadRequest(f"{where}.name: a namespace needs a name", param=f"{where}.name")
            if not isinstance(inner, list):
                raise BadRequest(f"{where}.tools: must be a list of tools", param=f"{where}.tools")
            for j, tool in enumerate(inner):
                at = f"{where}.tools.{j}"
                if not isinstance(tool, dict) or tool.get("type", "function") != "function":
                    raise BadRequest(f"{at}.type: a namespace holds function tools",
                                     param=f"{at}.type")
                name = tool.get("name")
                if not isinstance(name, str) or not name:
                    raise BadRequest(f"{at}.name: field required", param=f"{at}.name")
                flat = flat_name(namespace, name)
                out.append((at, {**tool, "type": "function", "name": flat}))
                wires[flat] = Wire(name, namespace)
        elif kind == "custom":
            name = spec.get("name")
            if not isinstance(name, str):
                raise BadRequest(f"{where}.name: field required", param=f"{where}.name")
            out.append((where, {"type": "function", "name": name,
                                "description": spec.get("description"),
                                "parameters": CUSTOM_PARAMETERS}))
            wires[name] = Wire(name, custom=True)
        elif kind in HOSTED:
            log.warning("tools.%d: a %r tool runs on OpenAI's side; this server cannot run it, "
                        "so the model is not offered it", i, kind)
        else:
            raise BadRequest(
                f"{where}.type: tools of type {str(kind)[:60]!r} are not supported (function, "
                "namespace and custom tools are; hosted tools such as web_search are left out)",
                param=f"{where}.type",
            )
    return out, wires


def call_name(namespace: Any, name: Any, where: str) -> str:
    """The flat name of a past call that names its namespace (an input item's)."""
    if namespace is None:
        return name
    if not isinstance(namespace, str) or not isinstance(name, str):
        raise BadRequest(f"{where}.namespace: must be a string", param=f"{where}.namespace")
    return flat_name(namespace, name)
