"""Turning generated token bytes into text a client may see.

Two jobs, both incremental and pure: never emit half of a multi-byte UTF-8 character, and never
emit any part of a stop string (which may span several tokens).
"""

from __future__ import annotations

import codecs


def held_suffix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that could be the start of one of ``stops`` (a
    stop string, a tag): the part to hold back until the next piece says what it is."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best


class TextAssembler:
    """Feeds token bytes, returns text that is safe to emit."""

    def __init__(self, stops: tuple[str, ...] = ()):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = tuple(s for s in stops if s)
        self._pending = ""
        self.stopped = False
        self.stopped_by: str | None = None  # the stop string that ended the text

    def feed(self, data: bytes) -> str:
        """Add bytes; return what can be emitted now. Sets ``stopped`` on a stop string."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(data)
        if not self._stops:
            out, self._pending = self._pending, ""
            return out
        cut = -1
        for stop in self._stops:
            i = self._pending.find(stop)
            if i != -1 and (cut == -1 or i < cut):
                cut, self.stopped_by = i, stop
        if cut != -1:
            out = self._pending[:cut]
            self._pending = ""
            self.stopped = True
            return out
        keep = held_suffix(self._pending, self._stops)
        split = len(self._pending) - keep
        out, self._pending = self._pending[:split], self._pending[split:]
        return out

    def flush(self) -> str:
        """Everything still held, at the end of generation.

        A character cut in half by the end of generation (max_tokens reached mid-character) is
        dropped rather than sent as U+FFFD: the client never sees a broken character.
        """
        if self.stopped:
            return ""
        out = self._pending
        self._pending = ""
        self._decoder.reset()
        return out
