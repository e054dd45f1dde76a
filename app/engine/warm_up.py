"""What a load runs before the model is declared ready, and again after each idle sleep: the
first burst's work done once (``warm_up``), then the chat template's opening left in the KV cache
(``prime``). Both run on the engine thread, through the engine's own queue and steps: ``enter``
puts a job in (prepared, counted, waiting) and ``step`` runs one engine step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from app.base.errors import ModelLoadError
from app.engine.llama_vocab import Tokenizer
from app.engine.scheduler import Scheduler
from app.engine.slots import PUBLIC, Job
from app.engine.types import Event, Failed, Finished, GenerationRequest, SamplingParams

log = logging.getLogger(__name__)


def warm_up(sched: Scheduler, tok: Tokenizer, parallel: int, prefill_chunk: int,
            enter: Callable[[Job], None], step: Callable[[], object],
            light: bool = False) -> None:
    """Run what the first burst of requests will: a full prefill chunk, then every slot
    generating in one batch (llama.cpp sizes its buffers and the OS maps the KV cache's pages
    on first use, which the first burst paid for before). ``light`` (WARM_UP=light, and a
    model loaded on demand): one short prompt and one token, which proves the model
    generates and leaves the rest to the request waiting for it. Its KV is dropped after: no
    prompt will reuse it. Raises ModelLoadError when it fails."""
    events: list[Event] = []
    # a prompt must leave room in its slot's context for the 4 tokens it generates: a
    # PREFILL_CHUNK larger than CTX_SIZE is a valid setting (the chunk is a step's budget
    # across slots), and once made the warm-up itself overflow and the load fail
    room = max(1, sched.n_ctx - 8)
    size = min(2 if light else prefill_chunk, room)
    text = "The quick brown fox jumps over the lazy dog. " * (size // 4 + 1)
    long = tok.tokens(text, add_bos=tok.add_bos)[:size]
    jobs = []
    for i in range(1 if light else parallel):
        prompt = tuple(long) if i == 0 else tuple(long[: min(8 + i, room)])
        # the last slot samples under a grammar, through its slow path: the first grammar
        # request after ready then pays no first-use cost (imports, buffers) of its own
        grammar = '"zq" [a-z]*' if i == parallel - 1 and not light else None
        params = SamplingParams(max_tokens=1 if light else 4, temperature=0.0,
                                grammar=f"root ::= {grammar}" if grammar else None)
        job = Job(request=GenerationRequest(prompt, params, cache_prompt=False),
                  sink=events.append)
        enter(job)
        jobs.append(job)
    for _ in range(100 + 4 * len(jobs)):
        step()
        if all(j.done for j in jobs):
            break
    failed = [e for e in events if isinstance(e, Failed)]
    if failed:
        raise ModelLoadError(f"warm-up generation failed: {failed[0].error.message}")
    if sum(isinstance(e, Finished) for e in events) != len(jobs):
        raise ModelLoadError("warm-up generation did not finish")
    sched.clear_kv()  # the warm-up text is no prefix anyone will reuse


def prime(opening: Callable[[], str | None], enter: Callable[[Job], None],
          step: Callable[[], object]) -> None:
    """Decode the text every chat starts with (``opening()``, the chat template's) into one
    slot and leave it there: later requests reuse it from the KV cache, and without this the
    first burst after ready decoded it once per request (2-3x its TTFT). Best effort: a
    template that cannot say its opening, or a failure, primes nothing."""
    try:
        text = opening()
        if not text:
            return
        events: list[Event] = []
        job = Job(request=GenerationRequest(text, SamplingParams(max_tokens=0),
                                            cache_scope=PUBLIC), sink=events.append)
        enter(job)
        for _ in range(100 + len(job.tokens)):  # bounded: chunks of PREFILL_CHUNK
            step()
            if job.done:
                break
        if not any(isinstance(e, Finished) for e in events):
            log.warning("could not decode the chat template's opening at load: %s", events)
    except Exception:  # noqa: BLE001 - an optimisation: the model serves without it
        log.exception("could not decode the chat template's opening at load")
