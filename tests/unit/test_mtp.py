"""Multi-token prediction's pure parts (app.engine.mtp): which GGUFs may load their MTP layers
(SPEC_MTP resolved from the header, before llama.cpp could abort on a missing tensor), how the
head's record of a sequence follows the target's KV edits (kv.KvShadow), and which sequences
propose asks the head for. The head's llama.cpp side runs in tests/e2e/test_mtp*.py."""

from __future__ import annotations

import numpy as np
import pytest

from app.base.errors import ModelLoadError
from app.engine import mtp
from app.engine.kv import KvSeq
from app.engine.slots import Job, Slot
from app.engine.speculative import SpecConfig, propose
from app.engine.types import GenerationRequest, SamplingParams, Speculation
from tests.support.tiny_bert import build_tiny_bert
from tests.support.tiny_mtp import build_tiny_mtp

META = {"hy_v3.nextn_predict_layers": 1, "hy_v3.block_count": 3}


def test_has_mtp_wants_the_layers_an_architecture_llama_cpp_runs_and_their_tensors():
    assert mtp.has_mtp("hy_v3", META, {"blk.2.nextn.eh_proj.weight"}) == (True, "")
    ok, why = mtp.has_mtp("hy_v3", META, {"blk.2.attn_q.weight"})
    assert not ok and "blk.2.nextn.eh_proj.weight" in why
    ok, why = mtp.has_mtp("llama", {}, set())
    assert not ok and "no MTP layers" in why
    ok, why = mtp.has_mtp("qwen35", {"qwen35.nextn_predict_layers": 1, "qwen35.block_count": 3},
                          {"blk.2.nextn.eh_proj.weight"})  # a hybrid: no rollback of its state
    assert not ok and "qwen35" in why


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    d = tmp_path_factory.mktemp("mtp")
    vocab = build_tiny_bert(d / "bert.gguf")
    return {"mtp": str(build_tiny_mtp(d / "m.gguf", vocab)),
            "bare": str(build_tiny_mtp(d / "b.gguf", vocab, nextn=False)),
            "none": str(vocab)}


def test_spec_mtp_resolved_from_the_gguf_header(ggufs):
    assert mtp.wanted("auto", ggufs["mtp"], None)
    assert mtp.wanted("on", ggufs["mtp"], None)
    assert not mtp.wanted("off", ggufs["mtp"], None)
    assert not mtp.wanted("auto", ggufs["mtp"], "draft.gguf")  # DRAFT_MODEL drafts instead
    assert not mtp.wanted("auto", ggufs["bare"], None)
    assert not mtp.wanted("auto", ggufs["none"], None)
    for path, draft, says in ((ggufs["mtp"], "d.gguf", "DRAFT_MODEL"),
                              (ggufs["bare"], None, "blk.2.nextn.eh_proj.weight"),
                              (ggufs["none"], None, "no MTP layers")):
        with pytest.raises(ModelLoadError, match=says):
            mtp.wanted("on", path, draft)


class _Memory:
    """llama.cpp's memory calls as the head's record makes them."""

    def __init__(self):
        self.calls: list[tuple] = []

    def llama_memory_seq_rm(self, mem, seq, p0, p1):
        self.calls.append(("rm", seq, p0))
        return True

    def llama_memory_seq_cp(self, mem, src, dst, p0, p1):
        self.calls.append(("cp", src, dst))


def _drafter(n_seq: int = 2) -> mtp.MtpDrafter:
    d = object.__new__(mtp.MtpDrafter)  # the record alone, no context
    d.ll, d.mem, d.width = _Memory(), None, 4
    d.seqs = {i: mtp._Seq() for i in range(n_seq)}
    d._last, d._proposed, d._pending, d.drafted, d.accepted = {}, {}, [], 0, 0
    return d


def test_the_heads_record_follows_the_targets_kv_edits():
    d = _drafter()
    kv = KvSeq(d.ll, None, 0, d)
    kv.decoded([1, 2, 3, 4], drafted=2)  # a draft checked: 4 positions, 2 drafted past them
    d.seqs[0] = mtp._Seq(n=6, h=np.full(4, 6.0))  # the head mirrored all 6
    d._last = {0: (2, np.arange(16, dtype=np.float32).reshape(4, 4))}  # that decode: 2..5
    kv.drop_draft()  # the target kept none of the draft: the head's cells are cut there too
    assert d.ll.calls[-2:] == [("rm", 0, 4), ("rm", 0, 4)]  # the target's, then the head's
    # in step again, with the target's hidden state at position 3: that decode's row 1
    assert d.in_sync(0, kv.n_pos) and d.seqs[0].h.tolist() == [4.0, 5.0, 6.0, 7.0]
    d.cut(0, 1)  # a state that decode did not compute: gone (a zero state stands in)
    assert d.seqs[0].n == 1 and d.seqs[0].h is None
    other = KvSeq(d.ll, None, 1, d)
    other.copy_from(KvSeq(d.ll, None, 0, d))  # a choice copies its leader's prompt
    assert d.seqs[1].n == 1 and ("cp", 0, 1) in d.ll.calls
    kv.clear()  # a sequence that starts afresh is followed again
    assert d.seqs[0] == mtp._Seq() and d.in_sync(0, 0)


def test_a_sequence_the_head_cannot_follow_is_not_drafted_for_until_it_restarts():
    d = _drafter()
    d.lose(0)  # an image's embeddings, a prompt restored from the prompt cache
    assert not d.in_sync(0, 0)
    d.cut(0, 3)
    assert not d.in_sync(0, 3)
    d.cut(0, 0)
    assert d.in_sync(0, 0)


def test_verified_counts_only_the_heads_drafts():
    d = _drafter()
    d._proposed[0] = 3
    d.verified(0, 3, 2)
    d.verified(1, 4, 4)  # a prediction's or n-gram draft
    assert d.report() == {"draft_tokens": 3, "draft_tokens_accepted": 2,
                          "sequences_unfollowed": 0}


class _Head:
    def __init__(self, synced: set[int]):
        self.synced, self.asked = synced, []

    def in_sync(self, seq, n_pos):
        return seq in self.synced

    def draft(self, asks):
        self.asked = asks
        return {seq: [9] * n for seq, _, _, n, _ in asks}


def _generating(seq: int, spec: Speculation | None = None) -> Slot:
    params = SamplingParams(speculative=spec or Speculation())
    job = Job(GenerationRequest("x", params), sink=lambda e: None)
    job.max_new = 100
    slot = Slot(KvSeq(None, None, seq), job=job, last_token=7)
    slot.kv.decoded([1, 2, 3, 7, 1, 2, 3])
    return slot


def test_propose_asks_the_head_for_sequences_it_follows_and_n_gram_for_the_rest():
    spec = SpecConfig(draft_max=4, draft_min=1, p_min=0.5, ngram=True, adaptive=False)
    slots = [_generating(0), _generating(1, Speculation(n_max=2, p_min=0.25)), _generating(2)]
    head = _Head({0, 1})
    got = propose(spec, None, 4096, slots, head)
    # the head's confidence floor is the request's (llama-server's default 0), not SPEC_P_MIN
    assert head.asked == [(0, 7, 7, 4, 0.0), (1, 7, 7, 2, 0.25)]
    assert got == {0: [9, 9, 9, 9], 1: [9, 9], 2: [1, 2, 3, 7]}  # 2: not followed, n-gram
