"""OpenAI streaming chunks and their SSE framing, as pure functions.

The termination semantics (``[DONE]`` or not, role chunk content, usage chunk, what follows an
error) are one small policy object; the writer asks it what to send and nothing else branches on
a profile.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Literal

from app.base.errors import BadRequest, ServiceError
from app.protocol.openai import SYSTEM_FINGERPRINT, error_body, usage

DONE = b"data: [DONE]\n\n"
HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


def frame(obj: dict[str, Any]) -> bytes:
    """One SSE data event holding one compact JSON object."""
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def comment(text: str = "ping") -> bytes:
    """An SSE comment: a heartbeat that no client parses as data."""
    return f": {text}\n\n".encode()


def event(name: str, obj: dict[str, Any]) -> bytes:
    """A named SSE event (for /models/sse, not for OpenAI streams)."""
    return f"event: {name}\n".encode() + frame(obj)


def model_status(snapshot: dict[str, Any], model: str | None) -> dict[str, Any]:
    """The ``model_status`` event body for a load-state snapshot."""
    stage = snapshot["stage"]
    body = {"status": {"ready": "loaded", "failed": "failed"}.get(stage, "loading"), "stage": stage}
    body.update({k: snapshot[k] for k in ("progress", "detail", "error", "elapsed_s") if k in snapshot})
    if model is not None:
        body["model"] = model
    return body


@dataclass(frozen=True)
class StreamPolicy:
    """How a stream starts and ends: built once from settings, adjusted per request."""

    send_done: bool = True
    done_after_error: bool = True
    role_content: Literal["empty", "null"] = "empty"
    always_usage: bool = False
    heartbeat_seconds: float = 0.0

    def with_done_header(self, value: str | None) -> StreamPolicy:
        """Apply a request's ``X-Stream-Done: 1|0`` header."""
        if value is None:
            return self
        v = value.strip().lower()
        if v in {"1", "true", "yes"}:
            return replace(self, send_done=True)
        if v in {"0", "false", "no"}:
            return replace(self, send_done=False)
        raise BadRequest(f"X-Stream-Done must be 1 or 0, not {value!r}", param="X-Stream-Done")


PROFILES: dict[str, StreamPolicy] = {
    # What OpenAI sends, and what benchmark tools and SDKs are written against.
    "openai": StreamPolicy(heartbeat_seconds=15.0),
    # No [DONE]: the stream ends when the response closes.
    "strict": StreamPolicy(send_done=False, done_after_error=False, heartbeat_seconds=15.0),
    # What llama-server sends: role chunk content null, usage chunk always, no [DONE] after an
    # error event.
    "llama.cpp": StreamPolicy(
        done_after_error=False, role_content="null", always_usage=True, heartbeat_seconds=15.0
    ),
}


def policy_from(
    profile: str,
    *,
    send_done: bool | None = None,
    done_after_error: bool | None = None,
    role_content: Literal["empty", "null"] | None = None,
    always_usage: bool | None = None,
    heartbeat_seconds: float | None = None,
) -> StreamPolicy:
    """The named profile with any individual settings that were given laid over it."""
    overrides = {
        "send_done": send_done,
        "done_after_error": done_after_error,
        "role_content": role_content,
        "always_usage": always_usage,
        "heartbeat_seconds": heartbeat_seconds,
    }
    return replace(PROFILES[profile], **{k: v for k, v in overrides.items() if v is not None})


def policy_of(settings: Any) -> StreamPolicy:
    """The configured STREAM_PROFILE with any individual STREAM_* settings laid over it."""
    return policy_from(
        settings.stream_profile,
        send_done=settings.stream_done,
        done_after_error=settings.stream_done_after_error,
        role_content=settings.stream_role_content,
        always_usage=settings.stream_always_usage,
        heartbeat_seconds=settings.stream_heartbeat_seconds,
    )


class ChunkWriter:
    """Builds the SSE bytes of one streamed response (all its choices), piece by piece. It takes
    plain values (a choice's index, text, finish reason, token counts), not any layer's event
    objects: the API adapter reads its core events and says what to write."""

    def __init__(
        self,
        kind: Literal["chat", "completion"],
        rid: str,
        created: int,
        model: str,
        policy: StreamPolicy,
        *,
        include_usage: bool = False,
        continuous_usage: bool = False,
        prompt_tokens: int = 0,
        n: int = 1,
    ):
        self.kind = kind
        self.policy = policy
        self.include_usage = include_usage or policy.always_usage
        self.continuous_usage = continuous_usage
        self.prompt_tokens = prompt_tokens
        self.n = n
        self._tokens = [0] * n  # completion tokens per choice
        self._finished: set[int] = set()  # the choices that have ended
        self.id = rid
        self._base = {
            "id": rid,
            "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
            "created": created,
            "model": model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }

    def _chunk(self, choice: dict[str, Any] | None,
               timings: dict[str, Any] | None = None) -> bytes:
        obj = dict(self._base)
        obj["choices"] = [choice] if choice is not None else []
        if timings is not None:
            obj["timings"] = timings
        if self.continuous_usage:
            obj["usage"] = usage(self.prompt_tokens, self.completion_tokens)
        elif self.include_usage:
            obj["usage"] = None
        return frame(obj)

    @property
    def completion_tokens(self) -> int:
        return sum(self._tokens)

    @property
    def all_finished(self) -> bool:
        return len(self._finished) == self.n

    def _choice(
        self, content: str | None, finish: str | None, role: bool = False, index: int = 0,
        logprobs: dict[str, Any] | None = None,
    ) -> dict:
        if self.kind == "completion":
            return {"index": index, "text": content or "", "logprobs": logprobs,
                    "finish_reason": finish}
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
            delta["content"] = None if self.policy.role_content == "null" else ""
        elif content is not None:
            delta["content"] = content
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    def start(self) -> list[bytes]:
        """The role chunk of every choice (chat only): role is sent once per choice, first."""
        if self.kind == "chat":
            return [self._chunk(self._choice(None, None, role=True, index=i)) for i in range(self.n)]
        return []

    def count(self, index: int, completion_tokens: int) -> None:
        self._tokens[index] = completion_tokens

    def delta(self, index: int, delta: dict[str, Any],
              logprobs: dict[str, Any] | None = None) -> bytes:
        """A chunk with a ready-made delta (tool calls, content parsed out of tool JSON), and
        the ``logprobs`` of the tokens it carries when they were asked for."""
        return self._chunk({"index": index, "delta": delta, "logprobs": logprobs,
                            "finish_reason": None})

    def text(self, index: int, text: str, logprobs: dict[str, Any] | None = None) -> list[bytes]:
        """A choice's next text (its token count is kept by ``count``); a chunk with no text
        still goes out when it carries ``logprobs``."""
        if not text and logprobs is None:
            return []
        return [self._chunk(self._choice(text, None, index=index, logprobs=logprobs))]

    def finish(self, index: int, reason: str, completion_tokens: int,
               cached_tokens: int = 0, logprobs: dict[str, Any] | None = None,
               timings: dict[str, Any] | None = None,
               predicted: tuple[int, int] | None = None) -> list[bytes]:
        """A choice's finish chunk (with the ``logprobs`` of tokens no chunk carried yet, and
        llama-server's ``timings`` on the last); after the last choice, the usage chunk (with
        ``cached_tokens``: the prompt tokens the cache served) and [DONE]."""
        self._tokens[index] = completion_tokens
        self._finished.add(index)
        out = [self._chunk(self._choice(None, reason, index=index, logprobs=logprobs),
                           timings)]
        if not self.all_finished:
            return out
        if self.include_usage:
            obj = dict(self._base)
            obj["choices"] = []
            obj["usage"] = usage(self.prompt_tokens, self.completion_tokens, cached_tokens,
                                 predicted)
            out.append(frame(obj))
        if self.policy.send_done:
            out.append(DONE)
        return out

    def error(self, err: ServiceError) -> list[bytes]:
        out = [frame(error_body(err))]
        if self.policy.send_done and self.policy.done_after_error:
            out.append(DONE)
        return out
