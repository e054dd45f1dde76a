"""What memory is free per device before a model loads: host RAM as the container sees it, and
each GPU's VRAM as llama.cpp's backend reports it.

Host RAM is the smaller of two readings. The kernel's ``MemAvailable`` (/proc/meminfo) is what
the machine can give without swapping. A container's limit is its cgroup's: under cgroup v2
``memory.max`` less what the group uses, where the use leaves out the page cache the kernel can
drop (``memory.current`` less ``inactive_file`` of ``memory.stat``: the working set, as
Kubernetes counts it); under cgroup v1 ``memory.limit_in_bytes`` and ``memory.usage_in_bytes``
with ``total_inactive_file``. The process's own group and every group above it count, the
tightest winning (Cloud Run sets the instance's memory as a limit; Docker's ``--memory`` too).

A GPU's free memory is ggml's ``ggml_backend_dev_memory``, the very figure llama.cpp splits
layers by (through ctypes over the ggml llama-cpp-python loaded: app.engine.placement._ggml).
The budget is what is free less MEMORY_MARGIN_GB, and no more than MEMORY_BUDGET_GB names.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

GIB = 1 << 30
_DEV_GPU = (1, 2)  # ggml_backend_dev_type: GPU, IGPU (0 is the CPU, 3 an accelerator)


@dataclass(frozen=True)
class Free:
    """One device's memory: what is free now, its total, and where the figures came from."""

    device: str
    free: int
    total: int
    source: str


def parse_budget(value: str | None) -> dict[str, float]:
    """MEMORY_BUDGET_GB's device=GiB pairs (checked by the setting's pattern)."""
    out: dict[str, float] = {}
    for pair in (value or "").split(","):
        name, eq, gib = pair.strip().partition("=")
        if eq:
            out[name.strip()] = float(gib)
    return out


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def _number(text: str | None) -> int | None:
    """A cgroup file's number; None for ``max``, absent or unreadable."""
    if text is None:
        return None
    text = text.strip()
    return int(text) if text.isdigit() else None


def _stat(text: str | None, key: str) -> int:
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def meminfo(root: str = "/") -> tuple[int, int] | None:
    """(MemAvailable, MemTotal) in bytes, from /proc/meminfo."""
    got: dict[str, int] = {}
    for line in (_read(os.path.join(root, "proc/meminfo")) or "").splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if name in ("MemAvailable", "MemTotal") and parts and parts[0].isdigit():
            got[name] = int(parts[0]) * 1024
    if "MemTotal" not in got:
        return None
    return got.get("MemAvailable", got["MemTotal"]), got["MemTotal"]


def _groups(root: str, controller: str | None) -> list[str]:
    """This process's cgroup directories, its own first, then each above it up to the mount
    (v2: controller None; v1: the memory controller's hierarchy)."""
    base = os.path.join(root, "sys/fs/cgroup", controller or "")
    rel = "/"
    for line in (_read(os.path.join(root, "proc/self/cgroup")) or "").splitlines():
        _, ctrls, path = (line.split(":", 2) + ["", ""])[:3]
        if (controller is None and ctrls == "") or (controller and controller in ctrls.split(",")):
            rel = path or "/"
            break
    out = []
    parts = [p for p in rel.split("/") if p and p != ".."]
    for i in range(len(parts), -1, -1):
        d = os.path.join(base, *parts[:i])
        if os.path.isdir(d) and d not in out:
            out.append(d)
    return out


def cgroup_room(root: str = "/") -> tuple[int, int, str] | None:
    """(room left, limit, which file) under the tightest cgroup memory limit; None: no limit."""
    best: tuple[int, int, str] | None = None
    for d in _groups(root, None):  # v2
        limit = _number(_read(os.path.join(d, "memory.max")))
        used = _number(_read(os.path.join(d, "memory.current")))
        if limit is None or used is None:
            continue
        used -= _stat(_read(os.path.join(d, "memory.stat")), "inactive_file")
        room = max(limit - max(used, 0), 0)
        if best is None or room < best[0]:
            best = (room, limit, os.path.join(d, "memory.max"))
    if best is not None:
        return best
    for d in _groups(root, "memory"):  # v1
        limit = _number(_read(os.path.join(d, "memory.limit_in_bytes")))
        used = _number(_read(os.path.join(d, "memory.usage_in_bytes")))
        if limit is None or used is None or limit >= 1 << 60:  # v1's "no limit" is ~2^63
            continue
        used -= _stat(_read(os.path.join(d, "memory.stat")), "total_inactive_file")
        room = max(limit - max(used, 0), 0)
        if best is None or room < best[0]:
            best = (room, limit, os.path.join(d, "memory.limit_in_bytes"))
    return best


def host(root: str = "/") -> Free:
    """Host RAM free for this process: the smaller of MemAvailable and the cgroup's room."""
    info = meminfo(root)
    room = cgroup_room(root)
    if info is None and room is None:
        return Free("CPU", 0, 0, "unknown (no /proc/meminfo, no cgroup limit)")
    if room is not None and (info is None or room[0] < info[0]):
        return Free("CPU", room[0], room[1], f"cgroup limit ({room[2]})")
    assert info is not None
    return Free("CPU", info[0], info[1], "MemAvailable (/proc/meminfo)")


def gpus(ll) -> list[Free]:
    """Each GPU llama.cpp's ggml sees, by device name (CUDA0, ...), with its free memory."""
    from app.engine.placement import _ggml

    ggml = _ggml(ll)
    ggml.ggml_backend_dev_name.restype = ctypes.c_char_p
    ggml.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_type.restype = ctypes.c_int
    ggml.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_memory.restype = None
    ggml.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                             ctypes.POINTER(ctypes.c_size_t)]
    out = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        if ggml.ggml_backend_dev_type(dev) not in _DEV_GPU:
            continue
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        ggml.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(Free(ggml.ggml_backend_dev_name(dev).decode(), free.value, total.value,
                        "ggml_backend_dev_memory"))
    return out


@dataclass(frozen=True)
class Budget:
    """What a model may take per device: free less the margin, capped by MEMORY_BUDGET_GB."""

    free: dict[str, Free]
    margin: int
    caps: dict[str, int]

    def of(self, device: str) -> int | None:
        """The device's budget; None when nothing is known of it (no reading, no cap)."""
        f = self.free.get(device)
        cap = self.caps.get(device)
        if f is None or f.total <= 0:
            return cap
        room = max(f.free - self.margin, 0)
        return room if cap is None else min(room, cap)

    def as_dict(self) -> dict:
        return {dev: {"free": f.free, "total": f.total, "budget": self.of(dev),
                      "source": f.source, **({"cap": self.caps[dev]} if dev in self.caps else {})}
                for dev, f in self.free.items()}


def budget(devices: list[Free], margin_gb: float, caps: str | None) -> Budget:
    parsed = parse_budget(caps)
    return Budget({f.device: f for f in devices}, int(margin_gb * GIB),
                  {dev: int(gib * GIB) for dev, gib in parsed.items()})
