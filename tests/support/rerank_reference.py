"""Reranker scores computed apart from the server: llama-cpp-python's own low-level API on a
GGUF, each pair made into tokens as llama-server's format_prompt_rerank makes them (the rerank
template filled in and tokenized with control tokens parsed; else BOS query EOS/SEP document
EOS) and decoded alone in a fresh context with pooling rank. Its raw outputs are the
classifier's (the first is llama-server's score)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp as ll
import numpy as np


class Reference:
    def __init__(self, path: Path, n_ctx: int = 512):
        ll.llama_backend_init()
        mp = ll.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = ll.llama_model_load_from_file(str(path).encode(), mp)
        assert self.model, path
        self.vocab = ll.llama_model_get_vocab(self.model)
        self.n_ctx = n_ctx
        self.n_out = max(1, ll.llama_model_n_cls_out(self.model))
        raw = ll.llama_model_chat_template(self.model, b"rerank")
        self.template = raw.decode() if raw else None

    def close(self) -> None:
        ll.llama_model_free(self.model)

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode()
        buf = (ll.llama_token * (len(data) + 8))()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, len(buf), add_special,
                              parse_special)
        assert n >= 0
        return list(buf[:n])

    def tokens(self, query: str, doc: str) -> list[int]:
        """llama-server's format_prompt_rerank."""
        v = self.vocab
        if self.template is not None:
            prompt = self.template.replace("{query}", query).replace("{document}", doc)
            return self.tokenize(prompt, False, True)
        eos = ll.llama_vocab_eos(v)
        if eos < 0:
            eos = ll.llama_vocab_sep(v)
        out: list[int] = []
        if ll.llama_vocab_get_add_bos(v):
            out.append(ll.llama_vocab_bos(v))
        out += self.tokenize(query, False, False)
        if ll.llama_vocab_get_add_eos(v):
            out.append(eos)
        if ll.llama_vocab_get_add_sep(v):
            out.append(ll.llama_vocab_sep(v))
        out += self.tokenize(doc, False, False)
        if ll.llama_vocab_get_add_eos(v):
            out.append(eos)
        return out

    def outputs(self, toks: list[int]) -> np.ndarray:
        """The classifier's raw outputs for one pair's tokens, decoded alone."""
        cp = ll.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = self.n_ctx
        cp.n_seq_max = 1
        cp.embeddings = True
        cp.pooling_type = ll.LLAMA_POOLING_TYPE_RANK
        cp.n_threads = cp.n_threads_batch = 2
        ctx = ll.llama_init_from_model(self.model, cp)
        assert ctx
        try:
            batch = ll.llama_batch_init(len(toks), 0, 1)
            for i, t in enumerate(toks):
                batch.token[i] = t
                batch.pos[i] = i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = True
            batch.n_tokens = len(toks)
            rc = (ll.llama_decode if ll.llama_get_memory(ctx) else ll.llama_encode)(ctx, batch)
            assert rc == 0, rc
            ptr = ll.llama_get_embeddings_seq(ctx, 0)
            out = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                        shape=(self.n_out,)).copy()
            ll.llama_batch_free(batch)
            return out
        finally:
            ll.llama_free(ctx)

    def score(self, query: str, doc: str) -> np.ndarray:
        return self.outputs(self.tokens(query, doc))
