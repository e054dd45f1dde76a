"""A tiny vision projector (an mmproj GGUF) with random weights, built with gguf-py: no vision
GGUF ships in a package this project can install. A 2-block ViT on 28 x 28 images in 14 x 14
patches (4 image tokens) and an ``mlp`` projector whose output width is the text model's
embedding width, the layout llama.cpp's clip loader reads for LLaVA-style projectors. libmtmd
loads it, tokenizes an image into a chunk of 4 tokens and encodes it, so the whole vision
pipeline runs; what it "sees" means nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter

IMAGE, PATCH, WIDTH, FF, BLOCKS, HEADS, PROJ = 28, 14, 32, 64, 2, 4, 64
N_TOKENS = (IMAGE // PATCH) ** 2  # image tokens per image


def build_tiny_mmproj(path: Path, n_embd_text: int, seed: int = 0) -> Path:
    """The projector for a text model of width ``n_embd_text`` (576 for the default model)."""
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "clip")
    w.add_name("tiny-mmproj")
    w.add_string("clip.projector_type", "mlp")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", IMAGE)
    w.add_uint32("clip.vision.patch_size", PATCH)
    w.add_uint32("clip.vision.embedding_length", WIDTH)
    w.add_uint32("clip.vision.feed_forward_length", FF)
    w.add_uint32("clip.vision.block_count", BLOCKS)
    w.add_uint32("clip.vision.attention.head_count", HEADS)
    w.add_uint32("clip.vision.projection_dim", PROJ)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    def t(name: str, *shape: int, scale: float = 0.2) -> None:
        # numpy shape is ggml's {ne0, ne1, ...} reversed
        w.add_tensor(name, (rng.standard_normal(shape[::-1]) * scale).astype(np.float32))

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    w.add_tensor("v.patch_embd.weight",
                 (rng.standard_normal((WIDTH, 3, PATCH, PATCH)) * 0.2).astype(np.float32))
    t("v.position_embd.weight", WIDTH, N_TOKENS)
    for i in range(BLOCKS):
        for ln in ("ln1", "ln2"):
            ones(f"v.blk.{i}.{ln}.weight", WIDTH)
            t(f"v.blk.{i}.{ln}.bias", WIDTH, scale=0.0)
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            t(f"v.blk.{i}.{part}.weight", WIDTH, WIDTH)
            t(f"v.blk.{i}.{part}.bias", WIDTH)
        t(f"v.blk.{i}.ffn_up.weight", WIDTH, FF)
        t(f"v.blk.{i}.ffn_up.bias", FF)
        t(f"v.blk.{i}.ffn_down.weight", FF, WIDTH)
        t(f"v.blk.{i}.ffn_down.bias", WIDTH)
    t("mm.0.weight", WIDTH, PROJ)
    t("mm.0.bias", PROJ)
    t("mm.2.weight", PROJ, n_embd_text)
    t("mm.2.bias", n_embd_text)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


if __name__ == "__main__":
    import sys

    print(build_tiny_mmproj(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 576))
