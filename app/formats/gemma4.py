"""Gemma 4: ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>`` calls, several back
to back, and thoughts in a ``<|channel>thought ... <channel|>`` channel.

The arguments are Gemma's own syntax (app.formats.gemma4_args reads them into JSON as they
stream; app.formats.gemma4_grammar forces them from the tool's schema). The model ends a turn
with ``<turn|>`` and a call with ``<|tool_response>`` (the tool's answer comes next): llama.cpp
makes both, and ``<eos>``, ends of generation when it loads the vocabulary, so none is shown.

Its templates read tool results from the assistant turn that called (``tool_responses``: the
first Gemma 4 templates know nothing else; the later ones also gather ``tool`` turns
themselves, and render both the same), and think only when ``enable_thinking`` is set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from app.engine.text import held_suffix
from app.formats import memo
from app.formats.base import MarkerFormat, rest_is
from app.formats.gbnf import hoist_defs, lit
from app.formats.gemma4_args import QUOTE, read_args
from app.formats.gemma4_grammar import SchemaGrammar
from app.formats.partial_json import Found, is_json, ws
from app.formats.spec import NAME_PREFIX_RE, NAME_RE, ReplySpec, Tool
from app.formats.think import ReasoningFormat, Thought
from app.grammar.gate import Limits

OPEN, CLOSE = "<|tool_call>", "<tool_call|>"
CALL = "call:"
CHANNEL, END_CHANNEL = "<|channel>", "<channel|>"
THOUGHT_LABEL = "thought"
END_TURN, TURN_MODEL = "<turn|>", "<|turn>model\n"


class Gemma4(MarkerFormat):
    name = "gemma4"
    summary = "`<|tool_call>call:NAME{...}`"
    triggers = (OPEN,)
    markers = (OPEN, CLOSE, QUOTE)
    # <|tool_call> is a control token Gemma writes only to call, never inside its thought
    # channel: under tool_choice auto a thinking Gemma's calls are held to their schemas too
    lazy_past_thoughts = True

    def detect(self, template: str) -> bool:
        return OPEN + CALL in template

    def history(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Arguments as objects; the ``tool`` turns after a call folded into the calling turn as
        its ``tool_responses`` (``{name, response}``, the name the result's call id names, a
        JSON object as itself), and an answer that follows them into the same turn."""
        msgs = super().history(messages)
        out: list[dict[str, Any]] = []
        i = 0
        while i < len(msgs):
            m = msgs[i]
            i += 1
            if m.get("role") != "assistant" or not m.get("tool_calls"):
                out.append(m)
                continue
            calls = m["tool_calls"]
            responses = []
            while i < len(msgs) and msgs[i].get("role") == "tool":
                responses.append({"name": _result_name(msgs[i], calls, len(responses)),
                                  "response": _response(msgs[i].get("content"))})
                i += 1
            if not responses:
                out.append(m)
                continue
            m = {**m, "tool_responses": responses}
            if not m.get("content"):
                m.pop("content", None)
            nxt = msgs[i] if i < len(msgs) else None
            if (nxt is not None and nxt.get("role") == "assistant" and not nxt.get("tool_calls")
                    and nxt.get("content") and not m.get("content")):
                m["content"] = nxt["content"]  # the answer after the results: the same turn
                i += 1
            out.append(m)
        return out

    def calls(self, tools: list[Tool], *, parallel: bool, template: str,
              limits: Limits) -> tuple[list[str], str]:
        """Each tool's arguments in Gemma's syntax, held to its schema; parallel calls back to
        back, as the model writes them."""
        params, defs = hoist_defs(tools)
        schemas = SchemaGrammar(defs, limits)
        alts = [f"{lit(t.name)} {schemas.value(p)}" for t, p in zip(tools, params, strict=True)]
        one = f'{lit(OPEN + CALL)} ( {" | ".join(alts)} ) {lit(CLOSE)}'
        return schemas.text(), (f"( {one} )+" if parallel else one)

    def block(self, body: str, i: int, marker: str, spec: ReplySpec,
              final: bool) -> tuple[list[Found], int | None]:
        j = ws(body, i + len(marker))
        start = rest_is(body, j, CALL)
        if start is None or start == -1:
            return [], start
        name = NAME_PREFIX_RE.match(body, start).group()
        k = start + len(name)
        if k >= len(body):
            return [], None
        if body[k] != "{" or not NAME_RE.fullmatch(name):
            return [], -1
        args, end = read_args(body, k, final)
        if end is None:
            return [(name, args, False)], None
        if end == -1:  # not Gemma's syntax: the call (named already) stays, uncounted
            close = body.find(CLOSE, k)
            return [(name, args, False)], (None if close == -1 else close + len(CLOSE))
        found = [(name, args, is_json(args))]
        after = rest_is(body, ws(body, end), CLOSE)
        if after is None:  # the closing tag may still come (at the very end: cut, swallowed)
            return found, (len(body) if final else None)
        return found, (end if after == -1 else after)  # a missing closing tag is forgiven


def _response(content: Any) -> Any:
    """A tool result as the template takes it: a JSON object as that object (rendered as Gemma's
    ``response:NAME{key:value}``, the form Google documents), any other text as it is (its
    text parts joined, as the later templates do)."""
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content
                          if isinstance(p, dict) and p.get("type") == "text")
    if not isinstance(content, str):
        return "" if content is None else content
    if content.lstrip().startswith("{"):
        try:
            value = json.loads(content)
        except ValueError:
            return content
        return value if isinstance(value, dict) else content
    return content


def _result_name(result: dict[str, Any], calls: list[dict[str, Any]], n: int) -> str:
    """The function a tool result answers: the call its id names, else the result's own name,
    else the call in its place."""
    wanted = result.get("tool_call_id")
    for c in calls:
        if wanted is not None and c.get("id") == wanted:
            return str((c.get("function") or {}).get("name") or "unknown")
    if result.get("name"):
        return str(result["name"])
    if n < len(calls):
        return str((calls[n].get("function") or {}).get("name") or "unknown")
    return "unknown"


@dataclass(frozen=True)
class ChannelThought(ReasoningFormat):
    """Gemma 4's thought: ``<|channel>thought\\n...<channel|>`` at the start of a reply. The
    model also writes a channel later in the reply (an empty one at the end, a stray
    ``<channel|>``, a doubled ``<|channel>``, as llama.cpp's tests show): those never reach
    the content. What a later channel says is dropped: the thought is the reply's first part
    (its budget, and the inline form, depend on that)."""

    @property
    def markers(self) -> tuple[str, ...]:
        return (CHANNEL, END_CHANNEL)  # the tokens ("thought" is text after <|channel>)

    def detect(self, template: str) -> bool:
        return CHANNEL in template and END_CHANNEL in template

    def controls(self, variables: dict[str, Any], effort: str | None,
                 thinking: bool | None) -> dict[str, Any]:
        """Gemma 4 thinks only when asked (``enable_thinking``): a request that asks for a
        thought (thinking on, an effort) gets one, ``none`` or thinking off none."""
        on = thinking if thinking is not None else (None if effort is None else effort != "none")
        return variables if on is None else {"enable_thinking": on, **variables}

    def finish_prompt(self, prompt: str, thinking: bool | None) -> str:
        """A turn that called, got its results and said more ends closed (``<turn|>``) with no
        cue after it: the model's turn is opened again (as llama.cpp does), else it would
        write whatever follows a finished turn."""
        return prompt + TURN_MODEL if prompt.endswith(END_TURN + "\n") else prompt

    def split(self, text: str, in_thought: bool = False, final: bool = False) -> Thought:
        if in_thought:
            body = text
        else:
            lead = _undoubled(text.lstrip())
            if not lead.startswith(self.open):
                if not final and _may_open(lead, self.open):
                    return Thought(None, None, False)  # "", "<|chan", "<|channel>tho": wait
                return Thought(None, _later_channels(text, final), False)
            body = lead[len(self.open):]
        kept = memo.resume("channel", body, 0)
        end = body.find(self.close, max(0, kept[0] - len(self.close) + 1) if kept else 0)
        if end == -1:
            memo.keep("channel", body, 0, len(body))
            keep = 0 if final else held_suffix(body, (self.close,))
            return Thought(body[: len(body) - keep].lstrip(), "", True)
        return Thought(body[:end].lstrip(), _later_channels(body[end + len(self.close):], final),
                       False)


def _undoubled(text: str) -> str:
    """``text`` without the extra ``<|channel>`` of a doubled one at its start."""
    while text.startswith(CHANNEL + CHANNEL):
        text = text[len(CHANNEL):]
    return text


def _may_open(lead: str, opening: str) -> bool:
    """Whether the start of a reply may still become a thought's opening."""
    if opening.startswith(lead):
        return True
    return lead.startswith(CHANNEL) and CHANNEL.startswith(lead[len(CHANNEL):])


def _later_channels(text: str, final: bool) -> str:
    """``text`` without the channels in it: a channel is removed whole (a reply's thought is
    the one at its start), one still open is held, as is what may be the start of a marker;
    a stray ``<channel|>`` is dropped."""
    markers = (CHANNEL, END_CHANNEL)
    kept = memo.resume("channels", text, 0)  # a stream: no marker up to there
    since = max(0, kept[0] - len(CHANNEL) + 1) if kept else 0
    if text.find(CHANNEL, since) == -1 and text.find(END_CHANNEL, since) == -1:
        memo.keep("channels", text, 0, len(text))
        keep = 0 if final else held_suffix(text, markers)
        return text[: len(text) - keep] if keep else text
    content: list[str] = []
    pos = 0
    while True:
        start, stray = text.find(CHANNEL, pos), text.find(END_CHANNEL, pos)
        if stray != -1 and (start == -1 or stray < start):
            content.append(text[pos:stray])
            pos = stray + len(END_CHANNEL)
            continue
        if start == -1:
            tail = text[pos:]
            content.append(tail[: len(tail) - (0 if final else held_suffix(tail, markers))])
            return "".join(content)
        content.append(text[pos:start])
        end = text.find(END_CHANNEL, start + len(CHANNEL))
        if end == -1:
            return "".join(content)
        pos = end + len(END_CHANNEL)


CHANNEL_THOUGHT = ChannelThought("channel", CHANNEL + THOUGHT_LABEL, END_CHANNEL)
