"""IBM Granite 3.x: calls as ``<|tool_call|>[{"name": ..., "arguments": {...}}, ...]``, and, when
the request turns thinking on (the templates' ``thinking`` variable), a thought in ``<think>``
followed by the answer in ``<response>...</response>``.

Granite 3.3's template renders no ``tool_calls`` (an assistant turn is its text alone), Granite
3.0-3.2's write them as ``<|tool_call|>`` and the JSON list: the history writes a turn's calls
into its text that way, which both render alike. Granite 4 templates teach Hermes's
``<tool_call>`` and are read as ``hermes``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.engine.text import held_suffix
from app.formats.json_list import JsonList, written
from app.formats.partial_json import ws
from app.formats.think import ReasoningFormat, Thought

TOOL_CALL = "<|tool_call|>"


class Granite(JsonList):
    name = "granite"
    summary = "`<|tool_call|>` JSON list"
    open = TOOL_CALL
    triggers = (TOOL_CALL,)
    markers = (TOOL_CALL,)

    def detect(self, template: str) -> bool:
        return TOOL_CALL in template

    def history(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """An assistant turn's calls written after its text as the model writes them (Granite
        3.3's template has no place for ``tool_calls``); no ``None`` text (it is added to a
        string)."""
        out = []
        for m in messages:
            m = dict(m)
            if m.get("role") == "assistant":
                text = m.get("content")
                text = "" if text is None else text
                calls = m.pop("tool_calls", None)
                if calls and isinstance(text, str):
                    text += TOOL_CALL + written(calls)
                m["content"] = text
            out.append(m)
        return out


@dataclass(frozen=True)
class ResponseThink(ReasoningFormat):
    """A ``<think>`` thought whose answer comes wrapped in ``<response>...</response>`` (the
    wrapper is not content), switched on by a template variable that is off unless set."""

    answer_open: str = "<response>"
    answer_close: str = "</response>"
    switch: str = "thinking"
    needs: str = "<|start_of_role|>"  # the family's turns (MiniMax writes <response> too)

    @property
    def markers(self) -> tuple[str, ...]:
        return (self.open, self.close, self.answer_open, self.answer_close)

    def detect(self, template: str) -> bool:
        return self.open in template and self.answer_open in template and self.needs in template

    def split(self, text: str, in_thought: bool = False, final: bool = False) -> Thought:
        t = super().split(text, in_thought, final)
        if t.rest is None or t.open:
            return t
        return Thought(t.reasoning, self._unwrapped(t.rest, final), False)

    def _unwrapped(self, rest: str, final: bool) -> str:
        """The answer without its wrapper; held while the text may still become it."""
        i = ws(rest, 0)
        if not rest.startswith(self.answer_open, i):
            if not final and self.answer_open.startswith(rest[i:]):
                return ""
            return rest
        body = rest[i + len(self.answer_open):]
        end = body.find(self.answer_close)
        if end != -1:
            return body[:end] + body[end + len(self.answer_close):]
        return body[: len(body) - (0 if final else held_suffix(body, (self.answer_close,)))]

    def controls(self, variables: dict[str, Any], effort: str | None,
                 thinking: bool | None) -> dict[str, Any]:
        """The switch on or off as the request said, else on for any effort but "none" (the
        template thinks only when asked); the client's own variables win."""
        on = thinking if thinking is not None else None if effort is None else effort != "none"
        return variables if on is None else {self.switch: on, **variables}


GRANITE_THINK = ResponseThink("granite", "<think>", "</think>")
