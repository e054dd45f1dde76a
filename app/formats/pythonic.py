"""Pythonic call lists, as Llama 4 and Llama 3.2's and ToolACE's pythonic templates teach them:
``[get_weather(city="Paris"), get_time(zone='CET')]``, keyword arguments whose values are Python
literals, read as JSON arguments while they stream (app.formats.pylit). Llama 4 may wrap the list
in ``<|python_start|>`` ... ``<|python_end|>``; its stock template asks for JSON instead
(``{"name": ..., "parameters": {...}}``, read as llama3 reads it), so a template that teaches no
pythonic list gets a JSON grammar, and the reader takes both.

A call list counts wherever it starts (``[`` then a name and ``(``); under tool_choice auto the
lazy grammar wakes at ``<|python_start|>`` or at ``[`` followed by an offered tool's name.
"""

from __future__ import annotations

from typing import Any

from app.engine.text import held_suffix
from app.formats import pylit
from app.formats.base import ToolFormat
from app.formats.gbnf import call_schema, hoist_defs, lit, schema_rules
from app.formats.llama3 import Llama3
from app.formats.partial_json import Found, Incomplete, ws
from app.formats.spec import NAME_PREFIX_RE, NAME_RE, Add, ReplySpec, Tool
from app.grammar.gate import Limits

PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"
TEACHES = "[func_name1("  # how the pythonic templates spell the format out
_JSON = Llama3()  # the JSON form Llama 4's stock template asks for
_KEY_CHARS = frozenset("=(),[]{}'\" \t\r\n")


class Pythonic(ToolFormat):
    name = "pythonic"
    summary = "Python call lists `[f(x=1)]`"
    triggers = (PYTHON_START,)
    markers = (PYTHON_START, PYTHON_END)

    def detect(self, template: str) -> bool:
        return TEACHES in template or ("<|header_start|>" in template and PYTHON_START in template)

    def lazy_triggers(self, tools: list[Tool]) -> tuple[str, ...]:
        return (*self.triggers, *(f"[{t.name}(" for t in tools))

    def history(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Arguments as objects; no ``None`` text (Llama 4's templates iterate a text that is
        not a string as parts)."""
        out = super().history(messages)
        for m in out:
            if m.get("role") == "assistant" and m.get("content") is None:
                m["content"] = ""
        return out

    def calls(self, tools: list[Tool], *, parallel: bool, template: str,
              limits: Limits) -> tuple[list[str], str]:
        if TEACHES not in template and '"parameters"' in template:  # Llama 4's stock template
            rules = [schema_rules(call_schema(tools, "parameters"), "c-", limits)]
            return rules, f"( {lit(PYTHON_START)} )? c-root ( {lit(PYTHON_END)} )?"
        rules, many = list_grammar(tools, parallel=parallel, limits=limits)
        return rules, f"( {lit(PYTHON_START)} )? {many} ( {lit(PYTHON_END)} )?"

    def scan(self, body: str, spec: ReplySpec, final: bool, add: Add) -> str:
        i = ws(body, 0)
        k = i + len(PYTHON_START) if body.startswith(PYTHON_START, i) else i
        j = ws(body, k)
        if not final and (not body[i:] or PYTHON_START.startswith(body[i:])):
            return ""
        if body.startswith("{", j):  # the JSON form, at the start as Llama 3 writes it
            return _strip(_JSON.scan(body[j:], spec, final, add), final)
        return _strip(_lists(body, final, add), final)


def list_grammar(tools: list[Tool], *, parallel: bool, limits: Limits) -> tuple[list[str], str]:
    """(rules, expression) of a call list ``[f(x=1), ...]``: each tool's parameters in its
    schema's order, a required one once and an optional one at most once, values as Python
    literals of the schema's JSON grammar (LFM2 writes the same list between its own markers)."""
    rules: list[str] = []
    params, defs = hoist_defs(tools)
    alts = []
    for i, (t, schema) in enumerate(zip(tools, params, strict=True)):
        props = list((schema.get("properties") or {}).items())
        required = set(schema.get("required") or ())
        items = []
        for j, (key, prop) in enumerate(props):
            sub = {**prop, "$defs": defs} if defs and isinstance(prop, dict) else prop
            json_rules = schema_rules(sub if isinstance(sub, dict) else {}, f"p{i}-{j}-", limits)
            rules.append(_as_python(json_rules))
            items.append((f"{lit(key + '=')} p{i}-{j}-root", key in required))
        args = _in_order(items, f"k{i}-", rules)
        alts.append(f'{lit(t.name + "(")} {args} ")"')
    call = "( " + " | ".join(alts) + " )"
    many = f'{call} ( ", " {call} )*' if parallel else call
    return rules, f'"[" {many} "]"'


def _strip(content: str, final: bool) -> str:
    """Content without the python markers (a list's own are read with it; others are noise)."""
    for m in (PYTHON_START, PYTHON_END):
        content = content.replace(m, "")
    keep = 0 if final else held_suffix(content, (PYTHON_START, PYTHON_END))
    return content[: len(content) - keep]


def _lists(body: str, final: bool, add: Add) -> str:
    """Content around call lists, handing each call to ``add``."""
    out: list[str] = []
    pos = 0
    while True:
        j = body.find("[", pos)
        if j == -1:
            out.append(body[pos:])
            return "".join(out)
        out.append(body[pos:j])
        looks = _opens_list(body, j)
        if looks == "maybe" and not final:
            return "".join(out)
        if looks != "yes":
            out.append("[")
            pos = j + 1
            continue
        found, end = call_list(body, j + 1)
        named = [f for f in found if f[0] is not None]
        if end == -1 and not named:
            out.append("[")
            pos = j + 1
            continue
        for f in named:
            add(*f)
        if end is None or end == -1:
            return "".join(out)
        pos = end


def _opens_list(body: str, j: int) -> str:
    """Whether the ``[`` at ``j`` opens a call list: "yes" (a name then ``(``), "no", or
    "maybe" (the text ends first)."""
    k = ws(body, j + 1)
    m = NAME_PREFIX_RE.match(body, k)
    end = m.end() if m else k
    if end >= len(body):
        return "maybe"
    return "yes" if end > k and body[end] == "(" else "no"


def call_list(body: str, j: int) -> tuple[list[Found], int | None]:
    """The calls of a list from just past its ``[``: (calls, where the list ends: None not yet,
    -1 malformed). LFM2 reads its lists with it too."""
    found: list[Found] = []
    while True:
        j = ws(body, j)
        if j >= len(body):
            return found, None
        if found:
            if body[j] == "]":
                return found, j + 1
            if body[j] != ",":
                return found, -1
            j = ws(body, j + 1)
            if j >= len(body):
                return found, None
        m = NAME_PREFIX_RE.match(body, j)
        name, k = m.group(), m.end()
        if k >= len(body):
            return found, None
        if body[k] != "(" or not NAME_RE.fullmatch(name):
            return found, -1
        args, end, sure = _kwargs(body, k + 1)
        if not sure:  # no keyword yet: ``name(`` alone may still be prose
            return found, end
        if end == -1:
            return [*found, (name, args, False)], -1
        found.append((name, args, end is not None))
        if end is None:
            return found, None
        j = end


def _kwargs(body: str, j: int) -> tuple[str, int | None, bool]:
    """Keyword arguments from just past ``(`` to ``)``: (the JSON object so far, where the call
    ends: None not yet, -1 malformed; whether it is a call: a keyword and ``=``, or ``)``). A
    string value streams as it is written."""
    parts = ["{"]
    while True:
        sure = len(parts) > 1
        j = ws(body, j)
        if j >= len(body):
            return "".join(parts), None, sure
        if body[j] == ")":
            return "".join(parts) + "}", j + 1, True
        if sure:
            if body[j] != ",":
                return "".join(parts), -1, sure
            j = ws(body, j + 1)
            if j >= len(body):
                return "".join(parts), None, sure
            if body[j] == ")":
                return "".join(parts) + "}", j + 1, sure
        k = j
        while k < len(body) and body[k] not in _KEY_CHARS:
            k += 1
        key = body[j:k]
        e = ws(body, k)
        if e >= len(body):
            return "".join(parts), None, sure
        if not key or body[e] != "=":
            return "".join(parts), -1, sure
        head = (", " if sure else "") + pylit.dumps(key) + ": "
        v = ws(body, e + 1)
        try:
            value, j = pylit.value(body, v)
        except Incomplete:
            if v < len(body) and body[v] in "\"'":  # a string streams as it is written
                text = pylit.string(body, v)[0]
                return "".join(parts) + head + '"' + pylit.escaped(text), None, True
            return "".join(parts), None, True
        except pylit.BadString as bad:  # what it streamed stays; the call does not count
            streamed = head + '"' + pylit.escaped(bad.text) if body[v] in "\"'" else ""
            return "".join(parts) + streamed, -1, True
        except ValueError:
            return "".join(parts), -1, True
        parts.append(head + pylit.dumps(value))


def _in_order(items: list[tuple[str, bool]], prefix: str, rules: list[str]) -> str:
    """GBNF for ``items`` ((expression, required)) in their order, comma separated, each
    required one exactly once and each optional one at most once (rules ``{prefix}N`` added to
    ``rules``)."""
    if not items:
        return ""
    n = len(items)
    needed = [any(r for _, r in items[k:]) for k in range(n + 1)]  # a required one at k or on
    for k in range(n - 1, -1, -1):  # rule k: a non-empty run of items k.. with every required
        expr, required = items[k]
        rest = ""
        if k + 1 < n:
            rest = f' ", " {prefix}{k + 1}' if needed[k + 1] else f' ( ", " {prefix}{k + 1} )?'
        alts = [f"{expr}{rest}"]
        if not required and k + 1 < n:
            alts.append(f"{prefix}{k + 1}")
        rules.append(f"{prefix}{k} ::= " + " | ".join(alts))
    return f"{prefix}0" if needed[0] else f"( {prefix}0 )?"


def _as_python(gbnf: str) -> str:
    """A JSON grammar's literals as Python writes them (``True``, ``False``, ``None``)."""
    for old, new in (('"true"', '"True"'), ('"false"', '"False"'), ('"null"', '"None"')):
        gbnf = gbnf.replace(old, new)
    return gbnf
