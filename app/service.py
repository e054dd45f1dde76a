"""What a request asks of the model, between thin routes and the engine.

Turns validated OpenAI requests into engine requests, collects or streams the engine's events,
and runs Vertex envelope instances concurrently. No Flask here: routes wrap the results.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import gevent
import gevent.pool

from app import bridge, grammar
from app.engine.types import (
    Accepted,
    Engine,
    Failed,
    Finished,
    GenerationRequest,
    Handle,
    ModelInfo,
    TextPiece,
)
from app.errors import ApiError, BadRequest, ClientGone, ModelNotReady, as_api_error
from app.protocol import chat_template, openai, reasoning, replies, sse, tools, vertex
from app.protocol.sse import ChunkWriter, StreamPolicy, comment

# How often a non-streaming request checks that its client is still connected (seconds).
GONE_POLL = 0.5

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    kind: vertex.Kind
    request: openai.ChatRequest | openai.CompletionRequest
    generation: GenerationRequest
    echo: str = ""
    reply: replies.ReplySpec | None = None  # how to parse the reply (None: it is plain text)


class Service:
    def __init__(
        self,
        engine: Engine,
        policy: StreamPolicy,
        max_instances: int,
        request_timeout: float = 0.0,
        reasoning_format: str = "auto",
        reasoning_field: str = "reasoning_content",
        tool_format: str = "auto",
        limits: grammar.Limits | None = None,
        max_tools: int = 128,
        slots_per_request: int = 1,
        protect_messages: bool = True,
        prepare_timeout: float = 30.0,
    ):
        self.limits = limits or grammar.Limits.defaults()
        self.max_tools = max_tools
        self.slots_per_request = slots_per_request
        self.protect_messages = protect_messages
        self.prepare_timeout = prepare_timeout
        self.reasoning_format = reasoning_format
        self.reasoning_field = reasoning_field
        self.tool_format = tool_format
        self._live: dict[str, _ThoughtGuard] = {}  # streams open to reasoning control, by id
        self.engine = engine
        self.policy = policy
        self.max_instances = max_instances
        self.timeout = request_timeout or None

    def warm(self, poll: float = 0.1, limit: float = 3600.0) -> None:
        """Once the model is ready, prepare one chat with a JSON schema off the hub: the chat
        template's first compile, the schema converter's import and the first pass through
        validation cost ~100 ms of interpreter time, which the first such request would
        otherwise take from the streams running beside it."""
        deadline = time.monotonic() + limit
        while self.engine.info is None and self.engine.state.stage != "failed":
            if time.monotonic() > deadline:
                return
            gevent.sleep(poll)
        if self.engine.info is None:
            return
        try:
            self.prepare_off_hub("chat", {
                "messages": [{"role": "user", "content": "hi"}],
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "warm", "schema": {"type": "object"}}},
            })
        except Exception:  # noqa: BLE001 - a template that fails here fails its requests clearly
            log.warning("warming the chat path failed", exc_info=True)

    def info(self) -> ModelInfo:
        info = self.engine.info
        if info is None:
            raise ModelNotReady(f"model is {self.engine.state.stage.replace('_', ' ')}")
        return info

    # ---- building requests ------------------------------------------------------------------
    def prepare(self, kind: vertex.Kind, body: Any) -> Prepared:
        """Validate and build the engine request. CPU-bound Python (validation, the chat
        template, JSON Schema conversion, the grammar gate): run off the request hub by
        :meth:`prepare_off_hub`."""
        info = self.info()
        if kind == "chat":
            prep = self._prepare_chat(info, openai.parse(openai.ChatRequest, body))
        else:
            prep = self._prepare_completion(openai.parse(openai.CompletionRequest, body))
        if prep.generation.n > self.slots_per_request:
            raise BadRequest(
                f"n={prep.generation.n}: one request may use at most {self.slots_per_request} "
                "of the server's slots (SLOTS_PER_REQUEST), so others are served too",
                param="n",
            )
        params = prep.generation.params
        if params.grammar is not None:
            stats = grammar.check(params.grammar, params.grammar_param, self.limits)
            params = replace(params, grammar_prefilter=not stats.has_tokens)
            prep.generation = replace(prep.generation, params=params)
        return prep

    def prepare_off_hub(self, kind: vertex.Kind, body: Any) -> Prepared:
        """:meth:`prepare` on a worker thread, so a costly request cannot stall the others'
        streams or the health route; past PREPARE_TIMEOUT it is refused."""
        self.info()  # 503 at once while loading
        return bridge.offload(self.prepare, kind, body, timeout=self.prepare_timeout)

    def _prepare_completion(self, req: openai.CompletionRequest) -> Prepared:
        prompt = req.single_prompt()
        echo = ""
        if req.echo:
            if not isinstance(prompt, str):
                raise BadRequest("echo is only supported with a text prompt", param="echo")
            echo = prompt
        gen = GenerationRequest(
            prompt, req.sampling(), timeout=self.timeout, cache_prompt=req.cache_prompt, n=req.n
        )
        return Prepared("completion", req, gen, echo=echo)

    def _prepare_chat(self, info: ModelInfo, req: openai.ChatRequest) -> Prepared:
        """The prompt (tools offered the way the template expects; message text marked so it
        stays text), the grammar that holds the model to a format, and how to read the reply."""
        template = info.chat_template or ""
        fmt = replies.detect_format(template) if self.tool_format == "auto" else self.tool_format
        params = req.sampling()
        protect = (chat_template.protector(info.control_texts) if self.protect_messages
                   else (lambda value: value))
        offered, required = tools.pick(
            tools.validate_tools(req.tools or [], self.max_tools), req.tool_choice
        )
        think = self.reasoning_format == "parsed" or (
            "<think>" in template and (self.reasoning_format == "auto" or bool(offered))
        )
        formatted = grammar.for_response_format(req.response_format, self.limits)
        if formatted is not None:
            if params.grammar is not None:
                raise BadRequest("grammar and a JSON response_format cannot be combined",
                                 param="response_format")
            params = replace(params, grammar=formatted[0], grammar_param=formatted[1])
        if offered and params.grammar is not None:
            raise BadRequest("tools cannot be combined with a JSON response_format or a grammar",
                             param="response_format")
        parallel = req.parallel_tool_calls and not isinstance(req.tool_choice, dict)
        extra: dict[str, Any] = protect(dict(req.chat_template_kwargs or {}))
        if fmt == "generic":
            messages = tools.render_history(protect(req.template_messages()))
            if offered:  # the generic form: described in words, held to JSON by a grammar
                think = False
                schema = tools.reply_schema(offered, required, parallel)
                params = replace(params, grammar=grammar.from_schema(schema, "tools", self.limits),
                                 grammar_param="tools")
                messages = _with_system(messages, protect(tools.system_prompt(offered, required)))
        else:
            messages = tools.native_history(protect(req.template_messages()), fmt)
            if offered:
                extra["tools"] = protect(tools.template_tools(offered))
        prompt = chat_template.render(
            info.chat_template, messages, bos_token=info.bos_token, eos_token=info.eos_token,
            extra=extra,
        )
        in_thought = think and prompt.rstrip().endswith(reasoning.OPEN)
        if offered and fmt != "generic" and (required or not think):
            lead = ("open" if in_thought else "think" if think else "") if required else ""
            try:
                call = tools.call_grammar(fmt, offered, parallel=parallel, lead=lead,
                                          template=template, limits=self.limits)
                grammar.check(call, "tools", self.limits)  # cached: prepare() checks it again
            except BadRequest:
                if required:
                    raise
                call = None  # auto: a schema the gate refuses is left to the model
                log.warning("tool schemas cannot be turned into a grammar: calls are not held to them")
            if call is not None:  # auto: the grammar takes hold only once a call starts
                params = replace(params, grammar=call, grammar_param="tools",
                                 grammar_takes_injection=bool(lead),
                                 grammar_triggers=() if required else tools.TRIGGERS[fmt])
        spec = None
        if offered or think:
            spec = replies.ReplySpec(
                tool_format=fmt if offered else None,
                think=think,
                in_thought=in_thought,
                inline=self.reasoning_format == "inline",
                string_params={t.name: tools.string_params(t) for t in offered},
                names=frozenset(t.name for t in offered),
            )
        gen = GenerationRequest(prompt, params, timeout=self.timeout, cache_prompt=req.cache_prompt, n=req.n)
        return Prepared("chat", req, gen, reply=spec)

    def _start(self, prep: Prepared) -> tuple[Handle, int]:
        """Submit and wait for acceptance, so that errors arrive before the first byte."""
        handle = self.engine.submit(prep.generation)
        try:
            first = handle.next_event()
        except BaseException:
            handle.cancel()
            raise
        if isinstance(first, Failed):
            raise first.error
        assert isinstance(first, Accepted), first
        return handle, first.prompt_tokens

    # ---- non-streaming ----------------------------------------------------------------------
    def complete(
        self, kind: vertex.Kind, body: Any, gone: Callable[[], bool] | None = None
    ) -> dict[str, Any]:
        """The whole answer. ``gone`` tells whether the client hung up: the generation is
        cancelled then (checked every GONE_POLL seconds while it runs)."""
        prep = self.prepare_off_hub(kind, body)
        created = int(time.time())
        handle, _ = self._start(prep)
        n = prep.generation.n
        parts: list[list[str]] = [[prep.echo] if prep.echo else [] for _ in range(n)]
        finished: dict[int, Finished] = {}
        done = False
        guard = _ThoughtGuard(prep, handle)
        try:
            for ev in _events(handle, gone):
                if isinstance(ev, TextPiece):
                    parts[ev.index].append(ev.text)
                    guard.on_piece(ev)
                elif isinstance(ev, Finished):
                    finished[ev.index] = ev
                elif isinstance(ev, Failed):
                    done = True
                    raise ev.error
            if len(finished) != n:
                raise ApiError("generation ended without a result")
            done = True
        finally:
            if not done:
                handle.cancel()
        first = finished[0]
        use = openai.usage(
            first.prompt_tokens,
            sum(f.completion_tokens for f in finished.values()),
            first.cached_tokens,
        )
        choices: list[tuple[str | dict[str, Any], str]] = []
        for i in range(n):
            text, reason = "".join(parts[i]), finished[i].reason
            if prep.reply is not None:
                parsed = replies.parse_reply(text, prep.reply, [], final=True)
                msg, called = replies.message(parsed, self.reasoning_field)
                choices.append((msg, "tool_calls" if called and reason == "stop" else reason))
            else:
                choices.append((text, reason))
        build = openai.chat_completion if kind == "chat" else openai.text_completion
        rid = openai.new_id("chatcmpl" if kind == "chat" else "cmpl")
        return build(rid, created, self.info(), choices, use)

    # ---- streaming --------------------------------------------------------------------------
    def stream(
        self, kind: vertex.Kind, body: Any, done_header: str | None = None
    ) -> Iterator[bytes]:
        """Checks everything that can fail before the first byte, then returns the SSE body."""
        policy = self.policy.with_done_header(done_header)
        prep = self.prepare_off_hub(kind, body)
        created = int(time.time())
        handle, prompt_tokens = self._start(prep)
        opts = prep.request.stream_options or openai.StreamOptions()
        writer = ChunkWriter(
            kind,
            openai.new_id("chatcmpl" if kind == "chat" else "cmpl"),
            created,
            self.info().name,
            policy,
            include_usage=opts.include_usage,
            continuous_usage=opts.continuous_usage_stats,
            prompt_tokens=prompt_tokens,
            n=prep.generation.n,
        )
        echo = prep.echo
        return self._sse(handle, writer, policy, echo, prep)

    def control(self, body: Any) -> dict[str, Any]:
        """``{"id", "action": "reasoning_end"}``: end a running stream's thought now."""
        if not isinstance(body, dict) or not isinstance(body.get("id"), str):
            raise BadRequest("'id' (a chat.completion id) is required", param="id")
        if body.get("action") != "reasoning_end":
            raise BadRequest("action must be 'reasoning_end'", param="action")
        guard = self._live.get(body["id"])
        return {"success": bool(guard and guard.end_thought())}

    def _sse(
        self, handle: Handle, writer: ChunkWriter, policy: StreamPolicy, echo: str,
        prep: Prepared,
    ) -> Iterator[bytes]:
        streams: dict[int, replies.ReplyStream] = {}
        guard = _ThoughtGuard(prep, handle)
        rid = writer.id
        if guard.watching and getattr(prep.request, "reasoning_control", False):
            self._live[rid] = guard
        over = False
        try:
            yield from writer.start()
            if echo:
                for i in range(writer.n):
                    yield from writer.text(TextPiece(echo, 0, i))
            heartbeat = policy.heartbeat_seconds or None
            while True:
                try:
                    ev = handle.next_event(heartbeat)
                except TimeoutError:
                    yield comment()
                    continue
                if isinstance(ev, TextPiece) and prep.reply is not None:
                    guard.on_piece(ev)
                    rs = streams.get(ev.index)
                    if rs is None:
                        rs = streams[ev.index] = replies.ReplyStream(prep.reply, self.reasoning_field)
                    writer.count(ev)
                    for delta in rs.feed(ev.text):
                        yield writer.delta(ev.index, delta)
                elif isinstance(ev, TextPiece):
                    yield from writer.text(ev)
                elif isinstance(ev, Finished):
                    rs = streams.get(ev.index)
                    if rs is not None:
                        for delta in rs.finish():
                            yield writer.delta(ev.index, delta)
                        _, called = replies.message(rs.result())
                        if called and ev.reason == "stop":
                            ev = replace(ev, reason="tool_calls")
                    yield from writer.finish(ev)
                    if writer.all_finished:
                        over = True
                        return
                elif isinstance(ev, Failed):
                    over = True
                    log.warning("stream failed mid-way: %s", ev.error.message)
                    yield from writer.error(ev.error)
                    return
        finally:
            self._live.pop(rid, None)
            if not over:
                handle.cancel()
                log.info(
                    "client went away mid-stream: generation cancelled after %d tokens",
                    writer.completion_tokens,
                )

    # ---- model load events ----------------------------------------------------------------
    def load_events(self, poll: float = 0.25, heartbeat: float = 15.0) -> Iterator[bytes]:
        """``download_progress`` and ``model_status`` SSE events while the model loads; ends
        once it is loaded or has failed. Polls the state's version (the loader is another
        thread)."""
        state = self.engine.state
        seen = -1
        last_sent = time.monotonic()
        while True:
            if state.version != seen:
                seen = state.version
                snap = state.snapshot()
                if snap["stage"] == "downloading" and "download" in snap:
                    yield sse.event("download_progress", snap["download"])
                info = self.engine.info
                body = sse.model_status(snap, info.name if info else None)
                yield sse.event("model_status", body)
                last_sent = time.monotonic()
                if body["status"] != "loading":
                    return
            elif time.monotonic() - last_sent >= heartbeat:
                yield sse.comment()
                last_sent = time.monotonic()
            gevent.sleep(poll)

    # ---- Vertex predict ---------------------------------------------------------------------
    def predict(
        self, body: Any, done_header: str | None = None, gone: Callable[[], bool] | None = None
    ) -> dict[str, Any] | Iterator[bytes]:
        """An envelope -> predictions; a raw OpenAI body -> what /v1 would answer."""
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        if not vertex.is_envelope(body):
            kind = vertex.kind_of(body)
            raw = vertex.strip_format(body)
            if openai.wants_stream(raw):
                return self.stream(kind, raw, done_header)
            return self.complete(kind, raw, gone)
        items = vertex.parse_envelope(body, self.max_instances)
        streams: list[vertex.Instance] = []
        for i, item in enumerate(items):
            if isinstance(item, vertex.Instance):
                try:
                    if openai.wants_stream(item.body):
                        streams.append(item)
                except ApiError as err:
                    items[i] = err
        if streams:
            if len(items) != 1:
                raise BadRequest(
                    f"stream: true needs exactly one instance (got {len(items)}): a stream "
                    "carries one answer; send the instances as separate requests",
                    param="instances",
                )
            return self.stream(streams[0].kind, streams[0].body, done_header)
        self.info()  # 503 for the whole envelope while loading
        # at most SLOTS_PER_REQUEST instances in the engine at once: one envelope cannot take
        # every slot (the rest wait their turn here, not in the engine's queue)
        pool = gevent.pool.Pool(self.slots_per_request)
        jobs = [
            pool.spawn(self._instance, item, gone) if isinstance(item, vertex.Instance) else None
            for item in items
        ]
        gevent.joinall([j for j in jobs if j is not None])
        results: list[dict[str, Any] | ApiError] = []
        for item, job in zip(items, jobs, strict=True):
            results.append(item if job is None else job.value)  # type: ignore[arg-type]
        return vertex.predictions(results)

    def _instance(self, item: vertex.Instance, gone: Callable[[], bool] | None) -> dict[str, Any] | ApiError:
        try:
            if gone is not None and gone():
                raise ClientGone("the client went away")
            return self.complete(item.kind, item.body, gone)
        except Exception as exc:  # noqa: BLE001 - one instance's failure stays in its slot
            return as_api_error(exc)


def _events(handle: Handle, gone: Callable[[], bool] | None) -> Iterator[Any]:
    """A handle's events; when the client is gone, raises ClientGone (the caller cancels)."""
    if gone is None:
        yield from handle
        return
    checked = time.monotonic()
    while not handle.over:
        try:
            ev = handle.next_event(GONE_POLL)
        except TimeoutError:
            ev = None
        if ev is not None:
            yield ev
        if time.monotonic() - checked >= GONE_POLL:
            checked = time.monotonic()
            if gone():
                log.info("client went away: generation cancelled")
                raise ClientGone("the client went away")


def _with_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """Put the tool description into the system message (first), creating one if needed."""
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{text}".strip()
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


class _ThoughtGuard:
    """Ends a thought on request (reasoning control) or once it has used its token budget, by
    injecting the closing tag into the generation (first choice only)."""

    def __init__(self, prep: Prepared, handle: Handle):
        self.handle = handle
        spec = prep.reply
        self.watching = spec is not None and spec.think
        self.in_thought = bool(spec and spec.in_thought)
        self.budget = getattr(prep.request, "reasoning_budget", None) if self.watching else None
        self.text = ""
        self.open = self.in_thought
        self.tokens_at_open = 0
        self.ended = False

    def on_piece(self, ev: TextPiece) -> None:
        if not self.watching or ev.index != 0 or self.ended:
            return
        self.text += ev.text
        was_open = self.open
        self.open = reasoning.split_thought(self.text, self.in_thought).open
        if self.open and not was_open:
            self.tokens_at_open = 0 if self.in_thought else ev.completion_tokens
        if self.open and self.budget is not None and ev.completion_tokens - self.tokens_at_open >= self.budget:
            self.end_thought()
        if not self.open and was_open:
            self.watching = False  # one thought per reply

    def end_thought(self) -> bool:
        """Close the thought if one is open; False when there is none to close."""
        if self.ended or not self.open:
            return False
        self.ended = True
        self.handle.inject(reasoning.CLOSE, unless=reasoning.CLOSE)
        return True
