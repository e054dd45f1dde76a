"""A reply's growth as the core's events: what a stream sends, and what folds into the
non-streamed answer (app.core.events.fold), so the two always agree."""

from __future__ import annotations

from app.core.events import CallArgs, CallStarted, Event, Text, Thinking
from app.formats.memo import Memo, resuming
from app.formats.reply import Reply, parse_reply
from app.formats.spec import ReplySpec


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
        self._scans: Memo = {}  # unfinished scans of this reply, resumed by the next parse

    def feed(self, piece: str) -> list[Event]:
        self.text += piece
        self._final = None
        with resuming(self._scans):
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
            with resuming(self._scans):
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
