"""The scheduler's records and the rules that need no context: a job (one choice of a request),
a slot (one sequence of the context and the tokens its KV holds), where a new prompt goes among
the slots, and how a job that holds no slot, or loses one, ends.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.base.errors import GenerationTimeout, ServiceError
from app.engine.llama_media import ImageSpan
from app.engine.sampling import Sampler
from app.engine.text import TextAssembler
from app.engine.tokens import Mark
from app.engine.types import Failed, GenerationRequest, Sink, TokenScore

if TYPE_CHECKING:
    from app.engine.prediction import Place

# the scope of KV any request may reuse: the chat template's opening the engine decodes at load
# (server text every client already sees in its own prompts, so reusing it tells nothing)
PUBLIC = "\0public"

# a cached prefix in a slot away from the running ones is copied over when it saves at least
# this many tokens of prompt (below it, decoding them again costs about what the copy does)
RELOCATE_MIN_TOKENS = 16


@dataclass(eq=False)
class Job:
    """One choice of a request, from its prompt's tokens to its end (n choices: n jobs, the
    first leading the others)."""

    request: GenerationRequest
    sink: Sink
    tokens: list[int] = field(default_factory=list)
    cancelled: bool = False
    done: bool = False
    deadline: float | None = None
    cached_tokens: int = 0  # prompt tokens whose KV was reused from the slot's last request
    index: int = 0  # the choice (n > 1)
    followers: list[Job] = field(default_factory=list)  # the other choices, led by this job
    leader: Job | None = None  # for a follower, the job that leads it
    inject: str = ""  # text to insert into the sequence at the next step (reasoning control)
    inject_unless: bytes = b""  # ... dropped if the generated text already has this
    generated: bytearray = field(default_factory=bytearray)  # the raw text, for inject_unless
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

    def pos_at(self, i: int) -> int:
        """The position of prompt token ``i``: its index, less what images before it saved
        (an M-RoPE image of n tokens moves the position by n_pos, its grid's longer side)."""
        return i + sum(s.n_pos - s.n for s in self.images if s.start + s.n <= i)


@dataclass(eq=False)
class Slot:
    """One sequence of the context: the job it serves, if any, and the tokens its KV holds."""

    seq_id: int
    job: Job | None = None
    cached: list[int] = field(default_factory=list)  # exactly the tokens in this seq's KV
    marks: list[Mark] = field(default_factory=list)  # the images among them, by full digest
    last_used: float = 0.0
    follows: Slot | None = None  # a choice waiting for its leader's prompt KV
    # the position the sequence's next token takes: its token count, except after an image of
    # a projector that places image tokens in 2-D (M-RoPE), which moves it by fewer
    n_past: int = 0
    n_prompt_done: int = 0  # prompt tokens decoded so far
    last_token: int = -1
    i_batch: int = -1  # index in the current batch whose logits this slot samples
    scope: str = ""  # cache_scope of the request whose KV the slot holds (an API key's digest)
    # this step's drafted tokens, in the batch after last_token at positions n_past.. but not
    # in ``cached`` until the target samples the same token; the rest are dropped by _settle
    draft: list[int] = field(default_factory=list)
    speculating: bool = False

    def keep(self, n: int) -> None:
        """The KV now holds only the first ``n`` cached tokens (never the inside of an
        image: ``before_image`` cuts there)."""
        del self.cached[n:]
        self.marks = [m for m in self.marks if m.start + m.n <= n]

    def copy_of(self, other: Slot) -> None:
        """The KV now holds a copy of ``other``'s."""
        self.cached, self.marks = list(other.cached), list(other.marks)


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
               key=lambda s: (len(s.cached) - shared[id(s)], -shared[id(s)], s.last_used))
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


def taken(job: Job) -> tuple[TokenScore, ...]:
    """The job's scores not sent yet, now to be sent."""
    if not job.scores:
        return ()
    out = tuple(job.scores)
    job.scores.clear()
    return out


def fail(job: Job, err: ServiceError, over: Callable[[Job], None]) -> None:
    """End one choice with an error event (unless it already ended)."""
    if not job.done:
        job.sink(Failed(err))
    over(job)


def drop(job: Job, over: Callable[[Job], None], err: ServiceError | None = None) -> None:
    """End a request that holds no slot yet, with all its choices (one Failed if ``err``)."""
    if err is not None:
        fail(job, err, over)
    for j in (job, *job.followers):
        over(j)


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
