"""``<think>`` as some families write it: a template that names its own on/off switch, and a
thought that a tool call may end without a ``</think>``.

DeepSeek V3.1 / V3.2 templates read a ``thinking`` variable (off unless set), not Qwen's
``enable_thinking``; Kimi K2 Thinking and DeepSeek V3.2 sometimes open their calls before they
close the thought (llama.cpp's parsers end the thought at the call's opener too). The tags stay
``<think>`` / ``</think>``, so the reasoning budget and reasoning_end inject ``</think>`` as
they do for every other template.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.engine.text import held_suffix
from app.formats import memo
from app.formats.think import ReasoningFormat, Thought


@dataclass(frozen=True)
class FamilyThink(ReasoningFormat):
    """``<think>...</think>`` with a family's own detection, switch and call openers."""

    needs: tuple[str, ...] = ()  # texts a template must all hold to teach this syntax
    # what opens a call: a thought left open ends there (the opener starts the rest)
    breaks: tuple[str, ...] = ()
    switch: str = "enable_thinking"  # the template variable that turns thinking on and off

    def detect(self, template: str) -> bool:
        return self.open in template and all(n in template for n in self.needs)

    def controls(self, variables: dict[str, Any], effort: str | None,
                 thinking: bool | None) -> dict[str, Any]:
        """The switch set from the request: on or off as it said, else on for any effort but
        "none" (a template whose switch is off by default thinks only when asked); both the
        family's variable and ``enable_thinking`` (forks of its template read that)."""
        if self.switch == "enable_thinking":
            return super().controls(variables, effort, thinking)
        on = thinking if thinking is not None else None if effort is None else effort != "none"
        if on is None:
            return variables
        return {self.switch: on, "enable_thinking": on, **variables}

    def split(self, text: str, in_thought: bool = False, final: bool = False) -> Thought:
        t = super().split(text, in_thought, final)
        if not self.breaks or t.reasoning is None:
            return t
        body = text if in_thought else text.lstrip()[len(self.open):]
        # the thought runs to its close (or to the end so far): a call opener before that ends it
        end = len(t.reasoning) if not t.open else len(body)
        longest = max(len(b) for b in self.breaks)
        kept = memo.resume("break", body, 0)  # searched before, up to there (a stream)
        start = max(0, kept[0] - longest + 1) if kept else 0
        hits = [j for b in self.breaks if (j := body.find(b, start, end + len(b) - 1)) != -1]
        hits = [j for j in hits if j < end]
        if hits:
            j = min(hits)
            return Thought(body[:j], body[j:], False)
        if not t.open:
            return t
        memo.keep("break", body, 0, len(body))
        keep = 0 if final else held_suffix(body, (self.close, *self.breaks))
        return Thought(body[: len(body) - keep], "", True)
