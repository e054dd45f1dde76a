"""A tiny mixture-of-experts model with random weights, built with gguf-py: the ``llama``
architecture with 4 experts per layer, 2 used per token (Mixtral's layout: a router
``ffn_gate_inp`` and stacked expert tensors ``ffn_{gate,up,down}_exps``), 2 layers 64 wide, on the
default model's tokenizer. For the placement settings (CPU_MOE, N_CPU_MOE, OVERRIDE_TENSOR):
what it says means nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from tests.support.tiny_mmproj import finish
from tests.support.tiny_qwen2vl import _rand, copy_tokenizer

N_EMBD, N_LAYER, N_HEAD, N_FF, N_EXPERT, N_USED = 64, 2, 4, 128, 4, 2


def build_moe(path: Path, vocab_src: Path, n_layer: int = N_LAYER, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "llama")
    w.add_name("tiny-moe")
    n_vocab = copy_tokenizer(w, vocab_src)
    w.add_context_length(2048)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_USED)
    w.add_vocab_size(n_vocab)
    w.add_file_type(0)
    w.add_tensor("token_embd.weight", _rand(rng, N_EMBD, n_vocab))
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    w.add_tensor("output.weight", _rand(rng, N_EMBD, n_vocab))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"blk.{i}.{name}.weight", _rand(rng, N_EMBD, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", _rand(rng, N_EMBD, N_EXPERT))
        w.add_tensor(f"blk.{i}.ffn_gate_exps.weight", _rand(rng, N_EMBD, N_FF, N_EXPERT))
        w.add_tensor(f"blk.{i}.ffn_up_exps.weight", _rand(rng, N_EMBD, N_FF, N_EXPERT))
        w.add_tensor(f"blk.{i}.ffn_down_exps.weight", _rand(rng, N_FF, N_EMBD, N_EXPERT))
    return finish(w, path)
