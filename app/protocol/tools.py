"""Tools offered to the model, as pure functions: validation, tool_choice, prompts, grammars.

Two ways to offer tools. A template that knows tools (Qwen, Hermes, Llama 3.x, Mistral) gets
them as its ``tools`` variable, and the history's calls with their arguments as objects; the
model answers in its native format. A template that does not (the default SmolLM2) gets the
generic form, as llama.cpp's generic handler does: the tools described in a system message and
the reply constrained by a grammar to ``{"tool_calls": [{"name", "arguments"}]}`` or, when it
may answer in words, ``{"response": "..."}``. When a call is required (tool_choice required or
named) a grammar forces one in whichever format; under tool_choice auto a native format gets a
lazy grammar that only takes hold once the model writes the format's opening marker. The
replies themselves are read by app.protocol.replies.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from dataclasses import dataclass
from typing import Any

from app import grammar
from app.errors import BadRequest

NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # used with fullmatch


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]


def make_tool(name: Any, description: Any, parameters: Any, where: str,
              name_param: str, params_param: str) -> Tool:
    """One tool, checked: a valid name and a JSON Schema object; the 400 names the field in the
    calling API's own terms (``name_param``, ``params_param``)."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise BadRequest(f"{name_param}: 1-64 letters, digits, '_' or '-'", param=name_param)
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise BadRequest(f"{params_param} of tool {name!r} must be a JSON Schema object",
                         param=params_param)
    return Tool(name, str(description or ""), {"type": "object", **parameters})


def check_tools(tools: list[Tool], max_tools: int, param: str = "tools") -> tuple[Tool, ...]:
    """At most ``max_tools``, names unique."""
    if len(tools) > max_tools:
        raise BadRequest(f"{param}: at most {max_tools} tools (MAX_TOOLS)", param=param)
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise BadRequest(f"{param}: function names must be unique", param=param)
    return tuple(tools)


def validate_tools(tools: list[Any], max_tools: int = 128) -> tuple[Tool, ...]:
    """Chat Completions tools: ``{"type": "function", "function": {name, description,
    parameters}}`` each; 400 naming the one at fault."""
    if len(tools) > max_tools:  # before looking at each one
        raise BadRequest(f"tools: at most {max_tools} tools (MAX_TOOLS)", param="tools")
    out: list[Tool] = []
    for i, t in enumerate(tools):
        where = f"tools.{i}"
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict):
            raise BadRequest(f"{where}: a tool must be {{'type': 'function', 'function': {{...}}}}", param=where)
        out.append(make_tool(fn.get("name"), fn.get("description"), fn.get("parameters"), where,
                             f"{where}.function.name", f"{where}.function.parameters"))
    return check_tools(out, max_tools)


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


def hoist_defs(tools: list[Tool]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each tool's parameters with its ``$defs`` (or ``definitions``) moved into one shared
    table, so that references still resolve once the parameters sit inside a larger schema
    (pydantic writes nested models this way). A name two tools define differently is renamed
    for the second, its references rewritten."""
    shared: dict[str, Any] = {}
    out = []
    for i, t in enumerate(tools):
        params = dict(t.parameters)
        local = {**(params.pop("definitions", None) or {}), **(params.pop("$defs", None) or {})}
        renames = {n: (f"{n}_{i}" if n in shared and shared[n] != s else n) for n, s in local.items()}

        def fix(node: Any, renames: dict[str, str] = renames) -> Any:
            if isinstance(node, list):
                return [fix(v) for v in node]
            if not isinstance(node, dict):
                return node
            new = {k: fix(v) for k, v in node.items()}
            ref = node.get("$ref")
            for prefix in ("#/$defs/", "#/definitions/"):
                if isinstance(ref, str) and ref.startswith(prefix) and ref[len(prefix):] in renames:
                    new["$ref"] = "#/$defs/" + renames[ref[len(prefix):]]
            return new

        for name, schema in local.items():
            shared[renames[name]] = fix(schema)
        out.append(fix(params))
    return out, shared


def _call_schema(tools: list[Tool], key: str) -> dict[str, Any]:
    """One call: ``{"name": <one of the tools>, key: <its parameters>}``, definitions hoisted."""
    params, defs = hoist_defs(tools)
    call: dict[str, Any] = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, key: p},
                "required": ["name", key],
                "additionalProperties": False,
            }
            for t, p in zip(tools, params, strict=True)
        ]
    }
    if defs:
        call["$defs"] = defs
    return call


def reply_schema(tools: list[Tool], required: bool, parallel: bool) -> dict[str, Any]:
    """The JSON Schema the reply is constrained to (turned into a grammar by the caller)."""
    call = _call_schema(tools, "arguments")
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
        "properties": {"response": {"type": "string"}},
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




def string_params(tool: Tool) -> frozenset[str]:
    """Parameters typed string: their text is the value as written (qwen3_coder)."""

    def is_string(schema: Any) -> bool:
        if not isinstance(schema, dict):
            return False
        kind = schema.get("type")
        if kind == "string" or (isinstance(kind, list) and "string" in kind):
            return True
        if "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
            return True
        return any(is_string(s) for s in schema.get("anyOf", []) + schema.get("oneOf", []))

    props = tool.parameters.get("properties") or {}
    return frozenset(k for k, v in props.items() if is_string(v))


def template_tools(tools: list[Tool]) -> list[dict[str, Any]]:
    """Tools as chat templates expect them (the OpenAI shape)."""
    return [
        {"type": "function",
         "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in tools
    ]


def native_history(messages: list[dict[str, Any]], tool_format: str) -> list[dict[str, Any]]:
    """History for a template that renders tool calls itself: arguments as objects (templates
    apply ``tojson`` or iterate ``items``), and for Mistral the 9-alphanumeric ids its
    template insists on (the same OpenAI id always maps to the same one)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = dict(c.get("function") or {})
                fn["arguments"] = _load_args(fn.get("arguments"))
                call = {**c, "function": fn}
                if tool_format == "mistral":
                    call["id"] = mistral_id(c.get("id"))
                calls.append(call)
            m["tool_calls"] = calls
        elif m.get("role") == "tool" and tool_format == "mistral":
            m["tool_call_id"] = mistral_id(m.get("tool_call_id"))
        out.append(m)
    return out


def mistral_id(call_id: Any) -> str:
    if isinstance(call_id, str) and len(call_id) == 9 and call_id.isalnum():
        return call_id
    digest = hashlib.sha256(str(call_id).encode()).digest()
    alphabet = string.ascii_letters + string.digits
    return "".join(alphabet[b % len(alphabet)] for b in digest[:9])


# ---- grammars for the native formats ---------------------------------------------------------

# What starts a call in each native format: a lazy grammar (tool_choice auto) waits for it.
TRIGGERS = {
    "hermes": ("<tool_call>",),
    "qwen3_coder": ("<tool_call>",),
    "mistral": ("[TOOL_CALLS]",),
    "llama3": ("<|python_tag|>",),
}

_GBNF_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|([A-Za-z][A-Za-z0-9-]*)')


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _schema_rules(schema: dict[str, Any], prefix: str, limits: grammar.Limits) -> str:
    """A JSON Schema's grammar with every rule renamed ``prefix + name`` (so several can live
    in one grammar); its start rule is ``prefix + "root"``."""
    gbnf = grammar.from_schema(schema, "tools", limits)
    return _GBNF_TOKEN.sub(lambda m: prefix + m.group(1) if m.group(1) else m.group(0), gbnf)


def _until(name: str, tag: str) -> str:
    """Rules ``{name}0``: any text that does not contain ``tag``, then ``tag`` (a matcher with
    one state per character matched; exact because the tag's first character does not recur)."""

    def cls(c: str) -> str:
        return "\\" + c if c in "\\]^-[" else c

    rules = [f"{name}0 ::= [^{cls(tag[0])}] {name}0 | {_lit(tag[0])} {name}1"]
    for k in range(1, len(tag)):
        nxt = f" {name}{k + 1}" if k + 1 < len(tag) else ""
        rules.append(
            f"{name}{k} ::= {_lit(tag[k])}{nxt} | {_lit(tag[0])} {name}1"
            f" | [^{cls(tag[k])}{cls(tag[0])}] {name}0"
        )
    return "\n".join(rules)


def call_grammar(tool_format: str, tools: list[Tool], *, parallel: bool, lead: str = "",
                 template: str = "", limits: grammar.Limits | None = None) -> str:
    """GBNF forcing one call (several when ``parallel``) in a native format. ``lead``: "" (the
    call comes first), "think" (an optional thought first) or "open" (the template opened a
    thought: it must close first)."""
    limits = limits or grammar.Limits.defaults()
    rules: list[str] = []
    if tool_format == "qwen3_coder":
        fns = []
        for i, t in enumerate(tools):
            keys = list((t.parameters.get("properties") or {}).keys())
            if keys:
                names = " | ".join(_lit(k) for k in keys)
                rules.append(f'p{i} ::= "<parameter=" ( {names} ) ">" pv0 "\\n"')
                fns.append(f'"<function=" {_lit(t.name)} ">\\n" p{i}* "</function>"')
            else:
                fns.append(f'"<function=" {_lit(t.name)} ">\\n</function>"')
        rules.append(_until("pv", "</parameter>"))
        one = '"<tool_call>\\n" ( ' + " | ".join(fns) + ' ) "\\n</tool_call>"'
        calls = f'{one} ( "\\n" {one} )*' if parallel else one
    elif tool_format == "mistral" and "[ARGS]" in template:  # [TOOL_CALLS]name[ARGS]{...}
        alts = []
        for i, t in enumerate(tools):
            rules.append(_schema_rules(t.parameters, f"a{i}-", limits))
            alts.append(f'{_lit(t.name)} "[ARGS]" a{i}-root')
        one = '"[TOOL_CALLS]" ( ' + " | ".join(alts) + " )"
        calls = f"( {one} )+" if parallel else one
    else:
        call = _call_schema(tools, "parameters" if tool_format == "llama3" else "arguments")
        if tool_format == "mistral":  # [TOOL_CALLS][{...}, ...]
            defs = call.pop("$defs", None)
            many = {"type": "array", "items": call, "minItems": 1, **({} if parallel else {"maxItems": 1})}
            if defs:
                many["$defs"] = defs
            rules.append(_schema_rules(many, "c-", limits))
            calls = '"[TOOL_CALLS]" c-root'
        elif tool_format == "llama3":
            rules.append(_schema_rules(call, "c-", limits))
            calls = '( "<|python_tag|>" )? c-root'
        else:
            rules.append(_schema_rules(call, "c-", limits))
            one = '"<tool_call>\\n" c-root "\\n</tool_call>"'
            calls = f'{one} ( "\\n" {one} )*' if parallel else one
    rules.append(f"calls ::= {calls}")
    if lead:
        rules.append(_until("th", "</think>"))
    root = {"": "calls", "think": '( "<think>" th0 [ \\t\\n]* )? calls', "open": "th0 [ \\t\\n]* calls"}
    rules.append(f"root ::= {root[lead]}")
    return "\n".join(rules)
