"""DeepSeek V3 / V3.1 and the R1 distills: calls between fullwidth-bar control tokens.

V3.1 writes ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
...<｜tool▁calls▁end｜>``; R1 and V3-0324 write ``...<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME``
then the arguments in a fenced ```json block. The scanner reads both; the grammar writes the
form the template teaches. Templates differ in ways the history must follow: DeepSeek's own
concatenate the arguments as text (an object there fails to render) while llama.cpp's copies
apply ``tojson``, and DeepSeek's own never render ``tools`` (its model card puts them in the system
prompt, which ``offer`` does), so the format is configured per template (``for_template``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from app.engine.text import held_suffix
from app.formats.base import MarkerFormat, T, load_args, rest_is
from app.formats.family_think import FamilyThink
from app.formats.gbnf import lit, schema_rules
from app.formats.generic import with_system
from app.formats.partial_json import Found, is_json, value_end, ws
from app.formats.spec import NAME_PREFIX_RE, NAME_RE, ReplySpec, Tool
from app.grammar.gate import Limits

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
ASSISTANT = "<｜Assistant｜>"
FENCE = "```"
_OBJECT_ARGS = re.compile(r"""(\[\s*['"]arguments['"]\s*\]|\.arguments)\s*\|\s*tojson""")
_NAMES_TOOLS = re.compile(r"\btools\b")

# V3.1 / V3.2 / V4 templates switch thinking with their own ``thinking`` variable (off by
# default); V3.2 and V4 may open a DSML call block before closing the thought
DEEPSEEK_THINK = FamilyThink("deepseek", "<think>", "</think>", needs=(ASSISTANT, "thinking is defined"),
                    breaks=("<｜DSML｜function_calls>", "<｜DSML｜tool_calls>"), switch="thinking")


class DeepSeek(MarkerFormat):
    name = "deepseek"
    summary = "`<｜tool▁call▁begin｜>` (V3, V3.1, R1)"
    triggers = (CALLS_BEGIN,)
    markers = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)

    def __init__(self, fenced: bool = False, object_args: bool = False,
                 describe: bool = True) -> None:
        self.fenced = fenced  # R1's form: function<sep>NAME, then a ```json block
        self.object_args = object_args  # the template applies tojson to the arguments
        self.describe = describe  # the template does not render the tools itself

    @property
    def starts(self) -> tuple[str, ...]:
        return (CALLS_BEGIN, CALL_BEGIN)  # a call written without its section still counts

    def detect(self, template: str) -> bool:
        return CALL_BEGIN in template

    def for_template(self, template: str) -> DeepSeek:
        return DeepSeek(fenced=FENCE + "json" in template,
                        object_args=bool(_OBJECT_ARGS.search(template)),
                        describe=not _NAMES_TOOLS.search(template))

    def history(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Arguments as the template reads them (JSON text unless it applies tojson); a turn
        that only calls has no content (R1's templates test ``content is none``)."""
        out = []
        for m in messages:
            if m.get("role") == "assistant" and m.get("tool_calls"):
                calls = []
                for c in m["tool_calls"]:
                    fn = dict(c.get("function") or {})
                    raw = fn.get("arguments")
                    fn["arguments"] = (load_args(raw) if self.object_args
                                       else raw if isinstance(raw, str)
                                       else json.dumps(raw or {}, ensure_ascii=False))
                    calls.append({**c, "type": c.get("type") or "function", "function": fn})
                m = {**m, "tool_calls": calls}
                if not m.get("content"):
                    m["content"] = None
            out.append(m)
        return out

    def offer(self, messages: list[dict[str, Any]], extra: dict[str, Any], tools: list[Tool],
              required: bool, protect: Callable[[T], T]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        messages, extra = super().offer(messages, extra, tools, required, protect)
        if self.describe:
            messages = with_system(messages, self._described(tools, protect))
        return messages, extra

    def _described(self, tools: list[Tool], protect: Callable[[T], T]) -> str:
        """The tools and the call syntax in the system prompt, as DeepSeek's model cards lay
        them out (the markers left as control tokens; the tools' own text protected)."""
        if self.fenced:
            specs = json.dumps([{"name": t.name, "description": t.description,
                                 "parameters": t.parameters} for t in tools],
                               ensure_ascii=False, indent=2)
            return (f"You may call these function tools: {protect(specs)}\n\nA call is written:\n"
                    f"{CALLS_BEGIN}{CALL_BEGIN}function{SEP}function_name\n{FENCE}json\n"
                    f'{{"argument": "value"}}\n{FENCE}{CALL_END}{CALLS_END}')
        parts = ["## Tools\nYou have access to the following tools:"]
        for t in tools:
            parts.append(f"### {protect(t.name)}\nDescription: {protect(t.description)}\n\n"
                         f"Parameters: {protect(json.dumps(t.parameters, ensure_ascii=False))}")
        parts.append(
            "IMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
            f"{CALLS_BEGIN}{CALL_BEGIN}tool_call_name{SEP}tool_call_arguments{CALL_END}"
            f"{{{{additional_tool_calls}}}}{CALLS_END}\n\nWhere:\n"
            "- `tool_call_name` must be an exact match to one of the available tools\n"
            "- `tool_call_arguments` must be valid JSON that strictly follows the tool's "
            "Parameters Schema\n"
            "- For multiple tool calls, chain them directly without separators or spaces")
        return "\n\n".join(parts)

    def calls(self, tools: list[Tool], *, parallel: bool, template: str,
              limits: Limits) -> tuple[list[str], str]:
        rules, alts = [], []
        for i, t in enumerate(tools):
            rules.append(schema_rules(t.parameters, f"a{i}-", limits))
            if self.fenced:
                alts.append(f'{lit(t.name)} {lit(chr(10) + FENCE + "json" + chr(10))} a{i}-root')
            else:
                alts.append(f"{lit(t.name)} {lit(SEP)} a{i}-root")
        head = lit(CALL_BEGIN + "function" + SEP) if self.fenced else lit(CALL_BEGIN)
        tail = lit("\n" + FENCE + CALL_END) if self.fenced else lit(CALL_END)
        one = f"{head} ( {' | '.join(alts)} ) {tail}"
        more = f' ( {lit(chr(10)) if self.fenced else ""} {one} )*' if parallel else ""
        return rules, f"{lit(CALLS_BEGIN)} {one}{more} {lit(CALLS_END)}"

    def block(self, body: str, i: int, marker: str, spec: ReplySpec,
              final: bool) -> tuple[list[Found], int | None]:
        found: list[Found] = []
        j = i + len(CALLS_BEGIN) if marker == CALLS_BEGIN else i
        while True:
            at = j  # content resumes here if no call follows
            j = ws(body, j)
            end = rest_is(body, j, CALLS_END)
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
    """One call from just past ``<｜tool▁call▁begin｜>``: ``NAME<sep>{...}`` or
    ``function<sep>NAME\\n```json\\n{...}\\n```"``, then ``<｜tool▁call▁end｜>``."""
    sep = body.find(SEP, k)
    if sep == -1:
        so_far = body[k:]
        so_far = so_far[: len(so_far) - held_suffix(so_far, (SEP,))]
        return [], (None if NAME_PREFIX_RE.fullmatch(so_far) else -1)
    head = body[k:sep]
    if not NAME_RE.fullmatch(head):
        return [], -1
    a = ws(body, sep + len(SEP))
    if a >= len(body):
        return [], None
    if body[a] in "{[":
        name, j = head, a
    else:  # R1: the type, then the name on a line of its own and a fenced block
        m = NAME_PREFIX_RE.match(body, a)
        name, j = m.group(), m.end()
        if j >= len(body):
            return [], None
        if not NAME_RE.fullmatch(name):
            return [], -1
        j = ws(body, j)
        fence = body[j:j + len(FENCE) + 4]
        if (FENCE + "json").startswith(fence) and j + len(fence) >= len(body):
            return [(name, "", False)], None
        if fence.startswith(FENCE + "json"):
            j = ws(body, j + len(FENCE) + 4)
        elif fence.startswith(FENCE):
            j = ws(body, j + len(FENCE))
        if j >= len(body):
            return [(name, "", False)], None
    end, complete = value_end(body, j)
    args = body[j:end]
    if not complete:
        return [(name, args, False)], None
    if not is_json(args):
        return [(name, args, False)], -1  # the name went out: it stays, uncounted
    call = [(name, args, True)]
    j = ws(body, end)
    if body.startswith(FENCE, j):
        j = ws(body, j + len(FENCE))
    elif FENCE.startswith(body[j:j + 3]) and j + 3 > len(body) and body[j:]:
        return call, None
    after = rest_is(body, j, CALL_END)
    if after is None:
        return call, None
    return call, (j if after == -1 else after)  # a missing end marker is forgiven
