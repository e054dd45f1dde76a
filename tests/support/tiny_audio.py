"""A tiny audio projector (an mmproj GGUF of Qwen2-Audio's type) with random weights, built
with gguf-py: a 2-block Whisper-style encoder over 80 mel bins and one projection to the text
model's width. libmtmd loads it, turns 16 kHz PCM into mel frames, tokenizes and encodes them,
so the whole audio pipeline runs; what it "hears" means nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from tests.support.tiny_mmproj import finish

WIDTH, FF, BLOCKS, HEADS, MELS, N_POS = 32, 64, 2, 4, 80, 1500


def build_tiny_audio(path: Path, n_embd_text: int, seed: int = 2) -> Path:
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "clip")
    w.add_name("tiny-audio-mmproj")
    w.add_string("clip.projector_type", "qwen2a")
    w.add_bool("clip.has_audio_encoder", True)
    w.add_uint32("clip.audio.embedding_length", WIDTH)
    w.add_uint32("clip.audio.feed_forward_length", FF)
    w.add_uint32("clip.audio.block_count", BLOCKS)
    w.add_uint32("clip.audio.attention.head_count", HEADS)
    w.add_uint32("clip.audio.projection_dim", n_embd_text)
    w.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)
    w.add_uint32("clip.audio.num_mel_bins", MELS)

    def t(name: str, *dims: int, scale: float = 0.1) -> None:
        w.add_tensor(name, (rng.standard_normal(dims[::-1], dtype=np.float32) * scale))

    t("a.conv1d.1.weight", 3, MELS, WIDTH)
    t("a.conv1d.1.bias", 1, WIDTH)  # {1, width}: added to every frame
    t("a.conv1d.2.weight", 3, WIDTH, WIDTH)
    t("a.conv1d.2.bias", 1, WIDTH)
    t("a.position_embd.weight", WIDTH, N_POS)
    for i in range(BLOCKS):
        for ln in ("ln1", "ln2"):
            w.add_tensor(f"a.blk.{i}.{ln}.weight", np.ones(WIDTH, dtype=np.float32))
            w.add_tensor(f"a.blk.{i}.{ln}.bias", np.zeros(WIDTH, dtype=np.float32))
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            t(f"a.blk.{i}.{part}.weight", WIDTH, WIDTH)
            if part != "attn_k":  # Whisper's keys have no bias
                t(f"a.blk.{i}.{part}.bias", WIDTH)
        t(f"a.blk.{i}.ffn_up.weight", WIDTH, FF)
        t(f"a.blk.{i}.ffn_up.bias", FF)
        t(f"a.blk.{i}.ffn_down.weight", FF, WIDTH)
        t(f"a.blk.{i}.ffn_down.bias", WIDTH)
    w.add_tensor("a.post_ln.weight", np.ones(WIDTH, dtype=np.float32))
    w.add_tensor("a.post_ln.bias", np.zeros(WIDTH, dtype=np.float32))
    t("mm.a.fc.weight", WIDTH, n_embd_text)
    t("mm.a.fc.bias", n_embd_text)
    return finish(w, path)


if __name__ == "__main__":
    import sys

    print(build_tiny_audio(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 576))
