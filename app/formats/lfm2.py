"""LFM2 / LFM2.5 (Liquid AI): ``<|tool_call_start|>[get_weather(city="Paris"), ...]<|tool_call_end|>``,
a Python call list (app.formats.pythonic reads it) between the family's markers, written before
any text; ``<think>`` thoughts for LFM2.5. llama.cpp's older LFM2 template and its parser took a
JSON list there too (``[{"name": ..., "arguments": {...}}]``): the scanner reads both.

The templates differ in what they render: LFM2's (tools between ``<|tool_list_start|>`` and
``<|tool_list_end|>``) and LFM2.5-Instruct's (``List of tools: [...]``) render an assistant turn's
text only, so the history writes an earlier call into the text as the model wrote it (and, for
a template that names ``<think>``, an earlier thought before it); LFM2.5-8B-A1B's renders the
calls itself (arguments as objects) and an earlier thought from ``thinking``.
"""

from __future__ import annotations

import json
from typing import Any

from app.formats.base import MarkerFormat, load_args, rest_is
from app.formats.partial_json import Found, call_object, ws
from app.formats.pythonic import call_list, list_grammar
from app.formats.spec import ReplySpec, Tool
from app.formats.think import THINK
from app.grammar.gate import Limits

START, END = "<|tool_call_start|>", "<|tool_call_end|>"
LIST_START = "<|tool_list_start|>"  # LFM2's template puts the tools between these
LISTED = "List of tools: ["  # LFM2.5-Instruct's spelling, without the markers


def py_literal(value: Any) -> str:
    """``value`` (JSON data) as a Python literal: strings double quoted as the model card writes
    them, True / False / None, lists and dicts of the same."""
    if isinstance(value, bool) or value is None:
        return {True: "True", False: "False", None: "None"}[value]
    if isinstance(value, list):
        return "[" + ", ".join(py_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k), ensure_ascii=False)}: {py_literal(v)}"
                               for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)


def call_text(calls: list[dict[str, Any]]) -> str:
    """OpenAI tool calls as the model writes them."""
    out = []
    for c in calls:
        fn = c.get("function") or {}
        args = load_args(fn.get("arguments"))
        kwargs = ", ".join(f"{k}={py_literal(v)}" for k, v in args.items()) \
            if isinstance(args, dict) else ""
        out.append(f"{fn.get('name')}({kwargs})")
    return START + "[" + ", ".join(out) + "]" + END


class Lfm2(MarkerFormat):
    name = "lfm2"
    summary = "`<|tool_call_start|>` Python call lists"
    triggers = (START,)
    markers = (START, END)

    def detect(self, template: str) -> bool:
        return START in template or LIST_START in template or (
            LISTED in template and "<|im_start|>" in template)

    def for_template(self, template: str) -> Lfm2:
        return self if "tool_calls" in template else _Lfm2Text(template)

    def history(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Arguments as objects, an earlier thought as ``thinking``, never ``None`` text (the
        template iterates a text that is not a string as parts)."""
        out = super().history(messages)
        for m in out:
            if m.get("role") == "assistant":
                if m.get("content") is None:
                    m["content"] = ""
                if m.get("reasoning_content"):
                    m.setdefault("thinking", m["reasoning_content"])
        return out

    def calls(self, tools: list[Tool], *, parallel: bool, template: str,
              limits: Limits) -> tuple[list[str], str]:
        rules, many = list_grammar(tools, parallel=parallel, limits=limits)
        return rules, f'"{START}" {many} "{END}"'

    def block(self, body: str, i: int, marker: str, spec: ReplySpec,
              final: bool) -> tuple[list[Found], int | None]:
        j = ws(body, i + len(marker))
        if j >= len(body):
            return [], None
        if body[j] != "[":
            return [], -1
        k = ws(body, j + 1)
        if k >= len(body):
            return [], None
        found, end = _json_list(body, k) if body[k] == "{" else call_list(body, j + 1)
        if end is None or end == -1:
            return found, end
        k = ws(body, end)
        after = rest_is(body, k, END)
        if after is None:
            return found, (len(body) if final else None)
        return found, (end if after == -1 else after)  # a missing closing marker is forgiven


class _Lfm2Text(Lfm2):
    """LFM2 as a template that renders an assistant turn's text only: the history writes the
    calls (and, where the template names ``<think>``, the thought) into the text."""

    def __init__(self, template: str):
        self.thinks = THINK.open in template

    def history(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for m in messages:
            if m.get("role") == "assistant":
                calls = m.get("tool_calls") or []
                m = {k: v for k, v in m.items() if k != "tool_calls"}
                text = m.get("content") if isinstance(m.get("content"), str) else ""
                thought = m.get("reasoning_content")
                head = f"{THINK.open}{thought}{THINK.close}" if self.thinks and thought else ""
                m["content"] = head + (call_text(calls) if calls else "") + text
            out.append(m)
        return out


def _json_list(body: str, j: int) -> tuple[list[Found], int | None]:
    """JSON call objects from the first ``{`` of a list to past its ``]``."""
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
        call, end = call_object(body, j)
        found.append(call)
        if end is None or end == -1:
            return found, end
        j = end
