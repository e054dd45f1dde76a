"""ByteDance Seed-OSS: Qwen3-Coder's XML calls in a block of their own,
``<seed:tool_call>\\n<function=NAME>\\n<parameter=KEY>VALUE</parameter>\\n</function>\\n</seed:tool_call>``
(no newlines around a value, so a value's own newlines are kept), and thoughts in
``<seed:think>...</seed:think>`` whose length the template's ``thinking_budget`` variable sets:
0 turns thinking off (the template then closes an empty thought in the prompt), -1 (its
default) leaves it free, another number asks the model to keep within it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.formats.base import T
from app.formats.qwen3_coder import END_FUNCTION, END_PARAMETER, FUNCTION, PARAMETER, Qwen3Coder
from app.formats.spec import Tool
from app.formats.think import ReasoningFormat

SEED_CALL, END_SEED_CALL = "<seed:tool_call>", "</seed:tool_call>"


class SeedOss(Qwen3Coder):
    name = "seed_oss"
    summary = "`<seed:tool_call>` with `<function=...>` XML"
    triggers = (SEED_CALL,)
    markers = (SEED_CALL, END_SEED_CALL, FUNCTION, END_FUNCTION, PARAMETER, END_PARAMETER)
    block_open, block_close, nl = SEED_CALL, END_SEED_CALL, ""

    def detect(self, template: str) -> bool:
        return SEED_CALL in template

    def offer(self, messages: list[dict[str, Any]], extra: dict[str, Any], tools: list[Tool],
              required: bool, protect: Callable[[T], T]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The tools as the template's ``tools``, each with ``properties`` (the template lists
        them, and fails on a tool that takes no arguments without them)."""
        messages, extra = super().offer(messages, extra, tools, required, protect)
        for tool in extra["tools"]:
            fn = tool["function"]
            fn["parameters"] = {"properties": {}, **fn["parameters"]}
        return messages, extra

    def history(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Arguments as objects whose values that are not strings are their JSON text (the
        template writes each value with Jinja's ``string``, which gives Python's ``True`` and
        ``{'a': 1}``)."""
        out = super().history(messages)
        for m in out:
            if m.get("role") != "assistant":
                continue
            for call in m.get("tool_calls") or ():
                args = call.get("function", {}).get("arguments")
                if isinstance(args, dict):
                    call["function"]["arguments"] = {
                        k: v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
                        for k, v in args.items()}
        return out


@dataclass(frozen=True)
class BudgetThink(ReasoningFormat):
    """A thought whose length a template variable sets (0: no thought)."""

    variable: str = "thinking_budget"

    def controls(self, variables: dict[str, Any], effort: str | None,
                 thinking: bool | None) -> dict[str, Any]:
        """Off (a budget of 0) when the request turns thinking off or asks for no effort; the
        client's own variables win."""
        if thinking is False or effort == "none":
            return {self.variable: 0, **variables}
        return variables

    def budgeted(self, variables: dict[str, Any], budget: int) -> dict[str, Any]:
        return {self.variable: budget, **variables}


SEED_THINK = BudgetThink("seed", "<seed:think>", "</seed:think>")
