"""Reasoning written between two tags (``<think>...</think>``), as a pure function of the text.

A thought is recognised only at the start of a reply (after whitespace), as reasoning models
write it, or from the first token when the chat template already opened the thought in the
prompt. ``split`` is called on the whole text generated so far, so a streaming caller gets a
prefix of the final answer each time: it never returns part of a tag, and holds text that may
still turn out to be the opening tag.

The tags live here and nowhere else: the reply parser, the grammar that lets a thought come
before a forced call, the engine's preserved tokens and the reasoning budget's injected close all
read them from the format object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.engine.text import held_suffix
from app.formats import memo
from app.formats.gbnf import lit, until


@dataclass(frozen=True)
class Thought:
    reasoning: str | None  # None: the reply has no thought (so far)
    rest: str | None  # the text after the thought; None while undecided (hold everything)
    open: bool  # the thought has not been closed yet


@dataclass(frozen=True)
class ReasoningFormat:
    """A thought between ``open`` and ``close`` at the start of a reply."""

    name: str
    open: str
    close: str

    @property
    def markers(self) -> tuple[str, ...]:
        """What the parser reads: kept in the text when a model makes them control tokens."""
        return (self.open, self.close)

    def detect(self, template: str) -> bool:
        """Whether a chat template teaches its model to think in these tags."""
        return self.open in template

    def opened(self, prompt: str) -> bool:
        """Whether the rendered prompt already opened a thought (the reply starts inside it)."""
        return prompt.rstrip().endswith(self.open)

    def split(self, text: str, in_thought: bool = False, final: bool = False) -> Thought:
        """The thought and what follows it in ``text`` (the whole reply so far, or all of it)."""
        if in_thought:
            body = text
        else:
            stripped = text.lstrip()
            if not stripped.startswith(self.open):
                if not final and self.open.startswith(stripped):
                    return Thought(None, None, False)  # "", "  " or "<thi": wait
                return Thought(None, text, False)
            body = stripped[len(self.open) :]
        kept = memo.resume("close", body, 0)  # searched before, up to there (a stream)
        end = body.find(self.close, max(0, kept[0] - len(self.close) + 1) if kept else 0)
        if end == -1:
            memo.keep("close", body, 0, len(body))
            keep = 0 if final else held_suffix(body, (self.close,))
            return Thought(body[: len(body) - keep], "", True)
        return Thought(body[:end], body[end + len(self.close) :], False)

    def answer(self, rest: str, final: bool) -> str:
        """The content of the text after the thought when no tool format reads it: the text
        itself (a syntax whose answer has markup of its own, such as harmony's final channel,
        reads it here)."""
        return rest

    def ending(self, calls: bool) -> str:
        """What ends a thought on request (reasoning control, a budget): the closing tag (a
        syntax may open the answer too; ``calls``: the reply is read for tool calls)."""
        return self.close

    def controls(self, variables: dict[str, Any], effort: str | None,
                 thinking: bool | None) -> dict[str, Any]:
        """The chat template's variables with the request's thinking switch and effort in the
        form this syntax's templates read (Qwen 3's and most others: ``enable_thinking``);
        what the client set itself (chat_template_kwargs) wins."""
        if thinking is False:
            return {"enable_thinking": False, **variables}
        return variables

    def budgeted(self, variables: dict[str, Any], budget: int) -> dict[str, Any]:
        """The chat template's variables with the request's thought budget in tokens (its
        reasoning_budget, Anthropic's budget_tokens, an effort's budget) where this syntax's
        template reads one (Seed-OSS's thinking_budget); unchanged here."""
        return variables

    def finish_prompt(self, prompt: str, thinking: bool | None) -> str:
        """The rendered prompt as the request's thinking switch wants it: a syntax whose
        template reads no switch (Command R7B) closes an empty thought itself; unchanged here."""
        return prompt

    def lead(self, lead: str, then: str) -> list[str]:
        """Grammar rules whose ``root`` is ``then`` after what ``lead`` allows first: "" (nothing),
        "think" (an optional thought) or "open" (the prompt opened a thought: it must close)."""
        rules = [until("th", self.close)] if lead else []
        # a few blank characters between the thought and what follows, not any number: a
        # random model looped on them until max_tokens
        root = {"": then, "think": f"( {lit(self.open)} th0 [ \\t\\n]{{0,4}} )? {then}",
                "open": f"th0 [ \\t\\n]{{0,4}} {then}"}
        return [*rules, f"root ::= {root[lead]}"]


THINK = ReasoningFormat("think", "<think>", "</think>")
OPEN, CLOSE = THINK.open, THINK.close


def split_thought(text: str, in_thought: bool = False, final: bool = False) -> Thought:
    """The thought and what follows it in ``text`` (the whole reply so far, or all of it): a
    thought is recognised only at the start of a reply, or from the first token when the chat
    template already opened it; a streaming caller gets a prefix of the final answer each time."""
    return THINK.split(text, in_thought, final)


def split(text: str, in_thought: bool = False) -> tuple[str | None, str]:
    """(reasoning or None, content) of a whole reply."""
    t = split_thought(text, in_thought, final=True)
    return t.reasoning, t.rest or ""
