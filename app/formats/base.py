"""What every tool-call format is: the base class, and the pieces marker-based formats share.

A format's knowledge sits on one object, so the things that must agree are written once: the
markers its reply scanner reads are the tokens the engine keeps in the text, and the markers that
open a call are what a lazy grammar waits for.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from app.engine.text import held_suffix
from app.formats.gbnf import schema_rules
from app.formats.partial_json import Found
from app.formats.spec import Add, ReplySpec, Tool
from app.formats.think import THINK, ReasoningFormat
from app.grammar.gate import Limits

Block = Callable[[str, int, str, ReplySpec, bool], tuple[list[Found], int | None]]
T = TypeVar("T")


def load_args(args: Any) -> Any:
    """Arguments given as a JSON string, as the object it holds (the text if it is not JSON)."""
    if isinstance(args, str):
        try:
            return json.loads(args)
        except json.JSONDecodeError:
            return args
    return args


def template_tools(tools: list[Tool]) -> list[dict[str, Any]]:
    """Tools as chat templates expect them (the OpenAI shape)."""
    return [
        {"type": "function",
         "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in tools
    ]


class ToolFormat:
    """One way a model writes tool calls. Subclasses set the class attributes and implement
    ``calls`` (the grammar) and ``scan`` (the reply scanner); the rest has defaults for a
    format whose chat template renders tools and calls itself."""

    name: ClassVar[str]
    summary: ClassVar[str]  # what it looks like, for the TOOL_FORMAT setting's help
    # what opens a call: under tool_choice auto a lazy grammar takes hold at one of them
    triggers: ClassVar[tuple[str, ...]] = ()
    # every marker the scanner reads (triggers included): the engine keeps them in the text
    # when a model's vocabulary makes them control tokens
    markers: ClassVar[tuple[str, ...]] = ()
    # the chat template renders the tools and past calls itself (else they are described in
    # words and the whole reply is held to JSON: see app.formats.generic)
    native: ClassVar[bool] = True
    # a lazy grammar may wait through a thought: the triggers are markup no thought writes
    # (harmony's headers), so under tool_choice auto a thinking model's calls are held too
    lazy_past_thoughts: ClassVar[bool] = False
    # the chat template makes every reply start in the format's markup (Command R7B's
    # <|START_RESPONSE|>, Functionary's recipient line): the scanner reads replies to requests
    # without tools too (their calls, if any, do not count: none were offered)
    reads_replies: ClassVar[bool] = False

    def detect(self, template: str) -> bool:
        """Whether a chat template teaches its model this format."""
        return False

    def history(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """History for a template that renders tool calls itself: arguments as objects
        (templates apply ``tojson`` or iterate ``items``)."""
        out = []
        for m in messages:
            m = dict(m)
            if m.get("role") == "assistant" and m.get("tool_calls"):
                calls = []
                for c in m["tool_calls"]:
                    fn = dict(c.get("function") or {})
                    fn["arguments"] = load_args(fn.get("arguments"))
                    calls.append({**c, "function": fn})
                m["tool_calls"] = calls
            out.append(m)
        return out

    def offer(self, messages: list[dict[str, Any]], extra: dict[str, Any], tools: list[Tool],
              required: bool, protect: Callable[[T], T]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """(messages, template variables) offering ``tools``: here as the template's ``tools``."""
        return messages, {**extra, "tools": protect(template_tools(tools))}

    def grammar(self, tools: list[Tool], *, parallel: bool, required: bool = True, lead: str = "",
                template: str = "", limits: Limits,
                thought: ReasoningFormat = THINK, answer: dict[str, Any] | None = None) -> str:
        """GBNF forcing one call (several when ``parallel``); under tool_choice auto the caller
        makes it lazy on ``triggers``, so ``required`` changes nothing here. ``lead``: ""
        (the call comes first), "think" (an optional thought first) or "open" (the template
        opened a thought: it must close first).

        ``answer``: under tool_choice auto with a JSON output format, the JSON Schema a text
        answer follows. The grammar is then the whole reply's, never lazy: the answer (rules
        ``o-*``) or the calls. A lazy grammar cannot hold the text: it takes hold only at a
        trigger, so the text before one is free. Every format's call expression starts with
        its trigger, as a lazy grammar's must, so the call branch is the one a lazy grammar
        would have applied from the trigger on, and the answer branch is the format's own."""
        rules, calls = self.calls(tools, parallel=parallel, template=template, limits=limits)
        then = "calls"
        if answer is not None:
            rules = [*rules, schema_rules(answer, "o-", limits), "reply ::= o-root | calls"]
            then = "reply"
        return "\n".join([*rules, f"calls ::= {calls}", *thought.lead(lead, then)])

    def calls(self, tools: list[Tool], *, parallel: bool, template: str,
              limits: Limits) -> tuple[list[str], str]:
        """(helper rules, the expression for the calls) of this format's grammar."""
        raise NotImplementedError

    def scan(self, body: str, spec: ReplySpec, final: bool, add: Add) -> str:
        """The content of a reply (thought removed), handing each call found to ``add``."""
        raise NotImplementedError

    def call_id(self) -> str:
        """A fresh id for a call the model made."""
        return "call_" + secrets.token_hex(12)

    def lazy_triggers(self, tools: list[Tool]) -> tuple[str, ...]:
        """What wakes the lazy grammar under tool_choice auto when ``tools`` are offered: the
        markers that open a call (a format whose calls open with a tool's name, as pythonic
        lists do, adds words of its own)."""
        return self.triggers

    def for_template(self, template: str) -> ToolFormat:
        """This format as ``template`` writes it: a family whose templates differ (in how they
        take the arguments, whether they render the tools) answers a variant; most are the
        same for every template."""
        return self


class MarkerFormat(ToolFormat):
    """A format whose calls are blocks opening with a marker, with content around them."""

    @property
    def starts(self) -> tuple[str, ...]:
        """The markers a block may open with."""
        return self.triggers

    def block(self, body: str, i: int, marker: str, spec: ReplySpec,
              final: bool) -> tuple[list[Found], int | None]:
        """The calls in the block at ``i`` (opened by ``marker``) and where it ends (None:
        not yet; -1: malformed)."""
        raise NotImplementedError

    def scan(self, body: str, spec: ReplySpec, final: bool, add: Add) -> str:
        return scan_markers(body, self.starts, self.block, spec, final, add)


def scan_markers(body: str, markers: tuple[str, ...], block: Block, spec: ReplySpec,
                 final: bool, add: Add) -> str:
    """Content around blocks that start with one of ``markers``; each block parsed by ``block``
    into calls. A block still open at the end (also at the very end: cut by max_tokens) shows no
    text; a malformed one is content."""
    content: list[str] = []
    pos = 0
    while True:
        hits = [(j, m) for m in markers if (j := body.find(m, pos)) != -1]
        if not hits:
            tail = body[pos:]
            keep = 0 if final else held_suffix(tail, markers)
            content.append(tail[: len(tail) - keep])
            break
        i, marker = min(hits)
        content.append(body[pos:i])
        found, end = block(body, i, marker, spec, final)
        named = [f for f in found if f[0] is not None]
        if end == -1 and not named:
            content.append(marker)  # not a call after all
            pos = i + len(marker)
            continue
        for f in named:
            add(*f)
        if end is None or end == -1:
            break
        pos = end
    return "".join(content)


def rest_is(body: str, i: int, lit: str) -> int | None:
    """``i`` past ``lit`` if the text there is ``lit``; None if it may still become it; -1 if not."""
    rest = body[i:]
    if rest.startswith(lit):
        return i + len(lit)
    return None if lit.startswith(rest) else -1
