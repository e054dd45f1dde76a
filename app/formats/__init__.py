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

from app.formats.apertus import APERTUS_THOUGHT, Apertus
from app.formats.base import ToolFormat
from app.formats.command_r7b import COMMAND_R7B_THOUGHT, CommandR7B
from app.formats.deepseek import DEEPSEEK_THINK, DeepSeek
from app.formats.deepseek_dsml import DeepSeekDsml
from app.formats.functionary import Functionary
from app.formats.gemma4 import CHANNEL_THOUGHT, Gemma4
from app.formats.generic import Generic
from app.formats.glm import Glm
from app.formats.granite import GRANITE_THINK, Granite
from app.formats.harmony import HARMONY, Harmony
from app.formats.hermes import Hermes
from app.formats.kimi import KIMI_THINK, Kimi
from app.formats.lfm2 import Lfm2
from app.formats.llama3 import Llama3
from app.formats.magistral import MAGISTRAL_THINK, Magistral
from app.formats.minimax import MiniMax
from app.formats.mistral import Mistral
from app.formats.nemotron import NEMOTRON_THINK, Nemotron
from app.formats.phi4 import Phi4
from app.formats.pythonic import Pythonic
from app.formats.qwen3_coder import Qwen3Coder
from app.formats.seed_oss import SEED_THINK, SeedOss
from app.formats.spec import NAME_RE
from app.formats.think import THINK, ReasoningFormat

__all__ = ["FORMATS", "NAME_RE", "REASONING", "REASONING_MODES", "THINK", "ReasoningFormat",
           "ToolFormat", "choose", "choose_reasoning", "describe", "detect", "detect_reasoning",
           "get", "preserved_tokens", "summary"]

# In detection order (llama.cpp's): the first whose detect() accepts a template is its format.
FORMATS: dict[str, ToolFormat] = {
    f.name: f for f in (DeepSeekDsml(), DeepSeek(), Kimi(), Glm(), MiniMax(),
                        Harmony(), Gemma4(), CommandR7B(), Functionary(), Lfm2(), Apertus(), Phi4(), SeedOss(), Qwen3Coder(), Granite(), Nemotron(), Hermes(), Magistral(), Mistral(), Pythonic(), Llama3(), Generic())
}
FALLBACK = "generic"  # what a template that teaches no format gets

# How thoughts are written, in detection order: the first whose detect() accepts a template is
# its syntax; <think> (the commonest, and what a template that names none gets) last.
REASONING: dict[str, ReasoningFormat] = {f.name: f for f in (HARMONY, CHANNEL_THOUGHT, COMMAND_R7B_THOUGHT, APERTUS_THOUGHT, MAGISTRAL_THINK, DEEPSEEK_THINK, KIMI_THINK, GRANITE_THINK, NEMOTRON_THINK, SEED_THINK, THINK)}
# REASONING_FORMAT's modes; a REASONING name there means "parsed, written that way"
REASONING_MODES = ("auto", "parsed", "inline")


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


def detect_reasoning(template: str | None) -> ReasoningFormat | None:
    """How a chat template teaches its model to write thoughts; None if it teaches none."""
    t = template or ""
    return next((f for f in REASONING.values() if f.detect(t)), None)


def choose_reasoning(setting: str, template: str | None) -> tuple[ReasoningFormat, bool]:
    """(the thought syntax, whether the template teaches it) for REASONING_FORMAT ``setting``:
    a syntax's name is that syntax; a mode takes the template's own, else <think>."""
    if setting in REASONING:
        return REASONING[setting], True
    found = detect_reasoning(template)
    return (found or THINK), found is not None


def choose(setting: str, template: str | None) -> ToolFormat:
    """The format the TOOL_FORMAT setting names, or the template's own for ``auto``."""
    fmt = detect(template) if setting == "auto" else get(setting)
    return fmt.for_template(template or "")


def preserved_tokens() -> tuple[str, ...]:
    """Every marker a reply parser reads, once each: the engine keeps these in the text when a
    model's vocabulary makes them control tokens (llama.cpp drops those unless asked)."""
    sources = (*REASONING.values(), *FORMATS.values())
    return tuple(dict.fromkeys(m for f in sources for m in f.markers))


def summary(template: str | None, control_texts: tuple[str, ...], tool_setting: str,
            reasoning_setting: str) -> dict[str, object]:
    """What the server reads in this model's replies (/props "formats" and the load log): the
    tool-call format and thought syntax chosen for its chat template, and of the control tokens
    the template names, those a reply parser reads and those dropped from replies (llama.cpp
    does not show a control token unless asked: a marker no format knows vanishes silently)."""
    fmt = choose(tool_setting, template)
    thought, taught = choose_reasoning(reasoning_setting, template)
    text = template or ""
    named = [c for c in control_texts if c and c in text]
    read = {*fmt.markers, *thought.markers}
    return {
        "tool_format": fmt.name,
        "thought_format": thought.name if taught else None,
        "reads": [c for c in named if c in read],
        "drops": [c for c in named if c not in read],
    }


def describe() -> str:
    """The formats in words, for the TOOL_FORMAT setting's help."""
    named = [f"{f.name} ({f.summary})" for f in FORMATS.values()]
    return ", ".join(named[:-1]) + ", or " + named[-1]
