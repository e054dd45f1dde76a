"""What a CUDA build of llama.cpp finds when it starts: the driver, the CUDA runtime it was built
with, and each GPU. The report goes into one log line and into /props, so an operator can see
it without a shell on the host.

It also names the two mismatches that would otherwise only show up as slow replies or an
obscure abort. First, a driver too old for the runtime: llama.cpp then finds no device and runs
on the CPU without saying why. Second, a GPU for whose architecture the build carries no machine
code. The CUDA libraries are read through ctypes, all optional: NVML for the driver's version
string, the driver API for its CUDA level and the devices, and the runtime llama.cpp itself
loaded. A library that is missing leaves its fields empty and never fails the start."""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field

# libcudart's soname for CUDA 12 (CUDA 13's is .13): the one llama.cpp loaded when it was
# built with CUDA, so asking for it returns that very library
LIBS = {"nvml": "libnvidia-ml.so.1", "driver": "libcuda.so.1",
        "runtime": ("libcudart.so.12", "libcudart.so.13")}
_ARCHS = re.compile(r"\bARCHS = ([0-9,]+)")
_CC_MAJOR, _CC_MINOR = 75, 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_{MAJOR,MINOR}


@dataclass
class Gpu:
    index: int
    name: str
    capability: tuple[int, int]
    memory_bytes: int

    @property
    def sm(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"


@dataclass
class CudaReport:
    driver: str | None = None  # NVML's version string, "535.216.01"
    driver_cuda: tuple[int, int] | None = None  # the CUDA level the driver supports
    runtime: tuple[int, int] | None = None  # the CUDA runtime llama.cpp runs on
    gpus: list[Gpu] = field(default_factory=list)
    archs: list[int] = field(default_factory=list)  # what the build carries: 800, 890, 900 ...
    error: str | None = None  # why no device could be listed

    def line(self) -> str:
        """The start-up log line."""
        gpus = "; ".join(f"{g.index}: {g.name} ({g.sm}, {g.memory_bytes / 2**30:.1f} GiB)"
                         for g in self.gpus) or f"none ({self.error or 'no device'})"
        archs = ",".join(f"sm_{a // 10}" for a in self.archs) or "unknown"
        return (f"CUDA: driver {self.driver or 'unknown'} "
                f"(CUDA {_dotted(self.driver_cuda) or 'unknown'}), "
                f"runtime {_dotted(self.runtime) or 'unknown'}, built for {archs}; GPUs: {gpus}")

    def problems(self) -> list[str]:
        """What stops llama.cpp from using the GPUs as built, each said with its remedy."""
        out = []
        if self.driver_cuda and self.runtime and self.driver_cuda[0] < self.runtime[0]:
            out.append(
                f"the GPU driver {self.driver or ''} supports CUDA "
                f"{self.driver_cuda[0]}.{self.driver_cuda[1]}, older than this build's CUDA "
                f"{self.runtime[0]}.{self.runtime[1]} runtime needs (a driver for CUDA "
                f"{self.runtime[0]}.x): llama.cpp runs on the CPU; use a newer driver or a build "
                "for the older CUDA")
        elif not self.gpus:
            out.append(f"llama.cpp was built with CUDA but finds no GPU "
                       f"({self.error or 'no device'}): it runs on the CPU")
        for gpu in self.gpus:
            if self.archs and not covered(gpu.capability, self.archs):
                built = ",".join(f"sm_{a // 10}" for a in self.archs)
                out.append(f"GPU {gpu.index} ({gpu.name}, {gpu.sm}) is not among the "
                           f"architectures this build carries code for ({built}): rebuild "
                           f"with CUDA_ARCHS including {gpu.capability[0]}{gpu.capability[1]}")
        return out

    def as_dict(self) -> dict:
        return {
            "driver": self.driver,
            "driver_cuda": _dotted(self.driver_cuda),
            "runtime": _dotted(self.runtime),
            "archs": [f"sm_{a // 10}" for a in self.archs],
            "gpus": [{"index": g.index, "name": g.name, "arch": g.sm,
                      "memory_bytes": g.memory_bytes} for g in self.gpus],
            "problems": self.problems(),
        }


def _dotted(version: tuple[int, int] | None) -> str | None:
    return f"{version[0]}.{version[1]}" if version else None


def built_archs(system_info: str) -> list[int]:
    """The architectures ggml-cuda lists in llama_print_system_info ("ARCHS = 800,890,900")."""
    m = _ARCHS.search(system_info)
    return [int(a) for a in m.group(1).split(",") if a] if m else []


def covered(capability: tuple[int, int], archs: list[int]) -> bool:
    """Machine code for sm_XY runs on a GPU of the same major version and a minor of at least Y
    (sm_80 code runs on an A10's sm_86, not on an H100's sm_90)."""
    major, minor = capability
    return any(a // 100 == major and (a // 10) % 10 <= minor for a in archs)


def _open(names: str | tuple[str, ...]) -> ctypes.CDLL | None:
    for name in (names,) if isinstance(names, str) else names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _version(code: int) -> tuple[int, int]:
    return code // 1000, (code % 1000) // 10  # 12020 -> (12, 2)


def probe(system_info: str, libs: dict | None = None) -> CudaReport:
    """Ask the driver, NVML and the runtime; whatever cannot be read stays empty."""
    libs = {**LIBS, **(libs or {})}
    report = CudaReport(archs=built_archs(system_info))
    nvml = _open(libs["nvml"])
    if nvml is not None and nvml.nvmlInit_v2() == 0:
        buf = ctypes.create_string_buffer(96)
        if nvml.nvmlSystemGetDriverVersion(buf, ctypes.c_uint(len(buf))) == 0:
            report.driver = buf.value.decode(errors="replace")
        nvml.nvmlShutdown()
    runtime = _open(libs["runtime"])
    if runtime is not None:
        v = ctypes.c_int(0)
        if runtime.cudaRuntimeGetVersion(ctypes.byref(v)) == 0 and v.value:
            report.runtime = _version(v.value)
    cuda = _open(libs["driver"])
    if cuda is None:
        report.error = "no libcuda.so.1: the host's driver is not mounted into the container"
        return report
    v = ctypes.c_int(0)
    if cuda.cuDriverGetVersion(ctypes.byref(v)) == 0 and v.value:
        report.driver_cuda = _version(v.value)
    status = cuda.cuInit(0)
    if status != 0:
        report.error = f"cuInit returned {status}"
        return report
    count = ctypes.c_int(0)
    cuda.cuDeviceGetCount(ctypes.byref(count))
    for i in range(count.value):
        dev = ctypes.c_int(0)
        if cuda.cuDeviceGet(ctypes.byref(dev), i) != 0:
            continue
        name = ctypes.create_string_buffer(256)
        cuda.cuDeviceGetName(name, len(name), dev)
        major, minor, mem = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_size_t(0)
        cuda.cuDeviceGetAttribute(ctypes.byref(major), _CC_MAJOR, dev)
        cuda.cuDeviceGetAttribute(ctypes.byref(minor), _CC_MINOR, dev)
        cuda.cuDeviceTotalMem_v2(ctypes.byref(mem), dev)
        report.gpus.append(Gpu(i, name.value.decode(errors="replace"), (major.value, minor.value),
                               mem.value))
    return report
