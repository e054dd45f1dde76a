"""Reasoning (``<think>...</think>``) separated from the answer, incrementally.

Fed one text piece at a time, ``ThinkSplitter`` returns (kind, text) parts, kind "reasoning" or
"content", never emitting part of a tag: a piece ending in "<thi" is held until the next one
says whether it is a tag. A template that already opened ``<think>`` in the prompt starts the
splitter inside the thought.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ThinkSplitter:
    def __init__(self, in_thought: bool = False):
        self.in_thought = in_thought
        self._held = ""
        self._seen_open = in_thought

    def feed(self, piece: str) -> list[tuple[str, str]]:
        text = self._held + piece
        self._held = ""
        out: list[tuple[str, str]] = []
        while text:
            tag = CLOSE if self.in_thought else OPEN
            if not self.in_thought and self._seen_open:
                out.append(("content", text))  # one thought per reply: the rest is the answer
                return _merge(out)
            i = text.find(tag)
            if i == -1:
                keep = _partial_tag(text, tag)
                body = text[: len(text) - keep]
                if body:
                    out.append(("reasoning" if self.in_thought else "content", body))
                self._held = text[len(text) - keep :]
                break
            if i:
                out.append(("reasoning" if self.in_thought else "content", text[:i]))
            text = text[i + len(tag) :]
            if self.in_thought:
                self.in_thought = False
            else:
                self.in_thought = self._seen_open = True
        return _merge(out)

    def flush(self) -> list[tuple[str, str]]:
        held, self._held = self._held, ""
        return [("reasoning" if self.in_thought else "content", held)] if held else []


def _merge(parts: list[tuple[str, str]]) -> list[tuple[str, str]]:
    merged: list[tuple[str, str]] = []
    for kind, text in parts:
        if merged and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + text)
        elif text:
            merged.append((kind, text))
    return merged


def split(text: str, in_thought: bool = False) -> tuple[str | None, str]:
    """(reasoning or None, content) of a whole reply."""
    s = ThinkSplitter(in_thought)
    parts = s.feed(text) + s.flush()
    reasoning = "".join(t for k, t in parts if k == "reasoning")
    content = "".join(t for k, t in parts if k == "content")
    return (reasoning if (reasoning or s._seen_open) else None), content
