"""Small random-weight models of a chosen shape, built with gguf-py, for the memory estimate
(app.engine.footprint) checked against what llama.cpp allocates: grouped-query attention with
a head size of its own, a mixture of experts, Gemma 3's sliding-window layers, tied or separate
output weights, f16 or quantized matrices. The default model's tokenizer; what they say means
nothing.

    python -m tests.support.tiny_shapes VOCAB.gguf OUT.gguf [key=value ...]
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, quants

from tests.support.tiny_mmproj import finish
from tests.support.tiny_qwen2vl import copy_tokenizer


@dataclass(frozen=True)
class Shape:
    arch: str = "llama"  # llama, gemma3 (sliding-window layers, 5 in 6), mamba (recurrent)
    n_layer: int = 4
    n_embd: int = 128
    n_head: int = 8
    n_head_kv: int = 2
    head_dim: int = 32  # key_length = value_length
    n_ff: int = 256
    n_expert: int = 0  # > 0: a mixture of experts (llama's Mixtral layout)
    n_expert_used: int = 2
    sliding_window: int = 128  # gemma3
    tied: bool = False  # no output.weight: llama.cpp uses the token embeddings
    matrix: str = "F16"  # the matrices' type: F16, F32, Q8_0, Q4_0
    context: int = 8192
    d_state: int = 16  # mamba: the scan's state per channel
    d_conv: int = 4  # mamba: the convolution's kernel


def _weights(rng: np.random.Generator, qtype: GGMLQuantizationType, *dims: int) -> np.ndarray:
    """``dims`` in ggml's order (ne0 first), of type ``qtype`` (quantized as gguf-py does)."""
    data = (rng.standard_normal(dims[::-1], dtype=np.float32) * 0.05).astype(np.float32)
    if qtype == GGMLQuantizationType.F32:
        return data
    if qtype == GGMLQuantizationType.F16:
        return data.astype(np.float16)
    return quants.quantize(data, qtype)


def build_shape(path: Path, vocab_src: Path, shape: Shape = Shape(), seed: int = 0) -> Path:
    s = shape
    rng = np.random.default_rng(seed)
    mat = GGMLQuantizationType[s.matrix]
    w = GGUFWriter(str(path), s.arch)
    w.add_name(f"tiny-{s.arch}")
    n_vocab = copy_tokenizer(w, vocab_src)
    w.add_context_length(s.context)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer)
    recurrent = s.arch == "mamba"
    w.add_feed_forward_length(0 if recurrent else s.n_ff)
    w.add_head_count(0 if recurrent else s.n_head)
    w.add_head_count_kv(0 if recurrent else s.n_head_kv)
    if not recurrent:
        w.add_key_length(s.head_dim)
        w.add_value_length(s.head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    if s.arch == "llama":
        w.add_rope_dimension_count(s.head_dim)
        w.add_vocab_size(n_vocab)
    if s.arch == "gemma3":
        w.add_sliding_window(s.sliding_window)
    if s.arch == "mamba":
        return _mamba(w, rng, s, n_vocab, mat, path)
    if s.n_expert:
        w.add_expert_count(s.n_expert)
        w.add_expert_used_count(s.n_expert_used)
    w.add_file_type(1 if s.matrix == "F16" else 0)

    def t(name: str, *dims: int, qtype: GGMLQuantizationType = mat) -> None:
        w.add_tensor(name, _weights(rng, qtype, *dims), raw_dtype=qtype)

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    q, kv = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    t("token_embd.weight", s.n_embd, n_vocab)
    ones("output_norm.weight", s.n_embd)
    if not s.tied:
        t("output.weight", s.n_embd, n_vocab)
    for i in range(s.n_layer):
        b = f"blk.{i}."
        ones(b + "attn_norm.weight", s.n_embd)
        t(b + "attn_q.weight", s.n_embd, q)
        t(b + "attn_k.weight", s.n_embd, kv)
        t(b + "attn_v.weight", s.n_embd, kv)
        t(b + "attn_output.weight", q, s.n_embd)
        ones(b + "ffn_norm.weight", s.n_embd)
        if s.arch == "gemma3":
            ones(b + "attn_q_norm.weight", s.head_dim)
            ones(b + "attn_k_norm.weight", s.head_dim)
            ones(b + "post_attention_norm.weight", s.n_embd)
            ones(b + "post_ffw_norm.weight", s.n_embd)
        if s.n_expert:
            t(b + "ffn_gate_inp.weight", s.n_embd, s.n_expert, qtype=GGMLQuantizationType.F32)
            for name in ("ffn_gate_exps", "ffn_up_exps"):
                t(f"{b}{name}.weight", s.n_embd, s.n_ff, s.n_expert)
            t(b + "ffn_down_exps.weight", s.n_ff, s.n_embd, s.n_expert)
        else:
            t(b + "ffn_gate.weight", s.n_embd, s.n_ff)
            t(b + "ffn_up.weight", s.n_embd, s.n_ff)
            t(b + "ffn_down.weight", s.n_ff, s.n_embd)
    return finish(w, path)


def _mamba(w: GGUFWriter, rng: np.random.Generator, s: Shape, n_vocab: int,
           mat: GGMLQuantizationType, path: Path) -> Path:
    """Mamba's layers: no attention, a recurrent state (a convolution and a selective scan)
    per sequence; d_inner is twice the width, the time-step rank a sixteenth of it."""
    inner, rank = 2 * s.n_embd, max(s.n_embd // 16, 1)
    w.add_ssm_conv_kernel(s.d_conv)
    w.add_ssm_inner_size(inner)
    w.add_ssm_state_size(s.d_state)
    w.add_ssm_time_step_rank(rank)
    f32 = GGMLQuantizationType.F32

    def t(name: str, *dims: int, qtype: GGMLQuantizationType = mat) -> None:
        w.add_tensor(name, _weights(rng, qtype, *dims), raw_dtype=qtype)

    t("token_embd.weight", s.n_embd, n_vocab)
    w.add_tensor("output_norm.weight", np.ones(s.n_embd, dtype=np.float32))
    for i in range(s.n_layer):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", np.ones(s.n_embd, dtype=np.float32))
        t(b + "ssm_in.weight", s.n_embd, 2 * inner)
        t(b + "ssm_conv1d.weight", s.d_conv, inner, qtype=f32)
        t(b + "ssm_conv1d.bias", inner, qtype=f32)
        t(b + "ssm_x.weight", inner, rank + 2 * s.d_state)
        t(b + "ssm_dt.weight", rank, inner)
        t(b + "ssm_dt.bias", inner, qtype=f32)
        w.add_tensor(b + "ssm_a", -np.ones((inner, s.d_state), dtype=np.float32))
        w.add_tensor(b + "ssm_d", np.ones(inner, dtype=np.float32))
        t(b + "ssm_out.weight", inner, s.n_embd)
    return finish(w, path)


if __name__ == "__main__":
    import sys

    fields = {f: type(getattr(Shape(), f)) for f in Shape.__dataclass_fields__}
    kw = {}
    for arg in sys.argv[3:]:
        k, _, v = arg.partition("=")
        kw[k] = (v == "true") if fields[k] is bool else fields[k](v)
    print(build_shape(Path(sys.argv[2]), Path(sys.argv[1]), replace(Shape(), **kw)))
