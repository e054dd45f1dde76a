"""OpenAI's streams: ``chat.completion.chunk`` and ``text_completion`` chunks framed as SSE under
the stream policy (app.protocol.stream_policy: ``[DONE]``, the role chunk, usage), and the
renderers that turn the core's events into them; with what a chunk's ``logprobs`` hold, which a
whole answer shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from app.api.generation import Renderer
from app.base.errors import ServiceError
from app.core.events import (
    CallArgs,
    CallStarted,
    ChoiceEnd,
    Event,
    Logprobs,
    PromptLogprobs,
    Text,
    Thinking,
    Usage,
)
from app.core.service import Run
from app.engine.types import TokenScore
from app.protocol import logprobs, openai
from app.protocol.openai import SYSTEM_FINGERPRINT, error_body, usage
from app.protocol.sse import frame
from app.protocol.stream_policy import StreamPolicy

DONE = b"data: [DONE]\n\n"


class ChunkWriter:
    """Builds the SSE bytes of one streamed response (all its choices), piece by piece: the
    role chunks, deltas and text, each choice's finish chunk (from its ChoiceEnd), the usage
    chunk and ``[DONE]`` as the policy says."""

    def __init__(
        self,
        kind: Literal["chat", "completion"],
        rid: str,
        created: int,
        model: str,
        policy: StreamPolicy,
        *,
        include_usage: bool = False,
        continuous_usage: bool = False,
        prompt_tokens: int = 0,
        n: int = 1,
    ):
        self.kind = kind
        self.policy = policy
        self.include_usage = include_usage or policy.always_usage
        self.continuous_usage = continuous_usage
        self.prompt_tokens = prompt_tokens
        self.n = n
        self._tokens = [0] * n  # completion tokens per choice
        self._finished: set[int] = set()  # the choices that have ended
        self.id = rid
        self._base = {
            "id": rid,
            "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
            "created": created,
            "model": model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }

    def _chunk(self, choice: dict[str, Any] | None,
               timings: dict[str, Any] | None = None) -> bytes:
        obj = dict(self._base)
        obj["choices"] = [choice] if choice is not None else []
        if timings is not None:
            obj["timings"] = timings
        if self.continuous_usage:
            obj["usage"] = usage(self.prompt_tokens, self.completion_tokens)
        elif self.include_usage:
            obj["usage"] = None
        return frame(obj)

    @property
    def completion_tokens(self) -> int:
        return sum(self._tokens)

    @property
    def all_finished(self) -> bool:
        return len(self._finished) == self.n

    def _choice(
        self, content: str | None, finish: str | None, role: bool = False, index: int = 0,
        logprobs: dict[str, Any] | None = None,
    ) -> dict:
        if self.kind == "completion":
            return {"index": index, "text": content or "", "logprobs": logprobs,
                    "finish_reason": finish}
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
            delta["content"] = None if self.policy.role_content == "null" else ""
        elif content is not None:
            delta["content"] = content
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    def start(self) -> list[bytes]:
        """The role chunk of every choice (chat only): role is sent once per choice, first."""
        if self.kind == "chat":
            return [self._chunk(self._choice(None, None, role=True, index=i))
                    for i in range(self.n)]
        return []

    def count(self, index: int, completion_tokens: int) -> None:
        self._tokens[index] = completion_tokens

    def delta(self, index: int, delta: dict[str, Any],
              logprobs: dict[str, Any] | None = None) -> bytes:
        """A chunk with a ready-made delta (tool calls, content parsed out of tool JSON), and
        the ``logprobs`` of the tokens it carries when they were asked for."""
        return self._chunk({"index": index, "delta": delta, "logprobs": logprobs,
                            "finish_reason": None})

    def text(self, index: int, text: str, logprobs: dict[str, Any] | None = None) -> list[bytes]:
        """A choice's next text (its token count is kept by ``count``); a chunk with no text
        still goes out when it carries ``logprobs``."""
        if not text and logprobs is None:
            return []
        return [self._chunk(self._choice(text, None, index=index, logprobs=logprobs))]

    def finish(self, end: ChoiceEnd, logprobs: dict[str, Any] | None = None,
               use: Usage | None = None) -> list[bytes]:
        """A choice's finish chunk (with the ``logprobs`` of tokens no chunk carried yet, and
        llama-server's ``timings`` on the last); after the last choice (``use``: the request's
        usage), the usage chunk (its ``cached_tokens``: the prompt tokens the cache served)
        and [DONE]."""
        self._tokens[end.index] = end.completion_tokens
        self._finished.add(end.index)
        timings = use.timings() if use is not None else None
        out = [self._chunk(self._choice(None, end.reason, index=end.index, logprobs=logprobs),
                           timings)]
        if not self.all_finished:
            return out
        if self.include_usage:
            obj = dict(self._base)
            obj["choices"] = []
            obj["usage"] = usage(self.prompt_tokens, self.completion_tokens,
                                 use.cached_tokens if use else 0, use.predicted if use else None,
                                 use.video_frames if use else 0)
            out.append(frame(obj))
        if self.policy.send_done:
            out.append(DONE)
        return out

    def error(self, err: ServiceError) -> list[bytes]:
        out = [frame(error_body(err))]
        if self.policy.send_done and self.policy.done_after_error:
            out.append(DONE)
        return out


# ---- what rendering needs of a request, and its scores ----------------------------------------


@dataclass(frozen=True)
class ChatReq:
    stream_options: openai.StreamOptions | None
    logprobs: bool = False
    as_ids: bool = False  # return_tokens_as_token_ids
    # where a thought goes (REASONING_FIELD): the request's model's, read when it was parsed
    reasoning_field: str = "reasoning_content"


@dataclass(frozen=True)
class CompletionReq:
    stream_options: openai.StreamOptions | None
    echo: str
    logprobs: bool = False  # the legacy logprobs object on every choice
    scored: bool = False  # ... with the prompt's tokens first (echo with logprobs)
    as_ids: bool = False  # return_tokens_as_token_ids


def chat_scores(req: ChatReq, scores: list[TokenScore] | None) -> dict[str, Any] | None:
    """A chat choice's ``logprobs`` for ``scores`` (None when not asked for)."""
    if not req.logprobs or scores is None:
        return None
    return logprobs.chat_logprobs(scores, req.as_ids)


def completion_scores(req: CompletionReq,
                      scores: list[TokenScore] | None) -> dict[str, Any] | None:
    """A completion chunk's legacy ``logprobs`` for ``scores``, offsets past the echo."""
    if not req.logprobs or scores is None:
        return None
    return logprobs.legacy(scores, logprobs.generated_offsets(scores, len(req.echo)),
                           req.as_ids)


def chat_delta(ev: Event, reasoning_field: str = "reasoning_content") -> dict[str, Any] | None:
    """The ``delta`` of a chunk for one event of a choice (None: nothing to send)."""
    if isinstance(ev, Thinking):
        return {reasoning_field: ev.text} if ev.text else None
    if isinstance(ev, Text):
        return {"content": ev.text} if ev.text else None
    if isinstance(ev, CallStarted):
        return {"tool_calls": [{"index": ev.call, "id": ev.id, "type": "function",
                                "function": {"name": ev.name, "arguments": ""}}]}
    if isinstance(ev, CallArgs):
        return {"tool_calls": [{"index": ev.call, "function": {"arguments": ev.text}}]}
    return None


# ---- the renderers ------------------------------------------------------------------------------


class _Chunks(Renderer):
    """What chat and completion streams share: a choice's scores wait for the chunk that carries
    its next text (or its finish chunk)."""

    def __init__(self, run: Run, writer: ChunkWriter):
        self.run = run
        self.w = writer
        self.pending: dict[int, list[TokenScore]] = {}  # scores not sent yet, by choice

    def scores(self, scores: list[TokenScore] | None) -> dict[str, Any] | None:
        raise NotImplementedError

    def content(self, ev: Event) -> list[bytes]:
        """The chunk of one event of a choice, with its pending scores when it goes out."""
        raise NotImplementedError

    def prompt_scored(self, ev: PromptLogprobs) -> list[bytes]:
        return []

    def start(self) -> list[bytes]:
        return self.w.start()

    def piece(self, ev: Event) -> list[bytes]:
        if isinstance(ev, Logprobs):
            self.pending.setdefault(ev.index, []).extend(ev.tokens)
            return []
        if isinstance(ev, PromptLogprobs):
            return self.prompt_scored(ev)
        index = ev.index  # type: ignore[union-attr]
        self.w.count(index, self.run.tokens[index])
        return self.content(ev)

    def choice_end(self, end: ChoiceEnd) -> list[bytes]:
        return self.w.finish(end, self.scores(self.pending.pop(end.index, None)))

    def done(self, end: ChoiceEnd, use: Usage) -> list[bytes]:
        # the last choice's end goes out with the usage (cached tokens, timings)
        return self.w.finish(end, self.scores(self.pending.pop(end.index, None)), use)

    def failure(self, err: ServiceError) -> list[bytes]:
        return self.w.error(err)


class ChatChunks(_Chunks):
    def __init__(self, req: ChatReq, run: Run, writer: ChunkWriter, reasoning_field: str):
        super().__init__(run, writer)
        self.req = req
        self.reasoning_field = reasoning_field

    def scores(self, scores: list[TokenScore] | None) -> dict[str, Any] | None:
        return chat_scores(self.req, scores)

    def content(self, ev: Event) -> list[bytes]:
        delta = chat_delta(ev, self.reasoning_field)
        if delta is None:
            return []
        index = ev.index  # type: ignore[union-attr]
        return [self.w.delta(index, delta, self.scores(self.pending.pop(index, None)))]


class CompletionChunks(_Chunks):
    def __init__(self, req: CompletionReq, run: Run, writer: ChunkWriter):
        super().__init__(run, writer)
        self.req = req

    def scores(self, scores: list[TokenScore] | None) -> dict[str, Any] | None:
        return completion_scores(self.req, scores)

    def start(self) -> list[bytes]:
        out = self.w.start()
        if self.req.echo and not self.req.scored:  # a scored echo waits for the prompt's scores
            out += self._echo()
        return out

    def _echo(self, lp: dict[str, Any] | None = None) -> list[bytes]:
        """The echoed prompt on every choice."""
        out: list[bytes] = []
        for i in range(self.w.n):
            out += self.w.text(i, self.req.echo, lp)
        return out

    def prompt_scored(self, ev: PromptLogprobs) -> list[bytes]:
        """The echoed prompt, with its tokens' scores, on every choice."""
        if not self.req.scored:
            return []
        return self._echo(logprobs.legacy(ev.tokens, logprobs.prompt_offsets(ev.tokens,
                                                                              self.req.echo),
                                          self.req.as_ids))

    def content(self, ev: Event) -> list[bytes]:
        if isinstance(ev, Text):
            return self.w.text(ev.index, ev.text, self.scores(self.pending.pop(ev.index, None)))
        return []
