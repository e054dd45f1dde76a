"""Recent responses, per API key, for ``previous_response_id`` and ``GET /v1/responses/{id}``
(RESPONSES_STORE_SIZE entries for RESPONSES_STORE_TTL seconds, in this replica)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.base import bridge
from app.base.errors import NotFound

# ---- the store --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    response: dict[str, Any]  # the response object, as returned
    messages: list[dict[str, Any]]  # the conversation so far (instructions left out)
    expires: float


class ResponseStore:
    """The most recent ``size`` responses, each for ``ttl`` seconds, kept apart per API key
    (``scope``: reqctx.cache_scope(), as the prefix cache and resumable streams are): another
    key's id is the same 404 as an unknown one. Full, the store evicts the oldest response of
    the key holding the most (the writer's own on a tie), so one key storing many responses
    only ever evicts its own while another key holds fewer. Read from request threads and
    written from the hub: a native lock guards it."""

    def __init__(self, size: int, ttl: float, clock: Callable[[], float] = time.monotonic):
        self.size = size
        self.ttl = ttl
        self.clock = clock
        self._scopes: dict[str, OrderedDict[str, Stored]] = {}  # scope -> its LRU
        self._total = 0
        self._lock = bridge.allocate_lock()

    @property
    def enabled(self) -> bool:
        return self.size > 0

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return self._total

    def put(self, scope: str, rid: str, response: dict[str, Any],
            messages: list[dict[str, Any]]) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._expire()
            items = self._scopes.setdefault(scope, OrderedDict())
            if items.pop(rid, None) is not None:
                self._total -= 1
            items[rid] = Stored(response, messages, self.clock() + self.ttl)
            self._total += 1
            while self._total > self.size:
                victim = max(self._scopes,
                             key=lambda s: (len(self._scopes[s]), s == scope))
                self._scopes[victim].popitem(last=False)
                self._total -= 1
                if not self._scopes[victim]:
                    del self._scopes[victim]

    def get(self, scope: str, rid: str) -> Stored | None:
        with self._lock:
            self._expire()
            items = self._scopes.get(scope)
            return items.get(rid) if items is not None else None

    def delete(self, scope: str, rid: str) -> bool:
        with self._lock:
            self._expire()
            items = self._scopes.get(scope)
            if items is None or items.pop(rid, None) is None:
                return False
            self._total -= 1
            if not items:
                del self._scopes[scope]
            return True

    def _expire(self) -> None:
        """Each key's LRU is in the order its responses were stored, so expiry stops at the
        first that is still fresh."""
        now = self.clock()
        for scope in list(self._scopes):
            items = self._scopes[scope]
            while items and next(iter(items.values())).expires <= now:
                items.popitem(last=False)
                self._total -= 1
            if not items:
                del self._scopes[scope]


class ResponseNotFound(NotFound):
    """OpenAI answers an unknown response id with a 404 of type invalid_request_error."""
