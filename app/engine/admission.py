"""How many requests the engine holds, in all and per API key scope, and when one more is a 429.

In all, PARALLEL running plus MAX_QUEUE waiting. Per key scope, PARALLEL plus
MAX_QUEUE_PER_KEY: one key may use every slot of an otherwise idle server, but not the whole
queue too, so another key's request is still taken (security3 M4: one key filled the slots and
the queue, and every other key got a 429). Which waiting request gets a freed slot is the
scheduler's rule (``slots.next_waiting``). Without API keys every request has the scope "",
one scope: the per-key cap does not apply, and MAX_QUEUE alone bounds the queue, as before.
"""

from __future__ import annotations

from collections import Counter

from app.base.errors import QueueFull


class Admission:
    """The engine's count of requests (choices) submitted and not yet ended. Not locked: the
    engine calls it under the lock its submissions and its accounting share."""

    def __init__(self, parallel: int, max_queue: int, max_queue_per_key: int):
        self.parallel = parallel
        self.max_queue = max_queue
        self.per_key = max_queue_per_key or (max_queue + 1) // 2
        self.total = 0
        self.by_scope: Counter[str] = Counter()

    def take(self, scope: str, n: int) -> None:
        """Count in a request of ``n`` choices from ``scope``, or refuse it (QueueFull): the
        queue is full, or this key already has its share of it."""
        if self.total + n > self.parallel + self.max_queue:
            raise QueueFull(f"server is busy: {self.max_queue} requests already waiting")
        if scope and self.by_scope[scope] + n > self.parallel + self.per_key:
            raise QueueFull(
                f"server is busy: this API key already has {self.by_scope[scope]} requests "
                f"in the engine, the most one key may (PARALLEL {self.parallel} + "
                f"MAX_QUEUE_PER_KEY {self.per_key}); other keys' requests are still taken")
        self.count(scope, n)

    def count(self, scope: str, n: int = 1) -> None:
        """Count in ``n`` choices unchecked (the engine's own warm-up jobs)."""
        self.total += n
        self.by_scope[scope] += n

    def give(self, scope: str) -> None:
        """One choice has ended."""
        self.total -= 1
        self.by_scope[scope] -= 1
        if self.by_scope[scope] <= 0:
            del self.by_scope[scope]
