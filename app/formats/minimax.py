"""MiniMax M2: ``<minimax:tool_call>\\n<invoke name="NAME">\\n<parameter name="KEY">VALUE
</parameter>\\n</invoke>\\n</minimax:tool_call>``, several invokes in one block.

Its thoughts are ``<think>`` (the prompt opens one); its template keeps the thought of every turn
after the last user message (``reasoning_content``, or a ``<think>`` left in the content), which
the history passes through as it is: MiniMax asks for the whole reply to be sent back."""

from __future__ import annotations

from app.formats.invoke import InvokeFormat

OPEN, CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"


class MiniMax(InvokeFormat):
    name = "minimax"
    summary = "`<minimax:tool_call>` with `<invoke>`"
    opens = (OPEN,)
    closes = (CLOSE,)
    triggers = (OPEN,)
    markers = (OPEN, CLOSE, *InvokeFormat.tags(""))

    def detect(self, template: str) -> bool:
        return OPEN in template
