"""Mistral: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]`` (Nemo) and
``[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}`` / ``[TOOL_CALLS]NAME[ARGS]{...}`` (Small 3.2, Devstral).

Its templates insist on call ids of 9 alphanumerics, so calls get such ids and the history's ids
are mapped to them.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import string
from typing import Any

from app.formats.base import MarkerFormat, rest_is
from app.formats.gbnf import call_schema, lit, schema_rules
from app.formats.partial_json import Found, call_object, is_json, value_end, ws
from app.formats.spec import NAME_PREFIX_RE, NAME_RE, ReplySpec, Tool
from app.grammar.gate import Limits

TOOL_CALLS, CALL_ID, ARGS = "[TOOL_CALLS]", "[CALL_ID]", "[ARGS]"
_ALPHABET = string.ascii_letters + string.digits
_ID_CHARS = re.compile(r"[A-Za-z0-9]*")


def mistral_id(call_id: Any) -> str:
    """The 9-alphanumeric id a Mistral template accepts for ``call_id`` (the same id always
    maps to the same one; one already of that shape is kept)."""
    if isinstance(call_id, str) and len(call_id) == 9 and call_id.isalnum():
        return call_id
    digest = hashlib.sha256(str(call_id).encode()).digest()
    return "".join(_ALPHABET[b % len(_ALPHABET)] for b in digest[:9])


class Mistral(MarkerFormat):
    name = "mistral"
    summary = "`[TOOL_CALLS]`"
    triggers = (TOOL_CALLS,)
    markers = (TOOL_CALLS, ARGS, CALL_ID)

    def detect(self, template: str) -> bool:
        return TOOL_CALLS in template

    def history(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = super().history(messages)
        for m in out:
            if m.get("role") == "assistant" and m.get("tool_calls"):
                m["tool_calls"] = [{**c, "id": mistral_id(c.get("id"))} for c in m["tool_calls"]]
            elif m.get("role") == "tool":
                m["tool_call_id"] = mistral_id(m.get("tool_call_id"))
        return out

    def call_id(self) -> str:
        return "".join(secrets.choice(_ALPHABET) for _ in range(9))

    def calls(self, tools: list[Tool], *, parallel: bool, template: str,
              limits: Limits) -> tuple[list[str], str]:
        rules: list[str] = []
        if ARGS in template:  # [TOOL_CALLS]name[ARGS]{...}
            alts = []
            for i, t in enumerate(tools):
                rules.append(schema_rules(t.parameters, f"a{i}-", limits))
                alts.append(f'{lit(t.name)} "[ARGS]" a{i}-root')
            one = '"[TOOL_CALLS]" ( ' + " | ".join(alts) + " )"
            return rules, (f"( {one} )+" if parallel else one)
        call = call_schema(tools, "arguments")  # [TOOL_CALLS][{...}, ...]
        defs = call.pop("$defs", None)
        many = {"type": "array", "items": call, "minItems": 1, **({} if parallel else {"maxItems": 1})}
        if defs:
            many["$defs"] = defs
        return [schema_rules(many, "c-", limits)], '"[TOOL_CALLS]" c-root'

    def block(self, body: str, i: int, marker: str, spec: ReplySpec,
              final: bool) -> tuple[list[Found], int | None]:
        j = ws(body, i + len(marker))
        if j >= len(body):
            return [], None
        if body[j] == "[":  # [{"name": ..., "arguments": ..., "id": ...}, ...]
            return _call_list(body, j + 1)
        m = NAME_PREFIX_RE.match(body, j)
        name, k = m.group(), m.end()
        if body.startswith(CALL_ID, k):
            k = _ID_CHARS.match(body, k + len(CALL_ID)).end()
        after = rest_is(body, k, ARGS)
        if after is None or (after == -1 and CALL_ID.startswith(body[k:])):
            return [], None
        if after == -1 or not NAME_RE.fullmatch(name):
            return [], -1
        start = ws(body, after)
        end, complete = value_end(body, start)
        args = body[start:end]
        if complete and not is_json(args):
            return [(name, args, False)], -1  # the name went out with [ARGS]: it stays, uncounted
        return [(name, args, complete)], (end if complete else None)


def _call_list(body: str, j: int) -> tuple[list[Found], int | None]:
    """The calls of a JSON list, from just past its ``[``."""
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
