"""OpenAI Responses (``/v1/responses``), with ``/v1/responses/input_tokens`` and retrieval.

A request's ``input`` items (messages, function calls and their outputs, reasoning) become the
core's chat-template messages, ``instructions`` a system message before them; ``tools`` (flat
function tools), ``tool_choice``, ``text.format`` and ``reasoning.effort`` map onto the core's
tools, output format and reasoning budget. The answer is a ``response`` object whose ``output``
holds a reasoning item, a message and function calls; streamed, it is the typed event sequence
OpenAI sends (``event:`` + ``data:`` lines, a ``sequence_number`` on each, no ``[DONE]``).

Recent responses are kept in a bounded in-process store (RESPONSES_STORE_SIZE entries for
RESPONSES_STORE_TTL seconds), per API key, so ``previous_response_id`` continues a conversation
and ``GET /v1/responses/{id}`` returns one to the key that made it; each replica has its own
store.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

from flask import Blueprint, Response, jsonify, request

from app.api.base import Facts, LargeAnswer, read_body
from app.api.generation import GenerationApi
from app.api.responses.parsing import (
    forget_images,
    input_messages,
    output_format,
    parse_request,
    parse_tools,
    tool_choice,
)
from app.api.responses.store import ResponseNotFound, ResponseStore, Stored
from app.api.responses.stream import (
    EventWriter,
    assistant_turn,
    call_item,
    item_id,
    message_item,
    reasoning_item,
    usage,
    wants_message,
)
from app.api.responses.tools import Wire
from app.base import reqctx
from app.base.errors import BadRequest, ServiceError
from app.core.events import Answer, Result
from app.core.input import EFFORT_BUDGET, ChatInput
from app.core.service import Run
from app.protocol import openai
from app.protocol.logprobs import chat_list

# ---- the API ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResponsesReq:
    """What rendering needs of a request: the fields a response echoes, and the conversation
    it continues (without instructions) for the store."""

    echo: dict[str, Any]
    history: list[dict[str, Any]]
    store: bool
    scope: str = ""  # the API key's scope, taken at parsing: the store keeps it with the answer
    logprobs: bool = False  # the output text carries the tokens' logprobs
    # how calls to namespaced and custom tools go back (app.api.responses.tools), by flat name
    wires: dict[str, Wire] = field(default_factory=dict)


class Responses(GenerationApi):
    name = "responses"
    paths = ("/v1/responses",)
    request_formats = ("responses", "/responses")
    id_prefix = "resp"

    def __init__(self, settings: Any, service: Any):
        super().__init__(settings, service)
        self.store = ResponseStore(settings.responses_store_size, settings.responses_store_ttl,
                                   max_bytes=settings.responses_store_bytes)

    def looks_like(self, body: dict[str, Any]) -> bool:
        return "input" in body and "messages" not in body and "prompt" not in body

    @staticmethod
    def error_body(err: ServiceError) -> dict[str, Any]:
        body = openai.error_body(err)
        if isinstance(err, ResponseNotFound):
            body["error"]["type"] = "invalid_request_error"
        return body

    def new_id(self) -> str:
        return item_id(self.id_prefix)

    def blueprint(self, bp: Blueprint) -> None:
        bp.add_url_rule("/v1/responses/input_tokens", "responses:input_tokens",
                        self.input_tokens, methods=["POST"])
        bp.add_url_rule("/v1/responses/<response_id>", "responses:get", self.retrieve,
                        methods=["GET"])
        bp.add_url_rule("/v1/responses/<response_id>", "responses:delete", self.delete,
                        methods=["DELETE"])

    # ---- parsing --------------------------------------------------------------------------
    def parse(self, body: Any, facts: Facts) -> tuple[ChatInput, ResponsesReq]:
        req = parse_request(body)
        settings = self.settings_of(facts)  # its model's: a preset's defaults are echoed
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            prev = self.store.get(reqctx.cache_scope(), req.previous_response_id)
            if prev is None:
                raise ResponseNotFound(
                    f"Previous response with id {req.previous_response_id!r} not found.",
                    param="previous_response_id", code="previous_response_not_found")
            history = forget_images(copy.deepcopy(prev.messages))
        images = self.images(facts)
        history += input_messages(req.input, images.part)
        messages = list(history)
        if req.instructions:
            messages.insert(0, {"role": "system", "content": req.instructions})
        if not messages:
            raise BadRequest("input: is empty", param="input")
        offered, tools_echo, wires = parse_tools(req.tools or [], settings.max_tools)
        choice = tool_choice(req.tool_choice, bool(offered))
        fmt, fmt_echo = output_format(req.text.format if req.text else None)
        effort = req.reasoning.effort if req.reasoning else None
        summary = (req.reasoning.summary or req.reasoning.generate_summary) if req.reasoning else None
        inp = ChatInput(
            messages=messages,
            media=tuple(images.items),
            params=req.sampling(),
            tools=offered,
            tool_choice=choice,
            parallel_tool_calls=req.parallel_tool_calls,
            output=fmt,
            reasoning_budget=EFFORT_BUDGET[effort] if effort else None,
            effort=effort,
            reasoning_control=req.reasoning_control,
            model=req.model,
        )
        text_echo: dict[str, Any] = {"format": fmt_echo}
        if req.text and req.text.verbosity:
            text_echo["verbosity"] = req.text.verbosity
        store = req.store and self.store.enabled
        echo = {
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "max_tool_calls": req.max_tool_calls,
            "metadata": dict(req.metadata or {}),
            "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": effort, "summary": summary},
            "store": store,
            "temperature": (settings.default_temperature if inp.params.temperature is None
                            else inp.params.temperature),
            "text": text_echo,
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "tools": tools_echo,
            "top_p": (settings.default_top_p if inp.params.top_p is None
                      else inp.params.top_p),
            "truncation": "disabled",
            "user": req.user,
        }
        if req.top_logprobs is not None:
            echo["top_logprobs"] = req.top_logprobs
        return inp, ResponsesReq(echo, history, store, scope=reqctx.cache_scope(),
                                 logprobs=req.logprobs, wires=wires)

    # ---- the response object --------------------------------------------------------------
    def response(self, req: ResponsesReq, run: Run, status: str, output: list[dict[str, Any]],
                 use: dict[str, Any] | None = None, error: dict[str, Any] | None = None,
                 ) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": run.id,
            "object": "response",
            "created_at": run.created,
            "status": status,
            "background": False,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error,
            "incomplete_details": ({"reason": "max_output_tokens"} if status == "incomplete"
                                   else None),
            "model": run.model,
            "output": output,
        }
        out.update(req.echo)
        out["usage"] = use
        return out

    def keep(self, req: ResponsesReq, resp: dict[str, Any], turn: dict[str, Any]) -> None:
        if req.store:
            self.store.put(req.scope, resp["id"], resp, [*req.history, turn])

    # ---- whole answers --------------------------------------------------------------------
    def render(self, req: ResponsesReq, run: Run, result: Result) -> dict[str, Any]:
        a: Answer = result.answers[0]
        length = a.reason == "length"
        items: list[dict[str, Any]] = []
        if a.reasoning:
            last = length and not a.text and not a.calls
            items.append(reasoning_item(item_id("rs"), a.reasoning,
                                        "incomplete" if last else "completed"))
        if wants_message(a.text, len(a.calls), a.reason):
            last = length and not a.calls
            scores = chat_list(a.logprobs or ()) if req.logprobs else None
            items.append(message_item(item_id("msg"), a.text,
                                      "incomplete" if last else "completed", scores))
        for c in a.calls:
            items.append(call_item(item_id("fc"), c.id, c.name, c.arguments, "completed",
                                   req.wires.get(c.name)))
        u = result.usage
        resp = self.response(
            req, run, "incomplete" if length else "completed", items,
            usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens, a.thought_tokens),
        )
        calls = [(c.id, c.name, c.arguments) for c in a.calls]
        self.keep(req, resp, assistant_turn(a.reasoning, a.text, calls))
        return LargeAnswer(resp) if req.logprobs else resp

    # ---- streams --------------------------------------------------------------------------
    def renderer(self, req: ResponsesReq, run: Run, facts: Facts) -> EventWriter:
        return EventWriter(lambda status, output, use=None, error=None:
                           self.response(req, run, status, output, use, error), req.wires,
                           keep=lambda resp, turn: self.keep(req, resp, turn))

    # ---- the other routes -----------------------------------------------------------------
    def input_tokens(self) -> Response:
        body = read_body()
        lease, facts = self.lease(body, self.facts(request.headers))
        with lease:
            count = lease.service.count_tokens(lambda: self.parse(body, facts))
        return jsonify({"object": "response.input_tokens", "input_tokens": count})

    def _stored(self, response_id: str) -> Stored:
        entry = self.store.get(reqctx.cache_scope(), response_id)
        if entry is None:
            raise ResponseNotFound(f"Response with id {response_id[:100]!r} not found.",
                                   param="response_id")
        return entry

    def retrieve(self, response_id: str) -> Response:
        if request.args.get("stream", "false").lower() not in ("false", "0"):
            raise BadRequest("stream: replaying a stored response as a stream is not supported",
                             param="stream")
        return jsonify(self._stored(response_id).response)

    def delete(self, response_id: str) -> Response:
        if not self.store.delete(reqctx.cache_scope(), response_id):
            self._stored(response_id)  # the same 404 as a GET's
        return jsonify({"id": response_id, "object": "response", "deleted": True})
