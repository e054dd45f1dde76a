"""Checks of one family's reply scanner on a reply text: the whole parse, the same reply cut in
two at every character and fed one character at a time (the stream's deltas add up to the
whole parse, a call's id and name come once, no markup reaches the content), and the parse
of every prefix only ever growing."""

from __future__ import annotations

import json
from typing import Any

from app.api.openai import chat_message
from app.api.openai.stream import chat_delta
from app.core.decode import ReplyStream
from app.core.events import Answer, Call
from app.formats.reply import parse_reply
from app.formats.spec import ReplySpec


def whole(spec: ReplySpec, reply: str) -> dict[str, Any]:
    """The OpenAI message of the whole reply (complete calls only)."""
    r = parse_reply(reply, spec, [], final=True)
    calls = [Call(c.id, c.name, c.arguments) for c in r.calls if c.complete]
    return chat_message(Answer(reasoning=r.reasoning, text=r.content, calls=calls))


def calls_of(msg: dict[str, Any]) -> list[tuple[str, Any]]:
    """(name, arguments as JSON) of a message's calls."""
    return [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in msg.get("tool_calls", [])]


def _deltas(rs: ReplyStream, text: str | None) -> list[dict[str, Any]]:
    events = rs.finish() if text is None else rs.feed(text)
    return [d for ev in events if (d := chat_delta(ev)) is not None]


def _add_up(deltas: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"reasoning": "", "content": "", "names": {}, "args": {}}
    for d in deltas:
        out["reasoning"] += d.get("reasoning_content", "")
        out["content"] += d.get("content", "")
        for tc in d.get("tool_calls", []):
            i, fn = tc["index"], tc["function"]
            if "name" in fn:
                assert i not in out["names"], "a call's name sent twice"
                assert i == len(out["names"]) and tc["id"] and fn["arguments"] == ""
                out["names"][i] = fn["name"]
            else:
                assert set(tc) == {"index", "function"} and set(fn) == {"arguments"}
            out["args"][i] = out["args"].get(i, "") + fn["arguments"]
    return out


def assert_streams_as_whole(spec: ReplySpec, reply: str, markup: tuple[str, ...]) -> None:
    """Cut in two at every character, and one character at a time: the deltas add up to the
    whole parse, and no delta's content holds any of ``markup``."""
    msg = whole(spec, reply)
    want = {"reasoning": msg.get("reasoning_content") or "", "content": msg["content"] or "",
            "names": {i: c["function"]["name"] for i, c in enumerate(msg.get("tool_calls", []))},
            "args": {i: c["function"]["arguments"] for i, c in enumerate(msg.get("tool_calls", []))}}
    for cut in range(len(reply) + 1):
        rs = ReplyStream(spec)
        got = _add_up(_deltas(rs, reply[:cut]) + _deltas(rs, reply[cut:]) + _deltas(rs, None))
        assert got == want, (cut, reply[:cut])
    rs = ReplyStream(spec)
    deltas = [d for ch in reply for d in _deltas(rs, ch)] + _deltas(rs, None)
    for d in deltas:
        assert not any(m in d.get("content", "") for m in markup), d
    assert _add_up(deltas) == want


def assert_only_grows(spec: ReplySpec, text: str) -> None:
    """The parse of each prefix of ``text`` extends the parse of the one before."""
    ids: list[str] = []
    states = [parse_reply(text[:k], spec, ids) for k in range(len(text) + 1)]
    states.append(parse_reply(text, spec, ids, final=True))
    for a, b in zip(states, states[1:], strict=False):
        assert (b.reasoning or "").startswith(a.reasoning or ""), text
        assert b.content.startswith(a.content), (text, a.content, b.content)
        assert len(b.calls) >= len(a.calls), text
        for x, y in zip(a.calls, b.calls, strict=False):
            assert x.name == y.name and y.arguments.startswith(x.arguments), text


def assert_random_replies_grow(specs: list[ReplySpec], pieces: list[str], seed: str,
                               n: int = 150) -> None:
    """Seeded random replies built from a family's ``pieces``: every prefix's parse extends the
    one before, under each of ``specs``."""
    import random

    rng = random.Random(seed)
    for _ in range(n):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        assert_only_grows(rng.choice(specs), text)
