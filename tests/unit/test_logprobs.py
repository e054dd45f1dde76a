"""Log probabilities, unit by unit: the scoring of one logits row against numpy's own log-softmax,
the wire shapes (the legacy object, chat entries, prompt text offsets), and the scheduler's
scoring on a stand-in for llama.cpp: a prompt scored in decodes of its own within the step's row
budget over several steps beside a stream, its scores sent once before any text, no prefix reuse
for it, max_tokens 0 sampling nothing, and generated tokens' scores riding on the pieces they
made."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.logprobs import FLOOR, STEP_LOGITS, rows_per_step, score
from app.engine.types import Finished, PromptScored, TextPiece, TokenScore
from app.protocol import logprobs as wire
from tests.support.fake_llama import EOG, N, Tables, job, row_at, run, scheduler


def log_softmax(row: np.ndarray) -> np.ndarray:
    x = row.astype(np.float64)
    return x - np.log(np.exp(x - x.max()).sum()) - x.max()


# ---- one row -----------------------------------------------------------------------------------


@pytest.mark.parametrize("top_n", [0, 1, 3, 20])
def test_a_row_scores_as_numpy_says(top_n):
    rng = np.random.default_rng(top_n)
    row = (rng.standard_normal(N) * 4).astype(np.float32)
    want = log_softmax(row)
    for tok in (0, 7, EOG):
        s = score(row, tok, top_n, Tables, offset=5)
        assert s.token == tok and s.piece == Tables.piece(tok) and s.offset == 5
        assert s.logprob == pytest.approx(want[tok], abs=1e-6)
        best = list(np.argsort(-want, kind="stable")[: min(top_n, N)])
        assert [t for t, _, _ in s.top] == best
        assert [lp for _, _, lp in s.top] == pytest.approx([want[t] for t in best], abs=1e-6)
        assert all(p == Tables.piece(t) for t, p, _ in s.top)
        # the token's own value and its value among the alternatives are the same float
        assert all(lp == s.logprob for t, _, lp in s.top if t == tok)


def test_no_probability_at_all_is_the_floor_not_minus_infinity():
    row = np.zeros(N, dtype=np.float32)
    row[3] = -np.inf
    s = score(row, 3, 2, Tables)
    assert s.logprob == FLOOR
    assert np.isfinite([lp for _, _, lp in s.top]).all()


def test_rows_per_step_bounds_the_logits_of_a_step():
    assert rows_per_step(49152, 256) == STEP_LOGITS // 49152 == 85
    assert rows_per_step(32000, 64) == 64  # never more than a prompt chunk
    assert rows_per_step(1 << 23, 256) == 1  # at least one
    for vocab in (32000, 151936, 262144):
        assert rows_per_step(vocab, 512) * vocab <= STEP_LOGITS


# ---- wire shapes -------------------------------------------------------------------------------


def ts(tok: int, lp: float | None, top: tuple = (), offset: int = 0, piece: bytes | None = None
       ) -> TokenScore:
    return TokenScore(tok, Tables.piece(tok) if piece is None else piece, lp, top, offset)


def test_the_legacy_object_has_the_token_among_its_alternatives():
    first = ts(1, None)
    alt = ts(2, -0.5, top=((3, b"d", -0.25),))  # the token itself is not among the top 1
    top = ts(4, -0.1, top=((4, b"e", -0.1),))
    out = wire.legacy([first, alt, top], [0, 1, 2])
    assert out == {
        "tokens": ["b", "c", "e"],
        "token_logprobs": [None, -0.5, -0.1],
        "top_logprobs": [None, {"d": -0.25, "c": -0.5}, {"e": -0.1}],
        "text_offset": [0, 1, 2],
    }
    named = wire.legacy([alt], [7], as_ids=True)
    assert named["tokens"] == ["token_id:2"]
    assert named["top_logprobs"] == [{"token_id:3": -0.25, "token_id:2": -0.5}]


def test_chat_entries_keep_the_exact_bytes():
    half = ts(5, -1.0, top=((5, b"\xc3", -1.0), (6, b"x", -2.0)), piece=b"\xc3")
    entry = wire.chat_entry(half)
    assert entry == {"token": "\ufffd", "logprob": -1.0, "bytes": [0xC3], "top_logprobs": [
        {"token": "\ufffd", "logprob": -1.0, "bytes": [0xC3]},
        {"token": "x", "logprob": -2.0, "bytes": [120]}]}
    assert wire.chat_logprobs([half], as_ids=True)["content"][0]["token"] == "token_id:5"
    assert wire.chat_logprobs([])["refusal"] is None


@pytest.mark.parametrize(("text", "pieces", "offsets"), [
    ("Hello world", [b"Hello", b" world"], [0, 5]),
    # a BOS the tokenizer added is not in the text: it takes no room
    ("Hello world", [b"<s>", b"Hello", b" world"], [0, 0, 5]),
    # SentencePiece's leading space on the first word
    ("Hello world", [b" Hello", b" world"], [0, 5]),
    # a character split over two tokens: the second starts after the character's first byte
    ("é!", [b"\xc3", b"\xa9", b"!"], [0, 1, 1]),
    ("<|im_start|>hi", [b"<|im_start|>", b"hi"], [0, 12]),
])
def test_prompt_offsets(text, pieces, offsets):
    scores = [TokenScore(i, p, None if i == 0 else -1.0) for i, p in enumerate(pieces)]
    assert wire.prompt_offsets(scores, text) == offsets


def test_generated_offsets_start_after_the_echo():
    assert wire.generated_offsets([ts(1, -1.0, offset=0), ts(2, -1.0, offset=3)], 10) == [10, 13]


# ---- the scheduler -----------------------------------------------------------------------------


def test_a_prompt_is_scored_within_the_step_budget_beside_a_stream():
    sched, ll = scheduler(rows=4)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    scored: list = []
    other: list = []
    sched.waiting.append(job([7, 7], ll, other, max_new=12, stop_after=99, logprobs=1))
    sched.waiting.append(job(prompt, ll, scored, max_new=2, stop_after=9, prompt_logprobs=2,
                             logprobs=0))
    run(sched)
    # the prompt being scored (seq 1) is decoded alone, at most 4 positions per decode, so its
    # scores do not depend on the other sequence; the other generates in decodes of its own
    scoring = [d for d in ll.flagged if any(seq == 1 and pos < len(prompt) for seq, pos in d)]
    assert len(scoring) == 3 and all(len(d) <= 4 and {seq for seq, _ in d} == {1}
                                     for d in scoring)
    assert sorted(pos for d in scoring for _, pos in d) == list(range(len(prompt)))
    assert sum(1 for d in ll.flagged if any(seq == 0 for seq, _ in d)) >= 12
    # the prompt's scores: once, before any text, each the log-softmax of the row before it
    first = scored[0]
    assert isinstance(first, PromptScored)
    assert sum(isinstance(e, PromptScored) for e in scored) == 1
    got = first.scores
    assert [s.token for s in got] == prompt and got[0].logprob is None and got[0].top == ()
    for i in range(1, len(prompt)):
        want = log_softmax(row_at(prompt[i - 1], i - 1))
        assert got[i].logprob == pytest.approx(want[prompt[i]], abs=1e-6)
        assert [t for t, _, _ in got[i].top] == list(np.argsort(-want, kind="stable")[:2])
    # the other sequence generated meanwhile, a token per step, each scored with 1 alternative
    pieces = [e for e in other if isinstance(e, TextPiece)]
    assert len(pieces) == 12 and all(len(p.scores) == 1 and len(p.scores[0].top) == 1
                                     for p in pieces)


def test_generated_scores_ride_on_their_text_and_the_end_token_on_finished():
    sched, ll = scheduler()
    got: list = []
    sched.waiting.append(job([1, 2, 3], ll, got, max_new=8, stop_after=3, logprobs=0))
    run(sched)
    pieces = [e for e in got if isinstance(e, TextPiece)]
    end = got[-1]
    assert isinstance(end, Finished) and end.completion_tokens == 4 and end.reason == "stop"
    assert [len(p.scores) for p in pieces] == [1, 1, 1]
    assert [p.scores[0].piece for p in pieces] == [p.text.encode() for p in pieces]
    assert [p.scores[0].offset for p in pieces] == [0, 1, 2]  # characters before each
    assert [s.token for s in end.scores] == [EOG] and end.scores[0].offset == 3
    assert not any(isinstance(e, PromptScored) for e in got)  # not asked


def test_no_scores_unless_asked():
    sched, ll = scheduler()
    got: list = []
    sched.waiting.append(job([1, 2, 3], ll, got, max_new=8, stop_after=3))
    run(sched)
    assert all(not e.scores for e in got if isinstance(e, TextPiece | Finished))
    assert all(len(step) <= 1 for step in ll.flagged)  # one logits row per step: the last


def test_a_prompt_to_score_reuses_no_cached_prefix():
    sched, ll = scheduler(parallel=1)
    ll.hold(sched.slots[0], [3, 1, 4, 1])
    got: list = []
    scoring = job([3, 1, 4, 1, 5], ll, got, max_new=0, prompt_logprobs=0)
    sched.waiting.append(scoring)
    run(sched)
    assert scoring.cached_tokens == 0
    assert [s.token for s in got[0].scores] == [3, 1, 4, 1, 5]
    plain: list = []
    reuse = job([3, 1, 4, 1, 6], ll, plain, max_new=1)
    sched.waiting.append(reuse)
    run(sched)
    assert reuse.cached_tokens == 4  # the scored prompt's KV stays for the next request


def test_max_tokens_zero_samples_nothing():
    sched, ll = scheduler()
    got: list = []
    zero = job([1, 2, 3, 4], ll, got, max_new=0, prompt_logprobs=1)
    sched.waiting.append(zero)
    run(sched)
    assert zero.sampler.calls == 0  # type: ignore[union-attr]
    assert [type(e) for e in got] == [PromptScored, Finished]
    assert (got[1].reason, got[1].completion_tokens) == ("length", 0)
