"""A reranker GGUF read the way llama-server reads it: how a (query, document) pair becomes
tokens (its rerank template, or the vocabulary's BOS / EOS / SEP around the two texts:
format_prompt_rerank in tools/server), and what its classification head outputs."""

from __future__ import annotations

import ctypes

from app.engine.embed import RankInfo


def meta(ll, model, key: str) -> str | None:
    """A GGUF metadata value as text (None when the model has no such key)."""
    buf = ctypes.create_string_buffer(256)
    n = ll.llama_model_meta_val_str(model, key.encode(), buf, 256)
    return buf.value.decode("utf-8", "replace") if n >= 0 else None


def rank_info(ll, model, vocab) -> RankInfo:
    """How llama-server turns a pair into tokens for this reranker (format_prompt_rerank), and
    its classifier's outputs: the GGUF's rerank template if it has one, else BOS query
    EOS/SEP document EOS as the vocabulary adds them (EOS falls back to SEP)."""
    raw = ll.llama_model_chat_template(model, b"rerank")
    template = raw.decode("utf-8", "replace") if raw else None
    eos = ll.llama_vocab_eos(vocab)
    if eos < 0:
        eos = ll.llama_vocab_sep(vocab)
    add_eos = bool(ll.llama_vocab_get_add_eos(vocab)) and eos >= 0
    add_sep = bool(ll.llama_vocab_get_add_sep(vocab)) and ll.llama_vocab_sep(vocab) >= 0
    bos = ll.llama_vocab_bos(vocab)
    n_out = max(1, int(ll.llama_model_n_cls_out(model)))
    labels = []
    for i in range(n_out):
        label = ll.llama_model_cls_label(model, i)
        if not label:
            break
        labels.append(label.decode("utf-8", "replace"))
    arch = meta(ll, model, "general.architecture") or ""
    return RankInfo(
        template=template,
        prefix=(bos,) if ll.llama_vocab_get_add_bos(vocab) and bos >= 0 else (),
        middle=((eos,) if add_eos else ()) + ((ll.llama_vocab_sep(vocab),) if add_sep else ()),
        suffix=(eos,) if add_eos else (),
        n_out=n_out,
        labels=tuple(labels),
        normalized=arch in ("qwen3", "qwen3vl"),  # llama.cpp's graph ends in a softmax
    )
