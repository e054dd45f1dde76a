"""The scheduler's records and the rules that need no context: a job (one choice of a request)
and what other threads may do to it, a slot (one sequence of the context: its phase, and its
KV), where a new prompt goes among the slots, and how a job that holds no slot, or loses one,
ends.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from app.base.errors import GenerationTimeout, ServiceError
from app.base.threads import allocate_lock
from app.engine.kv import KvSeq
from app.engine.llama_media import ImageSpan
from app.engine.prompt_file import digest_scope, scope_digest
from app.engine.sampling import Sampler
from app.engine.text import TextAssembler
from app.engine.types import Failed, GenerationRequest, Sink, TokenScore, slot_row

if TYPE_CHECKING:
    from app.engine.prediction import Place
    from app.engine.prompt_cache import Entry

# the scope of KV any request may reuse: the chat template's opening the engine decodes at load
# (server text every client already sees in its own prompts, so reusing it tells nothing)
PUBLIC = "\0public"

# a cached prefix in a slot away from the running ones is copied over when it saves at least
# this many tokens of prompt (below it, decoding them again costs about what the copy does)
RELOCATE_MIN_TOKENS = 16


class JobControl:
    """What another thread may do to a job: cancel it (the request's greenlet, when its client
    goes away), or inject text into its sequence (a reasoning budget's closing tag). The only
    part of a job that crosses threads: the rest belongs to one thread at a time (the request's,
    a prep thread, then the engine's)."""

    def __init__(self) -> None:
        self._lock = allocate_lock()
        self._cancelled = False
        self._text = ""  # injected and not yet taken by the engine thread
        self._unless = b""  # ... dropped if the generated text already has this

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """End the job at the engine's next step (its KV is kept for the next turn)."""
        self._cancelled = True

    def inject(self, text: str, unless: bytes = b"") -> None:
        """Insert ``text`` into the sequence at a next step (unless the reply has ``unless``)."""
        with self._lock:
            self._text += text
            self._unless = unless

    @property
    def injecting(self) -> bool:
        """Text is waiting to be injected."""
        return bool(self._text)

    def pending(self) -> tuple[str, bytes]:
        """The text waiting to be injected, and what drops it (engine thread)."""
        with self._lock:
            return self._text, self._unless

    def take(self, text: str) -> None:
        """``text``, as ``pending`` gave it, is injected (or dropped): what came since stays."""
        with self._lock:
            self._text = self._text[len(text):]


@dataclass(eq=False)
class Job:
    """One choice of a request, from its prompt's tokens to its end (n choices: n jobs, the
    first leading the others)."""

    request: GenerationRequest
    sink: Sink
    tokens: list[int] = field(default_factory=list)
    control: JobControl = field(default_factory=JobControl)  # cancel and inject, any thread
    done: bool = False
    deadline: float | None = None
    cached_tokens: int = 0  # prompt tokens whose KV was reused from the slot's last request
    index: int = 0  # the choice (n > 1)
    followers: list[Job] = field(default_factory=list)  # the other choices, led by this job
    leader: Job | None = None  # for a follower, the job that leads it
    generated: bytearray = field(default_factory=bytearray)  # the raw text (injection's unless)
    max_new: int = 0
    n_generated: int = 0
    assembler: TextAssembler | None = None
    sampler: Sampler | None = None  # built on a prep thread; freed when the job is over
    submitted: float = field(default_factory=time.monotonic)
    queued: float = 0.0  # seconds from submission to a slot (for /metrics)
    # logprobs, when the request asked: the sampled tokens' scores not sent yet, the prompt's
    # scores so far, and the characters generated so far (where the next token's text starts)
    scores: list[TokenScore] = field(default_factory=list)
    prompt_scores: list[TokenScore] = field(default_factory=list)
    n_chars: int = 0
    images: list[ImageSpan] = field(default_factory=list)  # the prompt's images, in order
    draft_n: int = 0  # tokens drafted for this choice (speculative decoding) ...
    draft_accepted: int = 0  # ... and of them, kept: the target sampled the same token
    # the next draft's length: halved after a draft the model turned down at its first token,
    # one past what it kept after a partial one, doubled after a whole one (0: not yet set)
    draft_len: int = 0
    prediction: Place | None = None  # Predicted Outputs: where the reply stands in it
    # a prompt kept on disk (PROMPT_CACHE_DIR) that this prompt extends, read by a prep thread
    # for the scheduler to copy into the job's slot if no slot holds as much of it
    preloaded: Entry | None = None

    @property
    def cancelled(self) -> bool:
        return self.control.cancelled

    def pos_at(self, i: int) -> int:
        """The position of prompt token ``i``: its index, less what images before it saved
        (an M-RoPE image of n tokens moves the position by n_pos, its grid's longer side)."""
        return i + sum(s.n_pos - s.n for s in self.images if s.start + s.n <= i)


class Phase(Enum):
    """Where a slot stands, as llama.cpp's ``slot_state``: what a step does with it."""

    IDLE = "idle"  # no job (its KV may still serve a later prompt's prefix)
    WAITING = "waiting"  # another choice of a request, waiting for its leader's prompt KV
    PREFILLING = "prefilling"  # prompt tokens left to decode
    GENERATING = "generating"  # sampling a token per step (with drafts, when speculating)


@dataclass(eq=False)
class Slot:
    """One sequence of the context: the job it serves, if any, and its KV (``kv``)."""

    kv: KvSeq
    job: Job | None = None
    last_used: float = 0.0
    follows: Slot | None = None  # a choice waiting for its leader's prompt KV
    n_prompt_done: int = 0  # prompt tokens decoded so far
    last_token: int = -1  # sampled, decoded at the next step
    scope: str = ""  # cache_scope of the request whose KV the slot holds (an API key's digest)

    @property
    def seq_id(self) -> int:
        return self.kv.seq_id

    @property
    def phase(self) -> Phase:
        """Worked out from the slot's facts, so it cannot disagree with them."""
        if self.job is None:
            return Phase.IDLE
        if self.follows is not None:
            return Phase.WAITING
        if self.n_prompt_done < len(self.job.tokens):
            return Phase.PREFILLING
        return Phase.GENERATING


def cache_scope(request: GenerationRequest) -> str:
    """The scope of KV a request may reuse: its API key's, and its adapter set's (KV computed
    under adapters is theirs)."""
    lora = request.lora
    return request.cache_scope + (f"\0lora{lora}" if lora else "")


def reuse_rule(scope: str, lora: object) -> Callable[[str], bool]:
    """Whose KV a prompt of key scope ``scope`` (adapter set ``lora``) may reuse, by the scope
    a slot holds: its own, a slot restored from a file of its scope (which knows only the
    scope's digest), and the public opening when it runs no adapters."""
    restored = digest_scope(scope_digest(scope))
    return lambda held: held in (scope, restored) or held == PUBLIC and not lora


def slot_rows(slots: list[Slot], n_ctx: int) -> list[dict[str, object]]:
    """Each slot as /slots shows it, from any thread: a slot's job is read once, so a row is
    never half of one request and half of the next."""
    rows: list[dict[str, object]] = []
    for slot in list(slots):
        job = slot.job
        kv = len(slot.kv)
        if job is None:
            rows.append(slot_row(slot.seq_id, n_ctx, kv))
            continue
        decoded = job.n_generated  # read once: the engine thread moves it on
        rows.append(slot_row(
            slot.seq_id, n_ctx, kv, job=True, prompt=len(job.tokens),
            processed=slot.n_prompt_done, cached=job.cached_tokens, decoded=decoded,
            remain=max(0, job.max_new - decoded), choice=job.index,
        ))
    return rows


def place(slots: list[Slot], free: list[Slot], shared: dict[int, int]) -> tuple[Slot, Slot]:
    """The slot a new prompt goes to, and the slot whose cached prefix it reuses.

    With one KV stream per slot, llama.cpp attends over every stream from the lowest to the
    highest sequence id in a batch: eight sequences spread over sixteen slots cost twice
    the attention of eight side by side (at 8 streams on the default model: 120 against
    227 tok/s). So the prompt goes where the running sequences' id span grows least, and
    there to the slot whose cache loses least: an empty one before another conversation's
    KV, which its next turn would reuse. The longest cached prefix of the prompt, in any
    slot (a running one's too: between steps its KV holds exactly its ``cached`` tokens),
    comes with it: taken in place when it is there, else copied over when it saves at
    least RELOCATE_MIN_TOKENS (a whole stream copied: a memory copy, far cheaper than
    decoding the prefix again, and the sequence it came from keeps its own)."""
    source = max(slots, key=lambda s: (shared[id(s)], s.job is None, -s.last_used))
    span = spread(slots)
    narrowest = min(span(s) for s in free)
    slot = min((s for s in free if span(s) == narrowest),
               key=lambda s: (len(s.kv) - shared[id(s)], -shared[id(s)], s.last_used))
    if shared[id(source)] - shared[id(slot)] >= RELOCATE_MIN_TOKENS:
        return slot, source
    return slot, slot


def next_waiting(waiting: Sequence[Job], slots: list[Slot]) -> int:
    """Which waiting request a free slot goes to (its index): the oldest of the key scope that
    holds the fewest slots now. Scopes take turns as slots free up, and a key whose requests
    fill the queue cannot keep another key's request behind all of them (security3 M4). With
    one scope (no API keys) it is first come, first served."""
    held = Counter(s.job.request.cache_scope for s in slots if s.job is not None)
    best, fewest = 0, -1
    seen: set[str] = set()
    for i, job in enumerate(waiting):
        scope = job.request.cache_scope
        if scope in seen:
            continue  # the scope's oldest is its candidate
        seen.add(scope)
        if fewest < 0 or held[scope] < fewest:
            best, fewest = i, held[scope]
            if fewest == 0:
                break  # none can hold fewer
    return best


def shares(budget: int, wants: list[int]) -> list[int]:
    """How a step's prompt budget is split between the prompts being decoded (``wants``: the
    tokens each has before its next image or its end): equal shares, and what a short prompt
    does not need goes to the longer ones (max-min fair; a remainder to the shorter first).
    So a short prompt admitted beside a long one is decoded in the next step, and every prompt
    gets at least budget / prompts a step (security3 L1: in slot order a request waited for
    another's whole prompt, 70 s there)."""
    out = [0] * len(wants)
    left = budget
    order = sorted(range(len(wants)), key=wants.__getitem__)
    for k, i in enumerate(order):
        out[i] = min(wants[i], -(-left // (len(order) - k)))
        left -= out[i]
    return out


def spread(slots: list[Slot]) -> Callable[[Slot], int]:
    """How far apart the running sequences' ids would be with a given slot running too
    (the running ones read once, not once per candidate slot)."""
    ids = [s.seq_id for s in slots if s.job is not None]
    if not ids:
        return lambda slot: 0
    lo, hi = min(ids), max(ids)
    return lambda slot: max(hi, slot.seq_id) - min(lo, slot.seq_id)


def pop_scores(job: Job) -> tuple[TokenScore, ...]:
    """The job's scores not sent yet, now to be sent."""
    if not job.scores:
        return ()
    out = tuple(job.scores)
    job.scores.clear()
    return out


def fail(job: Job, err: ServiceError, on_end: Callable[[Job], None]) -> None:
    """End one choice with an error event (unless it already ended)."""
    if not job.done:
        job.sink(Failed(err))
    on_end(job)


def drop(job: Job, err: ServiceError | None, on_end: Callable[[Job], None]) -> None:
    """End a request that holds no slot yet, with all its choices (one Failed if ``err``)."""
    if err is not None:
        fail(job, err, on_end)
    for j in (job, *job.followers):
        on_end(j)


def before_image(job: Job, n_common: int) -> int:
    """A reused prefix cut back to the start of an image it would end inside: an image's KV
    is decoded whole."""
    for span in job.images:
        if span.start < n_common < span.start + span.n:
            return span.start
    return n_common


def timeout_error(job: Job) -> GenerationTimeout:
    return GenerationTimeout(
        f"generation exceeded the request timeout of {job.request.timeout:g} s "
        f"after {job.n_generated} tokens"
    )
