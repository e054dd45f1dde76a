"""Tools offered to the model, as pure functions: validation, tool_choice, prompts, grammars.

Two ways to offer tools. A template that knows tools (Qwen, Hermes, Llama 3.x, Mistral) gets
them as its ``tools`` variable, and the history's calls with their arguments as objects; the
model answers in its native format. A template that does not (the default SmolLM2) gets the
generic form, as llama.cpp's generic handler does: the tools described in a system message and
the reply constrained by a grammar to ``{"tool_calls": [{"name", "arguments"}]}`` or, when it
may answer in words, ``{"response": "..."}``. When a call is required (tool_choice required or
named) a grammar forces one in whichever format; under tool_choice auto a native format gets a
lazy grammar that only takes hold once the model writes the format's opening marker. The
replies themselves are read by app.formats.reply.

What is particular to one format (its history, grammar, triggers, call ids) lives on its class in
app.formats; this module checks what a request offers (``Tool`` itself is app.formats.spec's).
"""

from __future__ import annotations

from typing import Any

from app.base.errors import BadRequest
from app.formats.spec import NAME_RE, Tool
from app.formats.spec import string_params as spec_string_params


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


def string_params(tool: Tool) -> frozenset[str]:
    """Parameters typed string: their text is the value as written (qwen3_coder)."""
    return spec_string_params(tool.parameters)
