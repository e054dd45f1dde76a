"""A tiny vision projector (an mmproj GGUF) with random weights, built with gguf-py: no vision
GGUF ships in a package this project can install. A 2-block ViT on 28 x 28 images in 14 x 14
patches (4 image tokens) and an ``mlp`` projector whose output width is the text model's
embedding width, the layout llama.cpp's clip loader reads for LLaVA-style projectors. libmtmd
loads it, tokenizes an image into a chunk of 4 tokens and encodes it, so the whole vision
pipeline runs; what it "sees" means nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter


@dataclass(frozen=True)
class Shape:
    image: int  # pixels per side the encoder takes
    patch: int
    width: int
    ff: int
    blocks: int
    heads: int
    proj: int
    dtype: type = np.float32
    # mlp (LLaVA's: image tokens attend causally, like text) or gemma3 (SigLIP, patches pooled
    # by ``merge`` per side, then a norm and a projection: image tokens attend both ways)
    projector: str = "mlp"
    merge: int = 1

    @property
    def n_tokens(self) -> int:
        return (self.image // self.patch // self.merge) ** 2


TINY = Shape(28, 14, 32, 64, 2, 4, 64)  # 4 image tokens, a few milliseconds to encode
# Gemma 3's projector type, as small: 4 x 4 patches pooled 2 x 2 into 4 tokens
TINY_GEMMA3 = Shape(56, 14, 32, 64, 2, 4, 64, projector="gemma3", merge=2)
# a CLIP ViT-B/14 at 224 pixels (86M parameters, 256 tokens per image), in float16: the size
# of a small vision model's encoder, for bench/vision.py
VIT_B = Shape(224, 14, 768, 3072, 12, 12, 2048, np.float16)
N_TOKENS = TINY.n_tokens  # image tokens per image


def build_tiny_mmproj(path: Path, n_embd_text: int, seed: int = 0, shape: Shape = TINY) -> Path:
    """The projector for a text model of width ``n_embd_text`` (576 for the default model)."""
    rng = np.random.default_rng(seed)
    PATCH, WIDTH, FF, BLOCKS, PROJ = (  # noqa: N806
        shape.patch, shape.width, shape.ff, shape.blocks, shape.proj)
    n_patches = shape.n_tokens
    w = vision_writer(path, shape)
    if shape.projector == "gemma3":
        w.add_uint32("clip.vision.projector.scale_factor", shape.merge)

    def t(name: str, *dims: int, scale: float = 0.2) -> None:
        # numpy shape is ggml's {ne0, ne1, ...} reversed; matrices in the shape's type
        if len(dims) > 1 and dims[0] > 64:  # wide layers: keep activations in range
            scale = scale / np.sqrt(dims[0]) * 4
        kind = shape.dtype if len(dims) > 1 else np.float32
        w.add_tensor(name, (rng.standard_normal(dims[::-1], dtype=np.float32) * scale).astype(kind))

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    w.add_tensor("v.patch_embd.weight",
                 (rng.standard_normal((WIDTH, 3, PATCH, PATCH)) * 0.2).astype(shape.dtype))
    t("v.position_embd.weight", WIDTH, n_patches)
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
    if shape.projector == "gemma3":
        ones("mm.soft_emb_norm.weight", WIDTH)
        t("mm.input_projection.weight", n_embd_text, WIDTH)
    else:
        t("mm.0.weight", WIDTH, PROJ)
        t("mm.0.bias", PROJ)
        t("mm.2.weight", PROJ, n_embd_text)
        t("mm.2.bias", n_embd_text)
    return finish(w, path)


def vision_writer(path: Path, shape: Shape) -> GGUFWriter:
    """A projector GGUF's writer with the vision encoder's metadata (clip.*) written."""
    w = GGUFWriter(str(path), "clip")
    w.add_name(f"tiny-mmproj-{shape.projector}")
    w.add_string("clip.projector_type", shape.projector)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", shape.image)
    w.add_uint32("clip.vision.patch_size", shape.patch)
    w.add_uint32("clip.vision.embedding_length", shape.width)
    w.add_uint32("clip.vision.feed_forward_length", shape.ff)
    w.add_uint32("clip.vision.block_count", shape.blocks)
    w.add_uint32("clip.vision.attention.head_count", shape.heads)
    w.add_uint32("clip.vision.projection_dim", shape.proj)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    return w


def finish(w: GGUFWriter, path: Path) -> Path:
    """Header, metadata and tensors to the file."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


if __name__ == "__main__":
    import sys

    print(build_tiny_mmproj(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 576))
