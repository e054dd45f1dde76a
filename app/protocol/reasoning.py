"""Reasoning (``<think>...</think>``) separated from the answer, as a pure function of the text.

The tags and the splitting live on the reasoning format (app.formats.think); these are its
names as the rest of the server uses them. A thought is recognised only at the start of a reply,
or from the first token when the chat template already opened it in the prompt; a streaming
caller gets a prefix of the final answer each time.
"""

from __future__ import annotations

from app.formats.think import THINK, Thought

__all__ = ["CLOSE", "OPEN", "Thought", "split", "split_thought"]

OPEN, CLOSE = THINK.open, THINK.close


def split_thought(text: str, in_thought: bool = False, final: bool = False) -> Thought:
    """The thought and what follows it in ``text`` (the whole reply so far, or all of it)."""
    return THINK.split(text, in_thought, final)


def split(text: str, in_thought: bool = False) -> tuple[str | None, str]:
    """(reasoning or None, content) of a whole reply."""
    t = split_thought(text, in_thought, final=True)
    return t.reasoning, t.rest or ""
