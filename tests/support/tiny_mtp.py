"""A tiny GGUF with a multi-token-prediction (NextN) layer, random weights, built with gguf-py
(issue 53: no MTP model ships in a PyPI package). Hunyuan v3's shape (``hy_v3``, the smallest
architecture llama.cpp builds an MTP graph for), dense: 2 trunk layers and 1 NextN layer of
64 wide, the tiny BERT's vocabulary. ``echo``: every layer adds nothing (attn_output and
ffn_down zero) and the NextN projection passes the token half through, so the trunk and the
MTP head both compute output(norm(embd[token])): every draft is the token the model samples
(the accept path's test; with random weights none would be kept)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from tests.support.tiny_mmproj import finish
from tests.support.tiny_qwen2vl import _rand, copy_tokenizer

D, H, HKV, FF, N_TRUNK = 64, 4, 2, 128, 2  # width, heads, KV heads, FFN, trunk layers
HD = D // H


def build_tiny_mtp(path: Path, vocab_src: Path, echo: bool = False, seed: int = 0,
                   nextn: bool = True) -> Path:
    """The GGUF at ``path`` (``vocab_src``'s tokenizer); the NextN layer is blk.N_TRUNK, and
    ``block_count`` counts it (llama_model_n_layer is the trunk's). ``nextn`` False: the
    metadata claims the layer but its own tensors are left out (a GGUF converted without
    them, on which llama.cpp's MTP context would abort the process)."""
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "hy_v3")
    n_vocab = copy_tokenizer(w, vocab_src)
    w.add_context_length(2048)
    w.add_embedding_length(D)
    w.add_block_count(N_TRUNK + 1)
    w.add_feed_forward_length(FF)
    w.add_expert_feed_forward_length(FF)  # read even for a dense model
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_rope_dimension_count(HD)  # must be the head's width
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_uint32("hy_v3.nextn_predict_layers", 1)
    w.add_file_type(0)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    def out(*dims: int) -> np.ndarray:  # a layer's output projection: zero for the echo
        return np.zeros(dims[::-1], dtype=np.float32) if echo else _rand(rng, *dims)

    w.add_tensor("token_embd.weight", _rand(rng, D, n_vocab))
    w.add_tensor("output_norm.weight", ones(D))
    w.add_tensor("output.weight", _rand(rng, D, n_vocab))
    for i in range(N_TRUNK + 1):
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones(D))
        w.add_tensor(f"blk.{i}.attn_q.weight", _rand(rng, D, H * HD))
        w.add_tensor(f"blk.{i}.attn_k.weight", _rand(rng, D, HKV * HD))
        w.add_tensor(f"blk.{i}.attn_v.weight", _rand(rng, D, HKV * HD))
        w.add_tensor(f"blk.{i}.attn_output.weight", out(H * HD, D))
        w.add_tensor(f"blk.{i}.attn_q_norm.weight", ones(HD))
        w.add_tensor(f"blk.{i}.attn_k_norm.weight", ones(HD))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", ones(D))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", _rand(rng, D, FF))
        w.add_tensor(f"blk.{i}.ffn_up.weight", _rand(rng, D, FF))
        w.add_tensor(f"blk.{i}.ffn_down.weight", out(FF, D))
    if not nextn:
        return finish(w, path)
    n = N_TRUNK  # the NextN layer's own tensors: concat(enorm(embd), hnorm(h)) -> eh_proj
    eh = (np.concatenate([np.eye(D, dtype=np.float32), np.zeros((D, D), np.float32)], axis=1)
          if echo else _rand(rng, 2 * D, D))
    w.add_tensor(f"blk.{n}.nextn.eh_proj.weight", eh)
    w.add_tensor(f"blk.{n}.nextn.enorm.weight", ones(D))
    w.add_tensor(f"blk.{n}.nextn.hnorm.weight", ones(D))
    w.add_tensor(f"blk.{n}.nextn.shared_head_norm.weight", ones(D))
    return finish(w, path)
