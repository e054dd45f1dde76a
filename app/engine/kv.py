"""One sequence's KV cache and the mirror of what it holds, changed together in one place.

The scheduler reuses a slot's KV for the next prompt that shares its prefix, so it must know
exactly which tokens (and which images, by digest) each sequence's cells hold. llama.cpp's own
server keeps that list private to its ``server_tokens`` for the same reason: "disallow accessing
these members directly, risking out-of-sync". Every change to a sequence's cells goes through a
``KvSeq`` method that changes the mirror with it, so between steps ``tokens`` is exactly what
the cells hold (tests/support/fake_llama.py checks it after every step). Within a step, a
draft being checked has cells past the mirror (``drafted``) until it is settled.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from app.engine.tokens import Mark

if TYPE_CHECKING:
    from app.engine.llama_media import ImageSpan


class KvShadow(Protocol):
    """A second memory that follows the sequences' cells (the MTP head's, app.engine.mtp):
    told of every edit that is not a decode."""

    def cut(self, seq: int, pos: int) -> None: ...  # cells from ``pos`` on dropped (0: all)

    def copied(self, src: int, dst: int) -> None: ...

    def lose(self, seq: int) -> None: ...  # cells it cannot follow (an image, a restore)


class KvSeq:
    """Sequence ``seq_id`` of a context's memory: its cells, the tokens they hold, the images
    among them, and the position its next token takes."""

    __slots__ = ("_ll", "_mem", "seq_id", "_tokens", "_marks", "n_pos", "_drafted", "canonical",
                 "shadow")

    def __init__(self, ll: Any, mem: Any, seq_id: int, shadow: KvShadow | None = None):
        self._ll, self._mem, self.seq_id = ll, mem, seq_id
        self.shadow = shadow
        self._tokens: list[int] = []
        self._marks: list[Mark] = []  # the images among the tokens, by full digest
        # the position the next token takes: the token count, except after an image of a
        # projector that places image tokens in 2-D (M-RoPE), which moves it by fewer
        self.n_pos = 0
        self._drafted = 0  # cells past the mirror: a draft decoded and not yet settled
        # DETERMINISTIC: the leading cells decoded in the micro-batches every run decodes them
        # in (app.engine.deterministic); the only ones a later prompt reuses
        self.canonical = 0

    @property
    def tokens(self) -> Sequence[int]:
        """The tokens the cells hold, in order (an image as its placeholder ids). Read only."""
        return self._tokens

    @property
    def marks(self) -> Sequence[Mark]:
        return self._marks

    @property
    def drafted(self) -> int:
        """Drafted cells past the mirror (0 between steps)."""
        return self._drafted

    def __len__(self) -> int:
        return len(self._tokens)

    def decoded(self, tokens: Sequence[int], drafted: int = 0) -> None:
        """``tokens`` were just decoded into the cells, from position ``n_pos`` on, and after
        them ``drafted`` tokens of a draft, which join the mirror only as they are kept."""
        self._tokens.extend(tokens)
        self.n_pos += len(tokens)
        self._drafted = drafted

    def draft_kept(self, token: int) -> None:
        """The next drafted cell is kept: the model sampled its token too."""
        assert self._drafted > 0
        self._tokens.append(token)
        self.n_pos += 1
        self._drafted -= 1

    def decoded_image(self, span: ImageSpan, after: int) -> None:
        """An image was just decoded into the cells; ``after``: the position after it."""
        self._tokens.extend([span.placeholder] * span.n)
        self._marks.append(span.mark)
        self.n_pos = after
        if self.shadow is not None:
            self.shadow.lose(self.seq_id)

    def keep_first(self, n: int, pos: int) -> int:
        """Keep the first ``n`` tokens (never the inside of an image: ``slots.before_image``
        cuts there), the next one at ``pos``; how many are kept: 0 when this model's memory
        cannot drop a suffix (a recurrent one), which then starts afresh."""
        if n < len(self._tokens) and not self._ll.llama_memory_seq_rm(
                self._mem, self.seq_id, pos, -1):
            self.clear()
            return 0
        if n < len(self._tokens) and self.shadow is not None:
            self.shadow.cut(self.seq_id, pos)
        del self._tokens[n:]
        self._marks = [m for m in self._marks if m.start + m.n <= n]
        self.n_pos = pos
        self.canonical = min(self.canonical, n)
        return n

    def clear(self) -> None:
        """Drop every cell."""
        self._ll.llama_memory_seq_rm(self._mem, self.seq_id, -1, -1)
        if self.shadow is not None:
            self.shadow.cut(self.seq_id, 0)
        self.freed()

    def copy_from(self, other: KvSeq) -> None:
        """The cells become a copy of ``other``'s (a whole stream: a memory copy)."""
        self._ll.llama_memory_seq_cp(self._mem, other.seq_id, self.seq_id, -1, -1)
        if self.shadow is not None:
            self.shadow.copied(other.seq_id, self.seq_id)
        self._tokens, self._marks = list(other._tokens), list(other._marks)
        self.n_pos = other.n_pos
        self.canonical = other.canonical

    def snapshot(self, ctx: Any) -> Any | None:
        """A copy of the cells (``llama_state_seq_get_data``: a ctypes byte array), to be put
        back with ``restore``, here or in another sequence of the same context; None if
        llama.cpp could not copy them."""
        assert not self._drafted
        size = self._ll.llama_state_seq_get_size(ctx, self.seq_id)
        if size <= 0:
            return None
        blob = (ctypes.c_uint8 * size)()
        if self._ll.llama_state_seq_get_data(ctx, blob, size, self.seq_id) != size:
            return None
        return blob

    def restore(self, ctx: Any, blob: Any, tokens: Sequence[int], marks: Sequence[Mark],
                n_pos: int) -> bool:
        """The cells become those ``snapshot`` copied (holding ``tokens``, ``marks``, the next
        position ``n_pos``). False if llama.cpp refused the blob: the cells are then empty
        (llama.cpp clears the sequence when a restore fails)."""
        self.clear()
        ll, mem, seq = self._ll, self._mem, self.seq_id
        # a blob whose checksums hold may still not be what its file says (written by anyone
        # who can write the folder): its cells must start at 0 and end just before the next
        # position (before it, after an M-RoPE image, whose cells share positions), or the
        # next decode would fail every request in flight
        ok = bool(ll.llama_state_seq_set_data(ctx, blob, len(blob), seq)) and len(tokens) > 0
        if ok:
            last = ll.llama_memory_seq_pos_max(mem, seq)
            ok = (last == n_pos - 1 if tokens[-1] >= 0 else 0 <= last < n_pos) \
                and ll.llama_memory_seq_pos_min(mem, seq) == 0
        if not ok:
            self.clear()
            return False
        self._tokens, self._marks = np.asarray(tokens, dtype=np.int32).tolist(), list(marks)
        self.n_pos = n_pos
        # kept only as a deterministic server keeps them (a file's identity says which)
        self.canonical = len(self._tokens)
        if self.shadow is not None:
            self.shadow.lose(seq)
        return True

    def drop_draft(self) -> None:
        """Drop the cells past the mirror, if any: the drafted tail the model did not keep."""
        if self._drafted:
            self._ll.llama_memory_seq_rm(self._mem, self.seq_id, self.n_pos, -1)
            self._drafted = 0
            if self.shadow is not None:
                self.shadow.cut(self.seq_id, self.n_pos)

    def freed(self) -> None:
        """The cells are gone (cleared, or the context freed): the mirror is empty."""
        self._tokens.clear()
        self._marks = []
        self.n_pos = 0
        self._drafted = 0
        self.canonical = 0
