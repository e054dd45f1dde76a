"""The generic form, for templates that know nothing of tools (the default SmolLM2), as
llama.cpp's generic handler does it: the tools described in a system message, and the whole reply
held by a grammar to ``{"tool_calls": [{"name", "arguments"}]}`` or, when the model may answer in
words, ``{"response": "..."}``. Past calls and results are written into the history as that
same JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from app.formats.base import T, ToolFormat, load_args
from app.formats.gbnf import call_schema
from app.formats.partial_json import Incomplete, call_object, expect, string, value_end, ws
from app.formats.spec import Add, ReplySpec, Tool
from app.formats.think import THINK, ReasoningFormat
from app.grammar.gate import Limits
from app.grammar.json_schema import from_schema


class Generic(ToolFormat):
    name = "generic"
    summary = "JSON held by a grammar, for templates that know no tools"
    native = False  # and never detected: it is what a template that teaches no format gets

    def history(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return render_history(messages)

    def offer(self, messages: list[dict[str, Any]], extra: dict[str, Any], tools: list[Tool],
              required: bool, protect: Callable[[T], T]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        return with_system(messages, protect(system_prompt(tools, required))), extra

    def grammar(self, tools: list[Tool], *, parallel: bool, required: bool = True, lead: str = "",
                template: str = "", limits: Limits,
                thought: ReasoningFormat = THINK, answer: dict[str, Any] | None = None) -> str:
        """The whole reply's grammar (never lazy; no thought comes first, so ``lead`` is
        unused): calls, or when not ``required`` also a direct answer (``{"response": ...}``,
        its value following ``answer`` when the request has a JSON output format, as in
        llama.cpp's generic handler)."""
        schema = reply_schema(tools, required, parallel, answer)
        return from_schema(schema, "tools", limits)

    def scan(self, body: str, spec: ReplySpec, final: bool, add: Add) -> str:
        """``{"tool_calls": [...]}`` or ``{"response": "..."}`` (the grammar allows nothing else)."""
        try:
            i = expect(body, 0, "{")
            key, i, closed = string(body, i)
            if not closed:
                return ""
            i = expect(body, i, ":")
            if key == "response":
                j = ws(body, i)
                if j < len(body) and body[j] != '"':  # an output format's JSON: its own text
                    return body[j:value_end(body, j)[0]]
                return string(body, i)[0]
            if key != "tool_calls":
                return ""
            i = expect(body, i, "[")
            while True:
                i = ws(body, i)
                if i >= len(body):
                    return ""
                found, end = call_object(body, i)
                add(*found)
                if end is None or end == -1:
                    return ""
                i = ws(body, end)
                if i < len(body) and body[i] == ",":
                    i += 1
                    continue
                return ""
        except (Incomplete, ValueError):
            return ""


def system_prompt(tools: list[Tool], required: bool) -> str:
    """The system message describing ``tools`` and the JSON to answer in."""
    specs = json.dumps(
        [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in tools],
        ensure_ascii=False,
    )
    answer = (
        'Reply with a JSON object {"tool_calls": [{"name": <tool name>, "arguments": <object>}]}.'
        if required
        else 'Reply with a JSON object: {"tool_calls": [{"name": <tool name>, "arguments": <object>}]} '
        'to call tools, or {"response": <your answer>} to answer directly.'
    )
    return f"You can call these tools:\n{specs}\n{answer}"


def reply_schema(tools: list[Tool], required: bool, parallel: bool,
                 answer: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON Schema the reply is constrained to (turned into a grammar by the caller); a
    direct answer's ``response`` is a string, or follows ``answer`` (an output format's schema)."""
    call = call_schema(tools, "arguments")
    defs = call.pop("$defs", None)
    calls = {"type": "array", "items": call, "minItems": 1}
    if not parallel:
        calls["maxItems"] = 1
    with_calls = {
        "type": "object",
        "properties": {"tool_calls": calls},
        "required": ["tool_calls"],
        "additionalProperties": False,
    }
    if defs:
        with_calls["$defs"] = defs
    if required:
        return with_calls
    answer = {
        "type": "object",
        "properties": {"response": {"type": "string"} if answer is None else answer},
        "required": ["response"],
        "additionalProperties": False,
    }
    defs = with_calls.pop("$defs", None)
    return {"anyOf": [with_calls, answer], **({"$defs": defs} if defs else {})}


def render_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant tool calls and tool results as text the generic form understands."""
    out = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = [
                {"name": c["function"]["name"], "arguments": load_args(c["function"].get("arguments"))}
                for c in m["tool_calls"]
            ]
            out.append({**m, "content": json.dumps({"tool_calls": calls}, ensure_ascii=False)})
            out[-1].pop("tool_calls", None)
        elif m.get("role") == "tool":
            body = {"tool_call_id": m.get("tool_call_id"), "result": m.get("content")}
            out.append({"role": "user", "content": "Tool result: " + json.dumps(body, ensure_ascii=False)})
        else:
            out.append(m)
    return out


def with_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """Put the tool description into the system message (first), creating one if needed."""
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{text}".strip()
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
