"""GLM 4.5 / 4.6 / 4.7: ``<tool_call>NAME\\n<arg_key>KEY</arg_key>\\n<arg_value>VALUE</arg_value>\\n
</tool_call>`` (4.7 writes no newlines), one block per call.

A value the tool types as a string is written bare, any other as JSON (app.formats.tagged);
the templates iterate the arguments' items, so the history keeps them objects. Thoughts are
``<think>``: 4.5 / 4.6 write the tag themselves, 4.7 finds it opened in the prompt; thinking is
switched off with ``enable_thinking`` false, which 4.5 / 4.6 render as ``/nothink`` after the
user's words and 4.7 as a closed thought."""

from __future__ import annotations

from app.formats.base import MarkerFormat, rest_is
from app.formats.gbnf import lit
from app.formats.hermes import CLOSE, OPEN
from app.formats.partial_json import Found, ws
from app.formats.spec import NAME_PREFIX_RE, NAME_RE, ReplySpec, Tool
from app.formats.tagged import Opened, read_args, tool_params
from app.grammar.gate import Limits

ARG_KEY, END_KEY, ARG_VALUE, END_VALUE = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"


class Glm(MarkerFormat):
    name = "glm"
    summary = "`<tool_call>` with `<arg_key>` / `<arg_value>`"
    triggers = (OPEN,)
    markers = (OPEN, CLOSE, ARG_KEY, END_KEY, ARG_VALUE, END_VALUE)

    def __init__(self, compact: bool = False) -> None:
        self.compact = compact  # 4.7: no newline between the name and the tags

    def detect(self, template: str) -> bool:
        return OPEN in template and ARG_KEY in template

    def for_template(self, template: str) -> Glm:
        return Glm(compact=END_KEY + ARG_VALUE in template)

    def calls(self, tools: list[Tool], *, parallel: bool, template: str,
              limits: Limits) -> tuple[list[str], str]:
        nl = "" if self.compact else "\n"

        def one(key: str, is_string: bool, value: str) -> str:
            return f"{lit(ARG_KEY + key + END_KEY + nl + ARG_VALUE)} {value}" + (
                f" {lit(nl)}" if nl else "")

        rules, seqs = tool_params(tools, limits, END_VALUE, one)
        alts = [f"{lit(t.name + nl)} {seq}" for t, seq in zip(tools, seqs, strict=True)]
        call = f"{lit(OPEN)} ( {' | '.join(alts)} ) {lit(CLOSE)}"
        more = f" ( {lit(nl) if nl else ''} {call} )*" if parallel else ""
        return rules, call + more

    def block(self, body: str, i: int, marker: str, spec: ReplySpec,
              final: bool) -> tuple[list[Found], int | None]:
        j = ws(body, i + len(OPEN))
        k = NAME_PREFIX_RE.match(body, j).end()
        if k == len(body):
            return [], None
        name = body[j:k]
        if not NAME_RE.fullmatch(name):
            return [], -1
        call, end = read_args(body, k, name, spec.string_params.get(name, frozenset()),
                              _opener, END_VALUE, CLOSE)
        return [call], end


def _opener(body: str, j: int) -> Opened:
    """``<arg_key>KEY</arg_key>`` then ``<arg_value>``: the key and where its value starts."""
    opened = rest_is(body, j, ARG_KEY)
    if opened is None or opened == -1:
        return opened
    e = body.find(END_KEY, opened)
    if e == -1:
        lt = body.find("<", opened)
        return None if lt == -1 or END_KEY.startswith(body[lt:lt + len(END_KEY)]) else -1
    key = body[opened:e].strip()
    v = rest_is(body, ws(body, e + len(END_KEY)), ARG_VALUE)
    if v is None or v == -1:
        return v
    return (key, v, None) if key else -1
