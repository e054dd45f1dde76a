"""The CUDA start-up report (app/engine/cuda_check.py) against stand-ins for NVIDIA's libraries:
small C libraries compiled here, exporting the very functions the report calls, with the values
a given host would give (a GPU machine is not needed to test the ctypes plumbing). On a real GPU
the report is checked by the GPU proof (bench/gpu/)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from app.engine import cuda_check

SYSTEM_INFO = ("CPU : SSE3 = 1 | AVX2 = 1 | CUDA : ARCHS = 800,890,900,1200 | USE_GRAPHS = 1 | "
               "PEER_MAX_BATCH_SIZE = 128 |")

FAKE = r"""
#include <string.h>
#include <stddef.h>
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlSystemGetDriverVersion(char *buf, unsigned len) { strncpy(buf, DRIVER, len); return 0; }
int cudaRuntimeGetVersion(int *v) { *v = RUNTIME; return 0; }
int cuDriverGetVersion(int *v) { *v = DRIVER_CUDA; return 0; }
int cuInit(unsigned flags) { return INIT; }
int cuDeviceGetCount(int *n) { *n = 2; return 0; }
int cuDeviceGet(int *dev, int i) { *dev = i; return 0; }
int cuDeviceGetName(char *name, int len, int dev) {
  strncpy(name, dev == 0 ? NAME0 : "NVIDIA A100-SXM4-80GB", len); return 0; }
int cuDeviceGetAttribute(int *v, int attr, int dev) {
  if (attr == 75) *v = dev == 0 ? MAJOR0 : 8;
  else if (attr == 76) *v = dev == 0 ? MINOR0 : 0;
  return 0; }
int cuDeviceTotalMem_v2(size_t *bytes, int dev) { *bytes = (size_t)(dev + 1) << 34; return 0; }
"""


def fake_cuda(tmp_path: Path, name: str = "NVIDIA L4", cc: tuple[int, int] = (8, 9),
              driver: str = "535.216.01", driver_cuda: int = 12020, runtime: int = 12090,
              init: int = 0) -> str:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler to build the stand-in libraries")
    src = tmp_path / "fake.c"
    src.write_text(FAKE)
    lib = tmp_path / f"libfake-{cc[0]}{cc[1]}-{driver_cuda}-{init}.so"
    defines = [f'-DDRIVER="{driver}"', f"-DRUNTIME={runtime}", f"-DDRIVER_CUDA={driver_cuda}",
               f"-DINIT={init}", f'-DNAME0="{name}"', f"-DMAJOR0={cc[0]}", f"-DMINOR0={cc[1]}"]
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(lib), str(src), *defines], check=True,
                   timeout=60)
    return str(lib)


def libs(path: str) -> dict:
    return {"nvml": path, "driver": path, "runtime": path}


def test_a_supported_host_is_named_in_one_line(tmp_path):
    report = cuda_check.probe(SYSTEM_INFO, libs(fake_cuda(tmp_path)))
    assert report.driver == "535.216.01" and report.driver_cuda == (12, 2)
    assert report.runtime == (12, 9)
    assert [(g.name, g.capability) for g in report.gpus] == [("NVIDIA L4", (8, 9)),
                                                             ("NVIDIA A100-SXM4-80GB", (8, 0))]
    assert report.problems() == []  # a 12.9 runtime on a 12.2 driver: minor-version compatible
    line = report.line()
    assert line.startswith("CUDA: driver 535.216.01 (CUDA 12.2), runtime 12.9, built for "
                           "sm_80,sm_89,sm_90,sm_120; GPUs: 0: NVIDIA L4 (sm_89, 16.0 GiB); ")
    assert "1: NVIDIA A100-SXM4-80GB (sm_80, 32.0 GiB)" in line
    as_dict = report.as_dict()
    assert as_dict["driver_cuda"] == "12.2" and as_dict["gpus"][0]["arch"] == "sm_89"


def test_a_driver_older_than_the_runtime_is_said_with_its_remedy(tmp_path):
    report = cuda_check.probe(SYSTEM_INFO, libs(fake_cuda(tmp_path, driver="470.256.02",
                                                          driver_cuda=11040)))
    [problem] = report.problems()
    assert "supports CUDA 11.4" in problem and "CUDA 12.9 runtime" in problem
    assert "runs on the CPU" in problem


def test_a_gpu_the_build_has_no_code_for(tmp_path):
    report = cuda_check.probe(SYSTEM_INFO, libs(fake_cuda(tmp_path, name="NVIDIA B200",
                                                          cc=(10, 0))))
    [problem] = report.problems()
    assert "NVIDIA B200, sm_100" in problem and "CUDA_ARCHS including 100" in problem


def test_no_device_and_no_driver(tmp_path):
    report = cuda_check.probe(SYSTEM_INFO, libs(fake_cuda(tmp_path, init=100)))
    assert report.gpus == [] and report.error == "cuInit returned 100"
    assert "finds no GPU (cuInit returned 100)" in report.problems()[0]
    missing = str(tmp_path / "libcuda-not-here.so.1")
    report = cuda_check.probe(SYSTEM_INFO, {"nvml": missing, "driver": missing,
                                            "runtime": missing})
    assert report.driver is None and report.runtime is None
    assert "no libcuda.so.1" in report.error and "GPUs: none (no libcuda.so.1" in report.line()


@pytest.mark.parametrize(("cc", "ok"), [((8, 0), True), ((8, 6), True), ((8, 9), True),
                                        ((9, 0), True), ((12, 0), True), ((7, 5), False),
                                        ((10, 0), False), ((12, 1), True)])
def test_machine_code_runs_on_the_same_major_and_a_newer_minor(cc, ok):
    assert cuda_check.covered(cc, cuda_check.built_archs(SYSTEM_INFO)) is ok
    assert cuda_check.covered(cc, []) is False


def test_the_archs_come_from_llama_cpps_system_info():
    assert cuda_check.built_archs(SYSTEM_INFO) == [800, 890, 900, 1200]
    assert cuda_check.built_archs("CPU : AVX2 = 1 |") == []
