"""How a reranking pair becomes tokens (app.core.rerank_pairs) and its outputs a score
(app.core.rerank): llama-server's framing, the rerank template split at its control tokens,
each fitting policy, and the activations. A byte tokenizer stands in for llama.cpp's."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.base.errors import ContextOverflow
from app.core.rerank import RerankResult, Score, score_of
from app.core.rerank_pairs import Fit, PairMaker, split_template
from app.engine.embed import RankInfo

SPECIAL = {"<|im_start|>": 1, "<|im_end|>": 2}


def tokenize(text: str, add_special: bool, parse_special: bool) -> list[int]:
    out: list[int] = []
    i = 0
    while i < len(text):
        hit = next((s for s in SPECIAL if parse_special and text.startswith(s, i)), None)
        if hit:
            out.append(SPECIAL[hit])
            i += len(hit)
        else:
            out.append(10 + ord(text[i]))
            i += 1
    return out


def pieces(tokens: list[int]) -> list[bytes]:
    return [chr(t - 10).encode() for t in tokens]


def b(text: str) -> list[int]:
    return [10 + ord(c) for c in text]


FRAMED = RankInfo(template=None, prefix=(5,), middle=(6, 7), suffix=(6,), n_out=1)
TEMPLATED = RankInfo(template="<|im_start|>Q={query};D={document}<|im_end|>!", prefix=(),
                     middle=(), suffix=(), n_out=2, normalized=True)


def maker(rank: RankInfo, n_ctx: int = 64) -> PairMaker:
    return PairMaker(rank, n_ctx, tokenize, pieces, tuple(SPECIAL))


def test_the_framing_is_llama_servers():
    built = maker(FRAMED).build(0, "ab", "cd", Fit())
    assert built.chunks == [[5, *b("ab"), 6, 7, *b("cd"), 6]] and not built.truncated


def test_the_template_is_split_at_its_control_tokens_and_filled_once():
    assert split_template(TEMPLATED.template or "", tuple(SPECIAL), tokenize) == [
        1, "Q={query};D={document}", 2, "!"]
    m = maker(TEMPLATED)
    # a query holding "{document}" is not filled in again; control-token text stays text
    assert m.pair("{document}", "x<|im_end|>") == [1, *b("Q={document};D=x<|im_end|>"), 2,
                                                    *b("!")]


def test_a_pair_over_the_context_is_refused_by_name():
    with pytest.raises(ContextOverflow) as err:
        maker(FRAMED, n_ctx=10).build(3, "ab", "c" * 10, Fit())
    assert err.value.message.startswith("documents[3]") and err.value.limit == 10


def test_truncation_and_chunks_cut_the_document_only():
    m = maker(FRAMED, n_ctx=10)  # 5 ab 6 7 + 4 document tokens + 6
    cut = m.build(0, "ab", "cdefghijklm", Fit("truncate"))
    assert cut.chunks == [[5, *b("ab"), 6, 7, *b("cdef"), 6]] and cut.truncated
    parts = m.build(0, "ab", "cdefghijklm", Fit("chunk", chunks=2))
    assert [c[5:-1] for c in parts.chunks] == [b("cdef"), b("ghij")] and parts.truncated
    whole = m.build(0, "ab", "cdefghij", Fit("chunk", chunks=3))
    assert len(whole.chunks) == 2 and not whole.truncated
    assert m.build(0, "ab", "cdefgh", Fit(max_doc_tokens=2)).chunks == [
        [5, *b("ab"), 6, 7, *b("cd"), 6]]
    assert len(m.build(0, "ab", "cdefgh", Fit("truncate", max_pair_tokens=8)).chunks[0]) == 8
    with pytest.raises(ContextOverflow) as err:
        m.build(0, "abcdefgh", "x", Fit("truncate", first="text_1", first_indexed=True))
    assert err.value.message.startswith("text_1[0]:")


def test_a_templated_pair_is_cut_through_its_documents_text():
    m = maker(TEMPLATED, n_ctx=20)  # the template alone: 1 + 5 + 2 + 1 tokens
    built = m.build(0, "q", "abcdefghijklmnop", Fit("truncate"))
    [toks] = built.chunks
    assert toks == [1, *b("Q=q;D=abcdefghijk"), 2, *b("!")] and len(toks) == 20
    parts = m.build(0, "q", "abcdefghijklmnop", Fit("chunk", chunks=2))
    assert [len(t) for t in parts.chunks] == [20, 14]
    assert m.build(0, "q", "abcdefghijklmnop", Fit(max_doc_tokens=3)).chunks == [
        [1, *b("Q=q;D=abc"), 2, *b("!")]]


def test_scores_follow_vllm_and_llama_server():
    assert score_of(np.array([0.0], np.float32), FRAMED, True) == 0.5
    assert score_of(np.array([2.0], np.float32), FRAMED, False) == 2.0  # llama-server's
    assert score_of(np.array([-800.0], np.float32), FRAMED, True) == pytest.approx(0.0)
    # a softmax in the graph (Qwen3): P(yes) as it is
    assert score_of(np.array([0.3, 0.7], np.float32), TEMPLATED, True) == pytest.approx(0.3)
    # ... and without the activation, the logits' difference (vLLM's), whose sigmoid is P(yes)
    raw = score_of(np.array([0.3, 0.7], np.float32), TEMPLATED, False)
    assert raw == pytest.approx(math.log(0.3 / 0.7), abs=1e-6)
    assert 1 / (1 + math.exp(-raw)) == pytest.approx(0.3, abs=1e-6)
    assert math.isfinite(score_of(np.array([1.0, 0.0], np.float32), TEMPLATED, False))
    several = RankInfo(None, (), (), (), n_out=2)
    assert score_of(np.array([1.0, 1.0], np.float32), several, True) == pytest.approx(0.5)


def test_ranking_is_by_score_then_request_order():
    r = RerankResult("m", [Score(s, 1, False) for s in (0.1, 0.9, 0.5, 0.9)])
    assert r.ranked() == [1, 3, 2, 0] and r.ranked(2) == [1, 3] and r.tokens == 4
