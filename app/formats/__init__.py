"""Tool-call and reasoning formats: one class per format, found by name.

Each format (``app.formats.base.ToolFormat``) holds all that is known of it: whether a chat
template teaches it (``detect``), the history its template expects (``history``), how tools are
offered (``offer``), the grammar that forces a call (``grammar``), the reply scanner (``scan``),
its call ids (``call_id``), and its markers, which are at once what the scanner reads, what the
engine keeps in the text (``preserved_tokens``) and, for those that open a call, what a lazy
grammar waits for (``triggers``). Replies are still parsed by a pure function of the text so far
(``app.formats.reply.parse_reply``); the format only says how to read one.

Adding a format is one module here and one entry in ``FORMATS``: the TOOL_FORMAT setting, the
engine's preserved tokens and the lazy-grammar triggers all follow from the registry.
"""

from __future__ import annotations

from app.formats.base import ToolFormat
from app.formats.generic import Generic
from app.formats.hermes import Hermes
from app.formats.llama3 import Llama3
from app.formats.mistral import Mistral
from app.formats.qwen3_coder import Qwen3Coder
from app.formats.spec import NAME_RE
from app.formats.think import THINK, ReasoningFormat

__all__ = ["FORMATS", "NAME_RE", "REASONING", "THINK", "ReasoningFormat", "ToolFormat", "choose",
           "describe", "detect", "get", "preserved_tokens"]

# In detection order (llama.cpp's): the first whose detect() accepts a template is its format.
FORMATS: dict[str, ToolFormat] = {
    f.name: f for f in (Qwen3Coder(), Hermes(), Mistral(), Llama3(), Generic())
}
FALLBACK = "generic"  # what a template that teaches no format gets

REASONING: dict[str, ReasoningFormat] = {THINK.name: THINK}


def get(name: str) -> ToolFormat:
    """The format called ``name``."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown tool format {name!r} (one of {', '.join(FORMATS)})") from None


def detect(template: str | None) -> ToolFormat:
    """The tool-call format a chat template teaches its model."""
    t = template or ""
    return next((f for f in FORMATS.values() if f.detect(t)), FORMATS[FALLBACK])


def choose(setting: str, template: str | None) -> ToolFormat:
    """The format the TOOL_FORMAT setting names, or the template's own for ``auto``."""
    return detect(template) if setting == "auto" else get(setting)


def preserved_tokens() -> tuple[str, ...]:
    """Every marker a reply parser reads, once each: the engine keeps these in the text when a
    model's vocabulary makes them control tokens (llama.cpp drops those unless asked)."""
    sources = (*REASONING.values(), *FORMATS.values())
    return tuple(dict.fromkeys(m for f in sources for m in f.markers))


def describe() -> str:
    """The formats in words, for the TOOL_FORMAT setting's help."""
    named = [f"{f.name} ({f.summary})" for f in FORMATS.values()]
    return ", ".join(named[:-1]) + ", or " + named[-1]
