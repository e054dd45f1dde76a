"""app.engine.memory_budget: what is free, read from fake /proc and /sys trees (cgroup v2, v1,
nested groups, no limit), the budget less the margin and under MEMORY_BUDGET_GB, and ggml's
devices on this (CPU) build."""

from __future__ import annotations

from pathlib import Path

from app.engine import memory_budget as mb

GIB = 1 << 30


def tree(root: Path, files: dict[str, str]) -> str:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return str(root)


MEMINFO = "MemTotal:       16384000 kB\nMemFree:  100 kB\nMemAvailable:   12288000 kB\n"


def test_no_limit_is_memavailable(tmp_path):
    root = tree(tmp_path, {"proc/meminfo": MEMINFO, "proc/self/cgroup": "0::/\n",
                           "sys/fs/cgroup/memory.max": "max\n",
                           "sys/fs/cgroup/memory.current": "5000\n"})
    free = mb.host(root)
    assert (free.free, free.total) == (12288000 * 1024, 16384000 * 1024)
    assert free.source.startswith("MemAvailable")


def test_cgroup_v2_room_is_the_limit_less_the_working_set(tmp_path):
    """Cloud Run's instance memory: memory.max; the page cache the kernel can drop does not
    count against it (inactive_file)."""
    root = tree(tmp_path, {
        "proc/meminfo": MEMINFO, "proc/self/cgroup": "0::/\n",
        "sys/fs/cgroup/memory.max": f"{4 * GIB}\n",
        "sys/fs/cgroup/memory.current": f"{2 * GIB}\n",
        "sys/fs/cgroup/memory.stat": f"anon 100\nfile 900\ninactive_file {GIB}\n"})
    free = mb.host(root)
    assert (free.free, free.total) == (3 * GIB, 4 * GIB)
    assert "cgroup limit" in free.source and "memory.max" in free.source


def test_the_tightest_of_nested_groups_wins(tmp_path):
    root = tree(tmp_path, {
        "proc/meminfo": MEMINFO, "proc/self/cgroup": "0::/pod/ctr\n",
        "sys/fs/cgroup/memory.max": "max\n", "sys/fs/cgroup/memory.current": "0\n",
        "sys/fs/cgroup/pod/memory.max": f"{2 * GIB}\n",
        "sys/fs/cgroup/pod/memory.current": f"{GIB + GIB // 2}\n",
        "sys/fs/cgroup/pod/ctr/memory.max": f"{8 * GIB}\n",
        "sys/fs/cgroup/pod/ctr/memory.current": f"{GIB}\n"})
    assert mb.host(root).free == GIB // 2  # the pod's: 2 GiB less 1.5 used


def test_memavailable_wins_when_smaller_than_the_limit(tmp_path):
    root = tree(tmp_path, {"proc/meminfo": MEMINFO, "proc/self/cgroup": "0::/\n",
                           "sys/fs/cgroup/memory.max": f"{64 * GIB}\n",
                           "sys/fs/cgroup/memory.current": "0\n"})
    assert mb.host(root).free == 12288000 * 1024


def test_cgroup_v1(tmp_path):
    root = tree(tmp_path, {
        "proc/meminfo": MEMINFO,
        "proc/self/cgroup": "5:cpu,cpuacct:/\n4:memory:/docker/abc\n0::/\n",
        "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": f"{3 * GIB}\n",
        "sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes": f"{2 * GIB}\n",
        "sys/fs/cgroup/memory/docker/abc/memory.stat": f"total_inactive_file {GIB // 2}\n",
        "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
        "sys/fs/cgroup/memory/memory.usage_in_bytes": "0\n"})
    free = mb.host(root)
    assert free.free == GIB + GIB // 2
    assert free.source.endswith("memory.limit_in_bytes)")


def test_v1_without_a_limit_is_memavailable(tmp_path):
    root = tree(tmp_path, {"proc/meminfo": MEMINFO, "proc/self/cgroup": "4:memory:/\n",
                           "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
                           "sys/fs/cgroup/memory/memory.usage_in_bytes": "1\n"})
    assert mb.host(root).source.startswith("MemAvailable")


def test_nothing_readable_is_unknown_not_zero_room(tmp_path):
    free = mb.host(str(tmp_path))
    assert free.total == 0 and "unknown" in free.source
    b = mb.budget([free], 0.5, None)
    assert b.of("CPU") is None  # unknown: no verdict on the CPU
    assert mb.budget([free], 0.5, "CPU=2").of("CPU") == 2 * GIB


def test_budget_is_free_less_the_margin_capped_by_the_setting():
    devices = [mb.Free("CPU", 10 * GIB, 16 * GIB, "x"), mb.Free("CUDA0", 20 * GIB, 24 * GIB, "y")]
    b = mb.budget(devices, 0.5, None)
    assert (b.of("CPU"), b.of("CUDA0")) == (int(9.5 * GIB), int(19.5 * GIB))
    b = mb.budget(devices, 0.5, "CUDA0=12, CPU=40")
    assert (b.of("CPU"), b.of("CUDA0")) == (int(9.5 * GIB), 12 * GIB)
    assert b.of("CUDA1") is None
    assert mb.budget(devices, 11, None).of("CPU") == 0
    assert b.as_dict()["CUDA0"] == {"free": 20 * GIB, "total": 24 * GIB, "budget": 12 * GIB,
                                    "source": "y", "cap": 12 * GIB}
    assert mb.parse_budget(" CPU = 1.5 ,CUDA0=2") == {"CPU": 1.5, "CUDA0": 2.0}


def test_ggml_s_gpus_are_read_with_their_memory():
    """On a CPU build, none; on a GPU build, each with its free memory within its total."""
    from llama_cpp import llama_cpp as ll

    ll.llama_backend_init()
    found = mb.gpus(ll)
    if not ll.llama_supports_gpu_offload():
        assert found == []
    for gpu in found:
        assert gpu.device and 0 < gpu.free <= gpu.total
