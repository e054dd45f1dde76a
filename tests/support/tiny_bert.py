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


def build_tiny_bert(path: Path, pooling: str = "mean", seed: int = 0, n_embd: int = N_EMBD,
                    n_layer: int = N_LAYER, n_ff: int = N_FF, n_head: int = N_HEAD,
                    n_ctx: int = N_CTX, f16: bool = False) -> Path:
    """``pooling`` rank makes it a cross-encoder (bge / jina reranker class): the pooler's dense
    layer and tanh (``cls``) and a one-logit head (``cls.output``), as convert_hf_to_gguf.py
    writes a BertForSequenceClassification; it then scores [CLS] query [SEP] document. The
    sizes make a larger one for benchmarks (bench/rerank.py: bge-reranker-base's 12 x 768),
    its matrices in f16 with ``f16``."""
    rng = np.random.default_rng(seed)
    fan = (N_EMBD / n_embd) ** 0.5  # wider layers, smaller weights: a well-conditioned net
    vocab = vocabulary()
    w = GGUFWriter(str(path), "bert")
    w.add_name("tiny-bert")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_block_count(n_layer)
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
        value = rng.standard_normal(shape[::-1]) * scale * fan  # fan: 1 at the tiny size
        big = f16 and name.startswith(("blk.", "token_embd.weight"))  # others are added as is
        w.add_tensor(name, value.astype(np.float16 if big and len(shape) == 2 else np.float32))

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    if pooling == "rank":
        t("cls.weight", n_embd, n_embd)
        t("cls.bias", n_embd)
        t("cls.output.weight", n_embd, 1, scale=0.3)
        t("cls.output.bias", 1)
    t("token_embd.weight", n_embd, len(vocab))
    t("token_types.weight", n_embd, 2)
    t("position_embd.weight", n_embd, n_ctx)
    ones("token_embd_norm.weight", n_embd)
    t("token_embd_norm.bias", n_embd, scale=0.0)
    for i in range(n_layer):
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t(f"blk.{i}.{part}.weight", n_embd, n_embd)
            t(f"blk.{i}.{part}.bias", n_embd)
        ones(f"blk.{i}.attn_output_norm.weight", n_embd)
        t(f"blk.{i}.attn_output_norm.bias", n_embd, scale=0.0)
        t(f"blk.{i}.ffn_up.weight", n_embd, n_ff)
        t(f"blk.{i}.ffn_up.bias", n_ff)
        t(f"blk.{i}.ffn_down.weight", n_ff, n_embd)
        t(f"blk.{i}.ffn_down.bias", n_embd)
        ones(f"blk.{i}.layer_output_norm.weight", n_embd)
        t(f"blk.{i}.layer_output_norm.bias", n_embd, scale=0.0)
    return finish(w, path)


if __name__ == "__main__":
    import sys

    print(build_tiny_bert(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("tiny-bert.gguf")))
