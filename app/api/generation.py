"""The generation seam: a request parsed and planned off the hub, submitted, then answered
whole (the run's events folded) or streamed through the one stream loop (:meth:`frames`).

An API says how to parse its request (the core's ChatInput or TextInput, and what its renderers
need of it), how to render the folded result, and what its stream sends for each kind of event
(a :class:`Renderer`). The loop, the keep-alive, the pairing of the last choice's end with the
usage, resumable streams and closing the run however the response ends are here, once.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any, ClassVar

from flask import current_app

from app import streams
from app.api.base import Answer, Api, Facts
from app.base import reqctx
from app.base.errors import ServiceError
from app.core.events import ChoiceEnd, Event, Failure, Result, Tick, Usage, fold
from app.core.input import ChatInput, TextInput
from app.core.media import Collected
from app.core.models import ModelLease, Models
from app.core.service import Run
from app.protocol import validate
from app.protocol.sse import comment
from app.protocol.stream_policy import policy_of
from app.settings import Settings

CONVERSATION_HEADER = "X-Conversation-Id"  # opts a stream in to resuming (app.streams)


class Renderer:
    """What one stream sends, event by event. The seam's loop reads the run and calls one
    method per event; a renderer holds only its API's state (open blocks, calls being
    gathered, scores not sent yet). Each method returns the frames to send, maybe none."""

    def start(self) -> Iterable[bytes]:
        """The frames before any event (a role chunk, ``message_start``)."""
        return ()

    def piece(self, ev: Event) -> Iterable[bytes]:
        """A piece of a choice: Thinking, Text, CallStarted, CallArgs, or the scores of its
        tokens (Logprobs, PromptLogprobs) when asked for."""
        raise NotImplementedError

    def choice_end(self, end: ChoiceEnd) -> Iterable[bytes]:
        """A choice ended, and others are still running (``n`` > 1)."""
        return ()

    def done(self, end: ChoiceEnd, use: Usage) -> Iterable[bytes]:
        """The last choice ended: its end, with the whole request's usage."""
        raise NotImplementedError

    def failure(self, err: ServiceError) -> Iterable[bytes]:
        """The generation failed after the first byte; nothing follows."""
        raise NotImplementedError


class GenerationApi(Api):
    """A generation API. Subclasses implement ``parse``, ``render``, ``renderer`` and
    ``error_body``."""

    id_prefix: ClassVar[str] = "req"
    keepalive: ClassVar[bytes] = comment()  # what its streams send when quiet (b"": nothing)

    def __init__(self, settings: Settings, models: Models):
        super().__init__(settings, models)
        # a stream whose wire has no keep-alive (NDJSON) never sends one
        self.heartbeat = (policy_of(settings).heartbeat_seconds or None) if self.keepalive else None

    def images(self, facts: Facts) -> Collected:
        """A collector for one request's images (its model's IMAGE_MAX_BYTES each) and videos
        (VIDEO_MAX_BYTES)."""
        settings = self.settings_of(facts)
        return Collected(settings.image_max_bytes, settings.video_max_bytes)

    # ---- what an API says ---------------------------------------------------------------
    def wants_stream(self, body: Any, facts: Facts) -> bool:
        return validate.wants_stream(body)

    def parse(self, body: Any, facts: Facts) -> tuple[ChatInput | TextInput, Any]:
        """The core's input and whatever the renderers need of the request. Runs on a worker
        thread (validation can be costly)."""
        raise NotImplementedError

    def render(self, req: Any, run: Run, result: Result) -> dict[str, Any]:
        """The whole answer, from the run's events folded."""
        raise NotImplementedError

    def renderer(self, req: Any, run: Run, facts: Facts) -> Renderer:
        """The stream's renderer; an error raised here still comes before the first byte."""
        raise NotImplementedError

    def new_id(self) -> str:
        return f"{self.id_prefix}_{secrets.token_hex(12)}"

    # ---- the flow ---------------------------------------------------------------------------
    def start(self, body: Any, facts: Facts) -> tuple[Any, Run, ModelLease]:
        """Lease the model the request names, parse and plan off the hub, submit, wait for
        acceptance: every error up to here comes before the first byte, and lets the model go.
        The caller releases the lease once the run is over."""
        reqctx.note_api(self.name)
        lease, facts = self.lease(body, facts)
        try:
            svc = lease.service
            plan, req = svc.prepare(lambda: self.parse(body, facts))
            # the API key's scope: a generation reuses only KV its own key wrote
            plan.generation = replace(plan.generation, cache_scope=reqctx.cache_scope())
            return req, svc.start(plan, self.new_id(), facts.label), lease
        except BaseException:
            lease.release()
            raise

    def answer(self, body: Any, facts: Facts) -> dict[str, Any]:
        """The whole answer; a client that hangs up (``facts.gone``) cancels it."""
        req, run, lease = self.start(body, facts)
        try:
            return self.render(req, run, fold(run.events(gone=facts.gone), run.n))
        finally:
            run.close()  # read to its end already, unless rendering failed: then cancelled
            note_run(run)
            lease.release()

    def serve(self, body: Any, facts: Facts) -> Answer:
        if self.wants_stream(body, facts):
            return self.stream(body, facts)
        return self.answer(body, facts)

    def stream(self, body: Any, facts: Facts) -> Iterator[bytes]:
        """The stream's bytes. With ``X-Conversation-Id`` the generation is produced into a
        resumable session that outlives this connection, and this is its first reader."""
        conv = streams.conversation_id(facts.headers.get(CONVERSATION_HEADER))
        if conv is None:
            return self._stream(body, facts)
        hub: streams.Streams = current_app.extensions["vertex_gguf_streams"]
        scope = reqctx.cache_scope()
        hub.replace(conv, scope)
        hub.admit(scope)  # 429 past the key's cap, before the generation starts
        # heartbeats are per connection: each reader of the session sends its own
        frames = self._stream(body, replace(facts, heartbeat=None))
        return hub.produce(conv, scope, frames, self.keepalive)

    def _stream(self, body: Any, facts: Facts) -> Iterator[bytes]:
        req, run, lease = self.start(body, facts)
        try:
            renderer = self.renderer(req, run, facts)
        except BaseException:
            try:
                run.close()
            finally:
                lease.release()
            raise
        return _Closing(self.frames(renderer, run, facts), run, lease)

    def frames(self, renderer: Renderer, run: Run, facts: Facts) -> Iterator[bytes]:
        """The one stream loop: the run's events through the renderer. A quiet spell sends the
        API's keep-alive; a choice's end goes out as it comes, but the last one is held until
        the usage that follows it, so the renderer gets both at once."""
        yield from renderer.start()
        ended = 0
        last: ChoiceEnd | None = None
        for ev in run.events(heartbeat=facts.heartbeat):
            if isinstance(ev, Tick):
                yield self.keepalive
            elif isinstance(ev, ChoiceEnd):
                ended += 1
                if ended < run.n:
                    yield from renderer.choice_end(ev)
                else:
                    last = ev
            elif isinstance(ev, Usage):
                if last is not None:
                    yield from renderer.done(last, ev)
                    last = None
            elif isinstance(ev, Failure):
                yield from renderer.failure(ev.error)
                return
            else:
                yield from renderer.piece(ev)


class _Closing:
    """The frames; however the response ends (the client gone, a stream stopped before its
    first byte was asked for, a resumable session's producer done or stopped), ``close``
    closes the run and lets its model go: a generator's own ``finally`` would not run if it
    was never started."""

    def __init__(self, frames: Iterator[bytes], run: Run, lease: ModelLease):
        self.frames = frames
        self.run = run
        self.lease = lease
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        return self

    @property
    def ending(self) -> bool:
        """The generation has ended: the frames left are its closing ones (a resumable
        session writes them together with its end, app.streams)."""
        return self.run.over

    def __next__(self) -> bytes:
        try:
            return next(self.frames)
        except BaseException:  # the end, or a failure: the run is over now (the access line
            self.close()       # is written after this, with its tokens)
            raise

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            close = getattr(self.frames, "close", None)
            if close is not None:
                close()
        finally:
            try:
                self.run.close()
                note_run(self.run)
            finally:
                self.lease.release()


def note_run(run: Run) -> None:
    """The run's tokens and finish reason, for the request's access-log line."""
    reqctx.note_run(run.prompt_tokens, run.completion_tokens, run.cached_tokens,
                    run.finish_reason)
