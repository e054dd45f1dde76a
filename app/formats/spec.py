"""The bottom of the formats: what a request's tools and reply reading are, with no format in
it. Every format module, the reply parser and the request side (app.protocol.tools) import these;
this module imports nothing of the project, so no circle can pass through it."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

_NAME_CHARS = "A-Za-z0-9_-"
NAME_RE = re.compile(f"[{_NAME_CHARS}]{{1,64}}")  # a tool's name (used with fullmatch)
NAME_PREFIX_RE = re.compile(f"[{_NAME_CHARS}]*")  # as much of a name as is written so far

Add = Callable[[str | None, str, bool], None]  # a call found: (name, arguments so far, complete)


@dataclass(frozen=True)
class Tool:
    """A function offered to the model, checked (app.protocol.tools builds them)."""

    name: str
    description: str
    parameters: dict[str, Any]


def string_params(parameters: dict[str, Any]) -> frozenset[str]:
    """The parameters of a tool's ``parameters`` schema typed string (or a string enum): their
    value is the text as written, in the formats that write values bare (qwen3_coder)."""

    def is_string(schema: Any) -> bool:
        if not isinstance(schema, dict):
            return False
        kind = schema.get("type")
        if kind == "string" or (isinstance(kind, list) and "string" in kind):
            return True
        if "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
            return True
        return any(is_string(s) for s in schema.get("anyOf", []) + schema.get("oneOf", []))

    props = parameters.get("properties") or {}
    return frozenset(k for k, v in props.items() if is_string(v))


class Scanner(Protocol):
    """What reading a reply needs of a tool-call format (app.formats.base.ToolFormat is one)."""

    name: str

    def scan(self, body: str, spec: ReplySpec, final: bool, add: Add) -> str: ...

    def call_id(self) -> str: ...


@dataclass(frozen=True)
class ReplySpec:
    """How to read one request's replies."""

    format: Scanner | None = None  # the tool-call format; None: no tools, the reply is text
    think: bool = False  # look for a thought at the start
    in_thought: bool = False  # the prompt already opened the thought
    # how thoughts are written (app.formats.think.ReasoningFormat; None: <think>...</think>)
    thought: Any = None
    inline: bool = False  # keep the thought in the content (tags included)
    string_params: dict[str, frozenset[str]] = field(default_factory=dict)  # qwen3_coder typing
    names: frozenset[str] = frozenset()  # the tools offered (a Llama 3 JSON reply naming none
    # of them is an answer, not a call)

    @property
    def tool_format(self) -> str | None:
        """The format's name (None: no tools)."""
        return self.format.name if self.format is not None else None
