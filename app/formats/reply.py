"""A model's reply parsed into reasoning, content and tool calls, in every tool-call format.

``parse_reply`` is a pure function of the whole text generated so far. Called after every piece,
it only ever extends what it said before: reasoning and content grow, calls are appended, a
call's name appears once and complete, its arguments grow. Text that may still become markup
(``<tool_`` at the end, a reply that so far reads ``{"na``) is held back, and text inside a
thought never becomes a tool call. The request's format (``ReplySpec.format``) reads the text
after any thought; app.core.decode turns the growth into events.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.formats.spec import Add, ReplySpec, Scanner
from app.formats.think import THINK


@dataclass
class Call:
    id: str
    name: str
    arguments: str = ""
    complete: bool = False


@dataclass
class Reply:
    reasoning: str | None = None
    content: str = ""
    calls: list[Call] = field(default_factory=list)


def parse_reply(text: str, spec: ReplySpec, ids: list[str], final: bool = False) -> Reply:
    """What the reply says so far (``final``: all of it; nothing more is held back). ``ids``
    holds the call ids handed out so far, so a call keeps its id from one parse to the next."""
    if spec.tool_format is None and not spec.think:
        return Reply(content=text)
    reply = Reply()
    fmt = spec.format
    body = text
    prefix = ""
    if spec.think:
        thought = spec.thought or THINK
        t = thought.split(text, spec.in_thought, final)
        if t.rest is None:
            return reply
        body = t.rest
        if t.reasoning is not None:
            if spec.inline:
                prefix = (("" if spec.in_thought else thought.open) + t.reasoning
                          + ("" if t.open else thought.close))
            else:
                reply.reasoning = t.reasoning
        if t.open:
            reply.content = prefix
            return reply  # whatever a thought says, it is not a call

    if fmt is None:
        content = (spec.thought or THINK).answer(body, final) if spec.think else body
    else:
        content = fmt.scan(body, spec, final, _adder(reply, ids, fmt))
    # trailing whitespace is held until more text follows it (or for good, at the end)
    reply.content = prefix + content.strip()
    return reply


def _adder(reply: Reply, ids: list[str], fmt: Scanner) -> Add:
    """What a scanner calls for each call it finds: appended to ``reply`` under the id handed
    out for its place (a fresh one the first time)."""

    def add(name: str | None, args: str, complete: bool) -> None:
        if name is None:
            return
        while len(ids) <= len(reply.calls):
            ids.append(fmt.call_id())
        reply.calls.append(Call(ids[len(reply.calls)], name, args, complete))

    return add
