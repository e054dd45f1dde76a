"""Runs planned requests on the engine and hands back neutral events; no API, no Flask.

``prepare`` validates and plans off the request hub (an API's parser runs there too);
``start`` submits and waits for acceptance, so every error that can come before the first byte
(queue full, context overflow, a bad grammar) is raised there and an API can answer it as an
HTTP error; :class:`Run` then yields the events of every choice, decoded (thought, answer, tool
calls) and with heartbeat ticks, and cancels the generation if its reader goes away.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from typing import TypeVar

import gevent

from app import formats
from app.base import bridge
from app.base.errors import BadRequest, ClientGone, EmbeddingOnly, ModelNotFound, ModelNotReady
from app.base.metrics import ABORT, Metrics, ModelMetrics
from app.core.decode import ReplyStream
from app.core.events import (
    ChoiceEnd,
    Event,
    Failure,
    Logprobs,
    PromptLogprobs,
    Text,
    Thinking,
    Tick,
    Usage,
)
from app.core.input import ChatInput, OutputFormat, TextInput
from app.core.plan import Plan, PlanOptions, plan_chat, plan_text
from app.engine.types import (
    Accepted,
    Engine,
    Failed,
    Finished,
    Handle,
    ModelInfo,
    PromptScored,
    TextPiece,
    outside_vocab,
)
from app.formats.memo import Memo, resuming
from app.formats.think import THINK
from app.settings import Settings

# How often a run whose reader is not streaming checks that its client is still connected.
GONE_POLL = 0.5

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")
# an API's parser: the core's input, and whatever its renderers need of the request
Parse = Callable[[], tuple[ChatInput | TextInput, R]]


def now_ns() -> int:
    """Monotonic nanoseconds, for a run's first token (one place, so a test can fix it)."""
    return time.monotonic_ns()


class Service:
    def __init__(self, engine: Engine, options: PlanOptions, prepare_timeout: float,
                 metrics: Metrics | ModelMetrics | None = None,
                 settings: Settings | None = None):
        self.engine = engine
        # the settings the model was made with (a pool's model: its preset's): what an API
        # reads of the model per request (Api.settings_of); None: the server's
        self.settings = settings
        self.metrics = metrics if metrics is not None else Metrics()  # its own registry
        self.options = options
        self.prepare_timeout = prepare_timeout
        # runs open to reasoning control, by id, with the API key's scope that started each
        self._live: dict[str, tuple[str, _ThoughtGuard]] = {}
        # LORA_ADAPTERS' scales for a request that names neither an adapter nor a lora field
        # (POST /lora-adapters sets them; none applied until then: the base model)
        self.lora_defaults: dict[int, float] = {}

    def info(self) -> ModelInfo:
        info = self.engine.info
        if info is None:
            raise ModelNotReady(f"model is {self.engine.state.stage.replace('_', ' ')}")
        return info

    def model_name(self, requested: str | None) -> str:
        """The ``model`` an answer carries: the request's when it names one of the model's
        aliases, else the id. With STRICT_MODEL_NAME a name that is none of them is a 404
        (ModelNotFound); a request that names no model is always served."""
        info = self.info()
        if requested is not None and (requested in info.names
                                      or any(requested == a for a, _ in info.adapters)):
            return requested
        if requested is not None and self.options.strict_model_name:
            raise ModelNotFound(
                f"The model {requested[:100]!r} does not exist: this server serves "
                f"{', '.join(repr(n) for n in (*info.names, *(a for a, _ in info.adapters)))}",
                param="model",
            )
        return info.name

    def warm(self, poll: float = 0.1, limit: float = 3600.0) -> None:
        """Once the model is ready, plan one chat with a JSON schema off the hub: the chat
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
        info = self.engine.info
        seen = formats.summary(info.chat_template, info.control_texts, self.options.tool_format,
                               self.options.reasoning_format)
        log.info("replies read as: tool calls %s, thoughts %s; the template's control tokens "
                 "read: %s; dropped from replies: %s", seen["tool_format"],
                 seen["thought_format"] or "none", ", ".join(seen["reads"]) or "none",
                 ", ".join(seen["drops"]) or "none")
        try:
            self.prepare(lambda: (ChatInput(
                [{"role": "user", "content": "hi"}],
                output=OutputFormat("json_schema", {"type": "object"}),
            ), None))
        except EmbeddingOnly:
            pass  # an embedding model or a reranker: no chat path to warm
        except Exception:  # noqa: BLE001 - a template that fails here fails its requests clearly
            log.warning("warming the chat path failed", exc_info=True)

    # ---- preparing ------------------------------------------------------------------------
    def plan(self, parse: Parse[R]) -> tuple[Plan, R]:
        """Parse (an API's request parser) and plan; the parser's second value comes back
        beside the plan. CPU-bound Python (validation, the chat template, JSON Schema
        conversion, the grammar gate)."""
        inp, extra = parse()
        model = self.model_name(inp.model)  # an unknown name fails before any work
        if isinstance(inp, TextInput):
            plan = plan_text(inp, self.options)
        else:
            plan = plan_chat(self.info(), inp, self.options)
        plan.model = model
        lora = self.lora_set(inp.model, inp.params.lora)
        if lora:
            plan.generation = replace(plan.generation, lora=lora)
        return plan, extra

    def lora_set(self, model: str | None,
                 asked: tuple[tuple[int, float], ...] | None) -> tuple[tuple[int, float], ...]:
        """The adapters a request runs with: the one its ``model`` names (at its LORA_ADAPTERS
        scale, the others off), else the defaults; then its ``lora`` entries over them."""
        adapters = self.info().adapters
        names = [name for name, _ in adapters]
        if model in names:
            k = names.index(model)
            scales = {k: adapters[k][1]}
        else:
            scales = dict(self.lora_defaults)
        for idx, scale in asked or ():
            if not 0 <= idx < len(adapters):
                raise BadRequest(
                    f"lora: no adapter with id {idx}; " + (
                        f"this server has {len(adapters)} (ids 0-{len(adapters) - 1}: "
                        f"{', '.join(names)})" if adapters else "this server loads none "
                        "(LORA_ADAPTERS)"), param="lora")
            scales[idx] = scale
        return tuple((i, s) for i, s in sorted(scales.items()) if s != 0)

    def prepare(self, parse: Parse[R]) -> tuple[Plan, R]:
        """:meth:`plan` on a worker thread, so a costly request cannot stall the others'
        streams or the health route; past PREPARE_TIMEOUT it is refused."""
        self.info()  # 503 at once while loading
        embedder = getattr(self.engine, "embedder", None)
        if embedder is not None and embedder.info.only:
            # before planning: such a GGUF often has no chat template
            raise EmbeddingOnly(reranks=embedder.info.rank is not None)
        return bridge.offload(self.plan, parse, timeout=self.prepare_timeout)

    def offload(self, fn: Callable[[], T]) -> T:
        """``fn`` on a worker thread, within PREPARE_TIMEOUT (the introspection routes:
        tokenizing a 10 MB body, or encoding its answer, would stall every stream on the hub;
        the engine thread is not used either)."""
        self.info()  # 503 at once while loading
        return bridge.offload(fn, timeout=self.prepare_timeout)

    def prompt_text(self, tokens: tuple[int, ...]) -> str:
        """A token prompt as text, control tokens spelled out (what echo shows of it); an id
        outside the vocabulary is a 400 on ``prompt``. Any thread but the hub's."""
        bad = outside_vocab(tokens, self.info().n_vocab)
        if bad is not None:
            raise BadRequest(f"prompt token id {bad} is out of range", param="prompt")
        return b"".join(self.engine.pieces(list(tokens))).decode("utf-8", "replace")

    def count_tokens(self, parse: Parse[object]) -> int:
        """How many tokens the prompt of this request is, exactly as it would be tokenized."""
        plan, _ = self.prepare(parse)
        return bridge.offload(self.engine.count_tokens, plan.generation,
                              timeout=self.prepare_timeout)

    # ---- running --------------------------------------------------------------------------
    def start(self, plan: Plan, rid: str, api: str = "other") -> Run:
        """Submit and wait for acceptance, so that errors arrive before the first byte.
        ``api``: the metrics' label for the route the request came through."""
        submitted = time.monotonic()
        handle = self.engine.submit(plan.generation)
        try:
            first = handle.next_event()
        except BaseException:
            handle.cancel()
            raise
        if isinstance(first, Failed):
            raise first.error
        assert isinstance(first, Accepted), first
        return Run(self, plan, handle, first.prompt_tokens, rid, api, submitted)

    def control(self, rid: str, scope: str = "") -> bool:
        """End the thought of the running request ``rid`` now; False if it has none open, or
        if another API key (``scope``) started it: the same answer as an unknown id."""
        found = self._live.get(rid)
        return bool(found and found[0] == scope and found[1].end_thought())


class Run:
    """One accepted generation: its events, once, in order."""

    def __init__(self, svc: Service, plan: Plan, handle: Handle, prompt_tokens: int, rid: str,
                 api: str = "other", submitted: float | None = None):
        self.id = rid
        self.created = int(time.time())
        self.model = plan.model or svc.info().name  # the request's alias, else the id
        self.prompt_tokens = prompt_tokens
        self.n = plan.generation.n
        self.tokens = [0] * self.n  # completion tokens per choice, so far
        # per choice, its completion tokens when its thought's last piece came (ChoiceEnd's)
        self._thought = [0] * self.n
        self.first_token_ns: int | None = None  # now_ns() at the first choice's first token
        self._svc = svc
        self._plan = plan
        self._handle = handle
        self._guard = _ThoughtGuard(plan, handle)
        self._decoders: dict[int, ReplyStream] = {}
        self._ended: dict[int, Finished] = {}
        self._over = False
        # metrics: time to first token and between tokens (first choice), counted once at the end
        self._m = svc.metrics.api(api)
        self._submitted = time.monotonic() if submitted is None else submitted
        self._last_token: float | None = None
        self._seen = 0  # the first choice's tokens so far
        self._counted = False
        self.finish_reason: str | None = None  # the first choice's, once it has ended
        self.cached_tokens: int | None = None  # prompt tokens reused, once every choice ended
        if self._guard.watching and plan.reasoning_control:
            svc._live[rid] = (plan.generation.cache_scope, self._guard)

    @property
    def completion_tokens(self) -> int:
        return sum(self.tokens)

    @property
    def over(self) -> bool:
        """Every choice has ended (or failed, or the run was closed): what a renderer still
        sends is its closing frames, with no more waiting on the engine."""
        return self._over

    def events(self, heartbeat: float | None = None,
               gone: Callable[[], bool] | None = None) -> Iterator[Event]:
        """The events of every choice. ``heartbeat``: a Tick after that many idle seconds.
        ``gone``: polled every GONE_POLL seconds; once it says the client hung up, ClientGone
        is raised. Stopping early (or the reader going away) cancels the generation."""
        wait = heartbeat or None
        if gone is not None:
            wait = min(wait or GONE_POLL, GONE_POLL)
        quiet_since = checked = time.monotonic()
        try:
            while not self._over:
                try:
                    ev = self._handle.next_event(wait)
                except TimeoutError:
                    ev = None
                now = time.monotonic()
                if ev is not None:
                    out = self._on(ev)
                    if out:
                        quiet_since = now
                    yield from out
                elif heartbeat and now - quiet_since >= heartbeat:
                    quiet_since = now
                    yield Tick()
                if gone is not None and now - checked >= GONE_POLL:
                    checked = now
                    if gone():
                        log.info("client went away: generation cancelled")
                        raise ClientGone("the client went away")
        finally:
            self.close()

    def close(self) -> None:
        """Cancel the generation unless every event has been read (idempotent)."""
        self._svc._live.pop(self.id, None)
        if not self._over:
            self._over = True
            self._handle.cancel()
            self._end(ABORT)
            log.info("client went away mid-stream: generation cancelled after %d tokens",
                     self.completion_tokens)

    def _on(self, ev: object) -> list[Event]:
        if isinstance(ev, TextPiece):
            if ev.index == 0 and ev.completion_tokens > self._seen:
                self._token_seen(ev.completion_tokens)
            self.tokens[ev.index] = ev.completion_tokens
            self._guard.on_piece(ev)
            # the tokens' scores first: a renderer sends them with the text they made
            scored: list[Event] = [Logprobs(ev.scores, ev.index)] if ev.scores else []
            if self._plan.reply is None:
                return [*scored, Text(ev.text, ev.index)] if ev.text else scored
            return [*scored, *self._thought_seen(ev, self._decoder(ev.index).feed(ev.text))]
        if isinstance(ev, Finished):
            if ev.index == 0 and ev.completion_tokens > self._seen:
                self._token_seen(ev.completion_tokens)
            self.tokens[ev.index] = ev.completion_tokens
            self._ended[ev.index] = ev
            out: list[Event] = [Logprobs(ev.scores, ev.index)] if ev.scores else []
            reason, cut = ev.reason, frozenset[int]()
            if self._plan.reply is not None:
                dec = self._decoder(ev.index)
                out += self._thought_seen(ev, dec.finish())
                cut = dec.cut_calls()
                if reason == "stop" and len(dec.result().calls) > len(cut):
                    reason = "tool_calls"
            stop = ev.stop_sequence if reason == "stop" else None
            if ev.index == 0:
                self.finish_reason = reason
            out.append(ChoiceEnd(reason, ev.completion_tokens, stop, cut,  # type: ignore[arg-type]
                                 ev.index, self._thought[ev.index]))
            if len(self._ended) == self.n:
                self._over = True
                first = self._ended[0]
                self.cached_tokens = first.cached_tokens
                ended = self._ended.values()
                out.append(Usage(first.prompt_tokens, self.completion_tokens, first.cached_tokens,
                                 _pair_sum([e.draft for e in ended]),
                                 _pair_sum([e.predicted for e in ended]),
                                 self._plan.video_frames))
                self._end(self.finish_reason or "stop", first)
            return out
        if isinstance(ev, PromptScored):
            return [PromptLogprobs(ev.scores)]
        if isinstance(ev, Failed):
            self._over = True
            self.finish_reason = "error"
            self._end(self._m.failed(ev.error))
            log.warning("generation failed mid-way: %s", ev.error.message)
            return [Failure(ev.error)]
        return []

    def _thought_seen(self, ev: TextPiece | Finished, out: list[Event]) -> list[Event]:
        """``out``, the events a piece of choice ``ev.index`` made; a thought among them
        moves the tokens its thought took to the piece's completion tokens."""
        if any(isinstance(e, Thinking) for e in out):
            self._thought[ev.index] = ev.completion_tokens
        return out

    def _token_seen(self, count: int) -> None:
        """The first choice has ``count`` tokens now: its first token's time, or the time per
        token since the last (a piece can carry several)."""
        now = time.monotonic()
        if self._last_token is None:
            self.first_token_ns = now_ns()
            self._m.ttft.observe(now - self._submitted)
        else:
            k = count - self._seen
            gap = (now - self._last_token) / k
            for _ in range(k):
                self._m.itl.observe(gap)
        self._last_token = now
        self._seen = count

    def _end(self, reason: str, first: Finished | None = None) -> None:
        """Count this generation once, however it ends (``first``: choice 0's Finished). Queued
        (Metrics.later): ``close`` runs in the stream's ``finally``, which a garbage-collector
        finalizer may run in the middle of another metric update on this thread."""
        if self._counted:
            return
        self._counted = True
        self._m.later(partial(self._count, reason, self.prompt_tokens, self.completion_tokens,
                              first))

    def _count(self, reason: str, prompt: int, completion: int, first: Finished | None) -> None:
        m = self._m
        m.finished(reason).inc()
        m.prompt_tokens.inc(prompt)
        m.generation_tokens.inc(completion)
        if first is not None:
            m.cached_tokens.inc(first.cached_tokens)
            m.queue.observe(first.queue_seconds)
        if reason == ABORT:
            m.gone()

    def _decoder(self, index: int) -> ReplyStream:
        dec = self._decoders.get(index)
        if dec is None:
            assert self._plan.reply is not None
            dec = self._decoders[index] = ReplyStream(self._plan.reply, index)
        return dec


def _pair_sum(pairs: list[tuple[int, int] | None]) -> tuple[int, int] | None:
    """The choices' counts added up (draft counts, prediction counts); None where no choice
    had any."""
    given = [p for p in pairs if p is not None]
    return (sum(p[0] for p in given), sum(p[1] for p in given)) if given else None


class _ThoughtGuard:
    """Ends a thought on request (reasoning control) or once it has used its token budget, by
    injecting the closing tag into the generation (first choice only)."""

    def __init__(self, plan: Plan, handle: Handle):
        self.handle = handle
        spec = plan.reply
        self.watching = spec is not None and spec.think
        self.in_thought = bool(spec and spec.in_thought)
        self.thought = (spec.thought if spec is not None else None) or THINK
        self.calls = spec is not None and spec.format is not None  # the reply is read for calls
        self.budget = plan.reasoning_budget if self.watching else None
        self.text = ""
        self._scans: Memo = {}
        self.open = self.in_thought
        self.tokens_at_open = 0
        self.ended = False

    def on_piece(self, ev: TextPiece) -> None:
        if not self.watching or ev.index != 0 or self.ended:
            return
        self.text += ev.text
        was_open = self.open
        with resuming(self._scans):  # the closing tag searched for in the new text only
            self.open = self.thought.split(self.text, self.in_thought).open
        if self.open and not was_open:
            self.tokens_at_open = 0 if self.in_thought else ev.completion_tokens
        over = self.budget is not None and ev.completion_tokens - self.tokens_at_open >= self.budget
        if self.open and over:
            self.end_thought()
        if not self.open and was_open:
            self.watching = False  # one thought per reply

    def end_thought(self) -> bool:
        """Close the thought if one is open; False when there is none to close."""
        if self.ended or not self.open:
            return False
        self.ended = True
        self.handle.inject(self.thought.ending(self.calls), unless=self.thought.close)
        return True

