"""OpenAI Chat Completions (``/v1/chat/completions``) and Completions (``/v1/completions``).

Requests are validated by app.protocol.openai and become the core's ChatInput / TextInput;
results become ``chat.completion`` / ``text_completion`` objects, and events become chunks
(app.api.openai.stream) under the configured stream policy (``[DONE]``, usage, heartbeats).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Literal

from app.api.base import Facts, LargeAnswer
from app.api.generation import GenerationApi
from app.api.openai.stream import (
    ChatChunks,
    ChatReq,
    ChunkWriter,
    CompletionChunks,
    CompletionReq,
    chat_scores,
)
from app.base.errors import BadRequest, ServiceError
from app.core.events import Answer, Result, Usage
from app.core.input import EFFORT_BUDGET, ChatInput, OutputFormat, TextInput, ToolChoice
from app.core.service import Run
from app.engine.types import TokenScore
from app.protocol import logprobs, openai, tools
from app.protocol.stream_policy import policy_of


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


def _usage(u: Usage) -> dict[str, Any]:
    return openai.usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens, u.predicted,
                        u.video_frames)


class _OpenAI(GenerationApi):
    kind: ClassVar[Literal["chat", "completion"]]

    def __init__(self, settings: Any, models: Any):
        super().__init__(settings, models)
        self.policy = policy_of(settings)

    @staticmethod
    def error_body(err: ServiceError) -> dict[str, Any]:
        return openai.error_body(err)

    def new_id(self) -> str:
        return openai.new_id(self.id_prefix)

    def _writer(self, req: ChatReq | CompletionReq, run: Run, facts: Facts) -> ChunkWriter:
        """The chunk writer, under the request's ``X-Stream-Done`` (a bad one is a 400)."""
        policy = self.policy.with_done_header(facts.headers.get("X-Stream-Done"))
        opts = req.stream_options or openai.StreamOptions()
        return ChunkWriter(
            self.kind, run.id, run.created, run.model, policy,
            include_usage=opts.include_usage, continuous_usage=opts.continuous_usage_stats,
            prompt_tokens=run.prompt_tokens, n=run.n,
        )


class ChatCompletions(_OpenAI):
    name = "chat"
    kind = "chat"
    paths = ("/v1/chat/completions",)
    request_formats = ("chatcompletions", "chat", "/v1/chat/completions", "/chat/completions")
    id_prefix = "chatcmpl"

    def looks_like(self, body: dict[str, Any]) -> bool:
        return "messages" in body

    def parse(self, body: Any, facts: Facts) -> tuple[ChatInput, ChatReq]:
        req = openai.parse(openai.ChatRequest, body)
        settings = self.settings_of(facts)
        images = self.images(facts)
        inp = ChatInput(
            messages=req.template_messages(images.part),
            media=tuple(images.items),
            params=req.sampling(),
            tools=tools.validate_tools(req.tools or [], settings.max_tools),
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
        return inp, ChatReq(req.stream_options, bool(req.logprobs),
                            req.return_tokens_as_token_ids, settings.reasoning_field)

    def render(self, req: ChatReq, run: Run, result: Result) -> dict[str, Any]:
        choices = [(chat_message(a, req.reasoning_field), a.reason,
                    chat_scores(req, a.logprobs or [])) for a in result.answers]
        body = openai.chat_completion(run.id, run.created, run.model, choices,
                                      _usage(result.usage), result.usage.timings())
        return LargeAnswer(body) if req.logprobs else body

    def renderer(self, req: ChatReq, run: Run, facts: Facts) -> ChatChunks:
        return ChatChunks(req, run, self._writer(req, run, facts), req.reasoning_field)


class Completions(_OpenAI):
    name = "completion"
    kind = "completion"
    paths = ("/v1/completions",)
    request_formats = ("completions", "completion", "/v1/completions", "/completions")
    id_prefix = "cmpl"

    def looks_like(self, body: dict[str, Any]) -> bool:
        return "prompt" in body

    def parse(self, body: Any, facts: Facts) -> tuple[TextInput, CompletionReq]:
        req = openai.parse(openai.CompletionRequest, body)
        prompt = req.single_prompt()
        params = req.sampling()
        echo = ""
        scored = req.echo and req.logprobs is not None
        if req.echo:  # a token prompt echoes as its text, control tokens spelled out
            echo = prompt if isinstance(prompt, str) else self.service_of(facts).prompt_text(prompt)
        if scored:
            params = replace(params, prompt_logprobs=req.logprobs)
        inp = TextInput(prompt, params, n=req.n, cache_prompt=req.cache_prompt,
                        model=req.model)
        return inp, CompletionReq(req.stream_options, echo, req.logprobs is not None, scored,
                                  req.return_tokens_as_token_ids)

    def render(self, req: CompletionReq, run: Run, result: Result) -> dict[str, Any]:
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
    def _legacy(req: CompletionReq, prompt: tuple[TokenScore, ...] | None,
                scores: list[TokenScore]) -> dict[str, Any]:
        """A choice's legacy logprobs: the prompt's tokens first when echo scored them, then
        the generated ones, with offsets into the text the choice shows."""
        head = list(prompt or ()) if req.scored else []
        offsets = logprobs.prompt_offsets(head, req.echo) if head else []
        offsets += logprobs.generated_offsets(scores, len(req.echo))
        return logprobs.legacy([*head, *scores], offsets, req.as_ids)

    def renderer(self, req: CompletionReq, run: Run, facts: Facts) -> CompletionChunks:
        return CompletionChunks(req, run, self._writer(req, run, facts))
