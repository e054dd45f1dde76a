"""Which inputs an embedding decode takes: requests take turns; a small one rides along.

A decode is atomic: it answers all of its inputs when it ends. Filling every decode round-robin
across requests (what this replaced) put a one-input request beside a big batch's inputs, so
it waited for the decode in progress and then for a full decode of the big batch's work: two of
its steps (security review round 3: 14 s behind a hung-up 1024-input batch on 2 cores). Here the
request that has waited longest since its last turn (a newcomer: since it arrived) fills the
decode with its own inputs; another request rides along only when everything it has left fits
in what remains, so it is answered by this decode. A small request therefore waits at most the
decode in progress, and a big one still gets every other decode against a flow of small ones.

Inputs are tokenized when their decode is planned, not when the request arrives, so a big batch
costs the embedding thread no more between two decodes than the inputs of the next one (and a
batch whose caller hangs up is never tokenized past the decode where it stopped).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from app.base.threads import Mailbox
from app.engine.embed import EmbedRequest, Outcome


@dataclass(eq=False)
class Input:
    index: int  # in its request
    item: str | tuple[int, ...]
    tokens: list[int] | None = None  # once tokenized


@dataclass(eq=False)
class Job:
    request: EmbedRequest
    channel: Mailbox
    deadline: float | None
    since: float  # when its last turn ended; before its first, when it arrived
    cancel: list[bool] = field(default_factory=lambda: [False])
    outcomes: list[Outcome | None] = field(default_factory=list)
    todo: deque[Input] = field(default_factory=deque)
    truncated: set[int] = field(default_factory=set)
    left: int = 0  # inputs without an outcome yet
    done: bool = False


# tokenizes the first ``n`` inputs of a job's todo in place; one that fails is settled with its
# error and leaves the todo
Ready = Callable[[Job, int], None]


def pick(jobs: list[Job], seats: int, room: int, ready: Ready) -> tuple[Job | None,
                                                                     list[tuple[Job, Input]]]:
    """The next decode: its turn's owner and the (job, input) pairs it takes, at most ``seats``
    inputs and ``room`` tokens (the owner's first input goes whole whatever its length: pooling
    needs an input in one piece). Taken inputs leave their job's todo."""
    picked: list[tuple[Job, Input]] = []
    head: Job | None = None
    for job in sorted(jobs, key=lambda j: j.since):
        if head is None:  # the turn: this request's inputs while they fit
            while job.todo and seats:
                ready(job, 1)
                if not job.todo:
                    break
                toks = job.todo[0].tokens
                assert toks is not None
                if picked and len(toks) > room:
                    break
                picked.append((job, job.todo.popleft()))
                seats -= 1
                room -= len(toks)
            if picked:
                head = job
            continue
        # riding along: only a request this decode finishes
        if not job.todo or len(job.todo) > seats:
            continue
        ready(job, len(job.todo))
        need = sum(len(x.tokens or ()) for x in job.todo)
        if not job.todo or need > room:
            continue
        picked += [(job, x) for x in job.todo]
        seats -= len(job.todo)
        room -= need
        job.todo.clear()
    return head, picked
