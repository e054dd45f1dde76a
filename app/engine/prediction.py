"""Predicted Outputs (OpenAI's ``prediction``): the text a reply is expected to repeat, as the
drafts of speculative decoding, and where each choice's reply stands in it.

The prediction is tokenized and indexed once, on a prep thread (``Prediction``). Each choice
follows it with a ``Place`` of its own: while the reply repeats the prediction the place moves
along with it; where the reply leaves it (an edit), the place is lost until the reply's last
tokens are found in the prediction again. The drafts are checked like any other
(app.engine.speculative), so the reply is what it would have been without a prediction.
"""

from __future__ import annotations

import numpy as np

from app.engine.tokens import common_prefix

# where the reply has left the prediction, the longest of its last tokens (of these lengths)
# found in the prediction says where it stands in it again
SYNC = (8, 4, 3, 2)


class Prediction:
    """A request's prediction: its tokens, and where each pair of adjacent tokens stands in
    it, sorted, so that finding a reply's place again costs the engine thread a binary search
    and a few short compares, not a scan. Shared by the request's choices; never changed."""

    CHECK = 32  # candidate places checked per direction, at most

    def __init__(self, tokens: list[int]):
        self.tokens = tokens
        arr = np.asarray(tokens, dtype=np.int64)
        self._base = int(arr.max()) + 1 if len(arr) else 1
        keys = arr[:-1] * self._base + arr[1:]
        order = np.argsort(keys, kind="stable")  # a pair's places stay in ascending order
        self._keys = keys[order]
        self._ends = order + 2  # where each pair ends

    def __len__(self) -> int:
        return len(self.tokens)

    def find(self, generated: list[int], near: int) -> tuple[int, int]:
        """Where the reply goes on in the prediction, and how many of its last tokens said so:
        the end of an occurrence of its longest last tokens (SYNC), the nearest one at or
        after ``near`` first, else the nearest before it; (-1, 0) where none occurs."""
        if len(generated) < 2 or max(generated[-2:]) >= self._base:
            return -1, 0
        key = generated[-2] * self._base + generated[-1]
        lo, hi = np.searchsorted(self._keys, [key, key + 1])
        if lo == hi:  # its last two tokens are nowhere in it: no longer suffix is either
            return -1, 0
        ends = self._ends[lo:hi]
        i = int(np.searchsorted(ends, near))
        candidates = [*ends[i:i + self.CHECK].tolist(),
                      *ends[max(0, i - self.CHECK):i][::-1].tolist()]
        for size in SYNC:
            if len(generated) < size:
                continue
            suffix = generated[-size:]
            for end in candidates:
                if end >= size and self.tokens[end - size:end] == suffix:
                    return end, size
        return -1, 0


class Place:
    """Where one choice's reply stands in its request's prediction: the index of the token
    expected next (while lost, the last place known), whether it is lost, how many generated
    tokens were checked and how many of those are counted, and how many were the
    prediction's (``matched``: OpenAI's accepted prediction tokens)."""

    def __init__(self, prediction: Prediction):
        self.prediction = prediction
        self.at = 0
        self.lost = False
        self.seen = 0
        self.counted = 0
        self.matched = 0

    def draft(self, generated: list[int], n_max: int) -> list[int]:
        """The prediction's next ``n_max`` tokens after where the reply (``generated``, its
        tokens so far) stands in it; none while its place is lost."""
        self.follow(generated)
        return [] if self.lost else self.prediction.tokens[self.at:self.at + n_max]

    def follow(self, generated: list[int]) -> None:
        """Move the place past the tokens generated since the last call. Tokens that repeat
        the prediction count as its; where the reply leaves it, the place is lost until the
        reply's last tokens are found in it again (``Prediction.find``), and the tokens that
        found it, and were not counted yet, count too."""
        pred = self.prediction
        new = generated[self.seen:]
        if not self.lost:
            k = common_prefix(pred.tokens[self.at:self.at + len(new)], new)
            self.at += k
            self.matched += k
            if k == len(new):
                self.seen = self.counted = len(generated)
                return
            self.counted = self.seen + k  # the tokens after these are not the prediction's
            self.lost = True
        at, size = pred.find(generated, self.at)
        if at >= 0:
            self.matched += min(size, len(generated) - self.counted)
            self.counted = len(generated)
            self.at, self.lost = at, False
        self.seen = len(generated)

    def usage(self) -> tuple[int, int]:
        """(the prediction's tokens, of them the reply's), for the request's usage."""
        return len(self.prediction), min(self.matched, len(self.prediction))

    def accepted_rejected(self) -> tuple[int, int]:
        """OpenAI's accepted and rejected prediction tokens: those the reply followed, and the
        rest of them."""
        total, accepted = self.usage()
        return accepted, total - accepted
