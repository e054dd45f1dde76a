"""A GGUF re-quantized (and optionally cut to its first layers) with gguf-py, for shapes no
package ships: a Q4_0 model, whose weights llama.cpp repacks into its CPU_REPACK buffer type
when its extra CPU buffer types are on (tests/unit/test_no_amx.py and tests/e2e/test_no_amx.py)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, quants

_BLOCK = re.compile(r"^blk\.(\d+)\.")


def requantize(src: Path, dst: Path, qtype: GGMLQuantizationType, layers: int | None = None,
               ) -> Path:
    """``src`` with every tensor of ``src``'s main quantized type re-quantized to ``qtype``;
    with ``layers``, only the first ``layers`` blocks (a truncated model still runs)."""
    reader = GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(str(dst), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        if layers is not None and key == f"{arch}.block_count":
            value = layers
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY:
            writer.add_key_value(key, value, vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(key, value, vtype)
    kinds = [t.tensor_type for t in reader.tensors if len(t.shape) == 2]
    main = max(set(kinds), key=kinds.count)
    for t in reader.tensors:
        m = _BLOCK.match(t.name)
        if layers is not None and m and int(m.group(1)) >= layers:
            continue
        data, kind = np.asarray(t.data), t.tensor_type
        if kind == main and kind != qtype:
            data, kind = quants.quantize(quants.dequantize(data, kind), qtype), qtype
        writer.add_tensor(t.name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
