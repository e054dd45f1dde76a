"""llama.cpp without its AMX kernels, and CPU_EXTRA_BUFFERS (issue 35).

llama.cpp's AMX kernels crash on CPUs that have AMX (llama.cpp#20824), so every install path
builds llama-cpp-python without them (cmake/no-amx.cmake, or the image's explicit options), and
CPU_EXTRA_BUFFERS decides whether llama.cpp may use its extra CPU buffer types at all."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from app.engine import cpu_buffers
from tests.support.server import ROOT

INCLUDE = ROOT / "cmake" / "no-amx.cmake"
CMAKE_ARGS = 'CMAKE_ARGS="-DCMAKE_PROJECT_INCLUDE=$PWD/cmake/no-amx.cmake"'
# fails to compile where AMX is on, or where the rest of -march (AVX-512 VNNI) was lost
PROBE = """#if defined(__AMX_TILE__) || defined(__AMX_INT8__) || defined(__AMX_BF16__)
#error AMX is on
#endif
#if !defined(__AVX512VNNI__)
#error the other native instructions are gone
#endif
int probe;
"""


def _require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        if os.environ.get("CI_REQUIRE_ALL"):
            pytest.fail(f"{tool} is missing")
        pytest.skip(f"{tool} is missing")
    return path


def _build_probe(tmp_path: Path, include: bool) -> subprocess.CompletedProcess:
    """A CMake project compiled for Sapphire Rapids (AMX on), as ggml's -march=native is on
    such a CPU, with or without the include the install paths pass."""
    (tmp_path / "probe.c").write_text(PROBE)
    (tmp_path / "probe.cpp").write_text(PROBE)
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.16)\nproject(probe C CXX)\n"
        "add_library(probe STATIC probe.c probe.cpp)\n"
        "target_compile_options(probe PRIVATE -march=sapphirerapids)\n")
    build = tmp_path / ("with" if include else "without")
    args = [_require("cmake"), "-S", str(tmp_path), "-B", str(build)]
    if include:
        args.append(f"-DCMAKE_PROJECT_INCLUDE={INCLUDE}")
    subprocess.run(args, check=True, capture_output=True, timeout=120)
    return subprocess.run([_require("cmake"), "--build", str(build)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120)


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "AMD64"), reason="x86 only")
def test_the_cmake_include_turns_amx_off_and_keeps_the_other_native_instructions(tmp_path):
    without = _build_probe(tmp_path, include=False)
    assert without.returncode != 0 and "AMX is on" in without.stdout  # the probe can fail
    built = _build_probe(tmp_path, include=True)
    assert built.returncode == 0, built.stdout


def test_the_installed_llama_cpp_has_no_amx_kernels():
    from llama_cpp import llama_cpp as ll

    info = ll.llama_print_system_info().decode()
    assert "CPU :" in info  # the feature list this reads is there
    assert not cpu_buffers.built_with_amx(info), info


def test_every_install_path_builds_without_amx():
    readme = (ROOT / "README.md").read_text()
    install = re.search(r"```bash\n(python3 -m venv .venv.*?)```", readme, re.S)
    assert install and CMAKE_ARGS in install.group(1) and "pip install" in install.group(1)
    # the image and CI: one script builds the wheel, portable and without the AMX kernels, for
    # both backends
    script = (ROOT / "scripts" / "build-llama-wheel.sh").read_text()
    no_amx = re.search(r'^no_amx="([^"]*)"$', script, re.M)
    assert no_amx
    for option in ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"):
        assert f"-D{option}=off" in no_amx.group(1).split()
    args = re.findall(r'^    cmake_args="(-DGGML[^"]*)"$', script, re.M)
    assert len(args) == 2  # the CPU and the GPU variant
    assert "$cmake_args -DGGML_NATIVE=off $no_amx" in script  # the GPU one, on its second line
    assert "-DGGML_NATIVE=off" in args[0] and "$no_amx" in args[0]
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^PYTHON=python scripts/build-llama-wheel\.sh cpu (\S+)$", ci, re.M)
    assert re.search(r"pip install --quiet \.whl/llama-cpu/llama_cpp_python-\*\.whl '\.\[test,video\]'", ci)
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert '/tmp/build/build-llama-wheel.sh "$BACKEND" /tmp/build/wheels' in dockerfile


AMX_BUILD = ("CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | AMX_INT8 = 1 | "
             "REPACK = 1 |")
PLAIN_BUILD = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | REPACK = 1 |"


@pytest.mark.parametrize(("mode", "info", "use"), [
    ("auto", PLAIN_BUILD, True),
    ("auto", AMX_BUILD, False),  # the crashing kernels: kept out of the way
    ("on", AMX_BUILD, True),  # the operator's explicit choice stands
    ("off", PLAIN_BUILD, False),
])
def test_cpu_extra_buffers_resolved(mode, info, use):
    got, why = cpu_buffers.resolve(mode, info)
    assert got is use
    if mode == "auto" and not use:
        assert cpu_buffers.AMX_ISSUE in why and "CPU_EXTRA_BUFFERS=on" in why


# ---- end to end: the setting reaches llama.cpp ----------------------------------------------


