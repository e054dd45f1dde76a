"""GGUF headers made in memory, as a converter would write them (f16 matrices, f32 norms), for
the memory estimate's unit tests: no file, no weights."""

from __future__ import annotations

from app.model.gguf_header import ArrayInfo, GgufHeader, TensorInfo

V = 1000  # the vocabulary


def model(arch: str = "llama", n_layer: int = 4, n_embd: int = 128, n_head: int = 8,
          n_head_kv: int | tuple = 2, head: int = 32, n_ff: int = 256, tied: bool = False,
          experts: int = 0, **extra: object) -> GgufHeader:
    """A header as a converter writes it: f16 matrices, f32 norms."""
    meta = {"general.architecture": arch, f"{arch}.block_count": n_layer,
            f"{arch}.embedding_length": n_embd, f"{arch}.attention.head_count": n_head,
            f"{arch}.attention.head_count_kv": n_head_kv, f"{arch}.attention.key_length": head,
            f"{arch}.attention.value_length": head, f"{arch}.feed_forward_length": n_ff,
            f"{arch}.context_length": 8192, "tokenizer.ggml.tokens": ArrayInfo(8, V)}
    if experts:
        meta.update({f"{arch}.expert_count": experts, f"{arch}.expert_used_count": 2})
    meta.update({f"{arch}.{k.replace('__', '.')}": v for k, v in extra.items()})
    tensors = [TensorInfo("token_embd.weight", (n_embd, V), 1, 0),
               TensorInfo("output_norm.weight", (n_embd,), 0, 0)]
    if not tied:
        tensors.append(TensorInfo("output.weight", (n_embd, V), 1, 0))
    for i in range(n_layer):
        kv = n_head_kv[i] if isinstance(n_head_kv, tuple) else n_head_kv
        tensors += [TensorInfo(f"blk.{i}.attn_q.weight", (n_embd, n_head * head), 1, 0),
                    TensorInfo(f"blk.{i}.attn_k.weight", (n_embd, max(kv, 1) * head), 1, 0),
                    TensorInfo(f"blk.{i}.attn_norm.weight", (n_embd,), 0, 0)]
        if experts:
            tensors.append(TensorInfo(f"blk.{i}.ffn_up_exps.weight", (n_embd, n_ff, experts), 1,
                                      0))
        else:
            tensors.append(TensorInfo(f"blk.{i}.ffn_up.weight", (n_embd, n_ff), 1, 0))
    return GgufHeader("m.gguf", 3, meta, tensors)
