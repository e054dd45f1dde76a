"""What a request asks of the model, between thin routes and the engine.

Turns validated OpenAI requests into engine requests, collects or streams the engine's events,
and runs Vertex envelope instances concurrently. No Flask here: routes wrap the results.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import gevent

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
from app.errors import ApiError, BadRequest, ModelNotReady, as_api_error
from app.protocol import chat_template, openai, reasoning, sse, tools, vertex
from app.protocol.sse import ChunkWriter, StreamPolicy, comment

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    kind: vertex.Kind
    request: openai.ChatRequest | openai.CompletionRequest
    generation: GenerationRequest
    echo: str = ""
    tools: bool = False  # the reply is the generic tool-call JSON (see app.protocol.tools)
    think: bool = False  # split <think> thoughts out of the reply (see app.protocol.reasoning)
    in_thought: bool = False  # the prompt already opened <think>


class Service:
    def __init__(
        self,
        engine: Engine,
        policy: StreamPolicy,
        max_instances: int,
        request_timeout: float = 0.0,
        reasoning_format: str = "auto",
        reasoning_field: str = "reasoning_content",
    ):
        self.reasoning_format = reasoning_format
        self.reasoning_field = reasoning_field
        self._live: dict[str, _ThoughtGuard] = {}  # streams open to reasoning control, by id
        self.engine = engine
        self.policy = policy
        self.max_instances = max_instances
        self.timeout = request_timeout or None

    def info(self) -> ModelInfo:
        info = self.engine.info
        if info is None:
            raise ModelNotReady(f"model is {self.engine.state.stage.replace('_', ' ')}")
        return info

    # ---- building requests ------------------------------------------------------------------
    def prepare(self, kind: vertex.Kind, body: Any) -> Prepared:
        info = self.info()
        if kind == "chat":
            req = openai.parse(openai.ChatRequest, body)
            messages = tools.render_history(req.template_messages())
            params = req.sampling()
            callable_tools, required = tools.pick(tools.validate_tools(req.tools or []), req.tool_choice)
            if callable_tools:
                if params.grammar is not None:
                    raise BadRequest("tools cannot be combined with a JSON response_format",
                                     param="response_format")
                named = isinstance(req.tool_choice, dict)  # a named function: exactly one call
                schema = tools.reply_schema(callable_tools, required, req.parallel_tool_calls and not named)
                params = replace(params, grammar=openai.schema_grammar(schema, "tools"))
                messages = _with_system(messages, tools.system_prompt(callable_tools, required))
            prompt = chat_template.render(
                info.chat_template,
                messages,
                bos_token=info.bos_token,
                eos_token=info.eos_token,
            )
            gen = GenerationRequest(
                prompt, params, timeout=self.timeout, cache_prompt=req.cache_prompt, n=req.n
            )
            think = not callable_tools and (
                self.reasoning_format == "parsed"
                or (self.reasoning_format == "auto" and "<think>" in (info.chat_template or ""))
            )
            in_thought = think and prompt.rstrip().endswith(reasoning.OPEN)
            return Prepared(kind, req, gen, tools=bool(callable_tools), think=think, in_thought=in_thought)
        req = openai.parse(openai.CompletionRequest, body)
        prompt = req.single_prompt()
        echo = ""
        if req.echo:
            if not isinstance(prompt, str):
                raise BadRequest("echo is only supported with a text prompt", param="echo")
            echo = prompt
        gen = GenerationRequest(
            prompt, req.sampling(), timeout=self.timeout, cache_prompt=req.cache_prompt, n=req.n
        )
        return Prepared(kind, req, gen, echo=echo)

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
    def complete(self, kind: vertex.Kind, body: Any) -> dict[str, Any]:
        prep = self.prepare(kind, body)
        created = int(time.time())
        handle, _ = self._start(prep)
        n = prep.generation.n
        parts: list[list[str]] = [[prep.echo] if prep.echo else [] for _ in range(n)]
        finished: dict[int, Finished] = {}
        done = False
        guard = _ThoughtGuard(prep, handle)
        try:
            for ev in handle:
                if isinstance(ev, TextPiece):
                    parts[ev.index].append(ev.text)
                    if prep.think:
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
            if prep.tools:
                msg, called = tools.message(tools.parse_partial(text, []))
                choices.append((msg, "tool_calls" if called and reason == "stop" else reason))
            elif prep.think:
                thought, answer = reasoning.split(text, prep.in_thought)
                msg = {"role": "assistant", "content": answer}
                if thought is not None:
                    msg[self.reasoning_field] = thought
                choices.append((msg, reason))
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
        prep = self.prepare(kind, body)
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
        tool_mode = prep.tools
        streams: dict[int, tools.ToolStream] = {}
        thinkers: dict[int, reasoning.ThinkSplitter] = {}
        guard = _ThoughtGuard(prep, handle)
        rid = writer.id
        if prep.think and getattr(prep.request, "reasoning_control", False):
            self._live[rid] = guard

        def think_deltas(index: int, parts: list[tuple[str, str]]) -> Iterator[bytes]:
            for kind, text in parts:
                key = self.reasoning_field if kind == "reasoning" else "content"
                yield writer.delta(index, {key: text})
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
                if isinstance(ev, TextPiece) and tool_mode:
                    ts = streams.setdefault(ev.index, tools.ToolStream())
                    writer.count(ev)
                    for delta in ts.feed(ev.text):
                        yield writer.delta(ev.index, delta)
                elif isinstance(ev, TextPiece) and prep.think:
                    guard.on_piece(ev)
                    splitter = thinkers.setdefault(ev.index, reasoning.ThinkSplitter(prep.in_thought))
                    writer.count(ev)
                    yield from think_deltas(ev.index, splitter.feed(ev.text))
                elif isinstance(ev, TextPiece):
                    yield from writer.text(ev)
                elif isinstance(ev, Finished):
                    if ev.index in thinkers:
                        yield from think_deltas(ev.index, thinkers[ev.index].flush())
                    if tool_mode and ev.reason == "stop" and ev.index in streams:
                        _, called = tools.message(streams[ev.index].result())
                        if called:
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
        self, body: Any, done_header: str | None = None
    ) -> dict[str, Any] | Iterator[bytes]:
        """An envelope -> predictions; a raw OpenAI body -> what /v1 would answer."""
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        if not vertex.is_envelope(body):
            kind = vertex.kind_of(body)
            raw = vertex.strip_format(body)
            if raw.get("stream"):
                return self.stream(kind, raw, done_header)
            return self.complete(kind, raw)
        items = vertex.parse_envelope(body, self.max_instances)
        wants_stream = [i for i in items if isinstance(i, vertex.Instance) and i.body.get("stream")]
        if wants_stream:
            if len(items) != 1:
                raise BadRequest(
                    f"stream: true needs exactly one instance (got {len(items)}): a stream "
                    "carries one answer; send the instances as separate requests",
                    param="instances",
                )
            return self.stream(wants_stream[0].kind, wants_stream[0].body, done_header)
        self.info()  # 503 for the whole envelope while loading
        jobs = [
            gevent.spawn(self._instance, item) if isinstance(item, vertex.Instance) else None
            for item in items
        ]
        gevent.joinall([j for j in jobs if j is not None])
        results: list[dict[str, Any] | ApiError] = []
        for item, job in zip(items, jobs, strict=True):
            results.append(item if job is None else job.value)  # type: ignore[arg-type]
        return vertex.predictions(results)

    def _instance(self, item: vertex.Instance) -> dict[str, Any] | ApiError:
        try:
            return self.complete(item.kind, item.body)
        except Exception as exc:  # noqa: BLE001 - one instance's failure stays in its slot
            return as_api_error(exc)


def _with_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """Put the tool description into the system message (first), creating one if needed."""
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{text}".strip()
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


class _ThoughtGuard:
    """Ends a thought on request (reasoning control) or once it has used its token budget, by
    injecting the closing tag into the generation."""

    def __init__(self, prep: Prepared, handle: Handle):
        self.handle = handle
        self.splitter = reasoning.ThinkSplitter(prep.in_thought)
        self.budget = getattr(prep.request, "reasoning_budget", None) if prep.think else None
        self.tokens_at_open: int | None = 0 if prep.in_thought else None
        self.ended = False

    def on_piece(self, ev: TextPiece) -> None:
        if ev.index != 0:
            return
        was_open = self.splitter.in_thought
        self.splitter.feed(ev.text)
        if not was_open and self.splitter.in_thought:
            self.tokens_at_open = ev.completion_tokens
        if (
            self.budget is not None
            and self.splitter.in_thought
            and self.tokens_at_open is not None
            and ev.completion_tokens - self.tokens_at_open >= self.budget
        ):
            self.end_thought()

    def end_thought(self) -> bool:
        """Close the thought if one is open; False when there is none to close."""
        if self.ended or not self.splitter.in_thought:
            return False
        self.ended = True
        self.handle.inject(reasoning.CLOSE)
        return True
