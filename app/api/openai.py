"""OpenAI Chat Completions (``/v1/chat/completions``) and Completions (``/v1/completions``).

Requests are validated by app.protocol.openai and become the core's ChatInput / TextInput;
results become ``chat.completion`` / ``text_completion`` objects, and events become chunks
framed by app.protocol.sse under the configured stream policy (``[DONE]``, usage, heartbeats).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from app.api.base import Api, LargeAnswer
from app.base.errors import BadRequest, ServiceError
from app.core.events import (
    Answer,
    CallArgs,
    CallStarted,
    ChoiceEnd,
    Event,
    Failure,
    Logprobs,
    PromptLogprobs,
    Result,
    Text,
    Thinking,
    Tick,
    Usage,
)
from app.core.input import EFFORT_BUDGET, ChatInput, OutputFormat, TextInput, ToolChoice
from app.core.service import Run
from app.engine.types import TokenScore
from app.protocol import logprobs, openai, tools
from app.protocol.sse import ChunkWriter, comment, policy_of

Pending = dict[int, list[TokenScore]]  # a stream's scores not sent yet, by choice


def tool_choice(value: Any) -> ToolChoice:
    """Chat Completions' tool_choice: 'auto', 'none', 'required' or a named function."""
    if value in (None, "auto", "none", "required"):
        return ToolChoice(value or "auto")
    if isinstance(value, dict) and isinstance(value.get("function"), dict):
        return ToolChoice("named", str(value["function"].get("name")))
    raise BadRequest("tool_choice must be 'auto', 'none', 'required' or a named function",
                     param="tool_choice")


def output_format(fmt: dict[str, Any] | None) -> OutputFormat | None:
    if not fmt or fmt.get("type", "text") == "text":
        return None
    if fmt["type"] == "json_object":
        return OutputFormat("json_object", param="response_format")
    spec = fmt.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    return OutputFormat("json_schema", schema, "response_format.json_schema.schema")


def chat_message(a: Answer, reasoning_field: str = "reasoning_content") -> dict[str, Any]:
    """The assistant message of one answer."""
    msg: dict[str, Any] = {"role": "assistant", "content": a.text or (None if a.calls else "")}
    if a.reasoning is not None:
        msg[reasoning_field] = a.reasoning
    if a.calls:
        msg["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in a.calls
        ]
    return msg


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


def _usage(u: Usage) -> dict[str, Any]:
    return openai.usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens, u.predicted)


class _OpenAI(Api):
    kind: ClassVar[str]

    def __init__(self, settings: Any, service: Any):
        super().__init__(settings, service)
        self.policy = policy_of(settings)

    def error_body(self, err: ServiceError) -> dict[str, Any]:
        return openai.error_body(err)

    def new_id(self) -> str:
        return openai.new_id(self.id_prefix)

    def _writer(self, req: Any, run: Run, headers: Mapping[str, str]) -> ChunkWriter:
        policy = self.policy.with_done_header(headers.get("X-Stream-Done"))
        opts = req.stream_options or openai.StreamOptions()
        return ChunkWriter(
            self.kind, run.id, run.created, run.model, policy,
            include_usage=opts.include_usage, continuous_usage=opts.continuous_usage_stats,
            prompt_tokens=run.prompt_tokens, n=run.n,
        )

    def _piece(self, req: Any, w: ChunkWriter, ev: Event, pending: Pending) -> list[bytes]:
        """The chunk of one event of a choice; a chunk that goes out takes the choice's
        pending scores with it."""
        raise NotImplementedError

    def _scores(self, req: Any, scores: list[TokenScore] | None) -> dict[str, Any] | None:
        """The ``logprobs`` of a chunk carrying ``scores`` (None when not asked for)."""
        raise NotImplementedError

    def _prelude(self, req: Any, w: ChunkWriter) -> list[bytes]:
        return list(w.start())

    def _prompt_scored(self, req: Any, w: ChunkWriter, ev: PromptLogprobs) -> list[bytes]:
        return []

    def render_stream(self, req: Any, run: Run, headers: Mapping[str, str]) -> Iterator[bytes]:
        w = self._writer(req, run, headers)  # before the first byte: a bad header is a 400
        return self._frames(req, run, w)

    def _frames(self, req: Any, run: Run, w: ChunkWriter) -> Iterator[bytes]:
        yield from self._prelude(req, w)
        last: ChoiceEnd | None = None
        ended = 0
        pending: Pending = {}
        for ev in run.events(heartbeat=self.heartbeat):
            if isinstance(ev, Tick):
                yield comment()
            elif isinstance(ev, Logprobs):
                pending.setdefault(ev.index, []).extend(ev.tokens)
            elif isinstance(ev, PromptLogprobs):
                yield from self._prompt_scored(req, w, ev)
            elif isinstance(ev, ChoiceEnd):
                ended += 1
                if ended < run.n:
                    yield from w.finish(ev.index, ev.reason, ev.completion_tokens,
                                        logprobs=self._scores(req, pending.pop(ev.index, None)))
                else:
                    last = ev  # the last choice's end goes out with the usage (cached tokens)
            elif isinstance(ev, Usage):
                if last is not None:
                    yield from w.finish(last.index, last.reason, last.completion_tokens,
                                        ev.cached_tokens,
                                        self._scores(req, pending.pop(last.index, None)),
                                        ev.timings(), ev.predicted)
                    last = None
            elif isinstance(ev, Failure):
                yield from w.error(ev.error)
                return
            else:
                w.count(ev.index, run.tokens[ev.index])
                yield from self._piece(req, w, ev, pending)


@dataclass(frozen=True)
class _ChatReq:
    stream_options: openai.StreamOptions | None
    logprobs: bool = False
    as_ids: bool = False  # return_tokens_as_token_ids


class ChatCompletions(_OpenAI):
    name = "chat"
    kind = "chat"
    paths = ("/v1/chat/completions",)
    request_formats = ("chatcompletions", "chat", "/v1/chat/completions", "/chat/completions")
    id_prefix = "chatcmpl"

    def looks_like(self, body: dict[str, Any]) -> bool:
        return "messages" in body

    def parse(self, body: Any) -> tuple[ChatInput, _ChatReq]:
        req = openai.parse(openai.ChatRequest, body)
        images = self.images()
        inp = ChatInput(
            messages=req.template_messages(images.part),
            media=tuple(images.items),
            params=req.sampling(),
            tools=tools.validate_tools(req.tools or [], self.settings.max_tools),
            tool_choice=tool_choice(req.tool_choice),
            parallel_tool_calls=req.parallel_tool_calls,
            output=output_format(req.response_format),
            template_kwargs=dict(req.chat_template_kwargs or {}),
            reasoning_budget=(req.reasoning_budget if req.reasoning_budget is not None
                              else EFFORT_BUDGET[req.reasoning_effort] if req.reasoning_effort
                              else None),
            reasoning_control=req.reasoning_control,
            effort=req.reasoning_effort,
            n=req.n,
            cache_prompt=req.cache_prompt,
            model=req.model,
        )
        return inp, _ChatReq(req.stream_options, bool(req.logprobs),
                             req.return_tokens_as_token_ids)

    def render(self, req: Any, run: Run, result: Result) -> dict[str, Any]:
        field = self.settings.reasoning_field
        choices = [(chat_message(a, field), a.reason, self._scores(req, a.logprobs or []))
                   for a in result.answers]
        body = openai.chat_completion(run.id, run.created, run.model, choices,
                                      _usage(result.usage), result.usage.timings())
        return LargeAnswer(body) if req.logprobs else body

    def _scores(self, req: Any, scores: list[TokenScore] | None) -> dict[str, Any] | None:
        if not req.logprobs or scores is None:
            return None
        return logprobs.chat_logprobs(scores, req.as_ids)

    def _piece(self, req: Any, w: ChunkWriter, ev: Event, pending: Pending) -> list[bytes]:
        delta = chat_delta(ev, self.settings.reasoning_field)
        if delta is None:
            return []
        index = ev.index  # type: ignore[attr-defined]
        return [w.delta(index, delta, self._scores(req, pending.pop(index, None)))]


@dataclass(frozen=True)
class _CompletionReq:
    stream_options: openai.StreamOptions | None
    echo: str
    logprobs: bool = False  # the legacy logprobs object on every choice
    scored: bool = False  # ... with the prompt's tokens first (echo with logprobs)
    as_ids: bool = False  # return_tokens_as_token_ids


class Completions(_OpenAI):
    name = "completion"
    kind = "completion"
    paths = ("/v1/completions",)
    request_formats = ("completions", "completion", "/v1/completions", "/completions")
    id_prefix = "cmpl"

    def looks_like(self, body: dict[str, Any]) -> bool:
        return "prompt" in body

    def parse(self, body: Any) -> tuple[TextInput, _CompletionReq]:
        req = openai.parse(openai.CompletionRequest, body)
        prompt = req.single_prompt()
        params = req.sampling()
        echo = ""
        scored = req.echo and req.logprobs is not None
        if req.echo:  # a token prompt echoes as its text, control tokens spelled out
            echo = prompt if isinstance(prompt, str) else self.service.prompt_text(prompt)
        if scored:
            params = replace(params, prompt_logprobs=req.logprobs)
        inp = TextInput(prompt, params, n=req.n, cache_prompt=req.cache_prompt,
                        model=req.model)
        return inp, _CompletionReq(req.stream_options, echo, req.logprobs is not None, scored,
                                   req.return_tokens_as_token_ids)

    def render(self, req: Any, run: Run, result: Result) -> dict[str, Any]:
        choices = []
        for a in result.answers:
            lp = None
            if req.logprobs:
                lp = self._legacy(req, result.prompt_logprobs, a.logprobs or [])
            choices.append((req.echo + a.text, a.reason, lp))
        body = openai.text_completion(run.id, run.created, run.model, choices,
                                      _usage(result.usage), result.usage.timings())
        return LargeAnswer(body) if req.logprobs else body

    @staticmethod
    def _legacy(req: Any, prompt: tuple[TokenScore, ...] | None,
                scores: list[TokenScore]) -> dict[str, Any]:
        """A choice's legacy logprobs: the prompt's tokens first when echo scored them, then
        the generated ones, with offsets into the text the choice shows."""
        head = list(prompt or ()) if req.scored else []
        offsets = logprobs.prompt_offsets(head, req.echo) if head else []
        offsets += logprobs.generated_offsets(scores, len(req.echo))
        return logprobs.legacy([*head, *scores], offsets, req.as_ids)

    def _scores(self, req: Any, scores: list[TokenScore] | None) -> dict[str, Any] | None:
        if not req.logprobs or scores is None:
            return None
        return logprobs.legacy(scores, logprobs.generated_offsets(scores, len(req.echo)),
                               req.as_ids)

    def _prelude(self, req: Any, w: ChunkWriter) -> list[bytes]:
        out = list(w.start())
        if req.echo and not req.scored:  # a scored echo waits for the prompt's scores
            for i in range(w.n):
                out += w.text(i, req.echo)
        return out

    def _prompt_scored(self, req: Any, w: ChunkWriter, ev: PromptLogprobs) -> list[bytes]:
        """The echoed prompt, with its tokens' scores, on every choice."""
        if not req.scored:
            return []
        lp = logprobs.legacy(ev.tokens, logprobs.prompt_offsets(ev.tokens, req.echo),
                             req.as_ids)
        out: list[bytes] = []
        for i in range(w.n):
            out += w.text(i, req.echo, lp)
        return out

    def _piece(self, req: Any, w: ChunkWriter, ev: Event, pending: Pending) -> list[bytes]:
        if isinstance(ev, Text):
            return w.text(ev.index, ev.text, self._scores(req, pending.pop(ev.index, None)))
        return []


