"""Calls as ``<invoke name="NAME">`` elements holding ``<parameter name="KEY">VALUE</parameter>``
inside one block: MiniMax M2 (``<minimax:tool_call>``) and DeepSeek V3.2 / V4's DSML
(``<｜DSML｜function_calls>`` / ``<｜DSML｜tool_calls>``, its tags prefixed ``｜DSML｜`` and
its parameters saying ``string="true|false"``). Values are bare (app.formats.tagged)."""

from __future__ import annotations

from typing import ClassVar

from app.formats.base import MarkerFormat, rest_is
from app.formats.gbnf import lit
from app.formats.partial_json import Found, ws
from app.formats.spec import ReplySpec, Tool
from app.formats.tagged import attr_opener, named, read_args, tool_params
from app.grammar.gate import Limits


class InvokeFormat(MarkerFormat):
    """One block (``opens`` ... ``closes``) of ``<{tag}invoke name="...">`` elements."""

    opens: ClassVar[tuple[str, ...]]  # the block's opening tags (the first is what it writes)
    closes: ClassVar[tuple[str, ...]]  # its closing tags, in the same order
    tag: ClassVar[str] = ""  # what every invoke and parameter tag starts with, after the "<"
    typed: ClassVar[bool] = False  # parameters say string="true" or "false"

    @property
    def starts(self) -> tuple[str, ...]:
        return self.opens

    @classmethod
    def tags(cls, tag: str) -> tuple[str, ...]:
        """The closing tags of an invoke and a parameter, for the formats' ``markers`` (their
        opening tags are plain text, never a control token)."""
        return (f"</{tag}invoke>", f"</{tag}parameter>")

    @property
    def written(self) -> int:
        """Which of the block's tags the grammar writes (an index into ``opens``)."""
        return 0

    @property
    def invoke(self) -> str:
        return f'<{self.tag}invoke name="'

    @property
    def end_invoke(self) -> str:
        return f"</{self.tag}invoke>"

    @property
    def end_parameter(self) -> str:
        return f"</{self.tag}parameter>"

    def calls(self, tools: list[Tool], *, parallel: bool, template: str,
              limits: Limits) -> tuple[list[str], str]:
        start = f'<{self.tag}parameter name="'

        def one(key: str, is_string: bool, value: str) -> str:
            kind = (' string="true"' if is_string else ' string="false"') if self.typed else ""
            return f'{lit(start + key + chr(34) + kind + ">")} {value} "\\n"'

        rules, seqs = tool_params(tools, limits, self.end_parameter, one)
        alts = [f'{lit(self.invoke + t.name + chr(34) + ">" + chr(10))} {seq} '
                f'{lit(self.end_invoke + chr(10))}' for t, seq in zip(tools, seqs, strict=True)]
        one_call = "( " + " | ".join(alts) + " )"
        many = f"{one_call}+" if parallel else one_call
        w = self.written
        return rules, f'{lit(self.opens[w] + chr(10))} {many} {lit(self.closes[w])}'

    def block(self, body: str, i: int, marker: str, spec: ReplySpec,
              final: bool) -> tuple[list[Found], int | None]:
        close = self.closes[self.opens.index(marker)]
        opener = attr_opener(f'<{self.tag}parameter name="', self.typed)
        found: list[Found] = []
        j = i + len(marker)
        while True:
            at = j  # content resumes here if no call follows
            j = ws(body, j)
            end = rest_is(body, j, close)
            if end is not None and end != -1:
                return found, end
            start = rest_is(body, j, self.invoke)
            if start is None or end is None:
                return found, None
            if start == -1:  # the block ends without its closing tag: what follows is content
                return found, (at if found else -1)
            name, k = named(body, start, '">')
            if name is None or k is None:
                return found, k
            call, k = read_args(body, k, name, spec.string_params.get(name, frozenset()),
                                opener, self.end_parameter, self.end_invoke)
            found.append(call)
            if k is None or k == -1:
                return found, k
            j = k
