"""llama.cpp's MTP drafting through the pinned bindings, the way issue 53's engine will drive
it, run as its own process (``python -m tests.support.mtp_probe MODEL``: llama.cpp stays out of
the test's process) and printing one JSON line: the trunk's and the NextN layers' counts, the
target's next token after a prompt, the MTP head's drafts after it, and the target's greedy
tokens at the draft positions (its verify batch).

The sequence: the model loaded with ``load_mtp``; a second context on it of type MTP (its KV the
NextN layer only); hidden states on for both (unmasked on the target: a row per batch row);
every target batch mirrored into the MTP context, row k carrying token k and the target's
hidden state of row k-1; drafts one MTP decode per token, each fed the MTP context's own hidden
state; the MTP KV dropped past the verified prefix before the verify batch."""

from __future__ import annotations

import ctypes
import json
import sys

import numpy as np


def main(path: str, prompt: list[int], n_draft: int = 3) -> dict:
    import llama_cpp.llama_cpp as L
    import llama_cpp.llama_cpp_ext as X

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.load_mtp = True
    model = L.llama_model_load_from_file(path.encode(), mp)
    assert model, "load failed"
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    width = L.llama_model_n_embd_out(model)

    def context(mtp: bool, other=None):
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 512, 64, 64, 1
        if mtp:
            cp.ctx_type, cp.n_rs_seq, cp.ctx_other = L.LLAMA_CONTEXT_TYPE_MTP, 0, other
        ctx = L.llama_init_from_model(model, cp)
        assert ctx, "context failed"
        return ctx

    tgt = context(False)
    mtp = context(True, tgt)
    X.llama_set_embeddings_nextn(tgt, True, False)
    X.llama_set_embeddings_nextn(mtp, True, True)

    def decode(ctx, rows):  # (token, pos, logits, hidden state or None) -> batch indexes
        b = L.llama_batch_ext_init(ctx)
        keep, idx = [], []
        for tok, pos, out, h in rows:
            i = L.llama_batch_ext_add_token(b, 0, tok)
            p = (L.llama_pos * 4)(pos, 0, 0, 0)
            keep.append(p)
            assert i >= 0 and L.llama_batch_ext_set_pos(b, i, p)
            if h is not None:
                arr = np.ascontiguousarray(h, dtype=np.float32)
                keep.append(arr)
                emb = L.llama_embd(arr.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, width)
                assert L.llama_batch_ext_set_embd_token(b, i, emb)
            if out:
                L.llama_batch_ext_set_output_logits(b, i, True)
            idx.append(i)
        rc = L.llama_process(ctx, L.LLAMA_PROCESS_TYPE_DECODE, b)
        L.llama_batch_ext_free(b)
        assert rc == 0, rc
        return idx

    def argmax(ctx, i: int) -> int:
        return int(np.argmax(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), (n_vocab,))))

    def hidden(ctx, i: int) -> np.ndarray:
        return np.ctypeslib.as_array(X.llama_get_embeddings_nextn_ith(ctx, i), (width,)).copy()

    n = len(prompt)
    idx = decode(tgt, [(t, p, p == n - 1, None) for p, t in enumerate(prompt)])
    hs = [hidden(tgt, i) for i in idx]
    zero = np.zeros(width, np.float32)
    decode(mtp, [(t, p, False, hs[p - 1] if p else zero) for p, t in enumerate(prompt)])
    sampled = argmax(tgt, idx[-1])
    drafts, tok, pos, h = [], sampled, n, hs[-1]
    for _ in range(n_draft):
        (i,) = decode(mtp, [(tok, pos, True, h)])
        tok, pos, h = argmax(mtp, i), pos + 1, hidden(mtp, i)
        drafts.append(tok)
    assert L.llama_memory_seq_rm(L.llama_get_memory(mtp), 0, n, -1)
    vidx = decode(tgt, [(t, n + j, True, None) for j, t in enumerate([sampled, *drafts])])
    return {"n_layer": L.llama_model_n_layer(model), "n_nextn": L.llama_model_n_layer_nextn(model),
            "sampled": sampled, "drafts": drafts, "greedy": [argmax(tgt, i) for i in vidx][:-1]}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], [int(t) for t in sys.argv[2:]] or [5, 9, 13, 21, 30])))
