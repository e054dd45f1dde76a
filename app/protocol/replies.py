"""Model replies parsed into reasoning, content and tool calls, in every tool-call format.

``parse_reply`` is a pure function of the whole text generated so far. Called after every piece,
it only ever extends what it said before: reasoning and content grow, calls are appended, a
call's name appears once and complete, its arguments grow. ``ReplyStream`` turns the growth into
neutral events (app.core.events), so streamed events add up to exactly the non-streamed reply. Text that may
still become markup (``<tool_`` at the end, a reply that so far reads ``{"na``) is held back, and
text inside a thought never becomes a tool call.

The formats themselves (hermes, qwen3_coder, llama3, mistral, generic: one class each, chosen
from the chat template by ``detect_format`` or by the TOOL_FORMAT setting) live in app.formats;
``ReplySpec`` carries the one a request uses, and its ``scan`` reads the text after any thought.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app import formats
from app.core.events import CallArgs, CallStarted, Event, Text, Thinking
from app.formats import ToolFormat
from app.formats.base import Add
from app.protocol.reasoning import CLOSE, OPEN, split_thought


def detect_format(template: str | None) -> str:
    """The name of the tool-call format a chat template teaches its model."""
    return formats.detect(template).name


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


@dataclass(frozen=True)
class ReplySpec:
    """How to read one request's replies."""

    tool_format: str | None = None  # a formats.FORMATS name; None: no tools, the reply is text
    think: bool = False  # look for a <think> thought at the start
    in_thought: bool = False  # the prompt already opened <think>
    inline: bool = False  # keep the thought in the content (tags included)
    string_params: dict[str, frozenset[str]] = field(default_factory=dict)  # qwen3_coder typing
    names: frozenset[str] = frozenset()  # the tools offered (a Llama 3 JSON reply naming none
    # of them is an answer, not a call)
    format: ToolFormat | None = field(init=False, default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        """Resolve ``tool_format`` once (an unknown name fails here, not mid-stream)."""
        if self.tool_format is not None:
            object.__setattr__(self, "format", formats.get(self.tool_format))


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
        t = split_thought(text, spec.in_thought, final)
        if t.rest is None:
            return reply
        body = t.rest
        if t.reasoning is not None:
            if spec.inline:
                prefix = ("" if spec.in_thought else OPEN) + t.reasoning + ("" if t.open else CLOSE)
            else:
                reply.reasoning = t.reasoning
        if t.open:
            reply.content = prefix
            return reply  # whatever a thought says, it is not a call

    content = body if fmt is None else fmt.scan(body, spec, final, _adder(reply, ids, fmt))
    # trailing whitespace is held until more text follows it (or for good, at the end)
    reply.content = prefix + content.strip()
    return reply


def _adder(reply: Reply, ids: list[str], fmt: ToolFormat) -> Add:
    """What a scanner calls for each call it finds: appended to ``reply`` under the id handed
    out for its place (a fresh one the first time)."""

    def add(name: str | None, args: str, complete: bool) -> None:
        if name is None:
            return
        while len(ids) <= len(reply.calls):
            ids.append(fmt.call_id())
        reply.calls.append(Call(ids[len(reply.calls)], name, args, complete))

    return add


class ReplyStream:
    """Feeds one choice's reply text; returns the neutral events (app.core.events) by which the
    parse grew, so the events of a whole reply add up to its final parse."""

    def __init__(self, spec: ReplySpec, index: int = 0):
        self.spec = spec
        self.index = index
        self.text = ""
        self.ids: list[str] = []
        self._sent_reasoning: int | None = None  # None: no thought seen yet
        self._sent_content = 0
        self._sent_args: list[int] = []
        self._final: Reply | None = None  # the final parse, once asked for

    def feed(self, piece: str) -> list[Event]:
        self.text += piece
        self._final = None
        return self._diff(parse_reply(self.text, self.spec, self.ids))

    def finish(self) -> list[Event]:
        """The events for what was held back until the end (an empty thought included, so
        the fold knows the reply had one)."""
        reply = self.result()
        events = self._diff(reply)
        if reply.reasoning is not None and self._sent_reasoning is None:
            self._sent_reasoning = 0
            events.insert(0, Thinking("", self.index))
        return events

    def result(self) -> Reply:
        """The parse of the whole reply, computed once however often it is asked for."""
        if self._final is None:
            self._final = parse_reply(self.text, self.spec, self.ids, final=True)
        return self._final

    def cut_calls(self) -> frozenset[int]:
        """The calls of the whole reply that never completed (cut off by the token limit)."""
        return frozenset(i for i, c in enumerate(self.result().calls) if not c.complete)

    def _diff(self, reply: Reply) -> list[Event]:
        out: list[Event] = []
        i = self.index
        sent = self._sent_reasoning or 0
        if reply.reasoning and len(reply.reasoning) > sent:
            out.append(Thinking(reply.reasoning[sent:], i))
            self._sent_reasoning = len(reply.reasoning)
        if len(reply.content) > self._sent_content:
            out.append(Text(reply.content[self._sent_content :], i))
            self._sent_content = len(reply.content)
        for n, call in enumerate(reply.calls):
            if n >= len(self._sent_args):
                self._sent_args.append(0)
                out.append(CallStarted(n, call.id, call.name, i))
            new = call.arguments[self._sent_args[n] :]
            if new:
                out.append(CallArgs(n, new, i))
                self._sent_args[n] = len(call.arguments)
        return out
