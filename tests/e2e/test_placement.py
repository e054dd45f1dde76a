"""End to end: the placement settings on real servers. A q8_0 KV cache shrinks the cache the
load reports and keeps the greedy answer to a short prompt; tensor overrides move tensors
(llama.cpp's own log lines, counted in /props), CPU_MOE and N_CPU_MOE move a real
mixture-of-experts model's experts (a random-weight one built by tests/support/tiny_moe.py), and
a bad pattern or an unknown buffer type stops the server at start with a message naming it."""

from __future__ import annotations

import pytest
import requests

from tests.support.server import ServerProcess, running_server
from tests.support.tiny_moe import build_moe

SMALL = {"PARALLEL": "2", "CTX_SIZE": "1024"}
# short prompts with a clear answer: on this 135M model a q8_0 cache changes the greedy reply
# to 2 of 6 open-ended prompts after a few tokens (docs/placement.md), never to these
ASKS = ("What is 2+2?", "Count from one to five.")


def props(srv: ServerProcess) -> dict:
    return requests.get(srv.url("/props"), timeout=30).json()


def answer(srv: ServerProcess) -> list[str]:
    out = []
    for ask in ASKS:
        r = requests.post(srv.url("/v1/chat/completions"), timeout=120, json={
            "messages": [{"role": "user", "content": ask}], "temperature": 0, "max_tokens": 12})
        r.raise_for_status()
        out.append(r.json()["choices"][0]["message"]["content"])
    return out


def test_a_q8_0_kv_cache_is_smaller_and_answers_the_same():
    with running_server(SMALL) as plain:
        base, base_answer = props(plain)["placement"], answer(plain)
    with running_server({**SMALL, "KV_CACHE_TYPE_K": "q8_0", "KV_CACHE_TYPE_V": "q8_0",
                         "N_UBATCH": "64"}) as q8:
        got, q8_answer = props(q8), answer(q8)
    placed = got["placement"]
    assert (base["kv_cache_type_k"], base["kv_cache_type_v"]) == ("f16", "f16")
    assert (placed["kv_cache_type_k"], placed["kv_cache_type_v"]) == ("q8_0", "q8_0")
    assert got["settings"]["kv_cache_type_v"] == "q8_0"
    # q8_0 stores 34 bytes per 32 values where f16 stores 64
    assert 0 < placed["kv_cache_mib"] < 0.6 * base["kv_cache_mib"]
    assert (base["n_ubatch"], placed["n_ubatch"]) == (512, 64)
    assert q8_answer == base_answer and all(base_answer)


def test_an_override_moves_the_tensors_it_names():
    with running_server({**SMALL, "OVERRIDE_TENSOR": r"blk\.[0-3]\.ffn_up=CPU"}) as srv:
        placed = props(srv)["placement"]
        assert placed["tensor_overrides"] == [{"pattern": r"blk\.[0-3]\.ffn_up",
                                               "buffer_type": "CPU"}]
        assert placed["tensors_moved"] == {"CPU": 4}  # blk.0-3.ffn_up.weight
        assert "tensor overrides: 4 tensors to CPU (blk.0.ffn_up.weight" in srv.logs()
        assert answer(srv)


@pytest.fixture(scope="module")
def moe(default_model, tmp_path_factory):
    """A 3-layer mixture-of-experts model: 3 expert tensors (gate, up, down) per layer."""
    return build_moe(tmp_path_factory.mktemp("moe") / "moe.gguf", default_model, n_layer=3)


@pytest.mark.parametrize(("env", "moved"), [
    ({"CPU_MOE": "true"}, 9),  # every layer's experts
    ({"N_CPU_MOE": "2"}, 6),  # the first two layers'
    ({"N_CPU_MOE": "1", "OVERRIDE_TENSOR": r"blk\.2\.ffn_up_exps=CPU"}, 4),
])
def test_moe_experts_go_where_the_settings_say(moe, env, moved):
    with running_server({**SMALL, "MODEL": str(moe), **env}) as srv:
        placed = props(srv)["placement"]
        assert placed["tensors_moved"] == {"CPU": moved}
        assert f"tensor overrides: {moved} tensors to CPU (blk.0.ffn_" in srv.logs()
        r = requests.post(srv.url("/v1/completions"), timeout=60,
                          json={"prompt": "Hello", "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_cpu_is_llama_cpps_own_cpu_buffer_type(moe):
    """CPU names the very buffer type llama.cpp compares against (looked up through the ggml
    libllama loaded, not a second copy of the library): llama.cpp then treats the experts as
    overridden to the CPU, keeping its CPU layouts, and says so in its mmap warning."""
    with running_server({**SMALL, "MODEL": str(moe), "CPU_MOE": "true",
                         "LOG_LEVEL": "debug"}) as srv:
        assert props(srv)["placement"]["tensors_moved"] == {"CPU": 9}
        assert "tensor overrides to CPU are used with mmap enabled" in srv.logs()


@pytest.mark.parametrize(("env", "says"), [
    ({"OVERRIDE_TENSOR": "blk.(=CPU"}, "is not a valid regular expression"),
    ({"OVERRIDE_TENSOR": "ffn_up=CUDA7"}, "names the buffer type CUDA7, which this machine does "
                                          "not have; it has CPU"),
    ({"KV_CACHE_TYPE_V": "q8_0", "FLASH_ATTN": "off"}, "needs flash attention"),
])
def test_bad_placement_stops_the_server_at_start_naming_it(server_factory, env, says):
    srv = server_factory({**SMALL, **env})
    assert srv.exit_code() != 0
    assert says in srv.logs()
