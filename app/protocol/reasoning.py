"""Reasoning (``<think>...</think>``) separated from the answer, as a pure function of the text.

A thought is recognised only at the start of a reply (after whitespace), as reasoning models
write it, or from the first token when the chat template already opened ``<think>`` in the
prompt. ``split_thought`` is called on the whole text generated so far, so a streaming caller
gets a prefix of the final answer each time: it never returns part of a tag, and holds text that
may still turn out to be the opening tag.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.text import held_suffix

OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class Thought:
    reasoning: str | None  # None: the reply has no thought (so far)
    rest: str | None  # the text after the thought; None while undecided (hold everything)
    open: bool  # the thought has not been closed yet


def split_thought(text: str, in_thought: bool = False, final: bool = False) -> Thought:
    """The thought and what follows it in ``text`` (the whole reply so far, or all of it)."""
    if in_thought:
        body = text
    else:
        stripped = text.lstrip()
        if not stripped.startswith(OPEN):
            if not final and OPEN.startswith(stripped):
                return Thought(None, None, False)  # "", "  " or "<thi": wait
            return Thought(None, text, False)
        body = stripped[len(OPEN) :]
    end = body.find(CLOSE)
    if end == -1:
        keep = 0 if final else held_suffix(body, (CLOSE,))
        return Thought(body[: len(body) - keep], "", True)
    return Thought(body[:end], body[end + len(CLOSE) :], False)


def split(text: str, in_thought: bool = False) -> tuple[str | None, str]:
    """(reasoning or None, content) of a whole reply."""
    t = split_thought(text, in_thought, final=True)
    return t.reasoning, t.rest or ""
