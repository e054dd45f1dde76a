"""Command R7B (Cohere): ``<|START_THINKING|>plan<|END_THINKING|>`` then either
``<|START_ACTION|>[{"tool_call_id": "0", "tool_name": ..., "parameters": {...}}, ...]<|END_ACTION|>``
or ``<|START_RESPONSE|>answer<|END_RESPONSE|>``. Cohere2 MoE (North Code) writes the same, its
answers between ``<|START_TEXT|>`` and ``<|END_TEXT|>``, and its prompt opens the thought.

The template wraps every answer in the response markers, so the scanner reads replies to
requests without tools too (``reads_replies``): no marker reaches the content. Thinking is on
unless the request turns it off: ``enable_thinking`` for llama.cpp's copy of the template, an
empty thought closed at the end of the prompt for Cohere's own (as llama.cpp does). An earlier call's plan is rendered from ``tool_plan`` (Cohere's template) or
``reasoning_content`` (llama.cpp's copy of it): the history sets both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.formats.base import MarkerFormat, rest_is
from app.formats.gbnf import hoist_defs, schema_rules
from app.formats.partial_json import Found, call_object, ws
from app.formats.spec import ReplySpec, Tool
from app.formats.think import ReasoningFormat
from app.grammar.gate import Limits

START_ACTION, END_ACTION = "<|START_ACTION|>", "<|END_ACTION|>"
START_RESPONSE, END_RESPONSE = "<|START_RESPONSE|>", "<|END_RESPONSE|>"
START_TEXT, END_TEXT = "<|START_TEXT|>", "<|END_TEXT|>"  # Cohere2 MoE's answer markers
START_THINKING, END_THINKING = "<|START_THINKING|>", "<|END_THINKING|>"
CHATBOT = "<|CHATBOT_TOKEN|>"  # the assistant turn's header: the generation prompt ends with it


@dataclass(frozen=True)
class CohereThought(ReasoningFormat):
    """``<|START_THINKING|>...<|END_THINKING|>``. llama.cpp's copy of the template reads
    ``enable_thinking`` (off unless set: llama.cpp sets it on unless told otherwise), Cohere2
    MoE's ``reasoning`` (on unless set off; its prompt opens the thought); Cohere's own reads no
    switch, so thinking off writes the empty thought into the prompt."""

    def controls(self, variables: dict[str, Any], effort: str | None,
                 thinking: bool | None) -> dict[str, Any]:
        on = thinking if thinking is not None else effort != "none"
        return {"enable_thinking": on, "reasoning": on, **variables}

    def finish_prompt(self, prompt: str, thinking: bool | None) -> str:
        if thinking is False and prompt.endswith(CHATBOT):
            return prompt + self.open + self.close
        return prompt


COMMAND_R7B_THOUGHT = CohereThought("command_r7b", START_THINKING, END_THINKING)


class CommandR7B(MarkerFormat):
    name = "command_r7b"
    summary = "`<|START_ACTION|>` JSON list"
    triggers = (START_ACTION,)
    markers = (START_ACTION, END_ACTION, START_RESPONSE, END_RESPONSE, START_TEXT, END_TEXT)
    reads_replies = True

    @property
    def starts(self) -> tuple[str, ...]:
        return (START_ACTION, START_RESPONSE, END_RESPONSE, START_TEXT, END_TEXT)

    def detect(self, template: str) -> bool:
        return START_ACTION in template and END_ACTION in template

    def history(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Arguments as objects (the template applies ``tojson``); a call's earlier thought as
        its ``tool_plan`` too."""
        out = super().history(messages)
        for m in out:
            if m.get("role") == "assistant" and m.get("tool_calls") and m.get("reasoning_content"):
                m.setdefault("tool_plan", m["reasoning_content"])
        return out

    def calls(self, tools: list[Tool], *, parallel: bool, template: str,
              limits: Limits) -> tuple[list[str], str]:
        """A JSON list of calls, each with a numeric ``tool_call_id`` (the template numbers the
        calls itself), the tool's name and its parameters."""
        params, defs = hoist_defs(tools)
        items = [{
            "type": "object",
            "properties": {"tool_call_id": {"type": "string", "pattern": "^[0-9]{1,10}$"},
                           "tool_name": {"const": t.name}, "parameters": p},
            "required": ["tool_call_id", "tool_name", "parameters"],
            "additionalProperties": False,
        } for t, p in zip(tools, params, strict=True)]
        many: dict[str, Any] = {"type": "array", "items": items[0] if len(items) == 1 else
                                {"anyOf": items}, "minItems": 1}
        if not parallel:
            many["maxItems"] = 1
        if defs:
            many["$defs"] = defs
        return [schema_rules(many, "c-", limits)], f'"{START_ACTION}" c-root "{END_ACTION}"'

    def block(self, body: str, i: int, marker: str, spec: ReplySpec,
              final: bool) -> tuple[list[Found], int | None]:
        if marker != START_ACTION:  # a response marker: dropped, its text is the content
            return [], i + len(marker)
        j = ws(body, i + len(marker))
        if j >= len(body):
            return [], None
        if body[j] != "[":
            return [], -1
        found, end = _action_list(body, j + 1)
        if not spec.names:  # no tools were offered: what it wrote is no call
            found = [(None, args, done) for _, args, done in found]
        if end is None or end == -1:
            return found, end
        k = ws(body, end)
        after = rest_is(body, k, END_ACTION)
        if after is None:
            return found, (len(body) if final else None)
        return found, (end if after == -1 else after)  # a missing END_ACTION is forgiven


def _action_list(body: str, j: int) -> tuple[list[Found], int | None]:
    """The calls of the action's JSON list, from just past its ``[``: (calls, past its ``]``)."""
    found: list[Found] = []
    while True:
        j = ws(body, j)
        if j >= len(body):
            return found, None
        if body[j] == "]":
            return found, j + 1
        if body[j] == ",":
            j += 1
            continue
        if body[j] != "{":
            return found, -1
        call, end = call_object(body, j, names=("tool_name",), args_keys=("parameters",))
        found.append(call)
        if end is None or end == -1:
            return found, end
        j = end
