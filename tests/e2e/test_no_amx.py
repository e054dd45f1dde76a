"""CPU_EXTRA_BUFFERS on a real server (issue 35); the build checks are in tests/unit/test_no_amx.py.

llama.cpp's AMX kernels crash on CPUs that have AMX (llama.cpp#20824), so every install path
builds llama-cpp-python without them (cmake/no-amx.cmake, or the image's explicit options), and
CPU_EXTRA_BUFFERS decides whether llama.cpp may use its extra CPU buffer types at all."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from gguf import GGMLQuantizationType

from app.engine import cpu_buffers
from tests.support.gguf_requant import requantize
from tests.support.server import running_server

# fails to compile where AMX is on, or where the rest of -march (AVX-512 VNNI) was lost


# ---- end to end: the setting reaches llama.cpp ----------------------------------------------

@pytest.fixture(scope="module")
def q4_0_model(default_model: Path, tmp_path_factory) -> Path:
    """The default model cut to two layers and re-quantized to Q4_0: a type llama.cpp repacks
    into its CPU_REPACK extra buffer type on x86 with AVX2."""
    out = tmp_path_factory.mktemp("q4_0") / "smol-2l-q4_0.gguf"
    return requantize(default_model, out, GGMLQuantizationType.Q4_0, layers=2)


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_cpu_extra_buffers_reach_llama_cpp(q4_0_model, mode):
    env = {"MODEL": str(q4_0_model), "CPU_EXTRA_BUFFERS": mode, "PARALLEL": "1"}
    with running_server(env) as srv:
        r = requests.post(srv.url("/v1/completions"), timeout=60,
                          json={"prompt": "Hello", "max_tokens": 4, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        props = requests.get(srv.url("/props"), timeout=10).json()
        logs = srv.logs()
    assert props["settings"]["cpu_extra_buffers"] == mode
    assert props["cpu_extra_buffers"] is (mode == "auto")
    assert not cpu_buffers.built_with_amx(props["system_info"])
    assert "AMX model buffer" not in logs
    # llama.cpp's own load lines say where the weights went
    assert ("CPU_REPACK model buffer" in logs) is (mode == "auto"), logs
    assert f"cpu extra buffers={'on' if mode == 'auto' else 'off'}" in logs
