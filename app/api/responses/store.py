"""Recent responses, per API key, for ``previous_response_id`` and ``GET /v1/responses/{id}``
(RESPONSES_STORE_SIZE entries and RESPONSES_STORE_BYTES of them, for RESPONSES_STORE_TTL
seconds, in this replica)."""

from __future__ import annotations

import json
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
    size: int = 0  # bytes, as JSON: what it costs the store's byte budget


def json_size(*values: Any) -> int:
    """Bytes of ``values`` as compact JSON: what an entry holds, near enough (its strings,
    images' base64 and echoed tools included)."""
    return sum(len(json.dumps(v, ensure_ascii=False, separators=(",", ":"), default=str))
               for v in values)


class ResponseStore:
    """The most recent ``size`` responses of at most ``max_bytes`` in all, each for ``ttl``
    seconds, kept apart per API key (``scope``: reqctx.cache_scope(), as the prefix cache and
    resumable streams are): another key's id is the same 404 as an unknown one. Full (in
    count or in bytes), the store evicts the oldest response of the key holding the most (of
    what is over: responses or bytes; the writer's own on a tie), so one key storing many or
    large responses only ever evicts its own while another key holds less. A response larger
    than the whole byte budget is not kept. Read from request threads and written from the
    hub: a native lock guards it."""

    def __init__(self, size: int, ttl: float, clock: Callable[[], float] = time.monotonic,
                 max_bytes: int = 1 << 62):
        self.size = size
        self.ttl = ttl
        self.clock = clock
        self.max_bytes = max_bytes
        self._scopes: dict[str, OrderedDict[str, Stored]] = {}  # scope -> its LRU
        self._bytes: dict[str, int] = {}  # scope -> bytes its responses hold
        self._total = 0
        self._total_bytes = 0
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
        size = json_size(response, messages)
        with self._lock:
            self._expire()
            items = self._scopes.get(scope)
            if items is not None and rid in items:
                self._drop(scope, rid)
            if size > self.max_bytes:
                return
            items = self._scopes.setdefault(scope, OrderedDict())
            items[rid] = Stored(response, messages, self.clock() + self.ttl, size)
            self._bytes[scope] = self._bytes.get(scope, 0) + size
            self._total += 1
            self._total_bytes += size
            while self._total > self.size or self._total_bytes > self.max_bytes:
                held = (self._bytes.get if self._total_bytes > self.max_bytes
                        else lambda s: len(self._scopes[s]))
                victim = max(self._scopes, key=lambda s: (held(s), s == scope))
                self._drop(victim, next(iter(self._scopes[victim])))

    def _drop(self, scope: str, rid: str) -> None:
        items = self._scopes[scope]
        gone = items.pop(rid)
        self._total -= 1
        self._total_bytes -= gone.size
        self._bytes[scope] -= gone.size
        if not items:
            del self._scopes[scope]
            del self._bytes[scope]

    def get(self, scope: str, rid: str) -> Stored | None:
        with self._lock:
            self._expire()
            items = self._scopes.get(scope)
            return items.get(rid) if items is not None else None

    def delete(self, scope: str, rid: str) -> bool:
        with self._lock:
            self._expire()
            items = self._scopes.get(scope)
            if items is None or rid not in items:
                return False
            self._drop(scope, rid)
            return True

    def _expire(self) -> None:
        """Each key's LRU is in the order its responses were stored, so expiry stops at the
        first that is still fresh."""
        now = self.clock()
        for scope in list(self._scopes):
            items = self._scopes[scope]
            while scope in self._scopes and next(iter(items.values())).expires <= now:
                self._drop(scope, next(iter(items)))


class ResponseNotFound(NotFound):
    """OpenAI answers an unknown response id with a 404 of type invalid_request_error."""
