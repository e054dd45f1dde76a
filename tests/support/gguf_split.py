"""Split a GGUF into shards the way llama.cpp's gguf-split does (for tests: no such tool ships
on PyPI). Uses gguf-py's writer, which writes the split.* keys llama.cpp's loader reads."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter


def split_gguf(src: Path, out_dir: Path, shards: int) -> list[Path]:
    reader = GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    stem = src.name[: -len(".gguf")]
    per_shard = math.ceil(len(reader.tensors) / shards)
    writer = GGUFWriter(str(out_dir / f"{stem}.gguf"), arch, split_max_tensors=per_shard)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture",) or key.startswith("split."):
            continue
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY:
            writer.add_key_value(key, field.contents(), vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(key, field.contents(), vtype)
    for t in reader.tensors:
        # t.data has the byte shape for quantized types: the writer converts it back
        writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sorted(out_dir.glob(f"{stem}-*-of-*.gguf"))


if __name__ == "__main__":
    import sys

    print(split_gguf(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])))
