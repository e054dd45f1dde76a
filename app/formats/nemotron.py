"""NVIDIA Nemotron Nano v2: calls as ``<TOOLCALL>[{"name": ..., "arguments": {...}}, ...]</TOOLCALL>``
and ``<think>`` thoughts that the template opens in the prompt (``<think>\\n``) unless a system
or user turn says ``/no_think`` (then it writes ``<think></think>``); ``/think`` turns them back
on, the last switch said wins.

The template reads no variable for it, so a request's own switch (Anthropic's ``thinking``,
Gemini's ``thinkingBudget: 0``, Ollama's ``think``) ends the prompt the way the template ends it
for that switch. Earlier thoughts are not rendered: the template drops them.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.formats.json_list import JsonList
from app.formats.think import ReasoningFormat

TOOLCALL, END_TOOLCALL = "<TOOLCALL>", "</TOOLCALL>"


class Nemotron(JsonList):
    name = "nemotron"
    summary = "`<TOOLCALL>` JSON list"
    open = TOOLCALL
    close = END_TOOLCALL
    triggers = (TOOLCALL,)
    markers = (TOOLCALL, END_TOOLCALL)

    def detect(self, template: str) -> bool:
        return TOOLCALL in template


@dataclass(frozen=True)
class SwitchedThink(ReasoningFormat):
    """``<think>`` opened by the prompt, switched by ``/think`` and ``/no_think`` in the turns:
    the template's own ending of the prompt is ``on`` or ``off``."""

    on: str = "<think>\n"
    off: str = "<think></think>"

    def detect(self, template: str) -> bool:
        return "/no_think" in template and self.off in template

    def finish_prompt(self, prompt: str, thinking: bool | None) -> str:
        if thinking is False and prompt.endswith(self.on):
            return prompt[: -len(self.on)] + self.off
        if thinking is True and prompt.endswith(self.off):
            return prompt[: -len(self.off)] + self.on
        return prompt


NEMOTRON_THINK = SwitchedThink("nemotron", "<think>", "</think>")
