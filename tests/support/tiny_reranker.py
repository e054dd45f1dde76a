"""A tiny decoder reranker, built with gguf-py: the Qwen3-Reranker layout as
convert_hf_to_gguf.py writes it (the ``qwen3`` architecture, pooling type rank, a two-row
classification head ``cls.output`` made of the LM head's "yes" and "no" rows, labels yes and
no, and the rerank prompt under ``tokenizer.chat_template.rerank``), 2 layers 64 wide with
random weights and the default model's tokenizer. llama.cpp reads its last token's hidden
state through the head and a softmax: the score is P("yes")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter, PoolingType

from tests.support.tiny_mmproj import finish
from tests.support.tiny_qwen2vl import _rand, copy_tokenizer

N_EMBD, N_LAYER, N_FF, N_CTX = 64, 2, 128, 2048

# Qwen3-Reranker's prompt, as llama.cpp's converter writes it
TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    "and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that "
    "answer the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)


def build_tiny_reranker(path: Path, vocab_src: Path, seed: int = 0, n_embd: int = N_EMBD,
                        n_layer: int = N_LAYER, n_ff: int = N_FF, f16: bool = False) -> Path:
    """The sizes make a larger one for benchmarks (bench/rerank.py), its matrices in f16 with
    ``f16``; heads stay 16 wide, half as many for keys and values."""
    rng = np.random.default_rng(seed)
    n_head = n_embd // 16
    n_kv = max(1, n_head // 2)
    head = n_embd // n_head

    def m(*dims: int, scale: float = 0.2) -> np.ndarray:
        x = _rand(rng, *dims, scale=scale * (N_EMBD / n_embd) ** 0.5)
        return x.astype(np.float16) if f16 else x

    w = GGUFWriter(str(path), "qwen3")
    w.add_name("tiny-qwen3-reranker")
    n_vocab = copy_tokenizer(w, vocab_src)
    w.add_chat_template([{"name": "rerank", "template": TEMPLATE}])
    w.add_context_length(N_CTX)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head)
    w.add_value_length(head)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_pooling_type(PoolingType.RANK)
    w.add_classifier_output_labels(["yes", "no"])
    w.add_file_type(1 if f16 else 0)
    w.add_tensor("token_embd.weight", m(n_embd, n_vocab))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("cls.output.weight", _rand(rng, n_embd, 2, scale=0.1))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", m(n_embd, n_head * head))
        w.add_tensor(f"blk.{i}.attn_k.weight", m(n_embd, n_kv * head))
        w.add_tensor(f"blk.{i}.attn_v.weight", m(n_embd, n_kv * head))
        w.add_tensor(f"blk.{i}.attn_output.weight", m(n_head * head, n_embd))
        w.add_tensor(f"blk.{i}.attn_q_norm.weight", np.ones(head, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_k_norm.weight", np.ones(head, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", m(n_embd, n_ff))
        w.add_tensor(f"blk.{i}.ffn_up.weight", m(n_embd, n_ff))
        w.add_tensor(f"blk.{i}.ffn_down.weight", m(n_ff, n_embd))
    return finish(w, path)


if __name__ == "__main__":
    import sys

    print(build_tiny_reranker(Path(sys.argv[1]), Path(sys.argv[2])))
