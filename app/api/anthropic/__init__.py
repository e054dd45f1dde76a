"""Anthropic Messages (``/v1/messages``, ``/v1/messages/count_tokens``).

A Messages request (system, content blocks, tools with ``input_schema``, ``tool_choice``,
``thinking``) becomes the core's ChatInput; the result becomes a ``message`` object with
thinking, text and tool_use blocks, and the events become Anthropic's named SSE events
(``message_start``, ``content_block_*``, ``message_delta``, ``message_stop``, ``ping``; no
``[DONE]``). Errors are ``{"type": "error", "error": {"type", "message"}}``, as HTTP errors before
the first byte and as an ``event: error`` after it.

Usage follows Anthropic's meaning: ``input_tokens`` are the prompt tokens that were decoded, the
ones served from the KV cache (a slot's reused prefix) are ``cache_read_input_tokens``; their sum
is the prompt's length, which is what ``count_tokens`` answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from flask import Blueprint, jsonify, request

from app.api.anthropic import models
from app.api.anthropic.parsing import CountTokensRequest, MessagesRequest, chat_input, parse
from app.api.anthropic.stream import (
    PING,
    MessageReq,
    MessageStream,
    content,
    error_body,
    message_id,
    stop_reason,
    usage,
)
from app.api.base import Facts, read_body
from app.api.generation import GenerationApi
from app.base.errors import ServiceError
from app.core.events import Result
from app.core.input import ChatInput
from app.core.models import Listed
from app.core.service import Run
from app.engine.types import ModelInfo


class Messages(GenerationApi):
    name = "messages"
    paths = ("/v1/messages",)
    request_formats = ("messages", "anthropic", "/v1/messages")
    id_prefix = "msg"
    keepalive = PING
    count_path: ClassVar[str] = "/v1/messages/count_tokens"

    def looks_like(self, body: dict[str, Any]) -> bool:
        """A raw Vertex body is a Messages request when it carries ``anthropic_version`` (every
        Claude body on Vertex does), or has ``messages`` and something only Messages has: a
        top-level ``system``, ``stop_sequences`` or ``thinking``, a tool with ``input_schema``,
        a ``tool_choice`` object of type auto/any/tool/none, or a content block of type
        tool_use, tool_result, thinking or redacted_thinking."""
        if "anthropic_version" in body:
            return True
        if "messages" not in body:
            return False
        if any(k in body for k in ("system", "stop_sequences", "thinking")):
            return True
        ts = body.get("tools")
        if isinstance(ts, list) and any(isinstance(t, dict) and "input_schema" in t for t in ts):
            return True
        choice = body.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") in ("auto", "any", "tool", "none"):
            return True
        messages = body.get("messages")
        for m in messages if isinstance(messages, list) else ():
            blocks = m.get("content") if isinstance(m, dict) else None
            for b in blocks if isinstance(blocks, list) else ():
                if isinstance(b, dict) and b.get("type") in _ANTHROPIC_ONLY:
                    return True
        return False

    def new_id(self) -> str:
        return message_id()

    @staticmethod
    def error_body(err: ServiceError) -> dict[str, Any]:
        return error_body(err)

    @classmethod
    def speaks(cls, headers: Mapping[str, str]) -> bool:
        """Anthropic's SDKs (and Claude Code) send ``anthropic-version`` with every request."""
        return models.VERSION_HEADER in headers

    @classmethod
    def model_list(cls, info: ModelInfo) -> dict[str, Any]:
        return models.models_list(info)

    @classmethod
    def model_card(cls, info: ModelInfo, name: str) -> dict[str, Any]:
        return models.model_card(info, name)

    @classmethod
    def listed_list(cls, items: list[Listed]) -> dict[str, Any]:
        return models.listed_models(items)

    @classmethod
    def listed_card(cls, item: Listed, name: str) -> dict[str, Any]:
        return models.listed_card(item, name)

    def parse(self, body: Any, facts: Facts) -> tuple[ChatInput, MessageReq]:
        req = parse(MessagesRequest, body)
        display = req.thinking.display if req.thinking else None
        settings = self.settings_of(facts)
        return (chat_input(req, settings.max_tools, settings.image_max_bytes),
                MessageReq(req.model, display in ("omitted", "updates")))

    def render(self, req: MessageReq, run: Run, result: Result) -> dict[str, Any]:
        a, u = result.answers[0], result.usage
        return {
            "id": run.id,
            "type": "message",
            "role": "assistant",
            "content": content(a, req.omit_thinking),
            "model": run.model,
            "stop_reason": stop_reason(a.reason, a.stop_sequence),
            "stop_sequence": a.stop_sequence if a.reason == "stop" else None,
            "usage": usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens),
        }

    def renderer(self, req: MessageReq, run: Run, facts: Facts) -> MessageStream:
        return MessageStream(run, req.omit_thinking)

    # ---- count_tokens -----------------------------------------------------------------------
    def blueprint(self, bp: Blueprint) -> None:
        bp.add_url_rule(self.count_path, f"{self.name}:count_tokens", self.count_view,
                        methods=["POST"])

    def count_tokens(self, body: Any, facts: Facts) -> dict[str, int]:
        """``{"input_tokens": N}``: the prompt this body would be, tokenized as its model
        would tokenize it."""
        lease, facts = self.lease(body, facts)
        with lease:
            settings = self.settings_of(facts)  # its model's limits

            def build() -> tuple[ChatInput, None]:
                return chat_input(parse(CountTokensRequest, body), settings.max_tools,
                                  settings.image_max_bytes), None

            return {"input_tokens": lease.service.count_tokens(build)}

    def count_view(self) -> Any:
        return jsonify(self.count_tokens(read_body(), self.facts(request.headers)))


# Content block types only a Messages request has (for telling a raw Vertex body apart).
_ANTHROPIC_ONLY = frozenset({"tool_use", "tool_result", "thinking", "redacted_thinking"})
