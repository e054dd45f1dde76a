"""GPT-OSS: OpenAI's harmony format, messages on channels, calls addressed to functions.

The prompt ends with ``<|start|>assistant``; the model writes one message or more, each a
header, ``<|message|>`` and its text, ended by ``<|end|>`` (another message follows, after
``<|start|>assistant``), ``<|call|>`` (a call: generation stops) or ``<|return|>`` (the answer:
generation stops)::

    <|channel|>analysis<|message|>THOUGHT<|end|><|start|>assistant<|channel|>final<|message|>ANSWER
    <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{ARGS}
     to=functions.NAME<|channel|>commentary json<|message|>{ARGS}     (the recipient in the role)

The analysis channel holds thoughts (HarmonyThought reads the ones a reply opens with); a message
addressed ``to=functions.NAME`` is a call; the final channel, and a commentary message to no one
(a preamble the user sees), are the content. A message to a built-in tool (``to=python``,
``to=browser.search``) is neither and is dropped. llama.cpp makes ``<|call|>`` and ``<|return|>``
ends of generation when it loads the vocabulary (and takes ``<|end|>`` off that list when both
are there), so they stop generation and never reach the text; every other marker is kept in the
text (preserved tokens) for this parser, which never lets one reach the content.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from app.engine.text import held_suffix
from app.formats import memo
from app.formats.base import ToolFormat, load_args
from app.formats.gbnf import lit, schema_rules
from app.formats.partial_json import is_json, value_end, ws
from app.formats.spec import NAME_RE, Add, ReplySpec, Tool
from app.formats.think import THINK, ReasoningFormat, Thought
from app.grammar.gate import Limits

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, CALL, RETURN = "<|constrain|>", "<|call|>", "<|return|>"
TO, FUNCTIONS = " to=", "functions."
MARKUP = (START, END, MESSAGE, CHANNEL, CONSTRAIN, CALL, RETURN)
ENDS = (END, CALL, RETURN)  # end a message (taken with it)
BREAKS = (START, CHANNEL)  # a new message starts here (the previous one forgot its end)
HEADS = (MESSAGE, TO, CHANNEL, CONSTRAIN, START)  # what a header is made of
ANALYSIS = CHANNEL + "analysis" + MESSAGE
ASSISTANT = START + "assistant"
_WORD = re.compile(r"[A-Za-z0-9_.\-]*")  # a role, recipient, channel or content type
_LEVELS = {"none": "low", "minimal": "low", "low": "low", "medium": "medium", "high": "high",
           "xhigh": "high", "max": "high"}


def taught(template: str) -> bool:
    """Whether a chat template writes harmony (llama.cpp's test: it names ``<|channel|>``)."""
    return CHANNEL in template and MESSAGE in template


@dataclass(frozen=True)
class Piece:
    """One message of a reply, as far as it is written."""

    kind: str  # "thought", "text", "call", "other" (a built-in tool's: dropped) or "pending"
    start: int  # where its header starts
    text: str = ""  # the text so far (a call: its arguments so far)
    done: bool = False  # ended (a call: its arguments are complete JSON)
    name: str | None = None  # a call's function


class _Pending(Exception):
    """The text ends inside a header: wait for more."""


def _word(s: str, j: int) -> tuple[str, int]:
    m = _WORD.match(s, j)
    if m.end() == len(s):
        raise _Pending
    return m.group(), m.end()


def header(s: str, i: int) -> tuple[str | None, str | None, int] | int | None:
    """(channel, recipient, where the text starts) of the header at ``i``; None while it may
    still become one; -1 if it is not one. Its parts come in any order (models put the
    recipient in the role or after the channel; gpt-oss-20b sometimes writes a stray
    ``<|channel|>commentary to=assistant`` before the real channel)."""
    channel = recipient = None
    j = i
    started = False
    try:
        while True:
            rest = s[j:j + 16]
            if any(h.startswith(rest) and len(rest) < len(h) for h in HEADS):
                raise _Pending
            if s.startswith(MESSAGE, j):
                return channel, recipient, j + len(MESSAGE)
            if s.startswith(START, j) and not started:
                _, j = _word(s, j + len(START))  # the role: assistant
            elif s.startswith(TO, j):
                recipient, j = _word(s, j + len(TO))
                if not recipient:
                    return -1
            elif s.startswith(CHANNEL, j):
                channel, j = _word(s, j + len(CHANNEL))
            elif s.startswith(CONSTRAIN, j):
                _, j = _word(s, j + len(CONSTRAIN))  # the content type: json
            elif started and s.startswith(" ", j):
                _, j = _word(s, j + 1)  # `<|channel|>commentary json`
            else:
                return -1
            started = True
    except _Pending:
        return None


def kind_of(channel: str | None, recipient: str | None) -> tuple[str, str | None]:
    """(kind, function name) of a message from its header."""
    if recipient is not None and recipient != "assistant":
        name = recipient[len(FUNCTIONS):] if recipient.startswith(FUNCTIONS) else ""
        return ("call", name) if NAME_RE.fullmatch(name) else ("other", None)
    return ("thought" if channel == "analysis" else "text"), None


def _find(s: str, i: int, tags: tuple[str, ...], scan: str) -> tuple[int, str] | None:
    """The first of ``tags`` in ``s`` from ``i`` (and which); a stream's search resumes where
    the last parse's stopped."""
    kept = memo.resume(scan, s, i)
    start = max(i, kept[0] - 15) if kept else i
    hits = [(k, t) for t in tags if (k := s.find(t, start)) != -1]
    if not hits:
        memo.keep(scan, s, i, len(s))
        return None
    return min(hits)


def clean(text: str) -> str:
    """Message text with any marker left in it removed."""
    for m in MARKUP:
        if m in text:
            text = text.replace(m, "")
    return text


def _open(text: str, final: bool) -> str:
    """The text of a message still being written: what may still become a marker held back
    (at the end, a marker's start cut by max_tokens, ``<|`` on, is dropped)."""
    keep = held_suffix(text, MARKUP)
    return clean(text[: len(text) - (0 if final and keep < 2 else keep)])


def _marked(text: str) -> bool:
    """Whether unfinished header text is markup (else, at the end, it is words: "<", " to")."""
    return TO in text or "<|" in text


def walk(s: str, final: bool, opened: bool = False, scan: str = "harmony") -> Iterator[Piece]:
    """The messages of reply text ``s``, in order, the last one possibly unfinished; a header
    not yet complete ends the walk with a "pending" piece. ``opened``: the text starts inside
    an analysis message (the prompt opened it). Text outside any message (a model that wrote
    none) is a "text" piece up to where a message starts."""
    i = 0
    while True:
        k = ws(s, i)
        if k >= len(s):
            return
        if k < len(s) and s[k] == "<":
            i = k  # space between messages (" to=" needs its own space)
        if opened:
            opened, found = False, ("analysis", None, i)
        else:
            found = header(s, i)
        if found is None and final and not _marked(s[i:]):
            found = -1  # a reply ending in "<" or " to" said that much in words
        if found is None:
            yield Piece("pending", i)
            return
        if found == -1:  # words outside any message, up to where one starts
            stop = _find(s, i + 1, BREAKS, scan + "-plain")
            if stop is None:
                yield Piece("text", i, _open(s[i:], final))
                return
            yield Piece("text", i, clean(s[i:stop[0]]), True)
            i = stop[0]
            continue
        assert isinstance(found, tuple)
        channel, recipient, body = found
        kind, name = kind_of(channel, recipient)
        if kind == "call":
            a = ws(s, body)
            end, complete = value_end(s, a) if a < len(s) else (a, False)
            args = s[a:end]
            valid = complete and is_json(args)
            yield Piece("call", i, args, valid, name)
            if not complete:
                return
            body = end  # anything after the arguments, up to the message's end, is dropped
        stop = _find(s, body, ENDS + BREAKS, scan)
        if stop is None:
            if kind != "call":
                yield Piece(kind, i, _open(s[body:], final))
            return
        if kind != "call":
            yield Piece(kind, i, clean(s[body:stop[0]]), True)
        i = stop[0] + (len(stop[1]) if stop[1] in ENDS else 0)


def read(s: str, final: bool, add: Add | None = None) -> str:
    """The content of harmony text (thoughts and built-in tools' messages dropped), handing
    each call to ``add`` (None: calls are dropped too)."""
    texts = []
    for p in walk(s, final):
        if p.kind == "text" and p.text:
            texts.append(p.text)
        elif p.kind == "call" and add is not None:
            add(p.name, p.text, p.done)
    return "\n\n".join(texts)


@dataclass(frozen=True)
class HarmonyThought(ReasoningFormat):
    """Thoughts on harmony's analysis channel: the analysis messages a reply opens with.
    ``close`` (``<|end|>``) ends one; what ends a thought on request also opens the next
    message (the final channel when no tools are read)."""

    @property
    def markers(self) -> tuple[str, ...]:
        return MARKUP

    def detect(self, template: str) -> bool:
        return taught(template)

    def split(self, text: str, in_thought: bool = False, final: bool = False) -> Thought:
        thoughts: list[str] = []
        for p in walk(text, final, opened=in_thought, scan="harmony-thought"):
            if p.kind == "pending":
                if not thoughts and not in_thought:
                    return Thought(None, None if not final else "", False)
                return Thought("\n".join(thoughts), "", False)
            if p.kind != "thought":
                return Thought("\n".join(thoughts) if thoughts else None, text[p.start:], False)
            if p.text:
                thoughts.append(p.text)
            if not p.done:
                return Thought("\n".join(thoughts), "", True)
        return Thought("\n".join(thoughts) if thoughts or in_thought else None, "", False)

    def answer(self, rest: str, final: bool) -> str:
        return read(rest, final)

    def ending(self, calls: bool) -> str:
        return self.close + ASSISTANT + ("" if calls else CHANNEL + "final" + MESSAGE)

    def controls(self, variables: dict[str, Any], effort: str | None,
                 thinking: bool | None) -> dict[str, Any]:
        """GPT-OSS always thinks; its template reads ``reasoning_effort`` (low, medium, high;
        medium unless told): no thinking is the least of it, an effort its nearest level."""
        level = "low" if thinking is False else _LEVELS.get(effort or "")
        return {"reasoning_effort": level, **variables} if level else variables

    def lead(self, lead: str, then: str) -> list[str]:
        """The thought's text holds no ``<|`` but its ``<|end|>``: the parser ends a message at
        ``<|start|>`` or ``<|channel|>`` too, so the grammar and the parser agree on where the
        thought ends (a random model's thought wrote them)."""
        rules = ['th0 ::= [^<] th0 | "<" th1', 'th1 ::= [^|<] th0 | "<" th1 | "|end|>"'] if lead else []
        root = {"": then, "think": f"( {lit(ANALYSIS)} th0 {lit(ASSISTANT)} )? {then}",
                "open": f"th0 {lit(ASSISTANT)} {then}"}
        return [*rules, f"root ::= {root[lead]}"]


HARMONY = HarmonyThought("harmony", ANALYSIS, END)


class Harmony(ToolFormat):
    """GPT-OSS's calls: one per reply (``<|call|>`` ends generation), after any thought."""

    name = "harmony"
    summary = "GPT-OSS channels, `to=functions.NAME`"
    triggers = (TO + FUNCTIONS,)
    markers = (*MARKUP, TO + FUNCTIONS)
    lazy_past_thoughts = True

    def detect(self, template: str) -> bool:
        return taught(template)

    def history(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """What GPT-OSS's template reads: ``thinking`` for reasoning_content (it renders it
        before a call still waiting for its answer and drops it elsewhere, and refuses a call
        turn with both content and thinking, so the thought wins there, as llama.cpp does);
        one call per assistant turn (it renders only the first), each followed by its result
        (a result is addressed from the last call's name); a system turn after the first (the
        template drops those) as a user turn, so its words still reach the model."""
        out: list[dict[str, Any]] = []
        i = 0
        while i < len(messages):
            m = dict(messages[i])
            i += 1
            role = m.get("role")
            if role == "system" and out:
                out.append({**m, "role": "user", "content": m.get("content") or ""})
                continue
            if role != "assistant":
                out.append(m)
                continue
            m["content"] = m.get("content") or ""
            thinking = m.get("reasoning_content")
            if isinstance(thinking, str) and thinking:
                m["thinking"] = thinking
            if not m.get("tool_calls"):
                m.pop("tool_calls", None)
                out.append(m)
                continue
            results = []
            while i < len(messages) and messages[i].get("role") == "tool":
                results.append(messages[i])
                i += 1
            out += _one_call_each(m, results)
        return out

    def calls(self, tools: list[Tool], *, parallel: bool, template: str,
              limits: Limits) -> tuple[list[str], str]:
        """One call in the form GPT-OSS writes it (``<|call|>``, an end of generation, is not
        in the grammar: once the arguments are complete it allows only an end)."""
        rules, alts = _args(tools, limits)
        head = lit(CHANNEL + "commentary" + TO + FUNCTIONS)
        tail = lit(" " + CONSTRAIN + "json" + MESSAGE)
        return rules, f"{head} ( " + " | ".join(f"{n} {tail} {a}" for n, a in alts) + " )"

    def grammar(self, tools: list[Tool], *, parallel: bool, required: bool = True, lead: str = "",
                template: str = "", limits: Limits,
                thought: ReasoningFormat = THINK, answer: dict[str, Any] | None = None) -> str:
        """Forced (required, or beside an answer format): the call as GPT-OSS writes it; the
        answer, if any, on the final channel. Lazy (auto): from `` to=functions.`` on, in
        either place a model puts the recipient, with or without the content type."""
        if required or answer is not None:
            rules, calls = self.calls(tools, parallel=parallel, template=template, limits=limits)
            then = "calls"
            if answer is not None:
                rules = [*rules, schema_rules(answer, "o-", limits),
                         f"reply ::= {lit(CHANNEL + 'final' + MESSAGE)} o-root | calls"]
                then = "reply"
            return "\n".join([*rules, f"calls ::= {calls}", *thought.lead(lead, then)])
        rules, alts = _args(tools, limits)
        rules += [f'h-ch ::= {lit(CHANNEL)} ( "commentary" | "analysis" )',
                  f'h-ct ::= ( " " | " "? {lit(CONSTRAIN)} ) [A-Za-z0-9_-]+',
                  f"h-end ::= h-ch? h-ct? {lit(MESSAGE)}"]
        one = " | ".join(f"{n} h-end {a}" for n, a in alts)
        return "\n".join([*rules, f"root ::= {lit(TO + FUNCTIONS)} ( {one} )"])

    def scan(self, body: str, spec: ReplySpec, final: bool, add: Add) -> str:
        return read(body, final, add)


def _args(tools: list[Tool], limits: Limits) -> tuple[list[str], list[tuple[str, str]]]:
    """Each tool's arguments grammar, and (its name, its start rule)."""
    rules = [schema_rules(t.parameters, f"a{i}-", limits) for i, t in enumerate(tools)]
    return rules, [(lit(t.name), f"a{i}-root") for i, t in enumerate(tools)]


def _one_call_each(turn: dict[str, Any], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An assistant turn with several calls as one turn per call, each followed by its result
    (matched by id, else in order); results left over come last."""
    calls = turn["tool_calls"]
    thinking = turn.get("thinking")
    if thinking:
        turn["content"] = ""  # the template refuses both on a call turn
    left = list(results)
    out = []
    for k, call in enumerate(calls):
        fn = dict(call.get("function") or {})
        fn["arguments"] = load_args(fn.get("arguments"))
        out.append({**(turn if k == 0 else {"role": "assistant", "content": ""}),
                    "tool_calls": [{**call, "function": fn}]})
        match = next((r for r in left if r.get("tool_call_id") == call.get("id")), None)
        if match is None and left and not any(
                r.get("tool_call_id") == c.get("id") for r in left for c in calls):
            match = left[0]
        if match is not None:
            left.remove(match)
            out.append(match)
    return out + left

