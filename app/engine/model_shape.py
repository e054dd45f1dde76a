"""What a GGUF's metadata says of a model's shape, as the memory estimate (app.engine.footprint)
needs it: layers, widths, heads per layer, the vocabulary, experts, which layers attend over a
sliding window, which keep a recurrent state instead of a KV cache.

llama.cpp reads the same keys (``{arch}.block_count``, ``{arch}.attention.head_count_kv``, ...).
Where a key is missing it falls back as llama.cpp does (a head's size is the width over the
heads; the KV heads are the heads). Where a model is something this module does not know how to
size (an unfamiliar recurrent layer, say), the shape says so in ``notes`` and the estimate takes
the larger reading.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.model.gguf_header import GgufHeader

# llama.cpp's default sliding-window layouts for architectures whose GGUF carries only the
# window (``set_swa_pattern(n)``: layer il slides when il % n < n - 1); a GGUF may state its own
# (``attention.sliding_window_pattern``: a number, or one bool per layer)
SWA_PATTERNS = {"gemma2": 2, "gemma3": 6, "gemma3n": 5, "cohere2": 4, "gpt-oss": 2,
                "exaone4": 4, "llama4": 4}
# architectures whose every layer is recurrent (no KV cache at all)
RECURRENT = ("mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7")
# the tensors llama.cpp puts in its input layer (always in host memory); every tensor outside
# the blocks and not here is the output layer's
INPUT_TENSORS = ("token_embd.", "token_embd_norm.", "position_embd.", "token_types.",
                 "per_layer_token_embd.")


def _per_layer(value: object, n_layer: int, default: int) -> tuple[int, ...]:
    """A per-layer hyperparameter: a number for every layer, or an array of one per layer."""
    if isinstance(value, tuple):
        vals = [int(v) for v in value[:n_layer]]
        return tuple(vals + [vals[-1] if vals else default] * (n_layer - len(vals)))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (int(value),) * n_layer
    return (default,) * n_layer


@dataclass(frozen=True)
class ModelShape:
    arch: str
    n_layer: int
    n_embd: int
    n_vocab: int
    n_head: tuple[int, ...]  # per layer
    n_head_kv: tuple[int, ...]  # per layer; 0: the layer keeps no KV cache
    head_k: int  # a key's values per head (key_length)
    head_v: int
    n_ff: int  # the widest feed-forward layer
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_expert: int = 0
    n_ff_shared: int = 0
    n_swa: int = 0  # the sliding window's tokens (0: none)
    swa_layers: tuple[bool, ...] = ()  # per layer: attends over the window only
    head_k_swa: int = 0
    head_v_swa: int = 0
    causal: bool = True
    has_output: bool = True  # an output.weight of its own (False: tied to token_embd)
    logits: bool = True  # computes logits over the vocabulary (a BERT does not)
    recurrent: tuple[bool, ...] = ()  # per layer: a recurrent state (Mamba, RWKV) not a KV cache
    rs_floats: int = 0  # a recurrent layer's state per sequence, in float32s
    n_layer_kv: int = 0  # the layers that own a KV cache (the rest share or skip one)
    notes: tuple[str, ...] = field(default=())

    @property
    def is_swa(self) -> bool:
        return self.n_swa > 0 and any(self.swa_layers)

    def kv_width(self, il: int) -> tuple[int, int]:
        """A cell's K and V values in layer ``il`` (n_embd_k_gqa, n_embd_v_gqa)."""
        if il >= self.n_layer_kv or self.recurrent[il]:
            return 0, 0
        k, v = self.head_k, self.head_v
        if self.swa_layers[il] and self.head_k_swa:
            k, v = self.head_k_swa, self.head_v_swa or self.head_v
        return k * self.n_head_kv[il], v * self.n_head_kv[il]


def shape_of(h: GgufHeader) -> ModelShape:
    """The shape a GGUF's metadata gives; raises ValueError when it gives no layers or width."""
    a = h.arch
    notes: list[str] = []
    n_layer = int(a("block_count", 0) or 0)
    n_embd = int(a("embedding_length", 0) or 0)
    if n_layer <= 0 or n_embd <= 0:
        raise ValueError(f"{h.path}: no {h.architecture}.block_count or embedding_length: not "
                         "a model llama.cpp can load")
    n_vocab = h.count("tokenizer.ggml.tokens") or int(a("vocab_size", 0) or 0)
    heads = _per_layer(a("attention.head_count"), n_layer, 0)
    kv_heads = _per_layer(a("attention.head_count_kv"), n_layer, -1)
    kv_heads = tuple(heads[i] if k < 0 else k for i, k in enumerate(kv_heads))
    top = max(heads) or 1
    head_k = int(a("attention.key_length", 0) or n_embd // top)
    head_v = int(a("attention.value_length", 0) or n_embd // top)
    n_ff = max(_per_layer(a("feed_forward_length"), n_layer, 0))
    n_expert = int(a("expert_count", 0) or 0)

    n_swa = int(a("attention.sliding_window", 0) or 0)
    pattern = a("attention.sliding_window_pattern", SWA_PATTERNS.get(h.architecture))
    if n_swa <= 0:
        swa = (False,) * n_layer
    elif isinstance(pattern, tuple):
        swa = tuple(bool(pattern[i]) if i < len(pattern) else False for i in range(n_layer))
    elif isinstance(pattern, int) and not isinstance(pattern, bool):
        swa = tuple(pattern == 0 or i % pattern < pattern - 1 for i in range(n_layer))
    else:  # a window without a layout this module knows: every layer sized in full
        swa = (False,) * n_layer
        notes.append(f"{h.architecture}'s sliding-window layers are not known here: every "
                     "layer's KV cache is counted in full")

    if a("attention.kv_lora_rank"):
        notes.append(f"{h.architecture}'s compressed (MLA) cache is counted as its K and V "
                     "rows; where llama.cpp keeps V as a view of K the estimate is high")
    recurrent, rs_floats = _recurrent(h, n_layer, kv_heads, notes)
    shared = int(a("attention.shared_kv_layers", 0) or 0)
    nextn = int(a("nextn_predict_layers", 0) or 0)
    names = {t.name for t in h.tensors}
    causal = a("attention.causal", True) is not False
    return ModelShape(
        arch=h.architecture, n_layer=n_layer, n_embd=n_embd, n_vocab=n_vocab,
        n_head=heads, n_head_kv=kv_heads, head_k=head_k, head_v=head_v, n_ff=n_ff,
        n_expert=n_expert, n_expert_used=int(a("expert_used_count", 0) or 0),
        n_ff_expert=int(a("expert_feed_forward_length", 0) or (n_ff if n_expert else 0)),
        n_ff_shared=int(a("expert_shared_feed_forward_length", 0) or 0),
        n_swa=n_swa, swa_layers=swa,
        head_k_swa=int(a("attention.key_length_swa", 0) or 0),
        head_v_swa=int(a("attention.value_length_swa", 0) or 0),
        causal=causal, has_output="output.weight" in names,
        logits="output.weight" in names or causal,
        recurrent=recurrent, rs_floats=rs_floats,
        n_layer_kv=max(0, n_layer - shared - nextn), notes=tuple(notes))


def _recurrent(h: GgufHeader, n_layer: int, kv_heads: tuple[int, ...],
               notes: list[str]) -> tuple[tuple[bool, ...], int]:
    """Which layers keep a recurrent state, and its float32s per sequence: Mamba's conv and
    scan states (ssm.*), RWKV's token shift and WKV state (wkv.head_size), LFM2's short
    convolutions. A hybrid model (Jamba, Granite 4, LFM2) states 0 KV heads for its recurrent
    layers."""
    a = h.arch
    d_conv, d_inner = int(a("ssm.conv_kernel", 0) or 0), int(a("ssm.inner_size", 0) or 0)
    d_state, n_group = int(a("ssm.state_size", 0) or 0), int(a("ssm.group_count", 0) or 0)
    wkv, l_cache = int(a("wkv.head_size", 0) or 0), int(a("shortconv.l_cache", 0) or 0)
    n_embd = int(a("embedding_length", 0) or 0)
    if d_inner and d_state:  # llama.cpp's n_embd_r + n_embd_s
        floats = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state) + d_state * d_inner
    elif wkv:
        floats = int(a("token_shift_count", 2) or 2) * n_embd + n_embd * wkv
    elif l_cache:  # LFM2's short convolutions
        floats = n_embd * max(l_cache - 1, 0)
    else:
        if h.architecture in RECURRENT:
            notes.append(f"{h.architecture}'s recurrent state could not be sized from its "
                         "metadata")
        return (False,) * n_layer, 0
    if h.architecture not in RECURRENT and any(k > 0 for k in kv_heads):
        # a hybrid: the layers without KV heads are recurrent
        return tuple(k == 0 for k in kv_heads), floats
    return (True,) * n_layer, floats
