"""A tiny Qwen2-VL pair with random weights, built with gguf-py: a ``qwen2vl`` text model (2
layers, 64 wide, M-RoPE over 4 position sections) on the default model's tokenizer and chat
template, and its ``qwen2vl_merger`` projector (a 2-block ViT with 2-D rotary positions, 2 x 2
patches merged into each image token). Qwen-VL models place an image's tokens in 2-D: the
image moves the sequence's position by its grid's longer side, not by its token count, so the
engine must count positions apart from tokens. What the pair says means nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from tests.support.tiny_mmproj import Shape, finish, vision_writer

N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF = 64, 2, 4, 2, 128
SECTIONS = [4, 2, 2, 0]  # rotary dimensions per position section (sum: head size / 2)
V_WIDTH, V_FF, V_BLOCKS, V_HEADS, V_PROJ, PATCH = 32, 64, 2, 4, 64, 14


def _rand(rng: np.random.Generator, *dims: int, scale: float = 0.2) -> np.ndarray:
    """``dims`` in ggml's order (ne0 first); numpy's shape is the reverse."""
    return (rng.standard_normal(dims[::-1], dtype=np.float32) * scale).astype(np.float32)


def copy_tokenizer(w: GGUFWriter, vocab_src: Path) -> int:
    """``vocab_src``'s tokenizer and chat template into ``w``; its vocabulary's size."""
    reader = GGUFReader(str(vocab_src))
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            vtype = field.types[0]
            w.add_key_value(key, field.contents(), vtype,
                            sub_type=field.types[1] if vtype == GGUFValueType.ARRAY else None)
    return len(reader.fields["tokenizer.ggml.tokens"].contents())


def build_text(path: Path, vocab_src: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "qwen2vl")
    w.add_name("tiny-qwen2vl")
    n_vocab = copy_tokenizer(w, vocab_src)
    w.add_context_length(4096)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_sections(SECTIONS)
    w.add_file_type(0)
    head = N_EMBD // N_HEAD
    w.add_tensor("token_embd.weight", _rand(rng, N_EMBD, n_vocab))
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    w.add_tensor("output.weight", _rand(rng, N_EMBD, n_vocab))
    for i in range(N_LAYER):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", _rand(rng, N_EMBD, N_EMBD))
        w.add_tensor(f"blk.{i}.attn_q.bias", _rand(rng, N_EMBD))
        w.add_tensor(f"blk.{i}.attn_k.weight", _rand(rng, N_EMBD, head * N_HEAD_KV))
        w.add_tensor(f"blk.{i}.attn_k.bias", _rand(rng, head * N_HEAD_KV))
        w.add_tensor(f"blk.{i}.attn_v.weight", _rand(rng, N_EMBD, head * N_HEAD_KV))
        w.add_tensor(f"blk.{i}.attn_v.bias", _rand(rng, head * N_HEAD_KV))
        w.add_tensor(f"blk.{i}.attn_output.weight", _rand(rng, N_EMBD, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", _rand(rng, N_EMBD, N_FF))
        w.add_tensor(f"blk.{i}.ffn_up.weight", _rand(rng, N_EMBD, N_FF))
        w.add_tensor(f"blk.{i}.ffn_down.weight", _rand(rng, N_FF, N_EMBD))
    return finish(w, path)


def build_projector(path: Path, n_embd_text: int = N_EMBD, seed: int = 1) -> Path:
    rng = np.random.default_rng(seed)
    w = vision_writer(path, Shape(56, PATCH, V_WIDTH, V_FF, V_BLOCKS, V_HEADS, V_PROJ,
                                  projector="qwen2vl_merger"))
    for name in ("v.patch_embd.weight", "v.patch_embd.weight.1"):
        w.add_tensor(name, (rng.standard_normal((V_WIDTH, 3, PATCH, PATCH)) * 0.1)
                     .astype(np.float32))
    for i in range(V_BLOCKS):
        for ln in ("ln1", "ln2"):
            w.add_tensor(f"v.blk.{i}.{ln}.weight", np.ones(V_WIDTH, dtype=np.float32))
            w.add_tensor(f"v.blk.{i}.{ln}.bias", np.zeros(V_WIDTH, dtype=np.float32))
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w.add_tensor(f"v.blk.{i}.{part}.weight", _rand(rng, V_WIDTH, V_WIDTH))
            w.add_tensor(f"v.blk.{i}.{part}.bias", _rand(rng, V_WIDTH))
        w.add_tensor(f"v.blk.{i}.ffn_up.weight", _rand(rng, V_WIDTH, V_FF))
        w.add_tensor(f"v.blk.{i}.ffn_up.bias", _rand(rng, V_FF))
        w.add_tensor(f"v.blk.{i}.ffn_down.weight", _rand(rng, V_FF, V_WIDTH))
        w.add_tensor(f"v.blk.{i}.ffn_down.bias", _rand(rng, V_WIDTH))
    w.add_tensor("mm.0.weight", _rand(rng, V_WIDTH * 4, V_PROJ))
    w.add_tensor("mm.0.bias", _rand(rng, V_PROJ))
    w.add_tensor("mm.2.weight", _rand(rng, V_PROJ, n_embd_text))
    w.add_tensor("mm.2.bias", _rand(rng, n_embd_text))
    return finish(w, path)


if __name__ == "__main__":
    import sys

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    print(build_text(out / "tiny-qwen2vl.gguf", Path(sys.argv[2])),
          build_projector(out / "mmproj-tiny-qwen2vl.gguf"))
