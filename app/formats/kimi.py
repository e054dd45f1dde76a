"""Kimi K2 (Instruct and Thinking): ``<|tool_calls_section_begin|><|tool_call_begin|>
functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>``.

The call's id is ``functions.NAME:IDX``, IDX counting the calls of the whole conversation, and
Kimi's own template writes each past call's ``id`` and each result's ``tool_call_id`` as they are
(``## Return of ID``): the history renames every call that way and points each result at its
call's new id. K2 Thinking thinks in ``<think>`` and may open its calls before it closes the
thought (llama.cpp ends the thought at the call), which ``KIMI_THINK`` follows.
"""

from __future__ import annotations

import re
from typing import Any

from app.engine.text import held_suffix
from app.formats.base import MarkerFormat, rest_is
from app.formats.family_think import FamilyThink
from app.formats.gbnf import lit, schema_rules
from app.formats.partial_json import Found, is_json, value_end, ws
from app.formats.spec import ReplySpec, Tool
from app.grammar.gate import Limits

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGS, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
_ID = re.compile(r"\s*(?:functions\.)?([A-Za-z0-9_-]{1,64})(?::[0-9]+)?\s*")
_ID_SO_FAR = re.compile(r"\s*[A-Za-z0-9_.:-]{0,90}")

KIMI_THINK = FamilyThink("kimi", "<think>", "</think>", needs=(SECTION_BEGIN,),
                         breaks=(SECTION_BEGIN, CALL_BEGIN))


def kimi_id(name: str, index: int) -> str:
    """The id Kimi gives its ``index``-th call of a conversation (from 0), to ``name``."""
    return f"functions.{name}:{index}"


class Kimi(MarkerFormat):
    name = "kimi"
    summary = "`<|tool_call_begin|>functions.NAME:IDX`"
    triggers = (SECTION_BEGIN,)
    markers = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARGS, CALL_END)

    @property
    def starts(self) -> tuple[str, ...]:
        return (SECTION_BEGIN, CALL_BEGIN)  # a call written without its section still counts

    def detect(self, template: str) -> bool:
        return SECTION_BEGIN in template

    def history(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each past call's id as Kimi writes it (``functions.NAME:IDX``, counted over the
        conversation), and each result's ``tool_call_id`` pointing at it: by the id the client
        gave, else the earliest call not answered yet."""
        out = super().history(messages)
        renamed: dict[str, str] = {}
        waiting: list[str] = []
        count = 0
        for m in out:
            if m.get("role") == "assistant" and m.get("tool_calls"):
                calls = []
                for c in m["tool_calls"]:
                    new = kimi_id(str((c.get("function") or {}).get("name") or "unknown"), count)
                    count += 1
                    if c.get("id") is not None:
                        renamed[str(c["id"])] = new
                    waiting.append(new)
                    calls.append({**c, "id": new})
                m["tool_calls"] = calls
            elif m.get("role") == "tool":
                old = m.get("tool_call_id")
                new = renamed.get(str(old)) if old is not None else None
                if new is None or new not in waiting:
                    new = waiting[0] if waiting else new
                if new is not None:
                    if new in waiting:
                        waiting.remove(new)
                    m["tool_call_id"] = new
        return out

    def calls(self, tools: list[Tool], *, parallel: bool, template: str,
              limits: Limits) -> tuple[list[str], str]:
        rules, alts = [], []
        for i, t in enumerate(tools):
            rules.append(schema_rules(t.parameters, f"a{i}-", limits))
            alts.append(f'{lit("functions." + t.name + ":")} [0-9] [0-9]? [0-9]? {lit(ARGS)} a{i}-root')
        one = f"{lit(CALL_BEGIN)} ( {' | '.join(alts)} ) {lit(CALL_END)}"
        return rules, f"{lit(SECTION_BEGIN)} {one}{' ( ' + one + ' )*' if parallel else ''} " \
                      f"{lit(SECTION_END)}"

    def block(self, body: str, i: int, marker: str, spec: ReplySpec,
              final: bool) -> tuple[list[Found], int | None]:
        found: list[Found] = []
        j = i + len(SECTION_BEGIN) if marker == SECTION_BEGIN else i
        while True:
            at = j  # content resumes here if no call follows
            j = ws(body, j)
            end = rest_is(body, j, SECTION_END)
            if end is not None and end != -1:
                return found, end
            start = rest_is(body, j, CALL_BEGIN)
            if start is None or end is None:
                return found, None
            if start == -1:  # the section ends without its marker: what follows is content
                return found, (at if found else -1)
            more, k = _call(body, start)
            found += more
            if k is None or k == -1:
                return found, k
            j = k


def _call(body: str, k: int) -> tuple[list[Found], int | None]:
    """One call from just past ``<|tool_call_begin|>``: its id, ``<|tool_call_argument_begin|>``,
    JSON arguments, then ``<|tool_call_end|>`` (forgiven when missing, as llama.cpp does)."""
    a = body.find(ARGS, k)
    if a == -1:
        so_far = body[k:]
        so_far = so_far[: len(so_far) - held_suffix(so_far, (ARGS,))]
        return [], (None if _ID_SO_FAR.fullmatch(so_far) else -1)
    m = _ID.fullmatch(body, k, a)
    if m is None:
        return [], -1
    name = m.group(1)
    j = ws(body, a + len(ARGS))
    end, complete = value_end(body, j)
    args = body[j:end]
    if not complete:
        return [(name, args, False)], None
    if not is_json(args):
        return [(name, args, False)], -1  # the name went out: it stays, uncounted
    j = ws(body, end)
    after = rest_is(body, j, CALL_END)
    if after is None:
        return [(name, args, True)], None
    return [(name, args, True)], (j if after == -1 else after)
