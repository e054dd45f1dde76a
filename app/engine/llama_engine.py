"""The llama.cpp engine: owns the model and context on one native OS thread.

Driven through llama-cpp-python's low-level API, a step at a time (app.engine.scheduler says
what a step is). Nothing here runs on a greenlet: greenlets hand requests in through a
lock-free deque and get events back through their sink (see app.base.threads).

A request is prepared before the engine thread sees it, on one of a few prep threads (native,
with a large stack; app.engine.llama_prep): its prompt is tokenized (llama.cpp's tokenizer only
reads the vocabulary, so it runs beside ``llama_decode``), checked against the context, and its
grammar compiled and probed. The engine thread only admits, decodes and samples
(app.engine.scheduler), so a 4 MB prompt or a costly grammar never stalls the streams already
running.

This module is the engine's public surface, its admission queue, its threads, and the model's
life: load (app.engine.llama_model), warm-up, idle sleep and reload.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from app.base import cxx_runtime
from app.base.errors import (
    BadRequest,
    EmbeddingOnly,
    EngineFailure,
    ModelLoadError,
    ModelNotReady,
    NotSupported,
    ServiceError,
    ShuttingDown,
    as_service_error,
)
from app.base.state import LoadState
from app.base.threads import (
    Mailbox,
    ThreadEvent,
    allocate_lock,
    held_wakes,
    original_sleep,
    run_at_low_priority,
    start_native_thread,
)
from app.engine.admission import Admission
from app.engine.config import PERSIST_EXIT_SECONDS, EngineConfig
from app.engine.file_holds import FileHolds
from app.engine.handle import JobHandle, new_channel
from app.engine.llama_embed import DecodeTurns, LlamaEmbedder
from app.engine.llama_model import LlamaModel
from app.engine.llama_prep import Preparer
from app.engine.lora import AdapterFile
from app.engine.prompt_persist import Persist, open_persist
from app.engine.resolve import resolve_files
from app.engine.scheduler import Scheduler, StepStats
from app.engine.slot_files import slot_action
from app.engine.slots import Job, drop, slot_rows
from app.engine.types import Accepted, GenerationRequest, ModelInfo, outside_vocab
from app.engine.warm_up import prime, warm_up

log = logging.getLogger(__name__)

PREP_THREADS = 2
PREP_STACK_BYTES = 64 << 20  # llama.cpp's grammar parser recurses; the gate bounds how deep


class LlamaEngine:
    """Loads a GGUF model on its own thread and serves generation jobs from a queue."""

    def __init__(
        self,
        config: EngineConfig,
        state: LoadState,
        resolve_model: Callable[[LoadState], str],
        on_fatal: Callable[[str], None] | None = None,
        resolve_projector: Callable[[LoadState], str | None] | None = None,
        resolve_draft: Callable[[LoadState], str | None] | None = None,
        resolve_adapters: Callable[[LoadState], list[AdapterFile]] | None = None,
    ):
        self.config = config
        self.state = state
        self._resolve_model = resolve_model
        # the projector's local path, fetched and checked (app.model.source); None: none
        self._resolve_projector = resolve_projector or (lambda state: None)
        self._mmproj: str | None = None
        # DRAFT_MODEL's local path, fetched and checked the same way; None: none
        self._resolve_draft = resolve_draft or (lambda state: None)
        self._draft: str | None = None
        self._holds = FileHolds()  # the resolved files, held until the engine stops
        # LORA_ADAPTERS, each a local file; [] without
        self._resolve_adapters = resolve_adapters or (lambda state: [])
        self._adapters: list[AdapterFile] = []
        self._on_fatal = on_fatal
        self._info: ModelInfo | None = None
        self._prep: deque[Job] = deque()  # submitted, to be prepared on a prep thread
        self._prep_wake = ThreadEvent()
        self._prep_busy: dict[int, float] = {}  # prep thread -> when its current job started
        self._inbox: deque[Job] = deque()  # prepared, for the engine thread
        self._wake = ThreadEvent()
        self._count_lock = allocate_lock()
        self._handoff = allocate_lock()  # prep threads vs. the engine closing
        self._closed = False
        # submitted and not finished (admitted + waiting), in all and per key scope
        self._admission = Admission(config.parallel, config.max_queue, config.max_queue_per_key)
        self._last_queue_log = 0.0
        self._stopping = False
        self._stopped = ThreadEvent()
        self._m: LlamaModel | None = None  # the loaded model (None before the first load)
        self._prep_r: Preparer | None = None  # prepares jobs against it
        self._abort: ServiceError | None = None  # set by abort(), acted on by the engine thread
        self._step_since: float | None = None  # when the step in progress began
        self._turns = DecodeTurns()  # generation steps and embedding decodes alternate
        # idle sleep: the model freed after SLEEP_IDLE_SECONDS; anything that needs it wakes it
        self._asleep = False
        self._users = 0  # holders of the model outside the queue (count_tokens, embeddings, ...)
        self._wake_requested = False
        self._reloading = False
        self._last_activity = time.monotonic()
        self._path = ""
        self._persist: Persist | None = None  # PROMPT_CACHE_DIR's writer and reads
        # work other threads hand the engine thread between steps (slot actions): the function,
        # where its result goes, and the event that says it is there
        self._controls: deque[tuple[Callable[[Scheduler], object], list, ThreadEvent]] = deque()

    # ---- what the loaded model holds (None / True before the first load) --------------------
    @property
    def _sched(self) -> Scheduler | None:
        """The slots and the step, once a generation context is open."""
        return self._m.sched if self._m is not None else None

    @property
    def _embedder(self) -> LlamaEmbedder | None:
        return self._m.embedder if self._m is not None else None

    @property
    def _generates(self) -> bool:
        """False: an embedding-only model, with no generation context."""
        return self._m.generates if self._m is not None else True

    # ---- greenlet side ---------------------------------------------------------------------
    @property
    def info(self) -> ModelInfo | None:
        return self._info

    @property
    def embedder(self) -> LlamaEmbedder | None:
        """The embedding context, once the model is ready (None: EMBEDDINGS is off)."""
        return self._embedder if self.state.ready else None

    def start(self) -> None:
        start_native_thread(self._thread_main)

    def count_tokens(self, request: GenerationRequest) -> int:
        return len(self.prompt_tokens(request))

    def prompt_tokens(self, request: GenerationRequest) -> list[int]:
        self._check_loaded()
        self._check_generates()
        self.acquire_model()
        try:
            return self._prep_r.prompt_tokens(request)
        finally:
            self.release_model()

    @property
    def sleeping(self) -> bool:
        return self._asleep

    def acquire_model(self, wait: bool = True, timeout: float = 3600.0) -> bool:
        """Hold the model for a use outside the generation queue (it cannot fall asleep until
        ``release_model``); asleep, it is woken. With ``wait`` (a native thread) this returns
        once it is awake; without, False says the caller must ``wait_awake`` off the hub."""
        with self._count_lock:
            self._users += 1
            self._last_activity = time.monotonic()
            if not self._asleep:
                return True
            self._wake_requested = True
        self._wake.set()
        if not wait:
            return False
        try:
            self.wait_awake(timeout)
        except BaseException:
            self.release_model()
            raise
        return True

    def wait_awake(self, timeout: float = 3600.0) -> None:
        """Block this native thread until the model is loaded again."""
        deadline = time.monotonic() + timeout
        while self._asleep:  # bounded by the deadline
            if self.state.stage == "failed":
                raise ModelNotReady("the model could not be loaded again after sleeping")
            if time.monotonic() > deadline:
                raise ModelNotReady(f"the model did not wake up within {timeout:g} s")
            original_sleep(0.02)

    def release_model(self) -> None:
        with self._count_lock:
            self._users -= 1
            self._last_activity = time.monotonic()

    def _check_loaded(self) -> None:
        if self.info is None:
            raise ModelNotReady(f"model is {self.state.stage.replace('_', ' ')}")

    def _check_generates(self) -> None:
        if not self._generates:
            raise EmbeddingOnly()

    def queue_depth(self) -> int:
        """Requests submitted but not yet admitted to a slot."""
        return max(0, self._admission.total - self.config.parallel)

    def stats(self) -> dict[str, object]:
        sched = self._sched
        slots = sched.slots if sched is not None else []
        return {
            "running": sum(1 for s in slots if s.job is not None),
            "waiting": (len(sched.waiting) if sched is not None else 0) + len(self._inbox)
            + len(self._prep),
            **(sched.stats if sched is not None else StepStats()).as_dict(),
            **self._image_stats(),
            **(sched.draft_report() if sched is not None else {}),
            **self._cache_report(sched),
        }

    def _cache_report(self, sched: Scheduler | None) -> dict[str, object]:
        """The prompt cache's counters, with PROMPT_CACHE_DIR's inside them (nothing while a
        reload has no cache yet)."""
        cache = sched.features.prompt_cache if sched is not None else None
        if cache is None:
            return {}
        report = cache.report()
        if self._persist is not None:
            report["prompt_cache"].update(self._persist.report())
        return report

    def _image_stats(self) -> dict[str, int]:
        """With a projector: images encoded, and images whose encoding came from its cache."""
        projector = self._m.projector if self._m is not None else None
        if projector is None:
            return {}
        return {"images_encoded": projector.encodes, "image_cache_hits": projector.cache_hits}

    def stalled(self, limit: float) -> str | None:
        now = time.monotonic()
        since = self._step_since
        if since is not None and now - since > limit:
            return f"one engine step has been running for {now - since:.0f} s"
        for started in list(self._prep_busy.values()):
            if now - started > limit:
                return f"preparing one request has taken {now - started:.0f} s"
        return self._embedder.stalled(limit) if self._embedder else None

    def submit(self, request: GenerationRequest, mailbox: Mailbox | None = None) -> JobHandle:
        """``mailbox``: where its events go (None: a channel the calling greenlet reads; an
        engine process passes its outbox to the web process)."""
        if self._stopping:
            raise ShuttingDown("server is shutting down")
        if not self.state.ready:
            raise ModelNotReady(f"model is {self.state.stage.replace('_', ' ')}")
        self._check_generates()
        if request.n > self.config.parallel:
            raise BadRequest(
                f"n={request.n} needs {request.n} slots, but this server has "
                f"{self.config.parallel} (PARALLEL)",
                param="n",
            )
        channel = mailbox or new_channel()
        deadline = time.monotonic() + request.timeout if request.timeout else None
        job = Job(request=request, sink=channel.put, deadline=deadline)
        job.followers = [
            Job(request=request, sink=channel.put, deadline=deadline, index=i, leader=job)
            for i in range(1, request.n)
        ]
        self._enqueue(job)
        return JobHandle(job, channel, self._wake.set)

    def _enqueue(self, job: Job) -> None:
        n = 1 + len(job.followers)
        with self._count_lock:
            self._admission.take(job.request.cache_scope, n)  # or a 429
            self._last_activity = time.monotonic()
            if self._asleep:
                self._wake_requested = True
        self._prep.append(job)
        self._prep_wake.set()
        waiting = self.queue_depth()
        now = time.monotonic()
        if waiting and now - self._last_queue_log >= 1.0:
            self._last_queue_log = now
            log.info("all %d slots busy: %d request(s) waiting", self.config.parallel, waiting)

    def drain(self) -> None:
        """Refuse new requests (503 shutting_down); the ones in flight go on (SIGTERM)."""
        self._stopping = True
        self._wake.set()
        if self._embedder:
            self._embedder.drain()

    def abort(self, message: str) -> None:
        """End every request now with a shutting_down error (a stream gets an error event
        rather than a cut connection): the end of the graceful timeout."""
        self._abort = ShuttingDown(message)
        self._wake.set()

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop after the jobs in flight; used at worker exit."""
        self._stopping = True
        self._wake.set()
        self._prep_wake.set()
        self._stopped.wait(timeout + (PERSIST_EXIT_SECONDS if self._persist else 0.0))

    # ---- prep threads ----------------------------------------------------------------------
    def _prep_main(self, me: int) -> None:
        while True:
            with self._count_lock:  # never while asleep: the model is freed (and reloading)
                job = self._prep.popleft() if self._prep and not self._asleep else None
            if job is None:
                if self._closed or (self._stopping and not self._prep):
                    return
                self._prep_wake.wait(0.5)
                continue
            if self._prep:
                self._prep_wake.set()  # more waiting: wake another prep thread
            self._prep_busy[me] = time.monotonic()
            try:
                self._prepare_job(job)
            finally:
                self._prep_busy.pop(me, None)

    def _prepare_job(self, job: Job) -> None:
        """Prepare ``job`` and hand it to the engine thread; a failure answers it here."""
        if job.cancelled:
            self._drop(job)
            return
        try:
            self._prep_r.prepare(job)
        except Exception as exc:  # noqa: BLE001 - every job gets an answer
            if not isinstance(exc, ServiceError):
                log.exception("could not prepare a request")
            self._drop(job, as_service_error(exc))
            return
        persist, sched = self._persist, self._sched
        if persist is not None and sched is not None:
            try:  # a prompt kept on disk that this one extends: read on the reader thread
                stored = persist.wanted(job, sched.slots, sched.features.prompt_cache)
            except Exception:  # noqa: BLE001 - the request goes on, decoding its whole prompt
                log.exception("prompt cache: looking for a kept prompt failed")
                stored = None
            if stored is not None:
                persist.read_for(job, stored, self._hand_over)
                return
        self._hand_over(job)

    def _hand_over(self, job: Job) -> None:
        """A prepared job to the engine thread (its prompt's file read first, if it had one)."""
        with self._handoff:
            if not self._closed:
                job.sink(Accepted(prompt_tokens=len(job.tokens)))
                self._inbox.append(job)
                self._wake.set()
                return
        self._drop(job, ShuttingDown("server is shutting down"))

    # ---- engine thread ---------------------------------------------------------------------
    def _thread_main(self) -> None:
        try:
            # at once, held until the engine stops (app.engine.resolve, file_holds)
            path, self._mmproj, self._draft, self._adapters = resolve_files(
                self.state, self._holds, self._resolve_model, self._resolve_projector,
                self._resolve_draft, self._resolve_adapters)
            self._path = path  # a reload after sleep reads this local file, not the network
            if self.config.load_priority == "low":  # beside models already serving
                run_at_low_priority(lambda: self._load_and_warm(path))
            else:
                self._load_and_warm(path)
        except Exception as exc:  # noqa: BLE001 - every load failure must end the process
            msg = str(exc) if isinstance(exc, ModelLoadError) else f"{type(exc).__name__}: {exc}"
            self.state.fail(msg)
            log.error("model load failed: %s", msg)
            if self._on_fatal:
                self._on_fatal(msg)
            self._holds.release()
            self._stopped.set()
            return
        for i in range(PREP_THREADS):
            start_native_thread(lambda i=i: self._prep_main(i), stack_size=PREP_STACK_BYTES)
        if self._embedder:
            self._embedder.start()
        self._last_activity = time.monotonic()  # idle counts from ready, not from construction
        self.state.set("ready", progress=1.0)
        log.info("model ready: %s (n_ctx=%d; %s)", self._info.name, self._m.n_ctx,
                 self.state.phases_text())
        try:
            self._loop()
            self._keep_prompts()
        except Exception as exc:  # pragma: no cover - a bug: fail loudly and end the process
            log.exception("engine loop crashed")
            self._stopping = True
            self.state.fail(f"engine crashed: {type(exc).__name__}: {exc}")
            self._fail_everything(EngineFailure("engine stopped unexpectedly"))
            if self._on_fatal:  # the platform restarts the container rather than it hanging
                self._on_fatal(self.state.error or "engine crashed")
        finally:
            with self._handoff:
                self._closed = True
            self._prep_wake.set()
            self._fail_everything(ShuttingDown("server is shutting down"))  # late arrivals
            while self._controls:  # slot actions no step will take now
                _, out, done = self._controls.popleft()
                out.append((False, ShuttingDown("server is shutting down")))
                done.set()
            self._free()
            self._holds.release()
            self._stopped.set()

    def _keep_prompts(self) -> None:
        """The drain is over: with PROMPT_CACHE_DIR, the slots' and the RAM cache's prompts
        written for the next start (app.engine.prompt_persist), before the model is freed."""
        persist, sched, m = self._persist, self._sched, self._m
        if persist is None:
            return
        if sched is None or m is None or self._asleep:
            persist.close(PERSIST_EXIT_SECONDS)
            return
        persist.at_exit(sched.slots, m.ctx, sched.features.prompt_cache, PERSIST_EXIT_SECONDS)

    def _load_and_warm(self, path: str) -> None:
        self._load(path)
        sched = self._sched
        if self._persist is None and sched is not None:  # once: it outlives sleep and reloads
            self._persist = open_persist(self.config, path, self._mmproj,
                                         [a.path for a in self._adapters],
                                         sched.features.prompt_cache, self._m.n_vocab)
        self._hook_persist()
        if self._generates:
            self._warm_up()
        if self._embedder:
            self._embedder.open()

    def _load(self, path: str) -> None:
        """Open the model (LlamaModel.load) and take what the engine reads of it."""
        cxx_runtime.pin()  # done when app was imported; a process that loads llama.cpp needs it
        from llama_cpp import llama_cpp as ll  # imported here: loading it takes time

        m = LlamaModel(ll, self.config, self._stage)
        self._m = m
        try:
            m.load(path, self._turns, self._job_over, self._mmproj, self._draft,
                   self._adapters)
        except BaseException:
            m.free()
            raise
        self._prep_r = Preparer(m, self.config.grammar_max_step_ms / 1000,
                                self.config.prompt_logprobs_max_tokens)
        self._info = m.card(path)

    def _hook_persist(self) -> None:
        """What leaves the RAM cache for room goes to the disk store (after each load)."""
        sched = self._sched
        cache = sched.features.prompt_cache if sched is not None else None
        if cache is not None and self._persist is not None:
            cache.on_evict = self._persist.spill

    def _warm_up(self) -> None:
        """Before declaring the model ready: the first burst's work done once, then the chat
        template's opening left in the KV cache (app.engine.warm_up); the counters forgotten."""
        self._stage("warming_up", progress=None)
        sched, info, m = self._sched, self._info, self._m
        assert sched is not None  # a generative model has a context
        light = self.config.warm_up == "light"
        if light:  # one compute thread: see below
            m.ll.llama_set_n_threads(m.ctx, 1, 1)
        try:
            warm_up(sched, m.tok, self.config.parallel, self.config.prefill_chunk,
                    self._enter, self._step_once, light=light)
            opening = self.config.opening
            if opening is not None and info is not None and not light:
                # (light: the request waiting for the model decodes the opening with its own
                # prompt, on every compute thread, and leaves it cached for the next)
                prime(lambda: opening(info), self._enter, self._step_once)
        finally:
            # a light warm-up is a model's load beside models that serve: llama.cpp's compute
            # threads wait for each other spinning, so two models' teams on the same cores
            # stalled both (a 3 s gap in the other model's stream on 2 cores); one thread
            # never waits for another. The model serves with all of them.
            if light:
                m.ll.llama_set_n_threads(m.ctx, m.n_threads, m.n_threads_batch)
        sched.reset_stats()  # the warm-up's steps measured nothing a request will see

    def _enter(self, job: Job) -> None:
        """A load's own job, prepared here and queued (counted: a reload's warm-up runs beside
        submissions)."""
        self._prep_r.prepare(job, warming=True)
        with self._count_lock:
            self._admission.count(job.request.cache_scope)
        self._sched.waiting.append(job)

    def _stage(self, stage: str, **kw: object) -> None:
        """The load stage health reports; a reload after sleep reports none (health stays 200)."""
        if not self._reloading:
            self.state.set(stage, **kw)

    def _loop(self) -> None:
        while True:
            if self._asleep:
                if self._stopping:
                    return
                if self._prep or self._wake_requested:
                    self._reload()
                else:
                    self._wake.wait(0.5)
                continue
            try:
                busy = self._step_once()
            except Exception:  # a bug: fail the jobs in flight, keep serving the next ones
                log.exception("engine step failed")
                if self._sched is not None:
                    self._sched.fail_active(EngineFailure("internal engine error"))
                busy = True
            waiting = self._sched is not None and self._sched.waiting
            reading = self._persist is not None and self._persist.reading
            if self._stopping and not busy and not (self._prep or self._prep_busy or self._inbox
                                                    or waiting or reading):
                return
            if not busy and not self._fall_asleep():
                self._wake.wait(0.5)

    def _fall_asleep(self) -> bool:
        """Free the model once nothing has needed it for SLEEP_IDLE_SECONDS. Decided under the
        lock every submission and model holder takes, so a request arriving at that moment
        either counts (no sleep) or finds the engine asleep and wakes it."""
        idle = self.config.sleep_idle_seconds
        if not idle or self._stopping or time.monotonic() - self._last_activity < idle:
            return False
        with self._count_lock:
            sched = self._sched
            if (self._admission.total or self._users or self._prep or self._inbox or self._prep_busy
                    or (sched is not None and (sched.waiting or sched.busy()))):
                return False
            self._asleep = True
            self._wake_requested = False
        if self._persist is not None and sched is not None:  # what the KV held, to disk
            self._persist.at_sleep(sched.slots, self._m.ctx, sched.features.prompt_cache)
        self._m.free()
        log.info("asleep after %g s without a request: model, contexts and KV cache freed", idle)
        return True

    def _reload(self) -> None:
        """Load the model again from the local file (engine thread); everything that waited
        goes on. A failure here is fatal, as at start-up."""
        started = time.monotonic()
        info = self._info
        self._reloading = True
        try:
            self._load(self._path)
            self._hook_persist()
            if self._generates:
                self._warm_up()
            if self._embedder:
                self._embedder.open()
                self._embedder.start()
        except Exception as exc:
            msg = f"reloading the model after sleep failed: {exc}"
            log.error("%s", msg)
            self.state.fail(msg)
            if self._on_fatal:
                self._on_fatal(msg)
            raise
        finally:
            self._reloading = False
        self._info = info  # the same model: its card (created, name) does not change
        with self._count_lock:
            self._asleep = False
            self._wake_requested = False
            self._last_activity = time.monotonic()
        self._prep_wake.set()
        log.info("woke up: model reloaded in %.1f s", time.monotonic() - started)

    def _step_once(self) -> bool:
        """Take new jobs, admit waiting ones, decode one batch. False when there was no work."""
        if self._abort is not None:
            err, self._abort = self._abort, None
            self._fail_everything(err)
        sched = self._sched
        if sched is None:  # an embedding-only model: nothing to generate
            return False
        while self._controls:
            fn, out, done = self._controls.popleft()
            if out:  # abandoned: its caller gave up waiting (and was told so)
                continue
            try:
                out.append((True, fn(sched)))
            except Exception as exc:  # noqa: BLE001 - raised on the caller's thread
                out.append((False, exc))
            done.set()
        with held_wakes():  # a step's events wake their requests' greenlets together
            self._take_inbox(sched)
            sched.reap()
            sched.admit()
            if not sched.busy():
                return False
            with self._turns.host():
                self._step_since = time.monotonic()
                try:
                    sched.step()
                finally:
                    self._step_since = None
        return True

    def _take_inbox(self, sched: Scheduler) -> None:
        """Prepared jobs join the admission queue, in the order they were prepared."""
        while self._inbox:
            job = self._inbox.popleft()
            if job.cancelled:
                self._drop(job)
            else:
                sched.waiting.append(job)

    def _job_over(self, job: Job) -> None:
        """A choice has ended (finished, failed, cancelled, dropped): its sampler freed, and the
        request counted out once."""
        if job.sampler is not None:
            job.sampler.free()
            job.sampler = None
        projector = self._m.projector if self._m is not None else None
        if job.images and projector is not None:  # its chunks (the KV keeps what they made)
            for span in job.images:
                projector.free_span(span)
        job.images = []
        if not job.done:
            job.done = True
            with self._count_lock:
                self._admission.give(job.request.cache_scope)
                self._last_activity = time.monotonic()  # idle counts from a request's end

    def _drop(self, job: Job, err: ServiceError | None = None) -> None:
        drop(job, err, self._job_over)

    def _fail_everything(self, err: ServiceError) -> None:
        """Every request: those in slots, admitted and waiting, prepared, and to be prepared."""
        sched = self._sched
        if sched is not None:
            sched.fail_active(err)
        waiting = sched.waiting if sched is not None else deque()
        while self._prep or waiting or self._inbox:
            queue = self._prep if self._prep else waiting if waiting else self._inbox
            self._drop(queue.popleft(), err)

    # ---- at exit (engine thread) --------------------------------------------------------------
    def _free(self) -> None:
        if self._m is None:
            return
        for slot in self._sched.slots if self._sched is not None else []:
            if slot.job is not None and slot.job.sampler is not None:
                slot.job.sampler.free()
        self._m.free()

    # ---- llama-server's slot actions: a native thread (it waits for the engine thread) -------
    def slot_action(self, slot_id: int, action: str, filename: str | None) -> dict[str, object]:
        """POST /slots/{id}?action=save|restore|erase: a slot's KV written to a file of
        PROMPT_CACHE_DIR, read back from one (checked as every kept prompt is), or dropped.
        The slot must be idle; the file's I/O runs on the calling thread, only the copy of
        the cells on the engine thread (between steps)."""
        self._check_loaded()
        self._check_generates()
        persist = self._persist
        if action != "erase" and persist is None:
            raise NotSupported("slot save and restore need PROMPT_CACHE_DIR (the folder or "
                               "gs:// prefix slot files live in)")
        if not 0 <= slot_id < self.config.parallel:
            raise BadRequest(f"no slot {slot_id}: this server has {self.config.parallel} "
                             "(PARALLEL)", param="id_slot")
        self.acquire_model()  # woken if asleep
        try:
            return slot_action(persist.store if persist is not None else None, self._on_engine,
                               slot_id, action, filename)
        finally:
            self.release_model()

    def _on_engine(self, fn: Callable[[Scheduler], object], timeout: float = 60.0) -> Any:
        """``fn(scheduler)`` run by the engine thread between two steps; its result here."""
        out: list = []
        done = ThreadEvent()
        self._controls.append((fn, out, done))
        self._wake.set()
        if not done.wait(timeout):
            out.append((False, None))  # abandoned: the engine thread skips it (or just ran it)
            raise EngineFailure(f"the engine thread did not take the slot action in {timeout:g} s")
        ok, value = out[0]
        if not ok:
            raise value
        return value

    # ---- introspection (/tokenize, /detokenize, /slots): any thread but the engine's ---------
    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        """/tokenize: exactly what llama.cpp says (Tokenizer.exact), the model held meanwhile."""
        self._check_loaded()
        self.acquire_model()  # asleep: woken; and it cannot fall asleep meanwhile
        try:
            return self._m.tok.exact(text, add_special, parse_special)
        finally:
            self.release_model()

    def pieces(self, tokens: list[int]) -> list[bytes]:
        """Each token's text as bytes, control tokens included (llama-server's pieces)."""
        self._check_loaded()
        # llama.cpp does not check: an id past the vocabulary would crash it (ints of any size)
        n_vocab = self._info.n_vocab
        bad = outside_vocab(tokens, n_vocab)
        if bad is not None:
            raise BadRequest(
                f"token id {bad} is not in the vocabulary (0..{n_vocab - 1})",
                param="tokens",
            )
        self.acquire_model()  # asleep: woken; and it cannot fall asleep meanwhile
        try:
            return self._m.tok.pieces(tokens)
        finally:
            self.release_model()

    def slots(self) -> list[dict[str, object]]:
        """Each slot as the engine thread left it (/slots)."""
        sched = self._sched
        return slot_rows(sched.slots, sched.n_ctx) if sched is not None else []
