"""End to end: the memory estimate (app.engine.footprint) against what llama.cpp itself
allocates on this CPU, read from its own log lines (tests/support/llama_buffers.py runs the real
llama-cpp-python in a child process), for the default model and tiny shapes built with gguf-py:
grouped-query attention, a mixture of experts, Gemma 3's sliding-window layers, q8_0 matrices,
Mamba's recurrent state;
at two contexts and slot counts, a quantized KV cache, flash attention off, an embedding
context. Then the pre-load check on real servers: /props shows the estimate beside llama.cpp's
figures, and a server whose budget (MEMORY_BUDGET_GB) is too small refuses the model with the
reason on /health.

The tolerances (docs/placement.md, "How much memory a model needs"): weights within 1% (the
file's tensors, as llama.cpp maps them), the KV cache and the output buffer to llama.cpp's
rounding (it prints MiB to two decimals), the compute buffer from llama.cpp's figure up to 15%
above it, never below."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests

from app.engine.footprint import Context, Layout, estimate
from app.model.gguf_header import read_model
from tests.support.llama_buffers import measure
from tests.support.server import ServerProcess, running_server
from tests.support.tiny_shapes import Shape, build_shape

ROUNDING = 6 << 10  # llama.cpp prints each buffer's MiB to two decimals: 5 KiB, and a bit
TYPES = {"f16": 1, "q8_0": 8}  # ggml_type ids of the caches used here
SHAPES = {
    "gqa": Shape(),  # 4 layers, 8 heads, 2 KV heads of 32
    "moe": Shape(n_expert=4, n_expert_used=2),
    "gemma3": Shape(arch="gemma3", n_layer=6, n_head=4, n_head_kv=1, head_dim=64, tied=True),
    "q8_0": Shape(matrix="Q8_0", n_embd=256, n_ff=512),
    "mamba": Shape(arch="mamba", n_layer=3),  # a recurrent state per sequence, no KV cache
}
# (role, cells per slot, slots, micro-batch, flash attention, K and V type, sliding window full)
CONTEXTS = [
    ("two slots", 1024, 2, 512, True, "f16", True),
    ("four slots, q8_0", 4096, 4, 256, True, "q8_0", True),
    ("no flash attention", 8192, 1, 512, False, "f16", True),
    ("window only", 4096, 4, 512, True, "f16", False),
]


@pytest.fixture(scope="module")
def models(default_model, tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("shapes")
    out = {"default": default_model}
    for name, shape in SHAPES.items():
        out[name] = build_shape(d / f"{name}.gguf", default_model, shape)
    return out


def _within(est: int, got: int, what: str) -> None:
    assert abs(est - got) <= max(ROUNDING, got // 1000), f"{what}: estimate {est}, llama.cpp {got}"


@pytest.mark.parametrize("name", ["default", *SHAPES])
def test_the_estimate_matches_what_llama_cpp_allocates(models, name):
    path = models[name]
    specs = [dict(n_ctx=cells * slots, n_seq_max=slots, n_batch=512, n_ubatch=ub,
                  flash_attn_type=1 if fa else 0, type_k=TYPES[kv], type_v=TYPES[kv],
                  swa_full=full, op_offload=False) for _, cells, slots, ub, fa, kv, full in CONTEXTS]
    specs.append(dict(n_ctx=2048, n_seq_max=16, n_batch=2048, n_ubatch=2048, kv_unified=True,
                      embeddings=True, pooling_type=1, flash_attn_type=1, op_offload=False))
    # all on the CPU, on a GPU build too (E2E_MODEL's runs): what the estimate is given here
    got = measure(path, {"model": {"n_gpu_layers": 0}, "contexts": specs})
    h = read_model(path)

    mapped = got["model"]["CPU_Mapped"]  # the file's tensors, mapped (a repacked copy beside)
    weights = estimate(h, Layout(), []).devices["CPU"].weights
    assert abs(weights - mapped) <= mapped // 100, (weights, got["model"])
    assert got["model"].get("CPU_REPACK", 0) <= weights

    contexts = [Context(role, cells * slots, slots, ub, type_k=kv, type_v=kv, flash_attn=fa,
                        swa_full=full) for role, cells, slots, ub, fa, kv, full in CONTEXTS]
    contexts.append(Context("embeddings", 2048, 16, 2048, kv_unified=True, embeddings=True))
    for ctx, llama in zip(contexts, got["contexts"], strict=True):
        assert "error" not in llama, llama
        need = estimate(h, Layout(), [ctx]).devices["CPU"]
        _within(need.kv, sum(llama.get("kv", {}).values()), f"{ctx.role}: KV cache")
        _within(need.output, sum(llama["output"].values()), f"{ctx.role}: output buffer")
        compute = sum(llama["compute"].values())
        assert compute <= need.compute <= 1.15 * compute, \
            f"{ctx.role}: compute estimate {need.compute}, llama.cpp {compute}"


def test_the_sliding_window_cache_is_smaller_only_when_asked(models):
    """Gemma 3's five window layers in six: a full-size cache by default (llama.cpp's, and this
    server's), the window plus a micro-batch per slot when not."""
    h = read_model(models["gemma3"])
    full = estimate(h, Layout(), [Context("x", 16384, 4, 512)]).devices["CPU"].kv
    window = estimate(h, Layout(), [Context("x", 16384, 4, 512, swa_full=False)]).devices["CPU"].kv
    assert window < full / 2


SMALL = {"PARALLEL": "2", "CTX_SIZE": "1024", "GPU_LAYERS": "0"}  # the CPU's figures alone


def test_props_shows_the_estimate_beside_what_llama_cpp_allocated():
    with running_server({**SMALL, "EMBEDDINGS": "on", "EMBEDDING_CTX": "512"}) as srv:
        memory = requests.get(srv.url("/props"), timeout=30).json()["memory"]
        logs = srv.logs()
    assert memory["check"] == "warn" and memory["fits"] and memory["over"] == []
    est, reported = memory["estimate"]["CPU"], memory["reported"]
    assert set(memory["estimate"]) == {"CPU"}
    assert memory["budget"]["CPU"]["budget"] == memory["budget"]["CPU"]["free"] - 512 * 2**20 \
        or "cap" in memory["budget"]["CPU"]
    _within(est["weights"], reported["CPU_Mapped"]["weights"], "weights")
    # the generation and the embedding contexts, both
    _within(est["kv_cache"], reported["CPU"]["kv_cache"], "KV cache")
    assert reported["CPU"]["compute"] <= est["compute"] <= 1.15 * reported["CPU"]["compute"]
    # the output buffer as it will grow (a scored prompt's rows), not as it starts
    assert est["output"] >= reported["CPU"]["output"]
    assert est["total"] == sum(est[k] for k in ("weights", "kv_cache", "compute", "output"))
    line = next(ln for ln in logs.splitlines() if "memory estimate: CPU needs" in ln)
    assert line.endswith(": fits") and "less the 0.50 GiB margin" in line


def test_a_model_over_its_budget_is_refused_with_the_reason_on_health(server_factory):
    srv = server_factory({**SMALL, "CTX_SIZE": "8192", "MEMORY_CHECK": "error",
                          "MEMORY_BUDGET_GB": "CPU=0.3"})
    failed = None
    deadline = time.monotonic() + 120
    while failed is None and srv.proc.poll() is None and time.monotonic() < deadline:
        try:  # the worker keeps answering for half a second after a failed load, then exits
            body = requests.get(srv.url("/health"), timeout=5).json()
            if body.get("stage") == "failed":
                failed = body
        except (requests.RequestException, ValueError):
            pass
        time.sleep(0.02)
    assert srv.exit_code() == 4
    assert failed is not None and failed["status"] == "failed", srv.logs()[-3000:]
    reason = failed["error"]
    assert "not enough memory to load it: CPU needs " in reason
    assert "budget 0.30 GiB (MEMORY_BUDGET_GB;" in reason
    assert "It would fit with CTX_SIZE=" in reason
    assert f"vertex-gguf stops (exit code 4): {reason}" in srv.logs()


def test_a_model_over_its_budget_loads_under_warn(server_factory):
    srv: ServerProcess = server_factory({**SMALL, "MEMORY_BUDGET_GB": "CPU=0.1"})
    srv.wait_ready(timeout=120)
    memory = requests.get(srv.url("/props"), timeout=30).json()["memory"]
    assert not memory["fits"] and memory["over"] == ["CPU"]
    assert "Loading it anyway (MEMORY_CHECK=warn)" in srv.logs()
