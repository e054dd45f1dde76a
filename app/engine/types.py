"""The engine interface: what HTTP-side code may ask of the model, and what comes back.

The engine knows nothing of HTTP, Vertex or OpenAI. It takes a prompt (text or token ids) and
sampling parameters and emits events; the protocol layer turns those into API objects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from app.errors import ApiError
from app.state import LoadState


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling. ``temperature == 0`` means greedy."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    penalty_last_n: int = 64
    grammar: str | None = None  # GBNF constraining the output (response_format, tools)
    # with triggers the grammar is lazy: it applies from the first of these words on
    grammar_triggers: tuple[str, ...] = ()
    # the grammar takes injected text (a thought's closing tag) at any point of a thought, so
    # injected tokens are fed to it; other grammars never see them (they might refuse them)
    grammar_takes_injection: bool = False


@dataclass(frozen=True)
class GenerationRequest:
    """A prompt and how to continue it. Text prompts are tokenized with special tokens parsed."""

    prompt: str | tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    add_bos: bool = True
    timeout: float | None = None  # seconds from submission; past it the job fails (504)
    cache_prompt: bool = True  # reuse a slot's KV for a shared prompt prefix
    n: int = 1  # choices: sequences sharing the prompt's KV, each sampled on its own


@dataclass(frozen=True)
class Accepted:
    """The prompt was tokenized and fits: generation will start (possibly after a queue wait)."""

    prompt_tokens: int


@dataclass(frozen=True)
class TextPiece:
    """Newly generated text (never a broken UTF-8 sequence, never part of a stop string)."""

    text: str
    completion_tokens: int
    index: int = 0  # the choice


@dataclass(frozen=True)
class Finished:
    reason: str  # "stop" | "length"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens whose KV was reused, not decoded again
    index: int = 0  # the choice; a request is over when every choice has finished


@dataclass(frozen=True)
class Failed:
    error: ApiError


Event = Accepted | TextPiece | Finished | Failed
Sink = Callable[[Event], None]


@dataclass(frozen=True)
class ModelInfo:
    """What the HTTP side needs to know about the loaded model."""

    name: str
    path: str
    n_ctx: int
    n_ctx_train: int
    chat_template: str | None
    bos_token: str
    eos_token: str
    created: int


class Handle(Protocol):
    """One submitted generation, as seen from the request's greenlet."""

    def __iter__(self) -> Iterator[Event]: ...

    def next_event(self, timeout: float | None = None) -> Event: ...

    def cancel(self) -> None: ...

    def inject(self, text: str) -> None:
        """Insert ``text`` into the generation as if generated (e.g. to end a thought)."""
        ...


class Engine(Protocol):
    """The narrow interface between HTTP and llama.cpp."""

    state: LoadState

    @property
    def info(self) -> ModelInfo | None: ...

    def submit(self, request: GenerationRequest) -> Handle:
        """Queue a generation; raises QueueFull or ModelNotReady at once."""
        ...

    def queue_depth(self) -> int: ...

    def shutdown(self) -> None: ...
