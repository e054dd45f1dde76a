"""The engine in a process of its own (ENGINE_PROCESS=on), seen from the web process.

RemoteEngine has the Engine interface (app.engine.types) and the embedder's; behind it, an
engine process (app.engine.child) runs LlamaEngine. Per engine step the child sends one message
with every event the step produced; here one reader, a native thread, hands each to its
request's channel and wakes the greenlets together (app.base.bridge.held_wakes): a message per
step, never per token, as vLLM's engine core sends its outputs. Requests go the other way
through a writer thread, so a greenlet never blocks on the socket; calls that want an answer
(tokenize, slots, the engine's status) wait on a bridge.Reply, which leaves the hub free.

A native crash of the engine ends that process only: its requests end with EngineFailure in
each caller's API shape, /health says ``loading`` while another process loads the model, and
the crash guard's rules decide (app.process.crash_guard, what="engine process"): a death while
loading restarts once in safe mode, deaths with requests in flight back off, CRASH_LIMIT deaths
with nothing in flight stop it, failed for good, with the reason.
"""

from __future__ import annotations

import _socket
import itertools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.base.bridge import Channel, Reply, held_wakes
from app.base.errors import (
    EngineFailure,
    ModelLoadError,
    ModelNotReady,
    ServiceError,
    ShuttingDown,
)
from app.base.state import LoadState
from app.base.threads import ThreadEvent, allocate_lock, close_fd, start_native_thread
from app.engine.config import PERSIST_EXIT_SECONDS, EngineConfig
from app.engine.embed import EmbedHandle, EmbedInfo, EmbedRequest
from app.engine.file_holds import FileHolds
from app.engine.handle import ChannelHandle
from app.engine.lora import AdapterFile
from app.engine.resolve import resolve_files
from app.engine.spawn import EXIT_WAIT, Launch, Link, spawn
from app.engine.types import Failed, Finished, GenerationRequest, ModelInfo
from app.engine.wire import Reader
from app.process.crash_guard import SAFE_SETTINGS, CrashGuard, _Record, safe_changes

log = logging.getLogger(__name__)

CALL_TIMEOUT = 600.0  # seconds a call may take (a 10 MB tokenize; a model woken from sleep)
STATUS_TIMEOUT = 2.0  # ... the engine's status (health, metrics): past it, it looks stuck
# seconds a status answer serves again unless a request came or ended since: one health check
# (or a burst of them: a probe every 20 ms) asks once, and none sees a request's end missing
STATUS_FRESH = 0.05
_STALE: tuple[float, Any] = (0.0, {})
_APP_ROOT = str(Path(__file__).resolve().parents[2])  # where this app package lives


class _Live:
    """A request the engine process runs: its channel, and how it ends."""

    __slots__ = ("channel", "left", "embed")

    def __init__(self, channel: Channel, left: int, embed: bool = False):
        self.channel = channel
        self.left = left
        self.embed = embed

    def over(self, item: Any) -> bool:
        if self.embed or isinstance(item, Failed):
            return True
        if isinstance(item, Finished):
            self.left -= 1
            return self.left <= 0
        return False


class _Token:
    """What the crash guard keys a process's records by."""

    pid = 0


class RemoteHandle(ChannelHandle):
    """A generation in the engine process, seen from its greenlet."""

    def __init__(self, engine: RemoteEngine, rid: int, channel: Channel, n: int):
        super().__init__(channel, n)
        self._engine = engine
        self._rid = rid

    def cancel(self) -> None:
        if not self._over:
            self._engine._forget(self._rid, ("cancel", self._rid))

    def inject(self, text: str, unless: str = "") -> None:
        if not self._over:
            self._engine._send(("inject", self._rid, text, unless))


class RemoteEmbedHandle(EmbedHandle):
    # the engine process cannot ask the caller's socket (``gone`` stays in this process), so the
    # caller's check is the only one: often enough that a hang-up costs a decode or two
    gone_poll = 0.02

    def __init__(self, engine: RemoteEngine, rid: int, channel: Channel):
        super().__init__(channel, [False])
        self._engine = engine
        self._rid = rid

    def cancel(self) -> None:
        self._engine._forget(self._rid, ("embed_cancel", self._rid))


class RemoteEmbedder:
    """The engine process's embedding context (EMBEDDINGS, or an embedding model)."""

    def __init__(self, engine: RemoteEngine, info: EmbedInfo):
        self._engine = engine
        self._info = info

    @property
    def info(self) -> EmbedInfo:
        return self._info

    def submit(self, request: EmbedRequest) -> EmbedHandle:
        return self._engine._embed(request)

    def stats(self) -> dict[str, object]:
        return self._engine._status_or_empty().get("embeddings") or {}


class RemoteEngine:
    """LlamaEngine in an engine process of its own, behind the same interface."""

    def __init__(
        self,
        config: EngineConfig,
        state: LoadState,
        resolve_model: Callable[[LoadState], str],
        on_fatal: Callable[[str], None] | None = None,
        resolve_projector: Callable[[LoadState], str | None] | None = None,
        resolve_draft: Callable[[LoadState], str | None] | None = None,
        resolve_adapters: Callable[[LoadState], list[AdapterFile]] | None = None,
        guard: CrashGuard | None = None,
        launch: Launch = spawn,
    ):
        self.config = config
        self.state = state
        self._resolve = (resolve_model, resolve_projector or (lambda state: None),
                         resolve_draft or (lambda state: None),
                         resolve_adapters or (lambda state: []))
        self._on_fatal = on_fatal
        self._guard = guard or CrashGuard(3, 600.0, safe_changes(config), 60.0,
                                          what="engine process")
        self._launch = launch
        self._lock = allocate_lock()  # the link and the live requests, as a death sees them
        self._link: Link | None = None
        self._live: dict[int, _Live] = {}
        self._calls: dict[int, Reply] = {}
        self._ids = itertools.count(1)
        self._info: ModelInfo | None = None
        self._embedder: RemoteEmbedder | None = None
        # the last status answer (or the failure to get one), and when it came
        self._status_cache = _STALE
        self._stall_limit = 1e9  # the watchdog's limit, as health last gave it
        self._draining = False
        self._stopping = False
        self._stopped = ThreadEvent()
        self._rest = ThreadEvent()  # a back-off's sleep, cut short by shutdown
        self.restarts = 0

    # ---- what callers read ------------------------------------------------------------------
    @property
    def info(self) -> ModelInfo | None:
        return self._info

    @property
    def embedder(self) -> RemoteEmbedder | None:
        return self._embedder if self.state.ready else None

    @property
    def pid(self) -> int | None:
        """The engine process's id (/props ``engine_process``); None while there is none."""
        link = self._link
        return link.proc.pid if link is not None else None

    @property
    def sleeping(self) -> bool:
        return bool(self._status_or_empty().get("sleeping"))

    def start(self) -> None:
        start_native_thread(self._main)

    # ---- requests -----------------------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> RemoteHandle:
        """Refusals the engine decides (a full queue, an n past PARALLEL) come back as the
        first event, a Failed, which Service.start raises before the first byte."""
        channel = self._admit()
        rid = self._enter(_Live(channel, request.n), "submit", request)
        return RemoteHandle(self, rid, channel, request.n)

    def _embed(self, request: EmbedRequest) -> EmbedHandle:
        channel = self._admit()
        # ``gone`` stays here: a hang-up is seen by the caller's poll, which cancels
        rid = self._enter(_Live(channel, 1, embed=True), "embed", replace(request, gone=None))
        return RemoteEmbedHandle(self, rid, channel)

    def _admit(self) -> Channel:
        if self._draining:
            raise ShuttingDown("server is shutting down")
        if not self.state.ready:
            raise ModelNotReady(f"model is {self.state.stage.replace('_', ' ')}")
        return Channel()

    def _enter(self, live: _Live, kind: str, request: Any) -> int:
        """The request sent, under an id its events come back with; counted live first, so a
        death from now on answers it."""
        rid = next(self._ids)
        with self._lock:
            link = self._link
            if link is None or link.closed:
                raise ModelNotReady("the engine process is restarting")
            self._live[rid] = live
        self._status_cache = _STALE
        link.send((kind, rid, request))
        return rid

    def _forget(self, rid: int, msg: tuple) -> None:
        """A request its reader has left: nothing more is read of it, the engine is told."""
        if self._live.pop(rid, None) is not None:
            self._send(msg)

    def _send(self, msg: tuple) -> None:
        link = self._link
        if link is not None:
            link.send(msg)

    def _call(self, op: str, *args: Any, timeout: float = CALL_TIMEOUT) -> Any:
        """``op`` run by the engine process, from a greenlet (its hub keeps serving) or a
        native thread; the engine's error raised as it was."""
        reply = Reply()
        cid = next(self._ids)
        with self._lock:
            link = self._link
            if link is None or link.closed:
                raise ModelNotReady(f"model is {self.state.stage.replace('_', ' ')}")
            self._calls[cid] = reply
        link.send(("call", cid, op, args))
        try:
            ok, value = reply.wait(timeout)
        except TimeoutError:
            raise EngineFailure(f"the engine process did not answer ({op}) in {timeout:g} s") \
                from None
        finally:
            self._calls.pop(cid, None)
        if not ok:
            raise value
        return value

    def count_tokens(self, request: GenerationRequest) -> int:
        return self._call("count_tokens", request)

    def prompt_tokens(self, request: GenerationRequest) -> list[int]:
        return self._call("prompt_tokens", request)

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        return self._call("tokenize", text, add_special, parse_special)

    def pieces(self, tokens: list[int]) -> list[bytes]:
        return self._call("pieces", tokens)

    def slots(self) -> list[dict[str, object]]:
        return self._call("slots", timeout=STATUS_TIMEOUT)

    def slot_action(self, slot_id: int, action: str, filename: str | None) -> dict[str, object]:
        return self._call("slot_action", slot_id, action, filename, timeout=CALL_TIMEOUT)

    # ---- the engine's status (health, metrics, the crash guard's hooks) -----------------------
    def _status(self) -> dict:
        """The engine's figures (its stall judged by the last limit ``stalled`` was given),
        asked at most every STATUS_FRESH seconds; {} when there is no engine process to ask.
        Raises EngineFailure when it does not answer in time. Each call wakes the engine
        process: a health probe every 20 ms asking each time cost streams 10%."""
        at, value = self._status_cache
        if time.monotonic() - at < STATUS_FRESH:
            if isinstance(value, EngineFailure):  # one wait per health check, not one per field
                raise value
            return value
        try:
            value = self._call("status", self._stall_limit, timeout=STATUS_TIMEOUT)
        except ModelNotReady:
            return {}
        except EngineFailure as exc:
            self._status_cache = (time.monotonic(), exc)
            raise
        self._status_cache = (time.monotonic(), value)
        return value

    def _status_or_empty(self) -> dict:
        try:
            return self._status()
        except ServiceError:
            return {}

    def stats(self) -> dict[str, object]:
        stats = dict(self._status_or_empty().get("stats") or {"running": 0, "waiting": 0})
        stats["process"] = self.process_report()
        return stats

    def queue_depth(self) -> int:
        return int(self._status_or_empty().get("queue") or 0)

    def stalled(self, limit: float) -> str | None:
        try:
            if limit != self._stall_limit:  # WATCHDOG_SECONDS: the same at every check
                self._stall_limit = limit
                self._status_cache = _STALE
            return self._status().get("stalled")
        except EngineFailure:
            return f"the engine process has not answered for {STATUS_TIMEOUT:g} s"

    def process_report(self) -> dict[str, object]:
        """Where the engine runs, and its deaths (/health's engine.process)."""
        out: dict[str, object] = {"pid": self.pid, "restarts": self.restarts}
        crashes = self._guard.crashes
        if crashes:
            out["deaths"] = len(crashes)
            out["last_death"] = {**crashes[-1].as_dict(), "describe": crashes[-1].describe()}
        if self._guard.safe_reason:
            out["safe_mode"] = self._guard.safe_reason
        if self._guard.halt_reason:
            out["stopped"] = self._guard.halt_reason
        return out

    # ---- the end --------------------------------------------------------------------------------
    def drain(self) -> None:
        """Refuse new requests (503 shutting_down); the ones in flight go on (SIGTERM)."""
        self._draining = True
        self._send(("drain",))

    def abort(self, message: str) -> None:
        self._send(("abort", message))

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop after the requests in flight, at most ``timeout`` seconds (worker exit)."""
        self._stopping = self._draining = True
        self._rest.set()
        link = self._link
        if link is not None:
            link.send(("shutdown", timeout))
        # the engine process writes its prompts to PROMPT_CACHE_DIR before it leaves
        persist = PERSIST_EXIT_SECONDS if self.config.prompt_cache_dir else 0.0
        if not self._stopped.wait(timeout + persist + EXIT_WAIT) and link is not None:
            link.proc.kill()

    # ---- the supervisor: one thread, which reads each engine process's messages ---------------
    def _main(self) -> None:
        # the downloaded files stay held while this engine lives, across its processes' loads,
        # restarts and sleeps: the bounded download cache never deletes them (file_holds)
        holds = FileHolds()
        try:
            model, mmproj, draft, adapters = resolve_files(self.state, holds, *self._resolve)
            paths = (model, mmproj, draft, tuple(adapters))
        except Exception as exc:  # noqa: BLE001 - a load failure ends the process, as in-process
            holds.release()
            msg = str(exc) if isinstance(exc, ModelLoadError) else f"{type(exc).__name__}: {exc}"
            self._fail(msg)
            self._stopped.set()
            return
        try:
            while not self._stopping and self._run(paths):
                pass
        except Exception as exc:  # pragma: no cover - a bug: say so rather than hang
            log.exception("the engine process supervisor failed")
            self._fail(f"engine supervisor failed: {type(exc).__name__}: {exc}")
        finally:
            holds.release()
            self._stopped.set()

    def _fail(self, msg: str) -> None:
        self.state.fail(msg)
        log.error("model load failed: %s", msg)
        if self._on_fatal:
            self._on_fatal(msg)

    def _run(self, paths: tuple) -> bool:
        """One engine process, from its start to its end; True: start another."""
        boot = self._guard.boot()
        if boot.backoff:
            self.state.set("loading", progress=None,
                           detail=f"the engine process restarts after {boot.backoff:g} s")
            self._rest.wait(boot.backoff)
            if self._stopping:
                return False
        config = replace(self.config, **{k: v for k, v in boot.safe_mode.items()
                                         if k in SAFE_SETTINGS})
        env = dict(os.environ)
        env.update({k: v for k, v in boot.safe_mode.items() if k not in SAFE_SETTINGS})
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_APP_ROOT, env.get("PYTHONPATH", "")) if p)  # this very app
        token = _Token()
        rec = self._guard.before_fork(token)
        # the C module's sockets: gevent's (cooperative, non-blocking) kept the other end open
        ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
        fd, child_fd = ours.detach(), theirs.detach()
        try:
            proc = self._launch(child_fd, rec, env)
        except BaseException:
            close_fd(fd)
            raise
        finally:
            close_fd(child_fd)
        token.pid = proc.pid
        link = Link(proc, fd)
        with self._lock:
            self._link = link
        log.info("engine process %d started%s", proc.pid, " (safe mode)" if boot.safe_reason
                 else "")
        link.send(("start", replace(config, opening=None), paths, config.opening is not None,
                   logging.getLogger().getEffectiveLevel()))
        self._read(link)
        return self._ended(link, rec, token)

    def _read(self, link: Link) -> None:
        reader = Reader(link.fd)
        while True:
            try:
                msgs = reader.recv_many()
            except (EOFError, OSError):
                return
            with held_wakes():  # what arrived together wakes its greenlets together
                for msg in msgs:
                    try:
                        self._on(link, msg)
                    except Exception:  # noqa: BLE001 - one bad message never ends the reader
                        log.exception("engine process message %r failed", msg[0])

    def _on(self, link: Link, msg: tuple) -> None:
        kind = msg[0]
        if kind == "events":  # a step's events (inside _read's held_wakes: one wake-up)
            for rid, item in msg[1]:
                live = self._live.get(rid)
                if live is not None:
                    live.channel.put(item)
                    if live.over(item):
                        self._live.pop(rid, None)
                        self._status_cache = _STALE  # a request's end: figures moved
        elif kind == "reply":
            reply = self._calls.pop(msg[1], None)
            if reply is not None:
                reply.set((msg[2], msg[3]))
        elif kind == "state":
            _, stage, progress, detail, error = msg
            if stage == "failed":
                self.state.fail(error or "the engine failed")
            else:
                self.state.set(stage, progress, detail)
        elif kind == "info":
            self._info = msg[1]
            self._embedder = RemoteEmbedder(self, msg[2]) if msg[2] is not None else None
        elif kind == "call":
            self._answer(link, *msg[1:])
        elif kind == "log":
            record = logging.makeLogRecord(msg[1])
            logger = logging.getLogger(record.name)
            if logger.isEnabledFor(record.levelno):
                logger.handle(record)

    def _answer(self, link: Link, cid: int, op: str, args: tuple) -> None:
        """The engine process's own calls: the chat template's opening (app.core.plan), which
        the engine decodes at load and which needs the web side's templates."""
        try:
            if op != "opening" or self.config.opening is None:
                raise ValueError(f"no such call: {op}")
            link.send(("reply", cid, True, self.config.opening(*args)))
        except Exception as exc:  # noqa: BLE001 - the engine goes on without it
            log.warning("the engine process's call %s failed: %s", op, exc)
            link.send(("reply", cid, False, None))

    def _ended(self, link: Link, rec: _Record | None, token: _Token) -> bool:
        """The engine process is gone: every request it held answered, its death judged."""
        with self._lock:
            link.closed = True
            live, self._live = self._live, {}
            calls, self._calls = self._calls, {}
            self._link = None
        exit_signal = link.proc.wait()
        link.finish()
        if rec is not None and live:
            kinds = {"embedding" if e.embed else "generation" for e in live.values()}
            rec.write_flight({"n": len(live), "oldest": " and ".join(sorted(kinds)),
                              "left": 0, "last": ""})
        deaths = len(self._guard.crashes)
        self._guard.child_exit(token, self._stopping, exit_signal)
        crash = self._guard.crashes[-1] if len(self._guard.crashes) > deaths else None
        why = crash.describe() if crash is not None else "the engine process ended"
        err = EngineFailure(f"{why}; the request was lost with it"
                            + ("" if self._stopping else ": retry once the model is loaded"))
        with held_wakes():
            for entry in live.values():
                entry.channel.put(err if entry.embed else Failed(err))
        for reply in calls.values():
            reply.set((False, err))
        if self._stopping:
            return False
        if self.state.stage == "failed":  # the model could not load: as in-process, fatal
            if self._on_fatal:
                self._on_fatal(self.state.error or "the model could not be loaded")
            return False
        if self._guard.halt_reason:
            self.state.fail(self._guard.halt_reason)
            log.error("the engine process is not started again: %s", self._guard.halt_reason)
            if self._on_fatal:
                self._on_fatal(self._guard.halt_reason)
            return False
        self.restarts += 1
        self.state.set("loading", progress=None, detail=f"restarting: {why}")
        return True
