"""The engine's MTP drafter (app.engine.mtp.MtpDrafter) driven as the scheduler drives it, in
a process of its own (``python -m tests.support.mtp_engine_probe MODEL``), printing one JSON
line: the drafts after a prompt decoded in two chunks, and after a checked draft's tail was
dropped. tests/support/mtp_probe.py computes the first with llama.cpp's calls written out; on
random weights the drafts depend on every hidden state handed over, so equal drafts say the
drafter's mirror (batch index to hidden state, row k given row k-1's) is right. After the cut
the drafts must be the probe's for the prompt extended by the kept tokens."""

from __future__ import annotations

import json
import sys

import numpy as np


def main(path: str, prompt: list[int], n_draft: int = 3) -> dict:
    import llama_cpp.llama_cpp as L
    import llama_cpp.llama_cpp_ext as X

    from app.engine.kv import KvSeq
    from app.engine.mtp import MtpDrafter
    from app.engine.tokens import put

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.load_mtp = True
    model = L.llama_model_load_from_file(path.encode(), mp)
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 512, 64, 64, 1
    ctx = L.llama_init_from_model(model, cp)
    mtp = MtpDrafter(L, X, model, ctx, n_ctx=512, n_seq=1, n_batch=64, n_ubatch=64, threads=2,
                     flash_attn=-1, draft_max=n_draft)
    kv = KvSeq(L, L.llama_get_memory(ctx), 0, mtp)
    batch = L.llama_batch_init(64, 0, 1)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))

    def decode(tokens: list[int], draft: int = 0) -> list[int]:
        """``tokens`` at the sequence's next positions (the last ``draft`` of them a draft);
        the target's greedy token after each."""
        for k, tok in enumerate(tokens):
            put(batch, k, tok, kv.n_pos + k, 0, True)
        batch.n_tokens = len(tokens)
        assert L.llama_decode(ctx, batch) == 0
        mtp.mirror(batch, len(tokens))
        kv.decoded(tokens[:len(tokens) - draft], drafted=draft)
        return [int(np.argmax(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, k),
                                                     shape=(n_vocab,))))
                for k in range(len(tokens))]

    half = len(prompt) // 2  # two chunks: the second's first row takes the first's last state
    decode(prompt[:half])
    sampled = decode(prompt[half:])[-1]
    first = mtp.draft([(0, sampled, kv.n_pos, n_draft, 0.0)])[0]
    # the draft checked, its first token kept and the rest dropped: the head follows the cut
    greedy = decode([sampled, *first], draft=len(first))
    kv.draft_kept(first[0])
    kv.drop_draft()
    second = mtp.draft([(0, greedy[1], kv.n_pos, n_draft, 0.0)])[0]
    return {"drafts": first, "sampled": sampled, "next": greedy[1], "after_cut": second,
            "in_sync": mtp.in_sync(0, kv.n_pos)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], [5, 9, 13, 21, 30])))
