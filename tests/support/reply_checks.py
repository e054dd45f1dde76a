"""Checks of a format's reply reading, shared by the families' unit tests: a reply read whole, cut
at every character into two pieces, fed one character at a time, and as a growing text whose
parse only ever extends (what app.formats.reply promises a stream)."""

from __future__ import annotations

import json
from typing import Any

from app.api.openai import chat_message
from app.api.openai.stream import chat_delta
from app.core.decode import ReplyStream
from app.core.events import Answer, Call
from app.formats.reply import Reply, parse_reply
from app.formats.spec import ReplySpec


def message(reply: Reply) -> dict[str, Any]:
    """The OpenAI message of a whole parse (complete calls only)."""
    calls = [Call(c.id, c.name, c.arguments) for c in reply.calls if c.complete]
    return chat_message(Answer(reasoning=reply.reasoning, text=reply.content, calls=calls))


def feed(rs: ReplyStream, text: str) -> list[dict[str, Any]]:
    """The OpenAI deltas of the events a piece of text produces."""
    return [d for ev in rs.feed(text) if (d := chat_delta(ev)) is not None]


def finish(rs: ReplyStream) -> list[dict[str, Any]]:
    return [d for ev in rs.finish() if (d := chat_delta(ev)) is not None]


def accumulate(deltas: list[dict[str, Any]]) -> dict[str, Any]:
    """What a client makes of the deltas; a name sent twice, or a call's first delta without
    id, type and an empty arguments string, fails."""
    out: dict[str, Any] = {"reasoning": "", "content": "", "names": {}, "args": {}}
    for d in deltas:
        out["reasoning"] += d.get("reasoning_content", "")
        out["content"] += d.get("content") or ""
        for tc in d.get("tool_calls", []):
            i, fn = tc["index"], tc["function"]
            if "name" in fn:
                assert i not in out["names"], "name sent twice"
                assert i == len(out["names"]), "indexes start at 0 and increase"
                assert tc["type"] == "function" and tc["id"] and fn["arguments"] == ""
                out["names"][i] = fn["name"]
            else:
                assert set(tc) == {"index", "function"} and set(fn) == {"arguments"}
            out["args"][i] = out["args"].get(i, "") + fn["arguments"]
    return out


def check_reply(spec: ReplySpec, reply: str, content: str, calls: list[tuple[str, Any]],
                reasoning: str | None, markup: tuple[str, ...]) -> None:
    """``reply`` reads as ``content``, ``calls`` ([(name, arguments as JSON values)]) and
    ``reasoning``, whole and streamed in every way; no delta's content ever holds ``markup``."""
    whole = message(parse_reply(reply, spec, [], final=True))
    assert (whole["content"] or "") == content, whole
    assert whole.get("reasoning_content") == reasoning, whole
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
           for c in whole.get("tool_calls", [])]
    assert got == calls, whole
    names = {i: c["function"]["name"] for i, c in enumerate(whole.get("tool_calls", []))}
    args = {i: c["function"]["arguments"] for i, c in enumerate(whole.get("tool_calls", []))}
    for cut in range(len(reply) + 1):
        rs = ReplyStream(spec)
        two = accumulate(feed(rs, reply[:cut]) + feed(rs, reply[cut:]) + finish(rs))
        assert (two["content"], two["reasoning"]) == (content, reasoning or ""), (cut, two)
        assert (two["names"], two["args"]) == (names, args), (cut, two)
    rs = ReplyStream(spec)
    deltas = [d for ch in reply for d in feed(rs, ch)] + finish(rs)
    for d in deltas:
        assert not any(m in (d.get("content") or "") for m in markup), d
    one = accumulate(deltas)
    assert (one["content"], one["names"], one["args"]) == (content, names, args), one
    for raw in args.values():
        json.loads(raw)
    grows(spec, reply)


def grows(spec: ReplySpec, text: str) -> None:
    """At every cut the parse of ``text`` extends the previous one: reasoning, content, calls,
    names, arguments, up to the final parse."""
    ids: list[str] = []
    states = [parse_reply(text[:k], spec, ids) for k in range(len(text) + 1)]
    states.append(parse_reply(text, spec, ids, final=True))
    for a, b in zip(states, states[1:], strict=False):
        assert (b.reasoning or "").startswith(a.reasoning or ""), text
        assert b.content.startswith(a.content), (text, a.content, b.content)
        assert len(b.calls) >= len(a.calls), text
        for x, y in zip(a.calls, b.calls, strict=False):
            assert x.name == y.name and y.arguments.startswith(x.arguments), (text, x, y)
