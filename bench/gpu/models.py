"""The benchmark's models, made with gguf-py from a vocabulary GGUF: a real tokenizer and chat
template on random weights. Random weights are enough to measure speed and to run every test that
does not need sensible text, and they can be made where nothing can be downloaded (the GPU
machine). Nothing here is committed: the files are made where they are used.

    python bench/gpu/models.py vocab SRC.gguf OUT.gguf        # metadata only: the tokenizer
    python bench/gpu/models.py build SHAPE VOCAB.gguf OUT.gguf

Shapes (all `llama` architecture):
  nearfree  2 layers, 64 wide: its math costs next to nothing, so a benchmark on it measures the
            server's own work per token, the cost that decides speed on a GPU
  small     SmolLM2-135M's shape (30 layers, 576 wide, 9/3 heads), Q4_1 like the default model
  8b        Llama 3.1 8B's shape (32 layers, 4096 wide, 32/8 heads, 14336 feed-forward, 128256
            tokens), Q4_K with a Q6_K output: the size of what users serve on one GPU

The quantized blocks are written directly (random quants, fixed small scales), so the 8B file
(about 4.6 GB) takes seconds, not a float16 file and a quantize pass.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType, GGUFWriter

# What a vocabulary carries over: the tokenizer and the chat template.
KEEP = ("tokenizer.",)

# Llama 3's chat format, for a vocabulary file that has no template (llama.cpp's vocab-only
# files carry none). Written for this benchmark: system, user, assistant and tool turns.
LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] | trim }}"
    "{%- else %}{%- for part in message['content'] %}{{- part['text'] | default('') }}{%- endfor %}"
    "{%- endif %}{{- '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)

# bytes per block and values per block of the types written here
BLOCK = {Q.F32: (4, 1), Q.F16: (2, 1), Q.Q4_1: (20, 32), Q.Q4_K: (144, 256), Q.Q6_K: (210, 256)}


@dataclass(frozen=True)
class Shape:
    layers: int
    width: int
    heads: int
    kv_heads: int
    ff: int
    context: int
    rope_base: float
    matrix: Q  # the type of the layers' matrices
    output: Q | None  # None: tied to the token embeddings
    embed: Q


SHAPES = {
    "nearfree": Shape(2, 64, 4, 4, 256, 8192, 100000.0, Q.F16, None, Q.F16),
    "small": Shape(30, 576, 9, 3, 1536, 8192, 100000.0, Q.Q4_1, None, Q.Q4_1),
    "8b": Shape(32, 4096, 32, 8, 14336, 131072, 500000.0, Q.Q4_K, Q.Q6_K, Q.Q4_K),
}


def copy_fields(reader: GGUFReader, writer: GGUFWriter, keep=lambda key: key.startswith(KEEP)) -> set[str]:
    """The reader's fields that ``keep`` accepts (the tokenizer's) into the writer, with their
    types; the keys copied."""
    copied = set()
    for key, field in reader.fields.items():
        if not keep(key):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
        copied.add(key)
    return copied


def vocab(src: Path, out: Path) -> None:
    """A metadata-only GGUF: the architecture, the hyperparameters and the tokenizer of SRC."""
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(out, arch)
    copy_fields(reader, writer, lambda key: key.startswith(f"{arch}.") or key == "general.name")
    copy_fields(reader, writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()


def random_blocks(rng: np.random.Generator, qtype: Q, rows: int, cols: int) -> np.ndarray:
    """rows x cols weights of type qtype as raw bytes: random quants, scales that keep every
    weight within about +-0.02 (no NaN or infinity can arise)."""
    size, per = BLOCK[qtype]
    if cols % per:
        raise ValueError(f"{cols} columns are not a multiple of {qtype.name}'s {per}")
    if qtype in (Q.F32, Q.F16):
        dtype = np.float32 if qtype == Q.F32 else np.float16
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(dtype)
    blocks = rng.integers(0, 256, size=(rows, cols // per, size), dtype=np.uint8)
    half = np.float16

    def put(offset: int, value: float) -> None:
        blocks[:, :, offset:offset + 2] = np.frombuffer(half(value).tobytes(), np.uint8)

    if qtype == Q.Q4_1:  # d, m, 16 bytes of 4-bit quants: w = d * q + m
        put(0, 0.02 / 8)
        put(2, -0.02)
    elif qtype == Q.Q4_K:  # d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of quants
        put(0, 0.02 / (63 * 15))
        put(2, 0.02 / 63)
    elif qtype == Q.Q6_K:  # 128 + 64 bytes of quants, 16 int8 scales, then d
        put(208, 0.02 / (127 * 32))
    return blocks.reshape(rows, -1)


def build(shape_name: str, vocab_path: Path, out: Path, seed: int = 0) -> None:
    shape = SHAPES[shape_name]
    reader = GGUFReader(vocab_path)
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    writer = GGUFWriter(out, "llama")
    writer.add_name(f"vertex-gguf bench {shape_name} (random weights)")
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.width)
    writer.add_feed_forward_length(shape.ff)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_rope_dimension_count(shape.width // shape.heads)
    writer.add_file_type(int(shape.matrix) if shape.matrix != Q.Q4_K else 15)  # 15: Q4_K_M
    copied = copy_fields(reader, writer)
    if "tokenizer.chat_template" not in copied:
        writer.add_chat_template(LLAMA3_TEMPLATE)

    head_dim = shape.width // shape.heads
    tensors: list[tuple[str, Q, int, int]] = [("token_embd.weight", shape.embed, n_vocab, shape.width)]
    for i in range(shape.layers):
        b = f"blk.{i}."
        tensors += [
            (b + "attn_norm.weight", Q.F32, 1, shape.width),
            (b + "attn_q.weight", shape.matrix, shape.width, shape.width),
            (b + "attn_k.weight", shape.matrix, shape.kv_heads * head_dim, shape.width),
            (b + "attn_v.weight", shape.matrix, shape.kv_heads * head_dim, shape.width),
            (b + "attn_output.weight", shape.matrix, shape.width, shape.width),
            (b + "ffn_norm.weight", Q.F32, 1, shape.width),
            (b + "ffn_gate.weight", shape.matrix, shape.ff, shape.width),
            (b + "ffn_up.weight", shape.matrix, shape.ff, shape.width),
            (b + "ffn_down.weight", shape.matrix, shape.width, shape.ff),
        ]
    tensors.append(("output_norm.weight", Q.F32, 1, shape.width))
    if shape.output is not None:
        tensors.append(("output.weight", shape.output, n_vocab, shape.width))

    for name, qtype, rows, cols in tensors:
        size, per = BLOCK[qtype]
        nbytes = rows * cols // per * size
        if per > 1:  # quantized: gguf-py takes the shape in bytes and works out the values
            writer.add_tensor_info(name, (rows, nbytes // rows), np.dtype(np.uint8), nbytes,
                                   raw_dtype=qtype)
        else:
            shape_ = (cols,) if rows == 1 else (rows, cols)
            writer.add_tensor_info(name, shape_, np.dtype(np.float32), nbytes, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, qtype, rows, cols in tensors:
        if name.endswith("norm.weight"):
            data = np.ones(cols, dtype=np.float32)
        else:
            data = random_blocks(rng, qtype, rows, cols)
        writer.write_tensor_data(data)
    writer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("vocab", help="a metadata-only copy of a GGUF (its tokenizer)")
    v.add_argument("src", type=Path)
    v.add_argument("out", type=Path)
    b = sub.add_parser("build", help="a random-weight model of a shape on a vocabulary")
    b.add_argument("shape", choices=sorted(SHAPES))
    b.add_argument("vocab", type=Path)
    b.add_argument("out", type=Path)
    b.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.cmd == "vocab":
        vocab(args.src, args.out)
    else:
        build(args.shape, args.vocab, args.out, args.seed)
    print(f"{args.out}: {args.out.stat().st_size / 2**20:.1f} MiB", file=sys.stderr)


if __name__ == "__main__":
    main()
