"""Model replies parsed into reasoning, content and tool calls, in every tool-call format.

``parse_reply`` is a pure function of the whole text generated so far. Called after every piece,
it only ever extends what it said before: reasoning and content grow, calls are appended, a
call's name appears once and complete, its arguments grow. ``ReplyStream`` turns the growth into
neutral events (app.core.events), so streamed events add up to exactly the non-streamed reply. Text that may
still become markup (``<tool_`` at the end, a reply that so far reads ``{"na``) is held back, and
text inside a thought never becomes a tool call.

Formats (chosen from the chat template by ``detect_format``, or by the TOOL_FORMAT setting):

- ``hermes``: Hermes 2/3, Qwen 2.5/3: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
- ``qwen3_coder``: ``<tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>``
- ``llama3``: Llama 3.x: the reply is ``{"name": ..., "parameters": {...}}`` (after an optional
  ``<|python_tag|>``), several separated by ``;``
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]`` (Nemo) and
  ``[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}`` / ``[TOOL_CALLS]NAME[ARGS]{...}`` (Small 3.2, Devstral)
- ``generic``: ``{"tool_calls": [{"name", "arguments"}]}`` or ``{"response": "..."}``, for
  templates that know nothing of tools (see app.protocol.tools)
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass, field

from app.core.events import CallArgs, CallStarted, Event, Text, Thinking
from app.engine.text import held_suffix
from app.protocol.reasoning import CLOSE, OPEN, split_thought

FORMATS = ("generic", "hermes", "qwen3_coder", "llama3", "mistral")
NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # used with fullmatch


def detect_format(template: str | None) -> str:
    """The tool-call format a chat template teaches its model (llama.cpp's detection order)."""
    t = template or ""
    if "<tool_call>" in t and "<function=" in t and "<parameter=" in t:
        return "qwen3_coder"
    if "<tool_call>" in t:
        return "hermes"
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<|python_tag|>" in t or ("<|start_header_id|>" in t and '"parameters"' in t):
        return "llama3"
    return "generic"


def new_call_id(tool_format: str | None) -> str:
    """``call_...`` ids; Mistral templates insist on 9 alphanumerics, so those get that."""
    if tool_format == "mistral":
        alphabet = string.ascii_letters + string.digits
        return "".join(secrets.choice(alphabet) for _ in range(9))
    return "call_" + secrets.token_hex(12)


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

    tool_format: str | None = None  # None: no tools were offered, the reply is text
    think: bool = False  # look for a <think> thought at the start
    in_thought: bool = False  # the prompt already opened <think>
    inline: bool = False  # keep the thought in the content (tags included)
    string_params: dict[str, frozenset[str]] = field(default_factory=dict)  # qwen3_coder typing
    names: frozenset[str] = frozenset()  # the tools offered (a Llama 3 JSON reply naming none
    # of them is an answer, not a call)


# ---- JSON, read as far as it goes -------------------------------------------------------------


class _Incomplete(Exception):
    """The text ends before the construct does: wait for more."""


_PLAIN = re.compile(r'[^"\\{}\[\],\s]+')
_IN_STRING = re.compile(r'[^"\\]+')


def _ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in " \t\r\n":
        i += 1
    return i


def _expect(s: str, i: int, lit: str) -> int:
    i = _ws(s, i)
    if s.startswith(lit, i):
        return i + len(lit)
    if lit.startswith(s[i:]):
        raise _Incomplete
    raise ValueError(f"expected {lit!r} at {i}")


def _string(s: str, i: int) -> tuple[str, int, bool]:
    """Decode a JSON string from its opening quote: (text so far, end, closed). Stops before an
    escape that is not complete yet, so the text so far only ever grows."""
    i = _ws(s, i)
    if i >= len(s):
        raise _Incomplete
    if s[i] != '"':
        raise ValueError("expected a string")
    i += 1
    out = []
    while i < len(s):
        m = _IN_STRING.match(s, i)
        if m:
            out.append(m.group())
            i = m.end()
            continue
        c = s[i]
        if c == '"':
            return "".join(out), i + 1, True
        if i + 1 >= len(s):
            break
        e = s[i + 1]
        if e == "u":
            code = _hex4(s, i + 2)
            if code is None:
                break
            if 0xD800 <= code < 0xDC00:  # a pair: wait for the low half, then join them
                if i + 12 > len(s):
                    break
                low = _hex4(s, i + 8) if s.startswith("\\u", i + 6) else None
                if low is not None and 0xDC00 <= low < 0xE000:
                    out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
                    i += 12
                    continue
                code = 0xFFFD
            out.append("\ufffd" if 0xDC00 <= code < 0xE000 else chr(code))
            i += 6
            continue
        out.append({"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}.get(e, e))
        i += 2
    return "".join(out), i, False


def _hex4(s: str, i: int) -> int | None:
    """Four hex digits at ``i``; None when the text ends first. Bad digits count as U+FFFD."""
    if i + 4 > len(s):
        return None
    try:
        return int(s[i : i + 4], 16)
    except ValueError:
        return 0xFFFD


def _value_end(s: str, i: int) -> tuple[int, bool]:
    """Scan one JSON value from ``i``: (end so far, complete)."""
    i = _ws(s, i)
    depth = 0
    in_str = False
    j = i
    while j < len(s):
        m = (_IN_STRING if in_str else _PLAIN).match(s, j)
        if m:
            j = m.end()
            continue
        c = s[j]
        if in_str:
            if c == "\\":
                j += 2
                continue
            in_str = False  # the closing quote
            if depth == 0:
                return j + 1, True
        elif c == '"':
            in_str = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return j + 1, True
            if depth < 0:
                return j, True
        elif depth == 0:  # a scalar ended at a delimiter
            return j, True
        j += 1
    return min(j, len(s)), False


_Found = tuple[str | None, str, bool]  # (name once complete, arguments so far, complete)
_Add = Callable[[str | None, str, bool], None]


def _call_object(s: str, i: int) -> tuple[_Found, int | None]:
    """``{"name": ..., "arguments"|"parameters": ...}`` (keys in any order, others skipped) from
    its ``{``: the call so far and where the object ends (None: not yet; -1: malformed)."""
    name: str | None = None
    args = ""
    args_done = False
    try:
        i = _expect(s, i, "{")
        while True:
            i = _ws(s, i)
            if i >= len(s):
                raise _Incomplete
            if s[i] == "}":
                end = i + 1
                break
            if s[i] == ",":
                i += 1
                continue
            key, i, closed = _string(s, i)
            if not closed:
                raise _Incomplete
            i = _expect(s, i, ":")
            if key == "name":
                value, i, closed = _string(s, i)
                if not closed:
                    raise _Incomplete
                name = value if name is None else name  # a repeated key never renames
                continue
            start = _ws(s, i)
            i, complete = _value_end(s, start)
            if key in ("arguments", "parameters") and not args_done:
                args = s[start:i]
                args_done = complete
            if not complete:
                raise _Incomplete
    except _Incomplete:
        return (name, "" if args.startswith('"') else args, False), None
    except ValueError:  # garbage after complete arguments still leaves a call
        return (name, _args(args) if args_done else "", args_done and _is_json(args)), -1
    return (name, _args(args), _is_json(args or "{}")), end


def _args(args: str) -> str:
    """Arguments as sent: the JSON as generated; one written as a string holding the JSON is
    unwrapped; none at all is ``{}``."""
    if args.startswith('"'):
        try:
            decoded = json.loads(args)
            return decoded if isinstance(decoded, str) else args
        except json.JSONDecodeError:
            return args
    return args or "{}"


def _is_json(text: str) -> bool:
    """Whether complete arguments are JSON (a call whose arguments are not never counts)."""
    try:
        json.loads(text)
        return True
    except json.JSONDecodeError:
        return False


# ---- formats ----------------------------------------------------------------------------------

_Block = Callable[[str, int, str, ReplySpec, bool], tuple[list[_Found], int | None]]


def _scan_markers(body: str, markers: tuple[str, ...], block: _Block, spec: ReplySpec,
                  final: bool, add: _Add) -> str:
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


def _rest_is(body: str, i: int, lit: str) -> int | None:
    """``i`` past ``lit`` if the text there is ``lit``; None if it may still become it; -1 if not."""
    rest = body[i:]
    if rest.startswith(lit):
        return i + len(lit)
    return None if lit.startswith(rest) else -1


def _hermes_block(body: str, i: int, marker: str, spec: ReplySpec, final: bool) -> tuple[list[_Found], int | None]:
    j = _ws(body, i + len(marker))
    if j >= len(body):
        return [], None
    if body[j] != "{":
        return [], -1
    found, end = _call_object(body, j)
    if end is None or end == -1:
        return [found], end
    k = _ws(body, end)
    after = _rest_is(body, k, "</tool_call>")
    if after is None:
        return [found], None
    if after != -1:
        return [found], after
    # stray text (a surplus "}") before the closing tag is dropped with it; a missing closing
    # tag is forgiven, but only once no closing tag can still come
    close, again = body.find("</tool_call>", k), body.find("<tool_call>", k)
    if close != -1 and (again == -1 or close < again):
        return [found], close + len("</tool_call>")
    return [found], (None if again == -1 and not final else end)


def _param_json(value: str, is_string: bool) -> str:
    if not is_string:
        try:
            return json.dumps(json.loads(value), ensure_ascii=False)
        except json.JSONDecodeError:
            pass
    return json.dumps(value, ensure_ascii=False)


def _trim_newline(value: str) -> str:
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def _qwen3_function(body: str, j: int, spec: ReplySpec) -> tuple[list[_Found], int | None]:
    """One ``NAME>...</function>`` from just past ``<function=``."""
    k = body.find(">", j)
    if k == -1:
        return [], (None if re.fullmatch(r"[A-Za-z0-9_.-]*", body[j:]) else -1)
    name = body[j:k]
    if not NAME_RE.fullmatch(name):
        return [], -1
    strings = spec.string_params.get(name, frozenset())
    parts = ["{"]
    n = 0
    j = k + 1
    while True:
        j = _ws(body, j)
        if body.startswith("</function>", j):
            return [(name, "".join(parts) + "}", True)], j + len("</function>")
        opened = _rest_is(body, j, "<parameter=")
        if opened == -1:
            return [(name, "".join(parts), False)], (None if "</function>".startswith(body[j:]) else -1)
        k = -1 if opened is None else body.find(">", opened)
        if opened is None or k == -1:
            return [(name, "".join(parts), False)], None
        key = body[opened:k]
        head = (", " if n else "") + json.dumps(key, ensure_ascii=False) + ": "
        close = body.find("</parameter>", k + 1)
        if close == -1:
            if key in strings:  # a string value streams as it is written
                raw = body[k + 1 :]
                raw = _trim_newline(raw[: len(raw) - held_suffix(raw, ("</parameter>",))])
                parts.append(head + '"' + json.dumps(raw, ensure_ascii=False)[1:-1])
            return [(name, "".join(parts), False)], None
        parts.append(head + _param_json(_trim_newline(body[k + 1 : close]), key in strings))
        n += 1
        j = close + len("</parameter>")


def _qwen3_coder_block(body: str, i: int, marker: str, spec: ReplySpec, final: bool) -> tuple[list[_Found], int | None]:
    if marker == "<function=":  # a function written without the <tool_call> wrapper
        return _qwen3_function(body, i + len(marker), spec)
    found: list[_Found] = []
    j = _ws(body, i + len(marker))
    while True:  # one or more functions, then </tool_call>
        start = _rest_is(body, j, "<function=")
        if start is None or start == -1:
            return found, (j if found and start == -1 else start)
        more, end = _qwen3_function(body, start, spec)
        found += more
        if end is None or end == -1:
            return found, end
        j = _ws(body, end)
        after = _rest_is(body, j, "</tool_call>")
        if after is None:
            return found, None
        if after != -1:
            return found, after
        if not body.startswith("<", j):
            return found, end  # a missing closing tag is forgiven


def _mistral_block(body: str, i: int, marker: str, spec: ReplySpec, final: bool) -> tuple[list[_Found], int | None]:
    j = _ws(body, i + len(marker))
    if j >= len(body):
        return [], None
    if body[j] == "[":  # [{"name": ..., "arguments": ..., "id": ...}, ...]
        found: list[_Found] = []
        j += 1
        while True:
            j = _ws(body, j)
            if j >= len(body):
                return found, None
            if body[j] == "]":
                return found, j + 1
            if body[j] == ",":
                j += 1
                continue
            if body[j] != "{":
                return found, -1
            call, end = _call_object(body, j)
            found.append(call)
            if end is None or end == -1:
                return found, end
            j = end
    m = re.compile(r"[A-Za-z0-9_.-]*").match(body, j)
    name, k = m.group(), m.end()
    if body.startswith("[CALL_ID]", k):
        k = re.compile(r"[A-Za-z0-9]*").match(body, k + len("[CALL_ID]")).end()
    after = _rest_is(body, k, "[ARGS]")
    if after is None or (after == -1 and "[CALL_ID]".startswith(body[k:])):
        return [], None
    if after == -1 or not NAME_RE.fullmatch(name):
        return [], -1
    start = _ws(body, after)
    end, complete = _value_end(body, start)
    args = body[start:end]
    if complete and not _is_json(args):
        return [(name, args, False)], -1  # the name went out with [ARGS]: it stays, uncounted
    return [(name, args, complete)], (end if complete else None)


def _looks_like_call(rest: str, names: frozenset[str]) -> str:
    """Whether a Llama 3 reply is a JSON tool call: "yes", "no" or "maybe" (too short to say).
    It is when it opens with ``"name"`` naming an offered tool (any, if none are known), or with
    ``"type": "function"``."""
    if not rest:
        return "maybe"
    if rest[0] != "{":
        return "no"
    try:
        key, i, closed = _string(rest, _ws(rest, 1))
        if not closed:
            return "maybe" if any(k.startswith(key) for k in ("name", "type")) else "no"
        if key not in ("name", "type"):
            return "no"
        value, i, closed = _string(rest, _expect(rest, i, ":"))
    except _Incomplete:
        return "maybe"
    except ValueError:
        return "no"
    wanted = {"function"} if key == "type" else names
    if not wanted:
        return "yes" if closed or key == "name" else "maybe"
    if closed:
        return "yes" if value in wanted else "no"
    return "maybe" if any(w.startswith(value) for w in wanted) else "no"


def _scan_llama3(body: str, spec: ReplySpec, final: bool, add: _Add) -> str:
    tag = "<|python_tag|>"
    i = _ws(body, 0)
    if body.startswith(tag, i):
        i = _ws(body, i + len(tag))
    elif not final and body[i:] and tag.startswith(body[i:]):
        return ""
    looks = _looks_like_call(body[i:], spec.names)
    if looks == "maybe" and not final:
        return ""
    if looks != "yes":
        return body
    while True:
        found, end = _call_object(body, i)
        add(*found)
        if end is None or end == -1:
            return ""
        k = _ws(body, end)
        if k < len(body) and body[k] in ";,":
            k = _ws(body, k + 1)
        if k >= len(body):
            return ""
        if body[k] != "{":
            return body[end:]  # words after the calls
        i = k


def _scan_generic(body: str, spec: ReplySpec, final: bool, add: _Add) -> str:
    """``{"tool_calls": [...]}`` or ``{"response": "..."}`` (the grammar allows nothing else)."""
    try:
        i = _expect(body, 0, "{")
        key, i, closed = _string(body, i)
        if not closed:
            return ""
        i = _expect(body, i, ":")
        if key == "response":
            return _string(body, i)[0]
        if key != "tool_calls":
            return ""
        i = _expect(body, i, "[")
        while True:
            i = _ws(body, i)
            if i >= len(body):
                return ""
            found, end = _call_object(body, i)
            add(*found)
            if end is None or end == -1:
                return ""
            i = _ws(body, end)
            if i < len(body) and body[i] == ",":
                i += 1
                continue
            return ""
    except (_Incomplete, ValueError):
        return ""


def _markers(markers: tuple[str, ...], block: _Block) -> Callable[[str, ReplySpec, bool, _Add], str]:
    return lambda body, spec, final, add: _scan_markers(body, markers, block, spec, final, add)


_SCANNERS: dict[str, Callable[[str, ReplySpec, bool, _Add], str]] = {
    "generic": _scan_generic,
    "hermes": _markers(("<tool_call>",), _hermes_block),
    "qwen3_coder": _markers(("<tool_call>", "<function="), _qwen3_coder_block),
    "mistral": _markers(("[TOOL_CALLS]",), _mistral_block),
    "llama3": _scan_llama3,
}


def parse_reply(text: str, spec: ReplySpec, ids: list[str], final: bool = False) -> Reply:
    """What the reply says so far (``final``: all of it; nothing more is held back). ``ids``
    holds the call ids handed out so far, so a call keeps its id from one parse to the next."""
    if spec.tool_format is None and not spec.think:
        return Reply(content=text)
    reply = Reply()
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

    def add(name: str | None, args: str, complete: bool) -> None:
        if name is None:
            return
        while len(ids) <= len(reply.calls):
            ids.append(new_call_id(spec.tool_format))
        reply.calls.append(Call(ids[len(reply.calls)], name, args, complete))

    content = _SCANNERS[spec.tool_format](body, spec, final, add) if spec.tool_format else body
    # trailing whitespace is held until more text follows it (or for good, at the end)
    reply.content = prefix + content.strip()
    return reply


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

    def feed(self, piece: str) -> list[Event]:
        self.text += piece
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
        return parse_reply(self.text, self.spec, self.ids, final=True)

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
