"""A speculative-decoding draft cut from a model, written with gguf-py: the model's first
``n_layers`` blocks and every tensor outside the blocks (embeddings, final norm, output), with
``{arch}.block_count`` lowered and every other key (the tokenizer, the chat template) as it
was. The draft shares the target's vocabulary, as llama.cpp's speculative decoding requires,
and no package ships one for the suite's model. Its tensors are copied byte for byte, so the
kept layers are exactly the target's: a truncated model still runs, and its greedy next token
often agrees with the full model's on text that repeats (code), less on free text."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

_BLOCK = re.compile(r"^blk\.(\d+)\.")


def write_draft(source: Path, dest: Path, n_layers: int) -> Path:
    """``source`` (a GGUF of a block-stacked architecture, e.g. llama) cut to its first
    ``n_layers`` blocks."""
    reader = GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    total = int(reader.fields[f"{arch}.block_count"].contents())
    if not 0 < n_layers <= total:
        raise ValueError(f"n_layers must be 1..{total} for {source.name}, not {n_layers}")
    writer = GGUFWriter(str(dest), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the writer writes these itself
        value = n_layers if key == f"{arch}.block_count" else field.contents()
        if key == "general.alignment":
            writer.data_alignment = int(value)  # the tensor data's padding, not only the key
        vtype = field.types[0]
        writer.add_key_value(key, value, vtype,
                             sub_type=field.types[-1] if vtype == GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        m = _BLOCK.match(t.name)
        if m and int(m.group(1)) >= n_layers:
            continue
        # quantized tensors come as rows of bytes; raw_dtype keeps them (and F32/F16) as they are
        writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest


if __name__ == "__main__":
    import sys

    print(write_draft(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])))
