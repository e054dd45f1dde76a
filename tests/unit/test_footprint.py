"""app.engine.footprint and app.engine.model_shape: the estimate's arithmetic against cases
worked by hand (llama.cpp's padding, streams per slot, grouped-query heads, quantized caches,
sliding-window layers, recurrent state, layers split over GPUs, overrides, a tied output, the
compute and output buffers). tests/e2e/test_footprint.py checks the same against llama.cpp."""

from __future__ import annotations

import pytest

from app.engine.footprint import Context, Layout, buft_device, estimate, pad
from app.engine.model_shape import shape_of
from app.engine.placement import Rule, rules
from app.model.gguf_header import GgufHeader
from tests.support.fake_header import V, model

MIB = 1 << 20


def ctx(n_ctx: int, n_seq: int = 1, ub: int = 512, **kw: object) -> Context:
    return Context("generation", n_ctx, n_seq, ub, **kw)


def test_cells_are_padded_as_llama_cpp_pads_them():
    assert ctx(1000 * 3, 3).cells() == (1024, 3)  # 3000 -> 3072 in all, 1024 per stream
    assert ctx(4096 * 4, 4).cells() == (4096, 4)
    assert ctx(300).cells() == (512, 1)
    assert ctx(2048, 16, kv_unified=True).cells() == (2048, 1)
    assert ctx(100 * 3, 3).cells() == (256, 3)  # 300 -> 512 / 3 = 170 -> 256 per stream


def test_kv_cache_of_grouped_query_heads():
    # 4 layers x 3072 cells x (2 heads x 32 values, K and V) x 2 bytes
    fp = estimate(model(), Layout(), [ctx(3000, 3)])
    assert fp.devices["CPU"].kv == 4 * 3072 * (64 + 64) * 2


def test_a_quantized_cache_counts_whole_blocks():
    # q8_0: 34 bytes per 32 values; q4_0: 18; a 64-value row is two blocks
    fp = estimate(model(), Layout(), [ctx(4096, type_k="q8_0", type_v="q4_0")])
    assert fp.devices["CPU"].kv == 4 * 4096 * (2 * 34 + 2 * 18)


def test_per_layer_kv_heads_and_layers_without_attention():
    h = model(n_head_kv=(2, 0, 4, 2))  # a layer with no KV heads keeps no KV cache
    assert estimate(h, Layout(), [ctx(1024)]).devices["CPU"].kv == 1024 * (2 + 0 + 4 + 2) * 32 * 2 * 2


def test_sliding_window_layers_hold_the_window_and_a_micro_batch():
    h = model("gemma3", n_layer=6, n_head=4, n_head_kv=1, head=64, attention__sliding_window=128)
    per_layer = 64 * 2 * 2  # K and V of one head, f16
    shape = shape_of(h)
    assert shape.swa_layers == (True,) * 5 + (False,)  # llama.cpp's pattern for gemma3: 5 in 6
    full = estimate(h, Layout(), [ctx(4096 * 4, 4)]).devices["CPU"].kv
    assert full == 6 * 4 * 4096 * per_layer  # swa_full (llama.cpp's default): every layer in full
    got = estimate(h, Layout(), [ctx(4096 * 4, 4, swa_full=False)]).devices["CPU"].kv
    # per stream: the window 128 + the micro-batch 512 = 640 -> 768 cells
    assert got == 1 * 4 * 4096 * per_layer + 5 * 4 * 768 * per_layer
    unified = estimate(h, Layout(), [ctx(4096 * 4, 4, swa_full=False, kv_unified=True)])
    # one stream: the window for each of 4 sequences + 512 = 1024 cells
    assert unified.devices["CPU"].kv == 16384 * per_layer + 5 * 1024 * per_layer


def test_a_stated_pattern_wins_over_the_architecture_s():
    h = model("gemma3", n_layer=4, attention__sliding_window=64,
              attention__sliding_window_pattern=(True, False, True, False))
    assert shape_of(h).swa_layers == (True, False, True, False)
    h = model("mystery", n_layer=2, attention__sliding_window=64)
    shape = shape_of(h)
    assert shape.swa_layers == (False, False) and "counted in full" in shape.notes[0]


def test_recurrent_state_per_sequence():
    # Mamba: (d_conv - 1) x (d_inner + 2 x groups x d_state) + d_state x d_inner float32s
    h = model("mamba", n_layer=2, n_head=0, n_head_kv=0, ssm__conv_kernel=4, ssm__inner_size=256,
              ssm__state_size=16, ssm__group_count=0)
    fp = estimate(h, Layout(), [ctx(4096, 3)])
    assert fp.devices["CPU"].kv == 2 * 3 * (3 * 256 + 16 * 256) * 4
    # a hybrid: the layers with KV heads attend, the others are recurrent
    h = model("jamba", n_layer=2, n_head_kv=(0, 2), ssm__conv_kernel=4, ssm__inner_size=256,
              ssm__state_size=16)
    fp = estimate(h, Layout(), [ctx(1024)])
    assert fp.devices["CPU"].kv == (3 * 256 + 16 * 256) * 4 + 1024 * 64 * 2 * 2


def test_weights_on_the_cpu_are_every_tensor_s_bytes():
    h = model()
    fp = estimate(h, Layout(), [])
    assert fp.devices["CPU"].weights == h.tensor_bytes
    assert set(fp.devices) == {"CPU"}


def test_layers_split_over_gpus_as_llama_cpp_splits_them():
    lay = Layout(gpus=("CUDA0", "CUDA1"), gpu_layers=3)
    # the last 3 of 4 blocks on GPUs, in two equal shares; the output stays on the CPU
    assert lay.devices(4) == ["CPU", "CUDA0", "CUDA0", "CUDA1", "CPU"]
    assert Layout(gpus=("CUDA0", "CUDA1"), gpu_layers=-1).devices(4) == \
        ["CUDA0", "CUDA0", "CUDA0", "CUDA1", "CUDA1"]
    assert Layout(gpus=("CUDA0", "CUDA1"), gpu_layers=-1, split=(3, 1)).devices(4) == \
        ["CUDA0", "CUDA0", "CUDA0", "CUDA0", "CUDA1"]
    assert Layout(gpus=("CUDA0", "CUDA1"), gpu_layers=4).devices(4)[-1] == "CPU"
    assert Layout(gpus=("CUDA0", "CUDA1"), gpu_layers=-1, split_mode="none",
                  main_gpu=1).devices(2) == ["CUDA1"] * 3


def test_weights_and_kv_follow_their_layer():
    h = model()
    fp = estimate(h, Layout(gpus=("CUDA0",), gpu_layers=-1), [ctx(1024)])
    layer = sum(t.nbytes for t in h.tensors if t.name.startswith("blk.0."))
    embd = 128 * V * 2
    assert fp.devices["CPU"].weights == embd  # the input layer stays in host memory
    assert fp.devices["CUDA0"].weights == h.tensor_bytes - embd
    assert fp.devices["CUDA0"].kv == 4 * 1024 * 128 * 2
    assert fp.devices["CPU"].kv == 0
    half = estimate(h, Layout(gpus=("CUDA0",), gpu_layers=2), [ctx(1024)])
    assert half.devices["CUDA0"].weights == 2 * layer
    assert half.devices["CUDA0"].kv == half.devices["CPU"].kv == 2 * 1024 * 128 * 2


def test_a_tied_output_is_copied_to_the_output_s_gpu():
    h = model(tied=True)
    on_gpu = estimate(h, Layout(gpus=("CUDA0",), gpu_layers=-1), [])
    embd = 128 * V * 2
    assert on_gpu.devices["CPU"].weights == embd
    assert on_gpu.devices["CUDA0"].weights == h.tensor_bytes - embd + embd
    assert estimate(h, Layout(), []).devices["CPU"].weights == h.tensor_bytes  # one mapping


def test_overrides_move_what_they_match_first_rule_first():
    h = model(experts=4)
    experts = sum(t.nbytes for t in h.tensors if "_exps" in t.name)
    moe = Layout(gpus=("CUDA0",), gpu_layers=-1, overrides=tuple(rules(None, True, 0)))
    fp = estimate(h, moe, [])
    assert fp.devices["CPU"].weights == 128 * V * 2 + experts
    two = Layout(gpus=("CUDA0",), gpu_layers=-1, overrides=tuple(rules(None, False, 2)))
    assert estimate(h, two, []).devices["CPU"].weights == 128 * V * 2 + experts // 2
    first = Layout(gpus=("CUDA0",), gpu_layers=-1, overrides=(
        Rule(r"blk\.0\.", "CUDA0"), Rule(r"blk\.[01]\.ffn_up_exps", "CPU")))
    assert estimate(h, first, []).devices["CPU"].weights == 128 * V * 2 + experts // 4
    assert [buft_device(b) for b in ("CPU", "CPU_REPACK", "CUDA_Host", "CUDA1", "CUDA0_Split")] \
        == ["CPU", "CPU", "CPU", "CUDA1", "CUDA0"]


def test_compute_is_the_largest_working_set_with_its_allowance():
    h = model()
    b, e = 512, 128
    # flash attention: the logits (micro-batch x vocabulary) and four widths, or the
    # feed-forward's set beside the mask, whichever is larger; 3% over it
    fa = estimate(h, Layout(), [ctx(4096)]).devices["CPU"].compute
    ffn = 2 * b * 4096 + 4 * b * (2 * e + 3 * 256)
    assert fa == int(1.03 * max(4 * b * (V + 4 * e), ffn))
    # without it, the attention scores: micro-batch x cells x heads, float32, and the mask
    scores = 4 * b * 32768 * (8 + 1) + 4 * b * (4 * e + 2 * 256)
    no_fa = estimate(h, Layout(), [ctx(32768, flash_attn=False)]).devices["CPU"].compute
    assert no_fa == int(1.03 * scores)
    assert no_fa > 500 * MIB > 50 * fa  # why FLASH_ATTN matters for long contexts


def test_compute_on_gpus_and_the_inputs_in_host_memory():
    h = model()
    fp = estimate(h, Layout(gpus=("CUDA0",), gpu_layers=-1), [ctx(4096)])
    alone = estimate(h, Layout(), [ctx(4096)])
    assert fp.devices["CUDA0"].compute == alone.devices["CPU"].compute
    assert 0 < fp.devices["CPU"].compute < fp.devices["CUDA0"].compute
    two = estimate(h, Layout(gpus=("CUDA0", "CUDA1"), gpu_layers=-1), [ctx(4096)])
    assert two.devices["CUDA0"].compute == 4 * alone.devices["CPU"].compute  # pipeline copies


def test_the_output_buffer_holds_the_most_rows_a_decode_returns():
    h = model()
    assert estimate(h, Layout(), [ctx(4096, 4)]).devices["CPU"].output == 4 * V * 4
    assert estimate(h, Layout(), [ctx(4096, 4, n_outputs=40)]).devices["CPU"].output == 40 * V * 4
    emb = Context("embeddings", 2048, 16, 2048, embeddings=True, kv_unified=True)
    assert estimate(h, Layout(), [emb]).devices["CPU"].output == 16 * (V + 128) * 4


def test_an_encoder_without_a_cache_attends_over_its_micro_batch():
    h = model("bert", n_layer=2, n_head=2, n_head_kv=2, head=16, n_embd=32, tied=True,
              attention__causal=False)
    shape = shape_of(h)
    assert not shape.causal and not shape.logits
    fp = estimate(h, Layout(), [Context("embeddings", 2048, 16, 2048, embeddings=True,
                                        kv_unified=True, flash_attn=False)])
    assert fp.devices["CPU"].kv == 0
    b = 2048
    assert fp.devices["CPU"].compute >= 4 * b * b * (2 + 1)  # scores and the mask, float32


def test_what_is_not_modelled_is_said():
    mla = shape_of(model("deepseek2", n_head_kv=1, head=576, attention__kv_lora_rank=512))
    assert "MLA" in mla.notes[0]
    rwkv = shape_of(model("rwkv7", n_head=0, n_head_kv=0))
    assert "could not be sized" in rwkv.notes[0]


def test_an_unsized_model_is_refused_not_guessed():
    with pytest.raises(ValueError, match="block_count"):
        shape_of(GgufHeader("x.gguf", 3, {"general.architecture": "llama"}, []))
    assert pad(1) == 256 and pad(256) == 256 and pad(257) == 512
