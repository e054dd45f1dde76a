"""Embeddings on llama.cpp: a context of their own, on a native thread of their own.

The generation engine loads the model and hands it here; this module opens a second context
on the same weights with embeddings on and the pooling chosen, so an embedding request never
waits behind a generation step (and generation never waits behind an embedding batch beyond
sharing the cores). Inputs of every waiting request are packed into one ``llama_decode``, one
sequence each; requests take turns at decodes (app.engine.embed_jobs), so a one-line request
waits at most the decode in progress even behind a 2,000-input one, and a request whose caller
has gone stops at the next decode.

Why a text's vector does not depend on its batch-mates: each input is its own sequence,
starting at position 0, in a unified KV buffer that is cleared after every decode; attention is
masked per sequence, so the others contribute nothing. Why no input can crash llama.cpp: the
micro-batch is the whole context (a non-causal model must see a sequence in one micro-batch,
and pooling must too), and no input or batch is larger than it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from app.base.errors import (
    BadRequest,
    ClientGone,
    ContextOverflow,
    EngineFailure,
    GenerationTimeout,
    ModelLoadError,
    QueueFull,
    ServiceError,
    ShuttingDown,
)
from app.base.threads import (
    Mailbox,
    ThreadEvent,
    allocate_lock,
    original_sleep,
    start_native_thread,
)
from app.engine.embed import (
    POOLING_IDS,
    VECTOR_POOLING,
    Embedding,
    EmbedHandle,
    EmbedInfo,
    EmbedRequest,
    Outcome,
    refusal,
)
from app.engine.embed_jobs import Input, Job, pick
from app.engine.handle import new_channel
from app.engine.llama_rank import meta, rank_info
from app.engine.types import outside_vocab

log = logging.getLogger(__name__)

_POOLING_CODES = {name: code for code, name in POOLING_IDS.items()}


def open_context(ll, model, what: str, hint: str, **params: object) -> tuple[object, object]:
    """A llama.cpp context on ``model`` (``params`` set over the defaults) and its memory
    (None for a model without a KV cache); a ModelLoadError naming ``what`` when llama.cpp
    cannot make it."""
    cparams = ll.llama_context_default_params()
    cparams.no_perf = True
    for name, value in params.items():
        setattr(cparams, name, value)
    ctx = ll.llama_init_from_model(model, cparams)
    if not ctx:
        raise ModelLoadError(
            f"could not create {what} of {cparams.n_ctx} tokens (not enough memory? {hint})")
    return ctx, ll.llama_get_memory(ctx)

CAUSAL_RANK_UBATCH = 512  # a decoder reranker's micro-batch (see LlamaEmbedder._ubatch)
DEFAULT_MAX_CTX = 8192  # EMBEDDING_CTX=0: the training context, at most this
# ... on a generative model, whose logits llama.cpp computes for every token of a decode too:
# 2048 tokens x a 49k vocabulary is a 400 MB compute buffer (8192 made it 1.7 GB)
GENERATIVE_MAX_CTX = 2048


class DecodeTurns:
    """The generation thread and the embedding thread take turns at ``llama_decode``, sharing
    the time equally when both are busy.

    Both contexts share the cores (or the GPU): decoding at once, their thread pools fight and
    both slow down (bench/embed_turns.py). So they never decode together. An embedding decode
    that finds generation idle, or generation having had at least as much time since the last
    embedding decode as that decode took, goes right after the step in progress: a lone
    embedding request waits one step. Under a sustained stream of embedding requests the two
    alternate by time, not by turn (a 10 ms generation step against a 700 ms embedding decode
    would otherwise leave streams one token per embedding decode): each side keeps about half
    the machine, and a stream's pause is one embedding decode, at most a prompt chunk.
    """

    BUSY_FOR = 0.25  # seconds after a generation step during which generation counts as busy

    def __init__(self) -> None:
        self._lock = allocate_lock()
        self._guest_waiting = False
        self._guest_done = ThreadEvent()
        self._host_at = -1.0  # when the last generation step ended
        self._host_due = -1.0  # generation's time is owed until then (the last guest's length)
        self._host_wants = False  # a generation step is waiting for its turn

    @contextlib.contextmanager
    def host(self) -> Iterator[None]:
        """A generation step: after the embedding decode that is waiting, if any."""
        self._host_wants = True
        for _ in range(100_000):  # bounded: each wait ends when that decode does
            if not self._guest_waiting:
                break
            self._guest_done.wait(0.05)
        with self._lock:
            try:
                yield
            finally:
                self._host_at = time.monotonic()
                self._host_wants = False

    def host_busy(self) -> bool:
        """Whether generation is running (a step ended moments ago): embedding decodes are
        then kept short, so a stream's pause stays the size of a prompt chunk."""
        return self._host_wants or time.monotonic() - self._host_at < self.BUSY_FOR

    @contextlib.contextmanager
    def guest(self) -> Iterator[None]:
        """An embedding decode: once generation has had its share, after the step in
        progress."""
        for _ in range(100_000):  # bounded: generation's share is one decode's length
            if time.monotonic() >= self._host_due or not self.host_busy():
                break
            original_sleep(min(0.01, max(0.0, self._host_due - time.monotonic())))
        self._guest_waiting = True
        try:
            with self._lock:
                start = time.monotonic()
                try:
                    yield
                finally:
                    end = time.monotonic()
                    self._host_due = end + (end - start)
        finally:
            self._guest_waiting = False
            self._guest_done.set()


@dataclass(frozen=True)
class EmbedConfig:
    """What the embedder needs: resolved by the engine from the settings and the model."""

    pooling: str  # mean | cls | last | none | rank
    n_ctx: int  # most tokens of an input and of a decode
    n_seq: int  # most inputs in one decode
    max_queue: int  # requests that may wait beyond those being decoded
    share_tokens: int  # most tokens of a decode while generation runs (an input goes whole)
    threads: int
    threads_batch: int
    flash_attn: int  # llama.cpp's flash_attn_type
    only: bool  # the model embeds only


class LlamaEmbedder:
    """Embeds on its own llama.cpp context. Built by the engine thread once the model is
    loaded (``open``); serves from its own thread (``start``)."""

    def __init__(
        self,
        ll,
        model,
        vocab,
        config: EmbedConfig,
        tokenize: Callable[[str], list[int]],
        max_input_bytes: int,
        n_vocab: int,
        turns: DecodeTurns | None = None,
    ):
        self._ll = ll
        self._model = model
        self._vocab = vocab
        self.config = config
        self._tokenize = tokenize  # add_special on, control tokens not parsed
        self._max_input_bytes = max_input_bytes
        self._n_vocab = n_vocab
        self._turns = turns or DecodeTurns()
        n_out = getattr(ll, "llama_model_n_embd_out", None)
        n_embd = n_out(model) if n_out else ll.llama_model_n_embd(model)
        rank = rank_info(ll, model, vocab) if config.pooling == "rank" else None
        self._n_out = rank.n_out if rank is not None else n_embd  # floats per input
        self._causal = meta(ll, model, f"{meta(ll, model, 'general.architecture')}"
                                        ".attention.causal") != "false"
        self._info = EmbedInfo(n_embd=n_embd, pooling=config.pooling,  # type: ignore[arg-type]
                               n_ctx=config.n_ctx, only=config.only, rank=rank,
                               max_bytes=max_input_bytes)
        # a truncated input keeps the special token the tokenizer puts last (SEP, EOS)
        self._keep_last = bool(ll.llama_vocab_get_add_eos(vocab) or ll.llama_vocab_get_add_sep(vocab))
        self._ctx = None
        self._batch = None
        self._queue: deque[Job] = deque()
        self._wake = ThreadEvent()
        self._count_lock = allocate_lock()
        self._in_flight = 0
        self._stopping = False
        self._stopped = ThreadEvent()
        self._running = False
        self._decodes = 0
        self._widths: Counter[int] = Counter()
        self._inputs = 0  # inputs decoded
        self._cancelled = 0  # requests stopped because their caller went
        self._skipped = 0  # their inputs, never decoded
        self._decode_since: float | None = None

    @property
    def info(self) -> EmbedInfo:
        return self._info

    @property
    def usable(self) -> bool:
        """Whether this pooling gives one output per input: a vector, or a reranker's scores."""
        return self.config.pooling in (*VECTOR_POOLING, "rank")

    # ---- engine thread, at load ------------------------------------------------------------
    def open(self) -> None:
        """Create the context and run one decode (buffers sized on first use)."""
        if not self.usable:
            log.warning("embedding pooling is %s: /v1/embeddings will refuse requests",
                        self.config.pooling)
            return
        ll, cfg = self._ll, self.config
        self._ctx, self._mem = open_context(
            ll, self._model, "the embedding context", "lower EMBEDDING_CTX, or EMBEDDINGS=off",
            embeddings=True,
            pooling_type=_POOLING_CODES[cfg.pooling],
            n_ctx=cfg.n_ctx,
            # a sequence, and a pooled one, must sit in one micro-batch: the whole batch
            n_batch=cfg.n_ctx,
            n_ubatch=self._ubatch(),
            n_seq_max=cfg.n_seq,
            kv_unified=True,  # inputs of any length share the cells; cleared every decode
            n_threads=cfg.threads,
            n_threads_batch=cfg.threads_batch,
            flash_attn_type=cfg.flash_attn,
        )
        self._batch = ll.llama_batch_init(cfg.n_ctx, 0, 1)
        # warm-up: a few sequences (buffers are reserved at creation; this maps them), kept
        # small, as it adds to the time before the health route says ready
        toks = self._tokenize("The quick brown fox jumps over the lazy dog.")[: max(1, cfg.n_ctx // 4)]
        out = self._decode([toks] * min(4, cfg.n_seq))
        if isinstance(out, ServiceError):
            raise ModelLoadError(f"embedding warm-up failed: {out.message}")
        self._decodes = self._inputs = 0
        self._widths.clear()
        rank = self._info.rank
        if rank is not None:
            log.info("reranking: %s, %d output(s)%s, %d tokens per pair and batch, %d pairs "
                     "per decode", "a rerank prompt template" if rank.template else
                     "query and document joined by the vocabulary's special tokens",
                     rank.n_out, f" ({', '.join(rank.labels)})" if rank.labels else "",
                     cfg.n_ctx, cfg.n_seq)
            return
        log.info("embeddings: %s pooling, %d dimensions, %d tokens per input and batch, "
                 "%d inputs per decode", cfg.pooling, self._info.n_embd, cfg.n_ctx, cfg.n_seq)

    def _ubatch(self) -> int:
        """The micro-batch: the whole context, so that a non-causal model sees each input in
        one piece (llama.cpp aborts otherwise) and pooling sees it whole. A causal reranker
        reads each pair's last token and has a KV cache, so its pairs may be split (as
        llama-server does): a smaller micro-batch keeps the output layer llama.cpp runs for
        every token (vocabulary x micro-batch floats: 5 GB for Qwen3-Reranker at 8192) small."""
        if self.config.pooling == "rank" and self._causal:
            return min(self.config.n_ctx, CAUSAL_RANK_UBATCH)
        return self.config.n_ctx

    def start(self) -> None:
        self._running = True
        start_native_thread(self._main)

    # ---- any greenlet ----------------------------------------------------------------------
    def submit(self, request: EmbedRequest, mailbox: Mailbox | None = None) -> EmbedHandle:
        if self._stopping or not self._running:
            raise ShuttingDown("server is shutting down")
        refused = refusal(self.config.pooling, request.rank)
        if refused is not None:
            raise refused
        with self._count_lock:
            if self._in_flight >= self.config.n_seq + self.config.max_queue:
                raise QueueFull(
                    f"server is busy: {self.config.max_queue} embedding requests already waiting"
                )
            self._in_flight += 1
        now = time.monotonic()
        job = Job(request, mailbox or new_channel(), now + request.timeout if request.timeout else None, now)
        self._queue.append(job)
        self._wake.set()
        return EmbedHandle(job.channel, job.cancel)

    def stats(self) -> dict[str, object]:
        return {
            "waiting": len(self._queue),
            "decodes": self._decodes,
            "batch_widths": {str(k): v for k, v in sorted(self._widths.items())},
            "inputs": self._inputs,
            "cancelled": self._cancelled,
            "inputs_skipped": self._skipped,
        }

    def stalled(self, limit: float) -> str | None:
        since = self._decode_since
        if since is not None and time.monotonic() - since > limit:
            return f"one embedding decode has been running for {time.monotonic() - since:.0f} s"
        return None

    def drain(self) -> None:
        self._stopping = True
        self._wake.set()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (requests still queued fail with shutting_down) and free the
        context; called by the engine thread before it frees the model."""
        self._stopping = True
        self._wake.set()
        if self._running and not self._stopped.wait(timeout):
            log.warning("the embedding thread did not stop in %g s: its context is not freed",
                        timeout)
            return  # freeing a context under a running decode would crash the process
        if self._ctx is not None:
            self._ll.llama_batch_free(self._batch)
            self._ll.llama_free(self._ctx)
            self._ctx = None

    # ---- the embedding thread ----------------------------------------------------------------
    def _main(self) -> None:
        active: list[Job] = []
        try:
            while True:
                while self._queue:
                    job = self._queue.popleft()
                    self._take(job)
                    if job.left:
                        active.append(job)
                active = [j for j in active if self._alive(j)]
                if active:
                    self._step(active)
                    active = [j for j in active if j.left]
                    continue
                if self._stopping and not self._queue:
                    return
                self._wake.wait(0.5)
        except Exception:  # pragma: no cover - a bug: fail what is left, keep the process up
            log.exception("embedding thread crashed")
            for job in active:
                self._answer(job, EngineFailure("embedding engine stopped unexpectedly"))
            self._stopping = True
        finally:
            while self._queue:
                self._answer(self._queue.popleft(), ShuttingDown("server is shutting down"))
            self._running = False
            self._stopped.set()

    def _take(self, job: Job) -> None:
        """A new request: its inputs wait untokenized until their decode is planned."""
        inputs = job.request.inputs
        job.outcomes = [None] * len(inputs)
        job.left = len(inputs)
        if self._stopping:
            self._answer(job, ShuttingDown("server is shutting down"))
            return
        job.todo.extend(Input(i, item) for i, item in enumerate(inputs))
        if not job.left:
            self._deliver(job)

    def _ready(self, job: Job, n: int) -> None:
        """Tokenize and check the first ``n`` inputs of the job's todo; a bad one gets its error
        as its outcome and leaves the todo (the next one takes its place)."""
        i = 0
        while i < n and i < len(job.todo):  # bounded: each pass tokenizes or removes one
            inp = job.todo[i]
            if inp.tokens is not None:
                i += 1
                continue
            try:
                inp.tokens, cut = self._tokens(inp.item, job.request.truncate)
            except ServiceError as err:
                del job.todo[i]
                self._settle(job, inp.index, err)
                continue
            if cut:
                job.truncated.add(inp.index)
            i += 1

    def _tokens(self, item: str | tuple[int, ...], truncate: bool) -> tuple[list[int], bool]:
        n_ctx = self.config.n_ctx
        if isinstance(item, str):
            data = item.encode("utf-8", "surrogatepass")
            if len(data) > self._max_input_bytes:
                if not truncate:
                    raise ContextOverflow(
                        f"input is {len(data)} bytes: over {self._max_input_bytes} bytes it "
                        f"cannot fit the {n_ctx} tokens an embedding input may have",
                        param="input",
                    )
                item = data[: self._max_input_bytes].decode("utf-8", "ignore")
            toks = self._tokenize(item)
        else:
            bad = outside_vocab(item, self._n_vocab)
            if bad is not None:
                raise BadRequest(f"token id {bad} is not in the vocabulary "
                                 f"(0..{self._n_vocab - 1})", param="input")
            toks = list(item)
        if not toks:
            raise BadRequest("input is empty", param="input")
        if len(toks) <= n_ctx:
            return toks, False
        if not truncate:
            raise ContextOverflow(
                f"input has {len(toks)} tokens, but an embedding input may have at most "
                f"{n_ctx} (EMBEDDING_CTX)",
                param="input",
            )
        if self._keep_last and isinstance(item, str):
            return toks[: n_ctx - 1] + toks[-1:], True
        return toks[:n_ctx], True

    def _alive(self, job: Job) -> bool:
        """Whether the job goes on, asked at every decode: its caller gone (the greenlet's
        cancel, or the request's own probe, so a hang-up stops it at the very next decode),
        its deadline, shutdown."""
        if job.cancel[0] or self._gone(job):
            self._cancelled += 1
            self._skipped += len(job.todo)
            self._answer(job, ClientGone("the client went away"))
            return False
        if job.deadline is not None and time.monotonic() > job.deadline:
            self._answer(job, GenerationTimeout(
                f"{'reranking' if job.request.rank else 'embedding'} exceeded the request "
                f"timeout of {job.request.timeout:g} s"))
            return False
        if self._stopping and self._ctx is None:
            self._answer(job, ShuttingDown("server is shutting down"))
            return False
        return True

    @staticmethod
    def _gone(job: Job) -> bool:
        """The request's own probe (False without one, or when it cannot tell)."""
        try:
            return bool(job.request.gone and job.request.gone())
        except Exception:  # noqa: BLE001 - the greenlet's own poll still sees the hang-up
            return False

    def _step(self, active: list[Job]) -> None:
        """One decode: the turn of the request that has waited longest, and the requests it
        finishes riding along (app.engine.embed_jobs)."""
        # while streams run, a decode is at most a prompt chunk's worth of tokens (a longer
        # single input still goes whole: pooling needs it in one piece)
        room = self.config.share_tokens if self._turns.host_busy() else self.config.n_ctx
        head, picked = pick(active, self.config.n_seq, room, self._ready)
        if not picked:
            return  # every input looked at failed on its own: answered already
        out = self._decode([inp.tokens or [] for _, inp in picked])
        if head is not None:
            head.since = time.monotonic()
        for k, (job, inp) in enumerate(picked):
            toks = inp.tokens or []
            if isinstance(out, ServiceError):
                self._settle(job, inp.index, out)
            else:
                self._settle(job, inp.index,
                             Embedding(out[k], len(toks), inp.index in job.truncated))

    def _decode(self, seqs: list[list[int]]) -> list[np.ndarray] | ServiceError:
        ll, b = self._ll, self._batch
        n = 0
        for seq_id, toks in enumerate(seqs):
            for pos, tok in enumerate(toks):
                b.token[n] = tok
                b.pos[n] = pos
                b.n_seq_id[n] = 1
                b.seq_id[n][0] = seq_id
                b.logits[n] = True  # pooling reads every token's output
                n += 1
        b.n_tokens = n
        try:
            with self._turns.guest():  # a model without memory (BERT) runs as an encoder
                self._decode_since = time.monotonic()  # for the watchdog; not the wait
                rc = (ll.llama_decode if self._mem else ll.llama_encode)(self._ctx, b)
                self._decode_since = None
            if rc != 0:
                return EngineFailure(f"embedding decode failed (code {rc})")
            dim = self._n_out
            vectors = []
            for seq_id in range(len(seqs)):
                ptr = ll.llama_get_embeddings_seq(self._ctx, seq_id)
                if not ptr:
                    return EngineFailure("llama.cpp gave no pooled embedding")
                vectors.append(np.ctypeslib.as_array(ptr, shape=(dim,)).astype(np.float32))
            return vectors
        finally:
            if self._mem:
                ll.llama_memory_clear(self._mem, True)
            self._decode_since = None
            self._decodes += 1
            self._inputs += len(seqs)
            self._widths[len(seqs)] += 1

    def _settle(self, job: Job, i: int, outcome: Outcome) -> None:
        if job.outcomes[i] is None:
            job.outcomes[i] = outcome
            job.left -= 1
        if not job.left:
            self._deliver(job)

    def _deliver(self, job: Job) -> None:
        job.channel.put(list(job.outcomes))
        self._finish(job)

    def _answer(self, job: Job, err: ServiceError) -> None:
        if job.done:
            return
        job.channel.put(err)
        self._finish(job)

    def _finish(self, job: Job) -> None:
        job.todo.clear()
        job.left = 0
        if job.done:
            return
        job.done = True
        with self._count_lock:
            self._in_flight -= 1
