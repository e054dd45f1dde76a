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


class Scanner(Protocol):
    """What reading a reply needs of a tool-call format (app.formats.base.ToolFormat is one)."""

    name: str

    def scan(self, body: str, spec: ReplySpec, final: bool, add: Add) -> str: ...

    def call_id(self) -> str: ...


@dataclass(frozen=True)
class ReplySpec:
    """How to read one request's replies."""

    format: Scanner | None = None  # the tool-call format; None: no tools, the reply is text
    think: bool = False  # look for a <think> thought at the start
    in_thought: bool = False  # the prompt already opened <think>
    inline: bool = False  # keep the thought in the content (tags included)
    string_params: dict[str, frozenset[str]] = field(default_factory=dict)  # qwen3_coder typing
    names: frozenset[str] = frozenset()  # the tools offered (a Llama 3 JSON reply naming none
    # of them is an answer, not a call)

    @property
    def tool_format(self) -> str | None:
        """The format's name (None: no tools)."""
        return self.format.name if self.format is not None else None
