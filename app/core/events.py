"""What comes back: a typed event stream per choice, and its fold for non-streamed answers.

Every API renders these and nothing else. The events of one choice, concatenated, are exactly
what the fold holds for it (the fold only drops calls that ``ChoiceEnd.cut_calls`` says were cut
off), so a streamed answer and a non-streamed one never disagree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from app.base.errors import ServiceError
from app.engine.types import TokenScore

Reason = Literal["stop", "length", "tool_calls"]


@dataclass(frozen=True)
class Thinking:
    """More of the choice's thought (reasoning) text."""

    text: str
    index: int = 0


@dataclass(frozen=True)
class Text:
    """More of the choice's answer text."""

    text: str
    index: int = 0


@dataclass(frozen=True)
class CallStarted:
    """A tool call began: its id and its whole name (arguments follow as CallArgs)."""

    call: int  # the call's position in this choice
    id: str
    name: str
    index: int = 0


@dataclass(frozen=True)
class CallArgs:
    """More of a tool call's arguments (JSON text; the pieces concatenate to the arguments)."""

    call: int
    text: str
    index: int = 0


@dataclass(frozen=True)
class Logprobs:
    """The scores of tokens the choice generated, in order, when the request asked for them:
    every sampled token's (those of a thought, a tool call's markup, a matched stop string and
    the end-of-generation token too). They come just before the events of the text they made,
    or before its ChoiceEnd."""

    tokens: tuple[TokenScore, ...]
    index: int = 0


@dataclass(frozen=True)
class PromptLogprobs:
    """The prompt's tokens scored (the first has no log probability), once, before any
    choice's text: every choice continues the same prompt."""

    tokens: tuple[TokenScore, ...]


@dataclass(frozen=True)
class ChoiceEnd:
    """The choice is over. ``reason``: ``stop`` (end of turn, or ``stop_sequence`` matched),
    ``length`` (the token limit) or ``tool_calls`` (it ended having made complete calls)."""

    reason: Reason
    completion_tokens: int
    stop_sequence: str | None = None
    cut_calls: frozenset[int] = frozenset()  # calls cut off by the limit (not in the fold)
    index: int = 0
    # the tokens its thought took: its completion tokens when the thought's last piece came
    # (0 without a thought); Gemini's thoughtsTokenCount, Responses' reasoning_tokens
    thought_tokens: int = 0


@dataclass(frozen=True)
class Usage:
    """Token counts of the whole request; sent once, after every choice has ended."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    # speculative decoding, all choices: (tokens drafted, of them accepted); None when off
    draft: tuple[int, int] | None = None
    # Predicted Outputs, all choices: (the prediction's tokens the reply followed, the rest of
    # them); None when the request brought no prediction
    predicted: tuple[int, int] | None = None
    video_frames: int = 0  # frames the request's videos gave the projector, each an image

    def timings(self) -> dict[str, int] | None:
        """llama-server's ``timings`` fields this server fills: the draft counts, when the
        request was speculated (None otherwise: the object is left out)."""
        if self.draft is None:
            return None
        return {"prompt_n": self.prompt_tokens, "predicted_n": self.completion_tokens,
                "draft_n": self.draft[0], "draft_n_accepted": self.draft[1]}


@dataclass(frozen=True)
class Tick:
    """Nothing happened for a heartbeat interval: an API may send a keep-alive."""


@dataclass(frozen=True)
class Failure:
    """The generation failed after it started; no more events follow."""

    error: ServiceError


Event = (Thinking | Text | CallStarted | CallArgs | Logprobs | PromptLogprobs | ChoiceEnd | Usage
         | Tick | Failure)


@dataclass
class Call:
    id: str
    name: str
    arguments: str = ""


def args_object(arguments: str) -> dict[str, Any]:
    """A call's arguments as an object, for the APIs that send them as one (Anthropic's
    ``input``, Gemini's ``args``, Ollama's ``arguments``): ``{}`` when they are not one."""
    try:
        value = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass
class Answer:
    """One choice, whole."""

    index: int = 0
    reasoning: str | None = None
    text: str = ""
    calls: list[Call] = field(default_factory=list)
    reason: Reason = "stop"
    stop_sequence: str | None = None
    completion_tokens: int = 0
    thought_tokens: int = 0  # as ChoiceEnd's
    logprobs: list[TokenScore] | None = None  # None: not asked for


@dataclass
class Result:
    answers: list[Answer]
    usage: Usage
    prompt_logprobs: tuple[TokenScore, ...] | None = None  # None: not asked for


def fold(events, n: int) -> Result:
    """The whole answer from an event stream; a Failure raises its error."""
    answers = [Answer(index=i) for i in range(n)]
    usage: Usage | None = None
    prompt: tuple[TokenScore, ...] | None = None
    for ev in events:
        if isinstance(ev, Thinking):
            a = answers[ev.index]
            a.reasoning = (a.reasoning or "") + ev.text
        elif isinstance(ev, Text):
            answers[ev.index].text += ev.text
        elif isinstance(ev, CallStarted):
            answers[ev.index].calls.append(Call(ev.id, ev.name))
        elif isinstance(ev, CallArgs):
            answers[ev.index].calls[ev.call].arguments += ev.text
        elif isinstance(ev, Logprobs):
            a = answers[ev.index]
            if a.logprobs is None:
                a.logprobs = []
            a.logprobs.extend(ev.tokens)
        elif isinstance(ev, PromptLogprobs):
            prompt = ev.tokens
        elif isinstance(ev, ChoiceEnd):
            a = answers[ev.index]
            a.calls = [c for i, c in enumerate(a.calls) if i not in ev.cut_calls]
            a.reason, a.stop_sequence = ev.reason, ev.stop_sequence
            a.completion_tokens, a.thought_tokens = ev.completion_tokens, ev.thought_tokens
        elif isinstance(ev, Usage):
            usage = ev
        elif isinstance(ev, Failure):
            raise ev.error
    if usage is None:
        raise ServiceError("generation ended without a result")
    return Result(answers, usage, prompt)
