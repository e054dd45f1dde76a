"""Magistral and Ministral 3 Reasoning: thoughts between ``[THINK]`` and ``[/THINK]`` at the start
of the reply, calls in Mistral's own form (``[TOOL_CALLS]NAME[ARGS]{...}``, see mistral.py).

Their templates teach the thought in the default system prompt and render an earlier thought
as ``[THINK]...[/THINK]`` before the turn's text (Ministral 3 from a ``thinking`` chunk, the
Unsloth Magistral template from the text itself), so the history writes it into the text: both
render the same prompt the model wrote.
"""

from __future__ import annotations

from typing import Any

from app.formats.mistral import Mistral
from app.formats.think import ReasoningFormat

MAGISTRAL_THINK = ReasoningFormat("magistral", "[THINK]", "[/THINK]")


class Magistral(Mistral):
    name = "magistral"
    summary = "`[THINK]` thoughts, `[TOOL_CALLS]` calls"

    def detect(self, template: str) -> bool:
        return MAGISTRAL_THINK.open in template and MAGISTRAL_THINK.close in template

    def history(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Mistral's history, with an assistant turn's earlier thought written before its text
        as the model wrote it, and no ``None`` text (Ministral 3 measures the text's length)."""
        out = super().history(messages)
        for m in out:
            if m.get("role") != "assistant":
                continue
            thought = m.get("reasoning_content")
            content = "" if m.get("content") is None else m["content"]
            if isinstance(content, str) and isinstance(thought, str) and thought:
                content = MAGISTRAL_THINK.open + thought + MAGISTRAL_THINK.close + content
                del m["reasoning_content"]
            m["content"] = content
        return out
