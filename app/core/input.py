"""What an API asks of the model, in no API's vocabulary."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from app.core.media import MediaInput
from app.engine.types import SamplingParams
from app.formats.spec import Tool

# An effort (OpenAI's reasoning.effort, Anthropic's output_config.effort) as a thought budget in
# tokens (None: no budget). The services' efforts are relative; these are the token counts this
# server ends a thought at.
EFFORT_BUDGET: dict[str, int | None] = {
    "none": 0,
    "minimal": 64,
    "low": 256,
    "medium": 1024,
    "high": 4096,
    "xhigh": 16384,
    "max": None,
}


def effort_for(budget: int | None) -> str | None:
    """The effort a thought budget in tokens reaches: the largest whose budget is at most it,
    and at least "minimal" for any budget but 0 (a small budget still asks for a thought; None:
    no budget, no effort)."""
    if budget is None:
        return None
    if budget == 0:
        return "none"
    reached = [(b, e) for e, b in EFFORT_BUDGET.items() if b and b <= budget]
    return max(reached, default=(0, "minimal"))[1]


def template_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """A past tool call as an assistant turn's ``tool_calls`` entry, in the form chat templates
    are written for; ``arguments`` as JSON text (a value that is not text yet, such as the
    object Anthropic, Gemini and Ollama send, is written as JSON). Every API's history spells a
    call this way."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@dataclass(frozen=True)
class OutputFormat:
    """Structured output: any JSON object, or JSON that follows ``schema``."""

    kind: Literal["json_object", "json_schema"]
    schema: dict[str, Any] | None = None
    param: str = "response_format"  # the request field it came from (named in errors)


@dataclass(frozen=True)
class ToolChoice:
    """Which tools the model may call: ``auto`` (it decides), ``none``, ``required`` (at least
    one call), or ``named`` (a call to ``name``)."""

    mode: Literal["auto", "none", "required", "named"] = "auto"
    name: str | None = None
    param: str = "tool_choice"


@dataclass(frozen=True)
class ChatInput:
    """A conversation to continue.

    ``messages`` are chat-template messages: ``role`` (system, user, assistant or tool),
    ``content`` text, and on assistant turns ``tool_calls`` (:func:`template_call`) and
    ``reasoning_content``; tool turns carry ``tool_call_id``. Text that came from the client is
    marked (see app.formats.chat_template.protector) by the planner, not here.
    """

    messages: list[dict[str, Any]]
    params: SamplingParams = field(default_factory=SamplingParams)
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    parallel_tool_calls: bool = True
    output: OutputFormat | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    reasoning_budget: int | None = None  # end a thought after this many tokens
    reasoning_control: bool = False  # the thought may be ended on request (see Service.control)
    # what the request said of thinking, in the API's own terms: turned on or off (None: not
    # said), and the effort it named (an EFFORT_BUDGET key). The thought syntax turns them
    # into its template's variables (ReasoningFormat.controls): enable_thinking, GPT-OSS's
    # reasoning effort ...
    thinking: bool | None = None
    effort: str | None = None
    n: int = 1
    cache_prompt: bool = True
    model: str | None = None  # the model the request named (see Service.model_name)
    # the template's cue for the assistant's turn at the end (only a tokenize request, vLLM's
    # form, may leave it out: a generation always has it)
    add_generation_prompt: bool = True
    # the start of the answer (Anthropic's final assistant message): written after the cue, as
    # message text, and continued; the reply holds only what follows it
    prefill: str = ""
    # the images, in the order their MEDIA marks stand in the messages' text
    media: tuple[MediaInput, ...] = ()


@dataclass(frozen=True)
class TextInput:
    """A raw prompt to continue (no chat template, no reply parsing)."""

    prompt: str | tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    n: int = 1
    cache_prompt: bool = True
    model: str | None = None  # the model the request named (see Service.model_name)
