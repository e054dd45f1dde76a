"""A random-weight LoRA adapter GGUF for a model, written with gguf-py (no package ships one
for the suite's model): low-rank A and B matrices on each block's feed-forward up and down
projections, shaped to the model's tensors as llama.cpp's adapter loader checks them
(lora_a ne = [n_in, rank], lora_b ne = [rank, n_out]). At the default size, scale 1 moves the
135M model's greedy reply within a few tokens, and scale 0 leaves it as it was."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter

TARGETS = ("ffn_up", "ffn_down")


def write_lora(base: Path, dest: Path, rank: int = 8, alpha: float = 16.0, seed: int = 0,
               std: float = 0.02, width: int | None = None) -> Path:
    """An adapter for ``base``; ``width`` (default: the model's) other than the model's gives
    an adapter whose shapes do not match it, which llama.cpp must refuse."""
    reader = GGUFReader(str(base))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(dest), arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    for t in reader.tensors:
        name = t.name
        parts = name.split(".")
        if parts[0] != "blk" or parts[-1] != "weight" or parts[2] not in TARGETS:
            continue
        n_in, n_out = int(t.shape[0]), int(t.shape[1])  # gguf-py gives ne order
        if width is not None:
            n_in = width
        stem = name[: -len(".weight")]
        a = rng.normal(0, std, (rank, n_in)).astype(np.float32)
        b = rng.normal(0, std, (n_out, rank)).astype(np.float32)
        writer.add_tensor(f"{stem}.weight.lora_a", a)
        writer.add_tensor(f"{stem}.weight.lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest
