"""How streams start and end: one small policy built once from the settings (STREAM_PROFILE and
the STREAM_* settings laid over it), adjusted per request. OpenAI's chunk writer asks it
everything (``[DONE]`` or not, the role chunk's content, the usage chunk, what follows an
error), and every API's stream its heartbeat; nothing else branches on a profile.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from app.base.errors import BadRequest


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
