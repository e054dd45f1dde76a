"""A tiny model of a model family, built with gguf-py: random weights (the ``llama``
architecture, 2 layers 64 wide), the default model's tokenizer with the family's special tokens
appended as control tokens, and a chat template that renders the family's markers as its real
one does. For the tool-call and thought formats (app.formats): forced calls go through the
grammar, so a random model writes the family's syntax; what it says otherwise means nothing.

llama.cpp marks a control token whose text it knows as an end of generation (``<|return|>``,
``<|call|>``, ``<end_of_turn>``, ``<|im_end|>``, ...) by itself when it loads the vocabulary, as
it does for the real models; ``eos`` names the token the GGUF calls its EOS.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from tests.support.tiny_mmproj import finish
from tests.support.tiny_qwen2vl import _rand

N_EMBD, N_LAYER, N_HEAD, N_FF = 64, 2, 4, 128
CONTROL = 3  # llama_token_type: LLAMA_TOKEN_TYPE_CONTROL


def build_family(path: Path, vocab_src: Path, tokens: list[str], template: str,
                 eos: str | None = None, bos: str | None = None, seed: int = 0,
                 favour: str | None = None, after: tuple[str, ...] = ()) -> Path:
    """The model at ``path``: ``vocab_src``'s tokenizer plus ``tokens`` (control tokens, in
    order, those it already has left as they are), with ``template`` as its chat template.
    ``favour``: the token the model writes right after any of the tokens ``after`` (a family's
    call opener after the generation prompt's last token, so that even a request that cannot
    force a call, Ollama's, gets one): their embeddings carry a large first component, which
    only that token's output row reads."""
    rng = np.random.default_rng(seed)
    reader = GGUFReader(str(vocab_src))
    vocab = list(reader.fields["tokenizer.ggml.tokens"].contents())
    types = list(reader.fields["tokenizer.ggml.token_type"].contents())
    for text in tokens:
        if text not in vocab:
            vocab.append(text)
            types.append(CONTROL)
        else:
            types[vocab.index(text)] = CONTROL
    w = GGUFWriter(str(path), "llama")
    w.add_name(path.stem)
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer.") or key in (
                "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.chat_template",
                "tokenizer.ggml.eos_token_id", "tokenizer.ggml.bos_token_id"):
            continue
        vtype = field.types[0]
        w.add_key_value(key, field.contents(), vtype,
                        sub_type=field.types[1] if vtype == GGUFValueType.ARRAY else None)
    w.add_token_list(vocab)
    w.add_token_types(types)
    w.add_chat_template(template)
    w.add_eos_token_id(vocab.index(eos) if eos else
                       int(reader.fields["tokenizer.ggml.eos_token_id"].contents()))
    w.add_bos_token_id(vocab.index(bos) if bos else
                       int(reader.fields["tokenizer.ggml.bos_token_id"].contents()))
    n_vocab = len(vocab)
    w.add_context_length(4096)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(0)
    embd, out = _rand(rng, N_EMBD, n_vocab), _rand(rng, N_EMBD, n_vocab)
    if favour is not None:
        embd[:, 0] = 0.0
        embd[[vocab.index(t) for t in after], 0] = 100.0
        out[:, 0] = 0.0
        out[vocab.index(favour), 0] = 5.0
    w.add_tensor("token_embd.weight", embd)
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    w.add_tensor("output.weight", out)
    for i in range(N_LAYER):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"blk.{i}.{name}.weight", _apart(_rand(rng, N_EMBD, N_EMBD), favour))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", _apart(_rand(rng, N_EMBD, N_FF), favour))
        w.add_tensor(f"blk.{i}.ffn_up.weight", _apart(_rand(rng, N_EMBD, N_FF), favour))
        w.add_tensor(f"blk.{i}.ffn_down.weight", _apart(_rand(rng, N_FF, N_EMBD), favour))
    return finish(w, path)


def _apart(weight: np.ndarray, favour: str | None) -> np.ndarray:
    """A layer's weight (numpy: out x in) that neither reads nor writes the residual stream's
    first component when a token is favoured: that component is then the current token's
    embedding alone, so the favoured token follows exactly the ``after`` tokens."""
    if favour is not None:
        if weight.shape[1] == N_EMBD:
            weight[:, 0] = 0.0
        if weight.shape[0] == N_EMBD:
            weight[0, :] = 0.0
    return weight
