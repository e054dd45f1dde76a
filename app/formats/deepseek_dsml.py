"""DeepSeek V3.2 and V4 (DSML): ``<｜DSML｜function_calls>`` (V4: ``<｜DSML｜tool_calls>``) holding
``<｜DSML｜invoke name="NAME">`` elements whose ``<｜DSML｜parameter name="KEY" string="true">``
says whether the bare value is a string (``false``: JSON). Thoughts are DeepSeek's ``<think>``
with its ``thinking`` switch (app.formats.deepseek.DEEPSEEK_THINK), and a call block may end a
thought left open."""

from __future__ import annotations

from app.formats.invoke import InvokeFormat

DSML = "｜DSML｜"
V32, V4 = f"<{DSML}function_calls>", f"<{DSML}tool_calls>"
END_V32, END_V4 = f"</{DSML}function_calls>", f"</{DSML}tool_calls>"


class DeepSeekDsml(InvokeFormat):
    name = "deepseek_dsml"
    summary = "`<｜DSML｜invoke>` (V3.2, V4)"
    opens = (V32, V4)
    closes = (END_V32, END_V4)
    tag = DSML
    typed = True
    triggers = (V32, V4)
    markers = (DSML, V32, V4, END_V32, END_V4, *InvokeFormat.tags(DSML))

    def __init__(self, v4: bool = False) -> None:
        self.v4 = v4  # V4 names the block tool_calls

    def detect(self, template: str) -> bool:
        # the templates build the tags from a dsml_token variable: no tag is spelt out whole
        return "dsml_token" in template and "DSML" in template

    def for_template(self, template: str) -> DeepSeekDsml:
        return DeepSeekDsml(v4="function_calls" not in template and "tool_calls" in template)

    @property
    def written(self) -> int:
        return 1 if self.v4 else 0
