"""The engine process: one model's LlamaEngine, apart from the web process (ENGINE_PROCESS).

Started by app.engine.remote with a fresh interpreter (``python -m app.engine.child``), never
forked from the web process (which runs gevent and threads). It imports what the engine needs
and nothing of the web stack: llama.cpp, numpy and app.engine, after app/__init__ pinned the
C++ runtime (docs/crashes.md, "Two C++ runtimes"). A native crash here ends this process
only; the web process answers its requests with an error and starts another.

Messages (tuples, app.engine.wire), from the web process:
  ("start", config, paths, has_opening, log_level)  first: load the model at these local paths
  ("submit", rid, GenerationRequest)     ("cancel", rid)     ("inject", rid, text, unless)
  ("embed", rid, EmbedRequest)           ("embed_cancel", rid)
  ("call", cid, op, args)                an answer is due: ("reply", cid, ok, value)
  ("reply", cid, ok, value)              the answer to this process's own call (opening)
  ("drain",)  ("abort", message)  ("shutdown", seconds)
and to it:
  ("state", stage, progress, detail, error)   every change of the load state
  ("info", ModelInfo, EmbedInfo | None)       the model's card, before "ready"
  ("events", [(rid, event), ...])             every event one engine step produced (or one)
  ("call", cid, "opening", info)  ("reply", cid, ok, value)  ("log", record)  ("bye",)
"""

from __future__ import annotations

import argparse
import faulthandler
import itertools
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from app.base import cxx_runtime
from app.base.errors import ServiceError, ShuttingDown, as_service_error
from app.base.state import LoadState
from app.base.threads import ThreadEvent, held, start_native_thread
from app.engine.config import EngineConfig
from app.engine.types import Failed, Finished
from app.engine.wire import Reader, Writer
from app.process.crash_guard import _Record

log = logging.getLogger(__name__)

OPENING_WAIT = 60.0  # seconds the warm-up waits for the web process to render the opening
EMBED_MARGIN = 60.0  # past an embedding request's own timeout, its wait here gives up
# calls answered on the reader thread at once; the others (which may tokenize a large text, or
# wait for a sleeping model to load again) on a thread of their own
FAST_CALLS = frozenset({"status", "slots"})


class _Batch:
    """One step's events, sent as one message when the step's ``held_wakes`` block ends."""

    def __init__(self, wire: Writer):
        self.wire = wire
        self.items: list[tuple[int, Any]] = []

    def flush(self) -> None:
        if self.items:
            self.wire.send(("events", self.items))


class Outbox:
    """A request's mailbox in this process: what the engine puts goes to the web process,
    gathered per step (inside the engine's ``held_wakes``) or at once (a prep thread's
    Accepted, an embedding's answer)."""

    __slots__ = ("rid", "wire", "left", "done")

    def __init__(self, rid: int, wire: Writer, left: int = 1,
                 done: Callable[[int], None] | None = None):
        self.rid = rid
        self.wire = wire
        self.left = left  # choices still running (a generation is over after n Finished)
        self.done = done  # told once the request is over

    def put(self, item: Any) -> None:
        batch = held(self.wire, _Batch)
        if batch is None:
            self.wire.send(("events", [(self.rid, item)]))
        else:
            batch.items.append((self.rid, item))
        if self.done is None:
            return
        if isinstance(item, Finished):
            self.left -= 1
            over = self.left <= 0
        else:  # a generation's failure, or an embedding's answer (its outcomes or its error)
            over = isinstance(item, (Failed, ServiceError, list))
        if over:
            self.done(self.rid)

    def get(self, timeout: float | None = None) -> Any:  # pragma: no cover - never read here
        raise NotImplementedError("an engine process's requests are read by the web process")


class _State(LoadState):
    """The engine's load state, each change sent to the web process (which mirrors it for
    /health and /models/sse) and written to the crash record."""

    def __init__(self, child: Child):
        super().__init__(child.record_stage)
        self._child = child

    def set(self, stage: str, progress: float | None = None, detail: str | None = None) -> None:
        super().set(stage, progress, detail)
        self._child.state_changed()

    def fail(self, error: str) -> None:
        super().fail(error)
        self._child.state_changed()


class _Forward(logging.Handler):
    """Log records to the web process, which writes them as its own (LOG_FORMAT)."""

    def __init__(self, wire: Writer):
        super().__init__()
        self.wire = wire

    def emit(self, record: logging.LogRecord) -> None:
        try:
            exc = self.format(record).partition("\n")[2] if record.exc_info else ""
            self.wire.send(("log", {"name": record.name, "levelno": record.levelno,
                                    "levelname": record.levelname, "msg": record.getMessage(),
                                    "exc_text": exc or None, "created": record.created}))
        except Exception:  # noqa: BLE001 - a log line never takes the engine down
            self.handleError(record)


EngineFactory = Callable[["Child", EngineConfig, tuple, Callable[[str], None]], Any]


def llama_engine(child: Child, config: EngineConfig, paths: tuple,
                 on_fatal: Callable[[str], None]) -> Any:
    """The real engine, at the local paths the web process resolved."""
    from app.engine.llama_engine import LlamaEngine

    model, mmproj, draft, adapters = paths
    return LlamaEngine(config, child.state, lambda state: model, on_fatal=on_fatal,
                       resolve_projector=lambda state: mmproj,
                       resolve_draft=lambda state: draft,
                       resolve_adapters=lambda state: list(adapters))


class Child:
    """Serves one engine over the wire: the main thread reads, the engine's threads send."""

    def __init__(self, fd: int, record: _Record | None = None,
                 make_engine: EngineFactory = llama_engine,
                 leave: Callable[[int], None] = os._exit):
        self.leave = leave  # ends the process with an exit code (a test's thread: its end)
        self.reader = Reader(fd)
        self.wire = Writer(fd)
        self.record = record
        self.make_engine = make_engine
        self.state = _State(self)
        self.engine: Any = None
        self.handles: dict[int, Any] = {}  # rid -> a generation's handle (or None, submitting)
        self.embeds: dict[int, Any] = {}  # rid -> an embedding's handle
        self._calls: dict[int, list] = {}  # this process's calls to the web process
        self._ids = itertools.count(1)

    # ---- the engine's side ------------------------------------------------------------------
    def record_stage(self, stage: str, detail: str = "") -> None:
        if self.record is not None:
            self.record.write(stage, detail)

    def state_changed(self) -> None:
        st = self.state
        if st.stage == "ready" and self.engine is not None:
            emb = self.engine.embedder
            self.wire.send(("info", self.engine.info, emb.info if emb is not None else None))
        self.wire.send(("state", st.stage, st.progress, st.detail, st.error))

    def fatal(self, message: str) -> None:
        """The engine's on_fatal: the model cannot load. The state already said so."""
        self.wire.send(("bye",))
        self.leave(4)

    def call_parent(self, op: str, *args: Any) -> Any:
        """Ask the web process (a native thread here waits; None when no answer came)."""
        cid = next(self._ids)
        slot: list = [ThreadEvent(), None]
        self._calls[cid] = slot
        self.wire.send(("call", cid, op, args))
        try:
            if not slot[0].wait(OPENING_WAIT):
                return None
        finally:
            self._calls.pop(cid, None)
        ok, value = slot[1]
        return value if ok else None

    # ---- the reader ---------------------------------------------------------------------------
    def serve(self) -> None:
        """Until the web process closes its end (or asks this process to end)."""
        try:
            start = self.reader.recv()
        except EOFError:
            return
        _, config, paths, has_opening, level = start
        logging.basicConfig(level=level, handlers=[_Forward(self.wire)], force=True)
        if has_opening:
            config = replace(config, opening=lambda info: self.call_parent("opening", info))
        self.engine = self.make_engine(self, config, paths, self.fatal)
        self.engine.start()
        while True:
            try:
                msg = self.reader.recv()
            except EOFError:
                return
            try:
                self.dispatch(msg)
            except Exception:  # noqa: BLE001 - one bad message never ends the engine
                log.exception("engine process: message %r failed", msg[0])

    def dispatch(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "submit":
            self.submit(msg[1], msg[2])
        elif kind == "cancel":
            handle = self.handles.pop(msg[1], None)
            if handle is not None:
                handle.cancel()
        elif kind == "inject":
            handle = self.handles.get(msg[1])
            if handle is not None:
                handle.inject(msg[2], msg[3])
        elif kind == "embed":
            self.embeds[msg[1]] = None
            start_native_thread(lambda: self.embed(msg[1], msg[2]))
        elif kind == "embed_cancel":
            handle = self.embeds.pop(msg[1], None)
            if handle is not None:
                handle.cancel()
        elif kind == "call":
            if msg[2] in FAST_CALLS:
                self.answer(*msg[1:])
            else:
                start_native_thread(lambda: self.answer(*msg[1:]))
        elif kind == "reply":
            slot = self._calls.get(msg[1])
            if slot is not None:
                slot[1] = (msg[2], msg[3])
                slot[0].set()
        elif kind == "drain":
            self.engine.drain()
        elif kind == "abort":
            self.engine.abort(msg[1])
        elif kind == "shutdown":
            start_native_thread(lambda: self.shutdown(msg[1]))

    def submit(self, rid: int, request: Any) -> None:
        box = Outbox(rid, self.wire, request.n, lambda rid: self.handles.pop(rid, None))
        self.handles[rid] = None
        try:
            handle = self.engine.submit(request, mailbox=box)
        except ServiceError as exc:
            box.put(Failed(exc))
            return
        if rid in self.handles:  # not over already
            self.handles[rid] = handle

    def embed(self, rid: int, request: Any) -> None:
        """An embedding (or rerank) request, on a thread of its own: the model is held (woken
        if asleep) until its answer is sent."""
        done = ThreadEvent()

        def over(_rid: int) -> None:
            self.embeds.pop(rid, None)
            done.set()

        box = Outbox(rid, self.wire, 1, over)
        engine = self.engine
        try:
            engine.acquire_model()
        except Exception as exc:  # noqa: BLE001 - the request gets the error
            box.put(as_service_error(exc))
            return
        try:
            emb = engine.embedder
            if emb is None:
                raise ShuttingDown("the model's embedding context is gone")
            handle = emb.submit(request, mailbox=box)
            if rid in self.embeds:
                self.embeds[rid] = handle
            else:
                handle.cancel()  # cancelled while it was submitted
            limit = (request.timeout or 3600.0) + EMBED_MARGIN
            done.wait(limit)
        except Exception as exc:  # noqa: BLE001 - the request gets the error
            box.put(as_service_error(exc))
        finally:
            engine.release_model()

    def answer(self, cid: int, op: str, args: tuple) -> None:
        try:
            value = self.call(op, *args)
        except Exception as exc:  # noqa: BLE001 - the caller gets the error
            self.wire.send(("reply", cid, False, as_service_error(exc)))
            return
        self.wire.send(("reply", cid, True, value))

    def call(self, op: str, *args: Any) -> Any:
        engine = self.engine
        if op == "status":
            emb = engine.embedder
            return {"stats": engine.stats(), "queue": engine.queue_depth(),
                    "sleeping": bool(getattr(engine, "sleeping", False)),
                    "embeddings": emb.stats() if emb is not None else None,
                    "stalled": engine.stalled(args[0])}
        if op in ("slots", "tokenize", "pieces", "prompt_tokens", "count_tokens", "slot_action"):
            return getattr(engine, op)(*args)
        if op == "modules":  # what this process has imported (a test: no web stack here)
            return sorted(sys.modules)
        raise ValueError(f"no such call: {op}")

    def shutdown(self, seconds: float) -> None:
        """Stop after the requests in flight (at most ``seconds``), then leave."""
        self.engine.shutdown(seconds)
        if self.record is not None:
            self.record.mark_exited()
        self.wire.send(("bye",))
        self.leave(0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m app.engine.child")
    ap.add_argument("--fd", type=int, help="the socket to the web process")
    ap.add_argument("--stage-fd", type=int, help="the crash guard's stage record")
    ap.add_argument("--fault-fd", type=int, help="the crash guard's fault record")
    ap.add_argument("--control-fd", type=int, help="a spare (app.engine.spare): the three "
                    "above come on this socket when it is taken")
    args = ap.parse_args(argv)
    cxx_runtime.pin()  # done by app/__init__, first; a no-op here
    # a signal to the server's process group is the web process's to act on: it tells this
    # one when to stop (spawned with these two blocked, so none was lost in between)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    if args.control_fd is not None:
        from app.engine.spare import wait_to_be_taken

        fds = wait_to_be_taken(args.control_fd)
        if fds is None:  # not wanted after all
            os._exit(0)
        args.fd = fds[0]
        if len(fds) == 3:
            args.stage_fd, args.fault_fd = fds[1], fds[2]
    if args.fd is None:
        ap.error("--fd or --control-fd is required")
    record = None
    if args.stage_fd is not None and args.fault_fd is not None:
        record = _Record((args.stage_fd, args.fault_fd))
        signal.signal(signal.SIGABRT, signal.SIG_DFL)  # a native abort() ends it as SIGABRT
        faulthandler.enable(file=args.fault_fd, all_threads=True)
        record.write("starting")
    Child(args.fd, record).serve()
    if record is not None:
        record.mark_exited()
    sys.stdout.flush()
    os._exit(0)  # the web process is gone: no teardown of a model it cannot use


if __name__ == "__main__":
    main()

