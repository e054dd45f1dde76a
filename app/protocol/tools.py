"""Tool calls in the generic JSON form (as llama.cpp's generic handler does), as pure functions.

Tools are described to the model in a system message, and its reply is constrained by a
grammar to one JSON object: ``{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}`` or,
when it may answer in words (tool_choice auto), ``{"response": "..."}``. ``ToolStream`` parses
that reply incrementally, one text piece at a time, into OpenAI deltas: a call's first delta
carries index, id, type and the complete name with ``arguments: ""``; later ones only argument
text; concatenated, the pieces are exactly the final arguments string.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from app.errors import BadRequest

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]


def validate_tools(tools: list[Any]) -> list[Tool]:
    """Each tool must be a function with a valid name and a JSON Schema object; 400 naming it."""
    out: list[Tool] = []
    for i, t in enumerate(tools):
        where = f"tools.{i}"
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict):
            raise BadRequest(f"{where}: a tool must be {{'type': 'function', 'function': {{...}}}}", param=where)
        name = fn.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise BadRequest(f"{where}.function.name: 1-64 letters, digits, '_' or '-'", param=f"{where}.function.name")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise BadRequest(
                f"{where}.function.parameters of tool {name!r} must be a JSON Schema object",
                param=f"{where}.function.parameters",
            )
        out.append(Tool(name, str(fn.get("description") or ""), {"type": "object", **params}))
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise BadRequest("tools: function names must be unique", param="tools")
    return out


def pick(tools: list[Tool], tool_choice: Any) -> tuple[list[Tool], bool]:
    """(the tools the model may call, whether it must call one) for a tool_choice."""
    if tool_choice in (None, "auto"):
        return tools, False
    if tool_choice == "none":
        return [], False
    if tool_choice == "required":
        return tools, True
    if isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        name = tool_choice["function"].get("name")
        chosen = [t for t in tools if t.name == name]
        if not chosen:
            raise BadRequest(f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
        return chosen, True
    raise BadRequest("tool_choice must be 'auto', 'none', 'required' or a named function", param="tool_choice")


def system_prompt(tools: list[Tool], required: bool) -> str:
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


def reply_schema(tools: list[Tool], required: bool, parallel: bool) -> dict[str, Any]:
    """The JSON Schema the reply is constrained to (turned into a grammar by the caller)."""
    call = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ]
    }
    calls = {"type": "array", "items": call, "minItems": 1}
    if not parallel:
        calls["maxItems"] = 1
    with_calls = {
        "type": "object",
        "properties": {"tool_calls": calls},
        "required": ["tool_calls"],
        "additionalProperties": False,
    }
    if required:
        return with_calls
    answer = {
        "type": "object",
        "properties": {"response": {"type": "string"}},
        "required": ["response"],
        "additionalProperties": False,
    }
    return {"anyOf": [with_calls, answer]}


def render_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant tool calls and tool results as text the generic form understands."""
    out = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = [
                {"name": c["function"]["name"], "arguments": _load_args(c["function"].get("arguments"))}
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


def _load_args(args: Any) -> Any:
    if isinstance(args, str):
        try:
            return json.loads(args)
        except json.JSONDecodeError:
            return args
    return args


# ---- incremental parsing ---------------------------------------------------------------------


class _Incomplete(Exception):
    pass


def _ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in " \t\r\n":
        i += 1
    return i


def _expect(s: str, i: int, lit: str) -> int:
    i = _ws(s, i)
    if s.startswith(lit, i):
        return i + len(lit)
    if lit.startswith(s[i:]):
        raise _Incomplete
    raise ValueError(f"expected {lit!r} at {i}")


def _string(s: str, i: int) -> tuple[str, int, bool]:
    """Decode a JSON string from its opening quote: (text so far, end, closed)."""
    i = _ws(s, i)
    if i >= len(s):
        raise _Incomplete
    if s[i] != '"':
        raise ValueError("expected a string")
    i += 1
    out = []
    while i < len(s):
        c = s[i]
        if c == '"':
            return "".join(out), i + 1, True
        if c == "\\":
            if i + 1 >= len(s):
                break
            e = s[i + 1]
            if e == "u":
                if i + 6 > len(s):
                    break
                out.append(chr(int(s[i + 2 : i + 6], 16)))
                i += 6
                continue
            out.append({"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}.get(e, e))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out), i, False


def _value_end(s: str, i: int) -> tuple[int, bool]:
    """Scan one JSON value from ``i``: (end so far, complete)."""
    i = _ws(s, i)
    depth = 0
    in_str = False
    j = i
    while j < len(s):
        c = s[j]
        if in_str:
            if c == "\\":
                j += 2
                continue
            if c == '"':
                in_str = False
                if depth == 0:
                    return j + 1, True
        elif c == '"':
            in_str = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return j + 1, True
            if depth < 0:
                return j, True
        elif depth == 0 and c in ",}] \n":
            return j, True
        j += 1
    return min(j, len(s)), False


@dataclass
class Call:
    id: str
    name: str
    arguments: str = ""
    complete: bool = False


@dataclass
class Parsed:
    content: str | None = None
    calls: list[Call] = field(default_factory=list)


def parse_partial(text: str, ids: list[str]) -> Parsed:
    """What a (possibly cut) reply says so far. Names appear only once complete; argument text
    is the raw JSON of the arguments as generated (a prefix of it while it is still open)."""
    out = Parsed()
    try:
        i = _expect(text, 0, "{")
        key, i, closed = _string(text, i)
        if not closed:
            return out
        i = _expect(text, i, ":")
        if key == "response":
            out.content, i, _ = _string(text, i)
            return out
        if key != "tool_calls":
            return out
        i = _expect(text, i, "[")
        while True:
            i = _expect(text, i, "{")
            k, i, closed = _string(text, i)
            if not closed or k != "name":
                return out
            i = _expect(text, i, ":")
            name, i, closed = _string(text, i)
            if not closed:
                return out
            while len(ids) <= len(out.calls):
                ids.append("call_" + secrets.token_hex(12))
            call = Call(ids[len(out.calls)], name)
            out.calls.append(call)
            i = _expect(text, i, ",")
            k, i, closed = _string(text, i)
            if not closed or k != "arguments":
                return out
            i = _expect(text, i, ":")
            start = _ws(text, i)
            end, complete = _value_end(text, start)
            call.arguments = text[start:end]
            if not complete:
                return out
            i = _expect(text, end, "}")
            call.complete = True
            i = _ws(text, i)
            if i < len(text) and text[i] == ",":
                i += 1
                continue
            return out
    except _Incomplete:
        return out
    except ValueError:
        return out


class ToolStream:
    """Feeds reply text; returns OpenAI deltas that accumulate into the final message."""

    def __init__(self) -> None:
        self.text = ""
        self.ids: list[str] = []
        self._sent_content = 0
        self._sent_args: list[int] = []

    def feed(self, piece: str) -> list[dict[str, Any]]:
        self.text += piece
        parsed = parse_partial(self.text, self.ids)
        deltas: list[dict[str, Any]] = []
        if parsed.content is not None and len(parsed.content) > self._sent_content:
            deltas.append({"content": parsed.content[self._sent_content :]})
            self._sent_content = len(parsed.content)
        for idx, call in enumerate(parsed.calls):
            if idx >= len(self._sent_args):
                self._sent_args.append(0)
                deltas.append({"tool_calls": [{"index": idx, "id": call.id, "type": "function",
                                               "function": {"name": call.name, "arguments": ""}}]})
            new = call.arguments[self._sent_args[idx] :]
            if new:
                deltas.append({"tool_calls": [{"index": idx, "function": {"arguments": new}}]})
                self._sent_args[idx] = len(call.arguments)
        return deltas

    def result(self) -> Parsed:
        return parse_partial(self.text, self.ids)


def message(parsed: Parsed) -> tuple[dict[str, Any], bool]:
    """The assistant message for a whole reply, and whether it made tool calls (complete ones
    only: a call cut by max_tokens is dropped, what parsed cleanly is kept)."""
    calls = [c for c in parsed.calls if c.complete]
    msg: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if calls:
        msg["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
    return msg, bool(calls)
