"""The scheduler's steps on the stand-in for llama.cpp (tests/support/fake_llama.py), which checks
after every step that each sequence's KV mirror is what its cells hold: drafts checked and their
rejected tails dropped, the same reply with speculation as without, images decoded into the
sequence and reused by digest, text injected, a failed decode, and the engine's own token count
(a sampled end-of-generation token counts; a stop string or max_tokens ends a reply with none).
KV reuse stays within an API key's scope."""

from __future__ import annotations

from typing import Any

from app.base.errors import ShuttingDown
from app.engine.llama_media import ImageSpan
from app.engine.prediction import Place, Prediction
from app.engine.scheduler import Features
from app.engine.slots import Job
from app.engine.speculative import SpecConfig
from app.engine.text import TextAssembler
from app.engine.types import Failed, Finished, GenerationRequest, TextPiece
from tests.support.fake_llama import EOG, Sampler, job, run, scheduler, step


def _text(events: list) -> str:
    return "".join(e.text for e in events if isinstance(e, TextPiece))


def _reply(spec: SpecConfig | None, predicted: str = "") -> tuple[str, Any]:
    """A reply beside another request's, and the counters."""
    prompt = [1, 2, 3, 4, 5, 6] * 4
    sched, ll = scheduler(parallel=2, chunk=32, features=Features(spec=spec))
    got: list = []
    j = job(prompt, ll, got, max_new=40, stop_after=99)
    if predicted:
        j.prediction = Place(Prediction([ord(c) - ord("a") for c in predicted]))
    sched.waiting.append(j)
    sched.waiting.append(job(prompt[:8], ll, [], max_new=40, stop_after=99))
    run(sched)  # the mirror checked after every step
    return _text(got), sched.stats


def test_drafts_are_checked_and_the_reply_is_what_it_is_without_them():
    plain, _ = _reply(None)
    assert len(plain) == 40
    # a prediction that is the reply but for an edit: most drafts kept, the reply unchanged
    edited = plain[:10] + "z" + plain[11:]
    own = SpecConfig(draft_max=8, draft_min=1, p_min=0.5, ngram=False, adaptive=False,
                     server=False)
    predicted, stats = _reply(own, edited)
    assert predicted == plain and stats.drafted > stats.accepted > 20


def test_an_image_is_decoded_into_the_sequence_and_reused_only_with_its_digest():
    def with_image(digest: str, sink: list) -> Job:
        tokens = [1, 2, -5, -5, -5, 3, 4]
        j = job(tokens, ll, sink, max_new=2, stop_after=9)
        j.images = [ImageSpan(2, 3, None, None, -5, 1, digest)]  # M-RoPE: one position
        return j

    sched, ll = scheduler(parallel=1, chunk=4, projector=True)
    projector = sched.features.projector
    first = with_image("a" * 64, [])
    sched.waiting.append(first)
    run(sched)
    assert projector.decoded == [(0, 2, 2)]  # after 2 tokens, at position 2
    assert sched.slots[0].kv.marks[0].digest == "a" * 64
    again = with_image("a" * 64, [])
    sched.waiting.append(again)
    run(sched)
    assert again.cached_tokens == 6 and len(projector.decoded) == 1  # the image reused
    other = with_image("b" * 64, [])  # the same 28-bit ids, another image
    sched.waiting.append(other)
    run(sched)
    assert other.cached_tokens == 2 and projector.decoded[-1] == (0, 2, 2)


def test_injected_text_is_sent_decoded_and_fed_to_the_sampler():
    sched, ll = scheduler(parallel=1)
    got: list = []
    j = job([1, 2, 3], ll, got, max_new=10, stop_after=99)
    sched.waiting.append(j)
    step(sched)
    j.control.inject("xy", b"")
    step(sched)
    assert "xy" in _text(got) and j.sampler.injected == [[23, 24]]
    assert list(sched.slots[0].kv.tokens[3:6])[1:] == [23, 24]  # after the last token
    j.control.inject("zz", b"x")  # the reply already has "x": dropped, not decoded
    before = len(_text(got))
    step(sched)
    assert "zz" not in _text(got)[before:] and not j.control.injecting


def test_a_failed_decode_ends_every_request_and_drops_the_kv():
    sched, ll = scheduler(parallel=2)
    got: list = []
    sched.waiting.append(job([1, 2, 3], ll, got, max_new=10, stop_after=99))
    sched.waiting.append(job([4, 5], ll, got, max_new=10, stop_after=99))
    step(sched)
    ll.fail_next = True
    step(sched)
    assert [type(e) for e in got[-2:]] == [Failed, Failed]
    assert not sched.busy() and all(len(s.kv) == 0 for s in sched.slots)


def _counted(tokens: list[int], stop: tuple[str, ...] = (), max_new: int = 8) -> Finished:
    """The scheduler's own count: ``tokens`` sampled in turn."""
    sched, ll = scheduler(parallel=1)
    got: list[Any] = []
    j = Job(GenerationRequest("x"), sink=got.append, tokens=[1], max_new=max_new,
            assembler=TextAssembler(stop), sampler=Sampler(ll, 99))  # type: ignore[arg-type]
    slot = sched.slots[0]
    slot.job = j
    for tok in tokens:
        if slot.job is None:
            break
        sched._on_token(slot, tok)
    end = got[-1]
    assert isinstance(end, Finished)
    assert all(isinstance(ev, TextPiece) for ev in got[:-1])
    return end


def test_the_engine_counts_a_sampled_end_token():
    assert (_counted([EOG]).reason, _counted([EOG]).completion_tokens) == ("stop", 1)
    end = _counted([0, 1, 0, EOG])
    assert (end.reason, end.completion_tokens) == ("stop", 4)
    cut = _counted([0, 1, 0, EOG], max_new=3)
    assert (cut.reason, cut.completion_tokens) == ("length", 3)
    stopped = _counted([0, 1, 0, EOG], stop=("b",))
    assert (stopped.reason, stopped.completion_tokens, stopped.stop_sequence) == ("stop", 2, "b")


def test_the_engine_reuses_kv_only_within_a_scope_and_fails_all_at_shutdown():
    sched, ll = scheduler(parallel=2, chunk=8, n_ctx=64)
    cached = list(range(1, 30))  # a prefix long enough to be worth copying to an empty slot

    def admit(scope: str) -> Job:
        j = Job(GenerationRequest("x", cache_scope=scope), sink=lambda ev: None,
                tokens=[*cached[:24], 9])
        sched.waiting.append(j)
        sched.admit()
        return j

    ll.hold(sched.slots[0], cached)
    sched.slots[0].scope = "a"
    assert admit("b").cached_tokens == 0
    for slot in sched.slots:
        sched.release(slot, keep_cache=False)
    ll.hold(sched.slots[0], cached)
    sched.slots[0].scope = "a"
    assert admit("a").cached_tokens == 24
    ll.check(sched)
    # the end of the graceful timeout: every running job gets its error, every slot is free
    got: list = []
    ended: list = []
    sched.on_job_end = ended.append
    running = Job(GenerationRequest("x"), sink=got.append, tokens=[1])
    sched.slots[1].job = running
    sched.fail_active(ShuttingDown("server is shutting down"))
    assert [type(e) for e in got] == [Failed] and running in ended
    assert not sched.busy()
