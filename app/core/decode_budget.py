"""Memory for decoding images, bounded per worker (IMAGE_DECODE_BUDGET), not per image.

IMAGE_MAX_PIXELS bounds one image; but the prep pool decodes several requests' images at once,
and a 186 KB PNG can inflate to hundreds of MB. Each decode takes its estimated bytes from this
budget before Pillow allocates them and gives them back when done, so a burst of such images
waits its turn (or gets a 429 once it has waited its share of PREPARE_TIMEOUT) instead of
pushing the worker into the out-of-memory killer.

Decodes run on the prep pool's native threads, so the lock is the original ``_thread`` one and
the wait sleeps the thread, never a greenlet (app.base.bridge).
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Iterator

from app.base.bridge import allocate_lock, original_sleep
from app.base.errors import QueueFull

_POLL = 0.01  # seconds between looks at the budget while waiting (rare: only past the budget)
# glibc keeps what a thread frees in that thread's arena: five large decodes on five prep threads,
# one after another, left five decodes' worth resident (+1 GB). A decode this large gives its
# memory back to the system when it ends (malloc_trim walks every arena).
_TRIM_AT = 32 * 1024 * 1024


class DecodeBudget:
    """Bytes of decoded pixels in flight across one worker's prep threads."""

    def __init__(self, limit: int, wait: float) -> None:
        self.limit = limit
        self.wait = wait  # seconds a decode may wait for room before its request gets a 429
        self._lock = allocate_lock()
        self.used = 0
        self.peak = 0  # the most ever in flight (what the tests read)

    @contextlib.contextmanager
    def hold(self, cost: int, param: str) -> Iterator[None]:
        """Take ``cost`` bytes (at most the whole budget: one image alone always decodes) for
        the duration of the block."""
        cost = max(1, min(cost, self.limit))
        deadline = time.monotonic() + self.wait
        while not self._take(cost):
            if time.monotonic() >= deadline:
                raise QueueFull(
                    f"too many images are being decoded at once (IMAGE_DECODE_BUDGET of "
                    f"{self.limit} bytes in flight): retry", param=param)
            original_sleep(_POLL)
        try:
            yield
        finally:
            if cost >= _TRIM_AT:
                _trim()  # before the next decode may start: its memory goes back, not to an arena
            with self._lock:
                self.used -= cost

    def _take(self, cost: int) -> bool:
        with self._lock:
            if self.used + cost > self.limit:
                return False
            self.used += cost
            self.peak = max(self.peak, self.used)
            return True


def _trim() -> None:
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc: nothing to trim
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None

# bytes per pixel as Pillow holds a mode in memory: one-byte modes, 16-bit grey, and every
# other mode (multi-band, 32-bit) in four bytes a pixel
_ONE_BYTE = frozenset({"1", "L", "P"})


def decode_cost(mode: str, width: int, height: int) -> int:
    """What decoding an image of ``mode`` and size costs in memory, with its RGB copy."""
    per = 1 if mode in _ONE_BYTE else 2 if mode.startswith("I;16") else 4
    rgb = 0 if mode == "RGB" else 4  # convert("RGB") makes a second full-size image
    return width * height * (per + rgb)
