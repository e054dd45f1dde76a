"""How much memory a model will take on each device, estimated from its GGUF header before
llama.cpp loads it: the weights, the KV cache, the compute buffers and the output buffer, per
device (the CPU's RAM, each GPU's VRAM).

The rules are llama.cpp's, checked against what it reports at load (tests/e2e/test_footprint.py,
the figures in docs/placement.md, "How much memory a model needs"):

- **Weights**: each tensor's bytes (ggml's block sizes) on the device its layer goes to. With
  GPU_LAYERS=n the last n blocks go to the GPUs, split between them by TENSOR_SPLIT or by their
  free memory, and the output layer too when n exceeds the blocks; the token embeddings stay in
  host memory. OVERRIDE_TENSOR, CPU_MOE and N_CPU_MOE move the tensors they match (the first
  rule that matches wins). An output tied to the token embeddings is copied to the output
  layer's GPU.
- **KV cache**: per layer, its cells x (K values x K type size + V values x V type size) on its
  layer's device. llama.cpp pads the context to 256 cells, and each slot's share too (one
  stream per slot); a sliding-window layer holds the window plus a micro-batch, padded, unless
  the cache is full-size (llama.cpp's default, which this server keeps); a recurrent layer holds
  its state (float32) per sequence.
- **Compute**: the largest working set of the graph for one micro-batch of ``n_ubatch`` tokens,
  which llama.cpp reserves up front: the logits (n_ubatch x the vocabulary, float32), the
  attention mask (f16 with flash attention, f32 without) and, without flash attention, the
  attention scores (n_ubatch x the cells x the heads, float32), or the feed-forward layer's;
  plus 3% for what ggml's allocator cannot reuse.
- **Output**: the logits (and embeddings) of the most rows one decode returns, in host memory.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from app.engine.model_shape import INPUT_TENSORS, ModelShape, shape_of
from app.engine.placement import Rule
from app.model.gguf_header import GGML_TYPES, TYPE_IDS, GgufHeader, row_bytes

CTX_PAD = 256  # llama.cpp pads the context, and each sequence's share, to this many cells
SLACK = 1.03  # the compute buffer's allowance for what ggml's allocator cannot reuse
PIPELINE_COPIES = 4  # llama.cpp's compute buffer copies with pipeline parallelism
# encoder architectures llama.cpp opens without a KV cache (their attention is over the input)
NO_CACHE = {"bert", "jina-bert-v2", "jina-bert-v3", "nomic-bert", "nomic-bert-moe",
            "neo-bert", "modern-bert", "t5encoder", "eurobert"}
_BLOCK = re.compile(r"^blk\.(\d+)\.")


def pad(n: int, to: int = CTX_PAD) -> int:
    return -(-n // to) * to


@dataclass(frozen=True)
class Context:
    """A llama.cpp context to be opened on the model, as app.engine.llama_model opens it."""

    role: str  # generation, embeddings, draft: what the estimate calls it
    n_ctx: int  # cells asked for, all sequences together
    n_seq: int
    n_ubatch: int
    n_outputs: int = 0  # rows of logits one decode may return (0: one per sequence)
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: bool = True
    kv_unified: bool = False
    swa_full: bool = True
    embeddings: bool = False

    def cells(self) -> tuple[int, int]:
        """(cells per stream, streams), as llama.cpp sizes them."""
        n_ctx = pad(max(self.n_ctx, 1))
        if self.kv_unified:
            return n_ctx, 1
        return pad(max(n_ctx // self.n_seq, 1)), self.n_seq


@dataclass(frozen=True)
class Layout:
    """Where the layers go: the GPUs llama.cpp sees (by device name, CUDA0 ...), GPU_LAYERS
    (< 0: all), SPLIT_MODE, MAIN_GPU, the shares per GPU (TENSOR_SPLIT, or their free memory;
    empty: equal) and the tensor overrides in the order llama.cpp tries them."""

    gpus: tuple[str, ...] = ()
    gpu_layers: int = 0
    split_mode: str = "layer"
    main_gpu: int = 0
    split: tuple[float, ...] = ()
    overrides: tuple[Rule, ...] = ()

    def used_gpus(self) -> tuple[str, ...]:
        if not self.gpus or self.gpu_layers == 0:
            return ()
        if self.split_mode == "none":
            return (self.gpus[min(self.main_gpu, len(self.gpus) - 1)],)
        return self.gpus

    def devices(self, n_layer: int) -> list[str]:
        """The device of each block, then of the output layer (llama.cpp's load_tensors)."""
        gpus = self.used_gpus()
        if not gpus:
            return ["CPU"] * (n_layer + 1)
        ngl = n_layer + 1 if self.gpu_layers < 0 else self.gpu_layers
        start, active = max(n_layer - ngl, 0), min(ngl, n_layer + 1)
        shares = list(self.split[:len(gpus)]) if self.split_mode != "none" else []
        if len(shares) != len(gpus) or sum(shares) <= 0:
            shares = [1.0] * len(gpus)
        total, cum = sum(shares), []
        for s in shares:
            cum.append((cum[-1] if cum else 0.0) + s / total)
        out = []
        for il in range(n_layer + 1):
            if il < start or il - start >= active:
                out.append("CPU")
            else:
                i = bisect.bisect_right(cum, (il - start) / active)
                out.append(gpus[min(i, len(gpus) - 1)])
        return out


@dataclass
class Need:
    """Bytes one device needs, by what for."""

    weights: int = 0
    kv: int = 0
    compute: int = 0
    output: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.output

    def add(self, other: Need) -> None:
        self.weights += other.weights
        self.kv += other.kv
        self.compute += other.compute
        self.output += other.output


@dataclass
class Footprint:
    devices: dict[str, Need] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def at(self, device: str) -> Need:
        return self.devices.setdefault(device, Need())

    def need(self, device: str) -> int:
        return self.devices[device].total if device in self.devices else 0

    def merge(self, other: Footprint) -> Footprint:
        for dev, need in other.devices.items():
            self.at(dev).add(need)
        self.notes.extend(n for n in other.notes if n not in self.notes)
        return self

    def as_dict(self) -> dict:
        return {dev: {"weights": n.weights, "kv_cache": n.kv, "compute": n.compute,
                      "output": n.output, "total": n.total}
                for dev, n in sorted(self.devices.items(), key=lambda kv: _order(kv[0]))}


def _order(device: str) -> tuple[int, str]:
    return (0 if device == "CPU" else 1, device)


def buft_device(buft: str) -> str:
    """The device whose memory a buffer type is: CPU, CPU_REPACK and CUDA_Host are host
    memory; CUDA0 and CUDA0_Split are the first GPU's."""
    if buft.startswith("CPU") or buft.endswith("_Host"):
        return "CPU"
    return buft.removesuffix("_Split")


def tensor_device(name: str, devices: Sequence[str], rules: Iterable[Rule]) -> str:
    for rule in rules:
        if re.search(rule.pattern, name):
            return buft_device(rule.buft)
    if m := _BLOCK.match(name):
        return devices[min(int(m.group(1)), len(devices) - 1)]
    if name.startswith(INPUT_TENSORS):
        return "CPU"
    return devices[-1]


def kv_row(type_name: str, values: int) -> int:
    """Bytes of one cell's ``values`` in a cache of type ``type_name`` (whole blocks)."""
    tid = TYPE_IDS[type_name]
    return row_bytes(tid, pad(values, GGML_TYPES[tid][1]))


def weights(h: GgufHeader, shape: ModelShape, layout: Layout) -> Footprint:
    fp = Footprint()
    devices = layout.devices(shape.n_layer)
    for t in h.tensors:
        fp.at(tensor_device(t.name, devices, layout.overrides)).weights += t.nbytes
    if not shape.has_output and shape.logits and devices[-1] != "CPU":
        embd = next((t for t in h.tensors if t.name == "token_embd.weight"), None)
        if embd is not None:  # llama.cpp duplicates the tied output onto the output's device
            fp.at(devices[-1]).weights += embd.nbytes
    fp.at("CPU")
    return fp


def _has_cache(shape: ModelShape) -> bool:
    return shape.causal or shape.arch not in NO_CACHE


def kv_cache(shape: ModelShape, layout: Layout, ctx: Context) -> Footprint:
    fp = Footprint()
    devices = layout.devices(shape.n_layer)
    if not _has_cache(shape):
        return fp
    per_stream, streams = ctx.cells()
    swa_cells = per_stream
    if shape.is_swa and not ctx.swa_full:
        window = shape.n_swa * (ctx.n_seq if ctx.kv_unified else 1) + ctx.n_ubatch
        swa_cells = pad(min(per_stream, window))
    for il in range(shape.n_layer):
        if shape.recurrent[il]:
            fp.at(devices[il]).kv += max(ctx.n_seq, 1) * shape.rs_floats * 4
            continue
        k, v = shape.kv_width(il)
        cells = (swa_cells if shape.swa_layers[il] else per_stream) * streams
        fp.at(devices[il]).kv += cells * (kv_row(ctx.type_k, k) + kv_row(ctx.type_v, v))
    return fp


def _phases(shape: ModelShape, ctx: Context) -> tuple[int, int, int]:
    """The graph's largest working sets for one micro-batch: attention, feed-forward, output."""
    b, e = ctx.n_ubatch, shape.n_embd
    per_stream, _ = ctx.cells()
    attending = [il for il in range(shape.n_layer)
                 if not shape.recurrent[il] and shape.n_head[il] > 0]
    if not _has_cache(shape):  # attention over the micro-batch itself
        spans = {il: b for il in attending}
        masks = b
    else:
        swa = per_stream
        if shape.is_swa and not ctx.swa_full:
            swa = pad(min(per_stream, shape.n_swa * (ctx.n_seq if ctx.kv_unified else 1) + b))
        spans = {il: swa if shape.swa_layers[il] else per_stream for il in attending}
        masks = per_stream + (swa if shape.is_swa else 0) if attending else 0
    width = max((shape.n_head[il] * shape.head_k for il in attending), default=e)
    mask = (2 if ctx.flash_attn else 4) * b * masks
    attn = mask
    if not ctx.flash_attn:
        attn += 4 * b * max((spans[il] * shape.n_head[il] for il in attending), default=0)
    ff = shape.n_ff
    if shape.n_expert:
        ff = shape.n_expert_used * shape.n_ff_expert + shape.n_ff_shared + shape.n_expert
    attn += 4 * b * (4 * e + 2 * width)
    ffn = mask + 4 * b * (2 * e + 3 * ff)  # the mask lives until the last layer's attention
    out = 4 * b * ((shape.n_vocab if shape.logits else 0) + 4 * e)
    if ctx.embeddings:  # pooling keeps the mask alive up to the output
        out += mask
    return attn, ffn, out


def compute(shape: ModelShape, layout: Layout, ctx: Context) -> Footprint:
    fp = Footprint()
    devices = layout.devices(shape.n_layer)
    attn, ffn, out = _phases(shape, ctx)
    layer_devices = set(devices[:-1])
    copies = 1
    gpus = layout.used_gpus()
    if len(gpus) > 1 and layout.split_mode == "layer" and "CPU" not in devices:
        copies = PIPELINE_COPIES  # llama.cpp's pipeline parallelism
    for dev in layer_devices | {devices[-1]}:
        phases = ([attn, ffn] if dev in layer_devices else []) + ([out] if dev == devices[-1]
                                                                   else [])
        need = int(SLACK * max(phases))
        fp.at(dev).compute += need * (copies if dev != "CPU" else 1)
    if "CPU" not in fp.devices:  # every layer on GPUs: the inputs in host memory
        mask = (2 if ctx.flash_attn else 4) * ctx.n_ubatch * ctx.cells()[0]
        fp.at("CPU").compute += 4 * ctx.n_ubatch * 2 * shape.n_embd + mask
    return fp


def output(shape: ModelShape, ctx: Context) -> Footprint:
    fp = Footprint()
    rows = max(ctx.n_outputs, ctx.n_seq)
    floats = (shape.n_vocab if shape.logits else 0) + (shape.n_embd if ctx.embeddings else 0)
    fp.at("CPU").output += 4 * rows * floats
    return fp


def estimate(h: GgufHeader, layout: Layout, contexts: Sequence[Context],
             shape: ModelShape | None = None) -> Footprint:
    """The model's weights placed by ``layout`` and each of ``contexts`` opened on it."""
    shape = shape or shape_of(h)
    fp = weights(h, shape, layout)
    fp.notes.extend(shape.notes)
    for ctx in contexts:
        fp.merge(kv_cache(shape, layout, ctx))
        fp.merge(compute(shape, layout, ctx))
        fp.merge(output(shape, ctx))
    return fp


def projector(h: GgufHeader, device: str) -> Footprint:
    """A vision or audio projector (MMPROJ): its weights, and its compute buffer for the
    largest image (a ViT's attention over its patches, float32, and its activations); audio
    encoders are sized by their weights only."""
    fp = Footprint()
    fp.at(device).weights += h.tensor_bytes
    width = int(h.get("clip.vision.embedding_length", 0) or 0)
    if width:
        size = int(h.get("clip.vision.image_size", 0) or 0)
        patch = int(h.get("clip.vision.patch_size", 0) or 1)
        n = max((size // max(patch, 1)) ** 2, 1)
        heads = int(h.get("clip.vision.attention.head_count", 0) or 1)
        ff = int(h.get("clip.vision.feed_forward_length", 0) or 4 * width)
        fp.at(device).compute += int(SLACK * 4 * n * (n * heads + 4 * width + 3 * ff))
    else:
        fp.notes.append("the audio encoder's compute buffer is not estimated")
    return fp
