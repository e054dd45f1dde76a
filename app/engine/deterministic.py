"""DETERMINISTIC: the same bytes for the same request, whatever else the server runs.

llama.cpp's kernels compute a row differently with the shape of the micro-batch it is in:
the number of rows (the CPU's quantized matmuls change path at 8 rows for some types, a GPU's
at its own sizes), where a prompt's chunks start (flash attention's tiles), and which cells a
cached prefix was computed in (bench/RESULTS.md, "Deterministic mode"). So a sequence's
numbers stay the same only if every row of it is computed in the same micro-batch however the
server got there. This module makes that so, and ``Canon`` is what the scheduler asks:

- one sequence per decode: the slots with work take turns, a step each (``one``);
- a prompt is decoded in pieces that end at multiples of the chunk (PREFILL_CHUNK) or at an
  image, so a chunk holds the same tokens whether the prompt started from nothing or from a
  cached prefix (``step_plan.plan_step``'s ``align``);
- a sequence's leading cells decoded that way are its canonical ones (``KvSeq.canonical``):
  only they are reused by a later prompt (``reuse``), and a finished request's slot keeps only
  them (``keep``), so the prompt cache and prompt files hold nothing else.

Generated tokens are each decoded alone in a step of their own, the same in every run; a
prompt extending a conversation decodes them again as prompt (as a fresh server would).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.engine.slots import before_image

if TYPE_CHECKING:
    from app.engine.llama_media import ImageSpan
    from app.engine.slots import Job, Slot
    from app.engine.step_plan import Feed


@dataclass
class Canon:
    """The scheduler's deterministic rules, for prompts decoded in pieces of ``chunk``."""

    chunk: int
    # the sequence served last, per adapter set (a step serves one set: the sets' turns are
    # lora.next_set's, the slots' within a set are these)
    _turn: dict[object, int] = field(default_factory=dict)

    def one(self, generating: list[Slot], prefilling: list[Slot], lora: object = ()
            ) -> tuple[list[Slot], list[Slot]]:
        """The one slot this step serves: the next with work after the last served, by
        sequence id (round robin: a long prompt cannot starve the streams)."""
        busy = sorted([*generating, *prefilling], key=lambda s: s.seq_id)
        if not busy:
            return [], []
        turn = self._turn.get(lora, -1)
        pick = next((s for s in busy if s.seq_id > turn), busy[0])
        self._turn[lora] = pick.seq_id
        return ([pick], []) if pick in generating else ([], [pick])

    def reuse(self, job: Job, common: int, canonical: int) -> int:
        """Of a cached prefix ``common`` tokens long whose first ``canonical`` cells were
        decoded canonically, what ``job`` may reuse: up to a place where a fresh run of the job
        cuts its prompt too (a multiple of the chunk, or where one of its images starts or
        ends), never past the canonical cells nor inside an image. A canonical end at another
        prompt's image start is no such place for a prompt without that image."""
        n = min(common, canonical)
        if not self.cut(job, n):
            n -= n % self.chunk
        return before_image(job, n)

    def cut(self, job: Job, n: int) -> bool:
        """Whether every run of ``job`` cuts its prompt at token ``n``."""
        return n % self.chunk == 0 or any(n in (span.start, span.start + span.n)
                                          for span in job.images)

    def settle(self, feeds: Sequence[Feed]) -> None:
        """After a decode: a prompt piece that began at its sequence's canonical end and
        ended where every run cuts the prompt (``cut``) extends the canonical cells."""
        for f in feeds:
            kv, job = f.slot.kv, f.slot.job
            end = len(kv)
            if f.prompt and job is not None and kv.canonical == end - len(f.tokens) \
                    and self.cut(job, end):
                kv.canonical = end

    @staticmethod
    def settle_image(slot: Slot, span: ImageSpan) -> None:
        """After an image's decode: its cells are canonical when the cells before were (an
        image is decoded whole, from its own start, in every run)."""
        kv = slot.kv
        if kv.canonical == span.start and len(kv) == span.start + span.n:
            kv.canonical = len(kv)

    @staticmethod
    def keep(slot: Slot, job: Job) -> None:
        """A finished request's slot keeps its canonical cells only."""
        n = slot.kv.canonical
        if n < len(slot.kv):
            slot.kv.keep_first(n, job.pos_at(n))
