"""A tiny BERT-style embedding GGUF with random weights, built with gguf-py (no embedding model
ships in a PyPI package). Non-causal attention, a pooling type in its metadata and a WordPiece
vocabulary, as convert_hf_to_gguf.py writes them for BERT: enough for llama.cpp to load it as
an embedding model and for shape, pooling and batching checks. Its vectors mean nothing."""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, PoolingType, TokenType

from tests.support.tiny_mmproj import finish

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "hello", "world", "is", "it", "here"]
N_EMBD, N_HEAD, N_FF, N_LAYER, N_CTX = 32, 2, 64, 2, 128


def vocabulary() -> list[str]:
    """Phantom-space WordPiece: "\u2581word" starts a word, bare text continues one; every
    lowercase letter and digit both ways, so any lowercase word has a tokenization."""
    chars = string.ascii_lowercase + string.digits
    toks = SPECIAL + ["\u2581" + w for w in WORDS]
    toks += ["\u2581" + c for c in chars] + list(chars)
    toks += ["\u2581" + p for p in ".,!?'-"]
    return list(dict.fromkeys(toks))  # one id per text (llama.cpp asserts it)


def build_tiny_bert(path: Path, pooling: str = "mean", seed: int = 0) -> Path:
    """``pooling`` rank makes it a cross-encoder (bge / jina reranker class): the pooler's dense
    layer and tanh (``cls``) and a one-logit head (``cls.output``), as convert_hf_to_gguf.py
    writes a BertForSequenceClassification; it then scores [CLS] query [SEP] document."""
    rng = np.random.default_rng(seed)
    vocab = vocabulary()
    w = GGUFWriter(str(path), "bert")
    w.add_name("tiny-bert")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_block_count(N_LAYER)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type({"mean": PoolingType.MEAN, "cls": PoolingType.CLS,
                        "rank": PoolingType.RANK}[pooling])
    w.add_token_type_count(2)
    w.add_tokenizer_model("bert")
    w.add_token_list(vocab)
    w.add_token_types([TokenType.CONTROL if t in SPECIAL else TokenType.NORMAL for t in vocab])
    w.add_pad_token_id(0)
    w.add_unk_token_id(1)
    w.add_bos_token_id(2)  # [CLS]: llama.cpp's WPM tokenizer starts with it
    w.add_sep_token_id(3)
    w.add_mask_token_id(4)
    w.add_add_bos_token(True)
    w.add_add_sep_token(True)

    def t(name: str, *shape: int, scale: float = 0.2) -> None:
        # numpy shape is reversed from ggml's {ne0, ne1}
        w.add_tensor(name, (rng.standard_normal(shape[::-1]) * scale).astype(np.float32))

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    if pooling == "rank":
        t("cls.weight", N_EMBD, N_EMBD)
        t("cls.bias", N_EMBD)
        t("cls.output.weight", N_EMBD, 1, scale=0.3)
        t("cls.output.bias", 1)
    t("token_embd.weight", N_EMBD, len(vocab))
    t("token_types.weight", N_EMBD, 2)
    t("position_embd.weight", N_EMBD, N_CTX)
    ones("token_embd_norm.weight", N_EMBD)
    t("token_embd_norm.bias", N_EMBD, scale=0.0)
    for i in range(N_LAYER):
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t(f"blk.{i}.{part}.weight", N_EMBD, N_EMBD)
            t(f"blk.{i}.{part}.bias", N_EMBD)
        ones(f"blk.{i}.attn_output_norm.weight", N_EMBD)
        t(f"blk.{i}.attn_output_norm.bias", N_EMBD, scale=0.0)
        t(f"blk.{i}.ffn_up.weight", N_EMBD, N_FF)
        t(f"blk.{i}.ffn_up.bias", N_FF)
        t(f"blk.{i}.ffn_down.weight", N_FF, N_EMBD)
        t(f"blk.{i}.ffn_down.bias", N_EMBD)
        ones(f"blk.{i}.layer_output_norm.weight", N_EMBD)
        t(f"blk.{i}.layer_output_norm.bias", N_EMBD, scale=0.0)
    return finish(w, path)


if __name__ == "__main__":
    import sys

    print(build_tiny_bert(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("tiny-bert.gguf")))
