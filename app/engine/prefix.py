"""Which cached prefix a new prompt reuses, decided before anything is copied: the slot it goes
to, the slot or kept prompt whose cells it starts from, and how many tokens of them.

A pure decision over the slots' mirrors and the prompt cache's index (the scheduler then copies,
restores and trims: ``Scheduler.admit``). The rules, in order: KV is reused only within the
prompt's key scope and adapter set (``slots.reuse_rule``), never for a prompt being scored (it
needs logits where a reused prefix has none), never into an image (``slots.before_image``),
always leaving the prompt's last token to decode; under DETERMINISTIC only as far as the
cells were decoded as every run decodes them (``deterministic.Canon.reuse``). A kept prompt
(host RAM, or a file read ahead) is copied back only when it holds RELOCATE_MIN_TOKENS more
than the best slot, and, for a recurrent model, only whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.engine.deterministic import Canon
from app.engine.prompt_cache import Entry, PromptCache
from app.engine.slots import (
    RELOCATE_MIN_TOKENS,
    Job,
    Slot,
    before_image,
    cache_scope,
    place,
    reuse_rule,
)
from app.engine.tokens import common_prefix


@dataclass(frozen=True)
class Reuse:
    """Where a new prompt goes and what it starts from."""

    scope: str  # the prompt's key scope (slots.cache_scope): what it may reuse, and leaves
    slot: Slot  # the free slot the prompt takes
    source: Slot  # the slot whose cells hold the reused prefix (``slot`` itself, or one to copy)
    n_common: int  # tokens of ``source``'s cells reused
    entry: Entry | None  # a kept prompt to copy back instead (then ``n_entry`` of its tokens)
    n_entry: int


def choose(job: Job, slots: list[Slot], free: list[Slot], cache: PromptCache | None,
           canon: Canon | None) -> Reuse:
    """The reuse decision for ``job`` (``free``: the slots without a job)."""
    prompt = np.asarray(job.tokens, dtype=np.int32)
    scope = cache_scope(job.request)
    reuse = job.request.cache_prompt and job.request.params.prompt_logprobs is None
    wanted = [span.mark for span in job.images]
    may_reuse = reuse_rule(scope, job.request.lora)
    last = len(job.tokens) - 1
    shared = {id(s): min(common_prefix(s.kv.tokens, prompt, s.kv.marks, wanted), last)
              if reuse and may_reuse(s.scope) and s.follows is None else 0
              for s in slots}
    if canon is not None:
        shared = {id(s): canon.reuse(job, shared[id(s)], s.kv.canonical) for s in slots}
    slot, source = place(slots, free, shared)
    n_common = before_image(job, shared[id(source)])
    entry, n_entry = (cache.best(scope, prompt, wanted, also=job.preloaded)
                      if cache is not None and reuse else (None, 0))
    n_entry = before_image(job, min(n_entry, last))
    if canon is not None and entry is not None:  # kept whole: canonical throughout
        n_entry = canon.reuse(job, n_entry, len(entry.tokens))
    whole = cache is not None and cache.whole_only  # a recurrent model's memory
    if n_entry - n_common < RELOCATE_MIN_TOKENS or entry is not None and whole \
            and n_entry < len(entry.tokens):
        entry = None  # a slot holds about as much, or it would not be kept whole
    return Reuse(scope, slot, source, n_common, entry, n_entry)
