"""Functionary v3.2 (MeetKai): every message names its recipient. The generation prompt ends with
``>>>``, so a reply is sections ``RECIPIENT\\nPAYLOAD`` joined by ``>>>``: ``all`` is text for the
user, any other recipient a call whose payload is its JSON arguments (``python`` may take raw
code instead, which becomes its one string argument). ``all\\nLet me look.>>>get_weather\\n{...}``.

Every reply starts with a recipient, so the scanner reads replies without tools too
(``reads_replies``). No marker is a control token: ``>>>`` is text, so a lazy grammar has no word
to wait for; under tool_choice auto the grammar holds the whole reply instead (text for ``all``,
which cannot hold ``>>>``, or calls). The template concatenates the arguments as text, so the
history keeps them JSON strings (a past ``python`` call as its code, as the model wrote it).
"""

from __future__ import annotations

import json
from typing import Any

from app.engine.text import held_suffix
from app.formats.base import ToolFormat, load_args
from app.formats.gbnf import hoist_defs, lit, schema_rules
from app.formats.partial_json import is_json, value_end, ws
from app.formats.spec import NAME_PREFIX_RE, NAME_RE, Add, ReplySpec, Tool
from app.formats.think import THINK, ReasoningFormat
from app.grammar.gate import Limits

SEP = ">>>"  # before every recipient but the first (which the generation prompt holds)
ALL = "all"  # the recipient of text for the user
PYTHON = "python"  # the tool whose payload may be raw code
# text without the separator (any character; ">" and ">>" only before another character)
TEXT = 'fx-text ::= ( [^>] | ">" [^>] | ">>" [^>] )* ( ">" | ">>" )?'


def code_key(spec: ReplySpec) -> str:
    """The argument raw python code goes into: the python tool's only string parameter, else
    ``code``."""
    strings = spec.string_params.get(PYTHON, frozenset())
    return next(iter(strings)) if len(strings) == 1 else "code"


class Functionary(ToolFormat):
    name = "functionary_v3_2"
    summary = "`>>>NAME` recipients"
    reads_replies = True

    def detect(self, template: str) -> bool:
        return SEP + ALL in template

    def history(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Arguments as JSON text (the template adds them to a string); a python call whose one
        argument is a string as that code."""
        out = []
        for m in messages:
            m = dict(m)
            if m.get("role") == "assistant" and m.get("tool_calls"):
                calls = []
                for c in m["tool_calls"]:
                    fn = dict(c.get("function") or {})
                    args = load_args(fn.get("arguments"))
                    if fn.get("name") == PYTHON and isinstance(args, dict) and len(args) == 1 \
                            and isinstance(next(iter(args.values())), str):
                        fn["arguments"] = next(iter(args.values()))
                    elif not isinstance(args, str):
                        fn["arguments"] = json.dumps(args, ensure_ascii=False)
                    else:
                        fn["arguments"] = args
                    calls.append({**c, "function": fn})
                m["tool_calls"] = calls
            out.append(m)
        return out

    def calls(self, tools: list[Tool], *, parallel: bool, template: str,
              limits: Limits) -> tuple[list[str], str]:
        """``NAME\\n`` and the tool's JSON arguments (python: or raw code), several joined by
        ``>>>`` when parallel."""
        params, defs = hoist_defs(tools)
        rules, alts = [TEXT], []
        for i, (t, p) in enumerate(zip(tools, params, strict=True)):
            rules.append(schema_rules({**p, "$defs": defs} if defs else p, f"f{i}-", limits))
            value = f"f{i}-root"
            if t.name == PYTHON:
                value = f'( {value} | [^{{] fx-text )'
            alts.append(f"{lit(t.name + chr(10))} {value}")
        rules.append("fx-call ::= " + " | ".join(alts))
        return rules, ('fx-call ( ">>>" fx-call )*' if parallel else "fx-call")

    def grammar(self, tools: list[Tool], *, parallel: bool, required: bool = True, lead: str = "",
                template: str = "", limits: Limits,
                thought: ReasoningFormat = THINK, answer: dict[str, Any] | None = None) -> str:
        """Forced: the calls. Otherwise the whole reply (there is no word to wake a lazy grammar
        at): the calls, or text for ``all`` (an output format's JSON when the request has one)
        and, when it has no format, calls after it."""
        rules, calls = self.calls(tools, parallel=parallel, template=template, limits=limits)
        rules.append(f"calls ::= {calls}")
        if required:
            then = "calls"
        elif answer is not None:
            rules += [schema_rules(answer, "o-", limits), 'reply ::= calls | "all\\n" o-root']
            then = "reply"
        else:
            rules.append('reply ::= calls | "all\\n" fx-text ( ">>>" calls )?')
            then = "reply"
        return "\n".join([*rules, *thought.lead(lead, then)])

    def scan(self, body: str, spec: ReplySpec, final: bool, add: Add) -> str:
        out: list[str] = []
        pos: int | None = 0
        while pos is not None:
            k = NAME_PREFIX_RE.match(body, pos).end()
            if k == len(body):  # the recipient may go on
                if final:
                    out.append(body[pos:])
                break
            name = body[pos:k]
            if body[k] != "\n" or not NAME_RE.fullmatch(name):
                pos = _text(body, pos, final, out)  # no recipient line: text
            elif name == ALL:
                pos = _text(body, k + 1, final, out)
            else:
                pos = _call(name, body, k + 1, spec, final, add, out)
        return "".join(out)


def _text(body: str, i: int, final: bool, out: list[str]) -> int | None:
    """Text from ``i`` to the next separator (past it returned; None: the text runs on)."""
    j = body.find(SEP, i)
    if j == -1:
        tail = body[i:]
        out.append(tail[: len(tail) - (0 if final else held_suffix(tail, (SEP,)))])
        return None
    out.append(body[i:j])
    return j + len(SEP)


def _call(name: str, body: str, i: int, spec: ReplySpec, final: bool, add: Add,
          out: list[str]) -> int | None:
    """The payload for recipient ``name`` from ``i``: its call, and where the next section
    starts (None: not yet known). Without tools offered no call counts."""
    named = name if spec.names else None
    j = ws(body, i)
    if j >= len(body):
        return None
    if body[j] == "{":
        end, complete = value_end(body, j)
        args = body[j:end]
        if not complete:
            add(named, args, False)
            return None
        add(named, args, is_json(args))  # arguments that are not JSON never count
        k = ws(body, end)
        if body.startswith(SEP, k):
            return k + len(SEP)
        if k >= len(body) or (not final and SEP.startswith(body[k:])):
            return None
        return _text(body, k, final, out)  # words after the call
    if name == PYTHON and PYTHON in spec.names:  # raw code: its one string argument
        stop = body.find(SEP, i)
        code = body[i:] if stop == -1 else body[i:stop]
        done = stop != -1 or final
        if not done:
            code = code[: len(code) - held_suffix(code, (SEP,))]
        code = code.rstrip()  # trailing blanks are held until more code follows
        encoded = json.dumps(code, ensure_ascii=False)
        key = json.dumps(code_key(spec))
        add(PYTHON, "{" + key + ": " + (encoded + "}" if done else encoded[:-1]), done)
        return stop + len(SEP) if stop != -1 else None
    return _text(body, i, final, out)  # a recipient with no call: its words are text
