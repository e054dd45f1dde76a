"""scripts/build-llama-wheel.sh and scripts/build-image.sh, run for real with fakes of the slow
parts on PATH (pip, podman, mmdebstrap) that record what they were asked. The real build and the
real image: tests/container/ and .ci/run."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from tests.support.deploy_files import ROOT, tool

WHEEL_SCRIPT = ROOT / "scripts" / "build-llama-wheel.sh"
IMAGE_SCRIPT = ROOT / "scripts" / "build-image.sh"
CUDA_SCRIPT = ROOT / "scripts" / "build-cuda-wheel.sh"
WHEEL = "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def lock_entry() -> str:
    lines = (ROOT / "requirements" / "image.lock").read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("llama-cpp-python=="))
    end = next(i for i in range(start, len(lines)) if not lines[i].endswith("\\"))
    return "\n".join(lines[start:end + 1]) + "\n"


@pytest.fixture
def fake_python(tmp_path: Path) -> Path:
    """A `python -m pip wheel ...` that records its argv, CMAKE_ARGS and the requirement file it
    was given, and writes a wheel into -w."""
    log = tmp_path / "pip.log"
    return executable(tmp_path / "python", f"""#!/usr/bin/env bash
{{ echo "ARGV $*"; echo "CMAKE_ARGS $CMAKE_ARGS"; echo "JOBS $CMAKE_BUILD_PARALLEL_LEVEL"; }} >> {log}
while [ $# -gt 0 ]; do
  case "$1" in
    -r) cp "$2" {tmp_path}/requirements.txt; shift ;;
    -w) mkdir -p "$2"; echo wheel > "$2/{WHEEL}"; shift ;;
  esac
  shift
done
[ -z "${{FAIL_PIP:-}}" ]
""")


def run_wheel_script(args: list[str], python: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(WHEEL_SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHON": str(python), **env})


def test_shellcheck_image_scripts():
    for script in (WHEEL_SCRIPT, IMAGE_SCRIPT, CUDA_SCRIPT, ROOT / ".ci" / "run"):
        proc = subprocess.run([tool("shellcheck"), str(script)], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(("env", "why"), [
    ({"CUDA_ARCHS": "sm_90"}, "CUDA_ARCHS=sm_90: want e.g. 80;89;90;120"),
    ({"CUDA_ARCHS": "90;"}, "CUDA_ARCHS=90;: want"),
    ({"BUILD_JOBS": "0"}, "BUILD_JOBS=0: want a positive integer"),
    ({"FATBIN_COMPRESS": "zstd"}, "FATBIN_COMPRESS=zstd: want none"),
])
def test_the_cuda_wheel_script_refuses_bad_settings_before_any_work(tmp_path, env, why):
    """Checked before the venv, the compiler download or the compile: nothing is created."""
    proc = subprocess.run([str(CUDA_SCRIPT)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "WORK": str(tmp_path / "work"), **env})
    assert proc.returncode != 0
    assert why in proc.stderr
    assert not (tmp_path / "work").exists()


def test_the_cuda_wheel_script_builds_what_the_image_builds():
    """The PyPI-toolchain script compiles the lock's sdist with the image's CUDA flags: the same
    architectures, uncompressed machine code (R535), no native or AMX code, and writes the
    BUILT_FOR line the Dockerfile checks."""
    script = CUDA_SCRIPT.read_text()
    assert 'CUDA_ARCHS="${CUDA_ARCHS:-80;89;90;120}"' in script
    assert 'FATBIN_COMPRESS="${FATBIN_COMPRESS:-none}"' in script
    assert "-DGGML_CUDA_COMPRESSION_MODE=$FATBIN_COMPRESS" in script
    for flag in ("-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS}", "-DGGML_NATIVE=off",
                 "-DGGML_AMX_TILE=off", "-DGGML_AMX_INT8=off", "-DGGML_AMX_BF16=off"):
        assert flag in script
    assert "--require-hashes" in script and "--no-binary llama-cpp-python" in script
    assert 'echo "cuda $CUDA_ARCHS" >"$OUT_DIR/BUILT_FOR"' in script
    assert 'want="cuda ${CUDA_ARCHS}"' in (ROOT / "Dockerfile").read_text()


@pytest.mark.parametrize(("backend", "archs", "built_for"), [
    ("cpu", None, "cpu"),
    ("cuda", None, "cuda 80;89;90;120"),
    ("cuda", "90", "cuda 90"),
])
def test_the_wheel_is_built_from_the_locks_hashed_sdist(tmp_path, fake_python, backend, archs,
                                                        built_for):
    env = {"BUILD_JOBS": "3", **({"CUDA_ARCHS": archs} if archs else {})}
    out = tmp_path / "out"
    proc = run_wheel_script([backend, str(out)], fake_python, **env)
    assert proc.returncode == 0, proc.stderr
    log = (tmp_path / "pip.log").read_text()
    argv = re.search(r"^ARGV (.*)$", log, re.M).group(1).split()
    assert argv[:3] == ["-m", "pip", "wheel"]
    assert {"--no-deps", "--no-cache-dir", "--require-hashes"} <= set(argv)
    # the lock's entry and nothing else: its pin and its sdist's hash
    assert (tmp_path / "requirements.txt").read_text() == lock_entry()
    cmake = re.search(r"^CMAKE_ARGS (.*)$", log, re.M).group(1).split()
    assert "-DGGML_NATIVE=off" in cmake  # runs on any host CPU
    assert {"-DGGML_AMX_TILE=off", "-DGGML_AMX_INT8=off", "-DGGML_AMX_BF16=off"} <= set(cmake)
    if backend == "cuda":
        assert "-DGGML_CUDA=on" in cmake
        assert "-DGGML_CUDA_COMPRESSION_MODE=none" in cmake  # R535 cannot load compressed code
        assert f"-DCMAKE_CUDA_ARCHITECTURES={built_for.split()[1]}" in cmake
    else:
        assert not [a for a in cmake if "CUDA" in a]
    assert "JOBS 3" in log
    assert (out / WHEEL).is_file()
    assert (out / "BUILT_FOR").read_text() == built_for + "\n"


def test_the_wheel_script_refuses_what_it_cannot_build(tmp_path, fake_python):
    proc = run_wheel_script(["rocm", str(tmp_path / "out")], fake_python)
    assert proc.returncode == 2 and "cpu or cuda" in proc.stderr
    lock = tmp_path / "lock"
    lock.write_text("numpy==2.0 \\\n    --hash=sha256:00\n")
    proc = run_wheel_script(["cpu", str(tmp_path / "out")], fake_python, LOCK=str(lock))
    assert proc.returncode == 1 and "no hashed llama-cpp-python entry" in proc.stderr
    proc = run_wheel_script(["cpu", str(tmp_path / "out")], fake_python, FAIL_PIP="1")
    assert proc.returncode != 0 and not (tmp_path / "out" / "BUILT_FOR").exists()


# ---- scripts/build-image.sh with a fake podman -----------------------------------------------


@pytest.fixture
def fake_tools(tmp_path: Path) -> Path:
    """podman and mmdebstrap that record their argv; podman's registry is unreachable, its
    local images are listed in a file, and its build checks the context it was given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    images = tmp_path / "images"
    images.touch()
    executable(bin_dir / "podman", f"""#!/usr/bin/env bash
echo "podman $*" >> {log}
args=("$@")
while [ "${{args[0]}}" = --runtime ]; do args=("${{args[@]:2}}"); done
case "${{args[0]}} ${{args[1]:-}}" in
  "image inspect")
    grep -qx -- "${{args[-1]}}" {images} || exit 125
    [ "${{args[2]}}" = --format ] && echo 509000000
    exit 0 ;;
  "pull "*) exit 125 ;;
  "import "*) cat > /dev/null; echo "${{args[-1]}}" >> {images}; exit 0 ;;
  "build "*)
    ls "{ROOT}/wheels" > {tmp_path}/context.txt
    for a in "${{args[@]}}"; do
      case "$a" in *:/root:ro) cat "${{a%%:*}}/.config/pip/pip.conf" > {tmp_path}/pip.conf ;; esac
    done
    if [ -n "${{FAIL_BUILD:-}}" ]; then echo "STEP 13/19: RUN pip install ... failed" >&2; exit 1; fi
    echo "${{args[-4]}}" >> {images}   # -t TAG -f Dockerfile CONTEXT
    exit 0 ;;
esac
exit 0
""")
    executable(bin_dir / "mmdebstrap", f"""#!/usr/bin/env bash
echo "mmdebstrap $*" >> {log}
echo tarball
""")
    executable(bin_dir / "runc", "#!/bin/sh\nexit 0\n")
    return bin_dir


def run_image_script(args: list[str], bin_dir: Path, **env: str) -> subprocess.CompletedProcess:
    path = f"{bin_dir}:{os.environ['PATH']}"
    base = {k: v for k, v in os.environ.items() if k not in {"ENGINE", "BASE_IMAGE", "LLAMA_WHEEL_DIR"}}
    return subprocess.run([str(IMAGE_SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={**base, "PATH": path, "ENGINE": "podman", **env})


def test_cpu_image_on_a_local_debian_base_with_a_prebuilt_wheel(tmp_path, fake_tools):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / WHEEL).write_text("wheel")
    (wheels / "BUILT_FOR").write_text("cpu\n")
    ca = tmp_path / "ca.pem"
    ca.write_text("a CA")
    proc = run_image_script(["cpu", "vertex-gguf:test"], fake_tools, LLAMA_WHEEL_DIR=str(wheels),
                            PIP_CERT=str(ca), PULL_TIMEOUT="5")
    assert proc.returncode == 0, proc.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert any(c.startswith("podman --runtime runc pull") or c.startswith("podman pull") for c in calls)
    debootstrap = next(c for c in calls if c.startswith("mmdebstrap"))
    assert "--variant=minbase" in debootstrap and " bookworm - " in debootstrap
    assert "deb http://deb.debian.org/debian-security bookworm-security main" in debootstrap
    build = next(c for c in calls if " build " in c)
    assert "--runtime runc" in build and "--format docker" in build and "--network host" in build
    assert "--build-arg BUILD_IMAGE=localhost/vertex-gguf-base:bookworm" in build
    assert "--build-arg RUNTIME_IMAGE=localhost/vertex-gguf-base:bookworm" in build
    assert "--build-arg BACKEND=cpu" in build and "-t vertex-gguf:test" in build
    assert re.search(r"--label org\.opencontainers\.image\.revision=[0-9a-f]{40}", build)
    # the wheel was in the build context during the build, and only then
    assert set((tmp_path / "context.txt").read_text().split()) >= {WHEEL, "BUILT_FOR"}
    assert sorted(p.name for p in (ROOT / "wheels").iterdir()) == [".gitignore", "README.md"]
    # the host's CA reached the build through a read-only mount, not a layer
    assert "cert = /root/host-ca.pem" in (tmp_path / "pip.conf").read_text()
    assert re.search(r"-v \S+/root:/root:ro", build)
    assert "built vertex-gguf:test" in proc.stderr and "509 MB" in proc.stderr

    # a second build finds the local base and does not make it again
    (tmp_path / "calls.log").unlink()
    proc = run_image_script(["cpu", "vertex-gguf:test"], fake_tools, PULL_TIMEOUT="5")
    assert proc.returncode == 0, proc.stderr
    assert not [c for c in (tmp_path / "calls.log").read_text().splitlines() if c.startswith("mmdebstrap")]


def test_a_failed_build_shows_its_step_and_leaves_the_context_clean(tmp_path, fake_tools):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / WHEEL).write_text("wheel")
    (wheels / "BUILT_FOR").write_text("cpu\n")
    proc = run_image_script(["cpu"], fake_tools, LLAMA_WHEEL_DIR=str(wheels), FAIL_BUILD="1",
                            BASE_IMAGE="debian:bookworm-slim")
    assert proc.returncode != 0
    assert "STEP 13/19" in proc.stderr
    assert sorted(p.name for p in (ROOT / "wheels").iterdir()) == [".gitignore", "README.md"]


def test_the_image_script_refuses_bad_arguments(tmp_path, fake_tools):
    proc = run_image_script(["arm"], fake_tools)
    assert proc.returncode == 2 and "usage" in proc.stderr
    proc = run_image_script(["cpu"], fake_tools, LLAMA_WHEEL_DIR=str(tmp_path))
    assert proc.returncode == 1 and "LLAMA_WHEEL_DIR lacks" in proc.stderr


def test_the_cuda_image_needs_nvidias_images_and_says_so(tmp_path, fake_tools):
    """The registry is unreachable (the fake pull fails): the script stops before building, names
    the image, and points to the PyPI-toolchain wheel; once the images are there it builds on
    them."""
    proc = run_image_script(["cuda"], fake_tools, PULL_TIMEOUT="5")
    assert proc.returncode == 1
    assert "nvidia/cuda:12.9.1-devel-ubuntu22.04 could not be pulled" in proc.stderr
    assert "scripts/build-cuda-wheel.sh" in proc.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert not [c for c in calls if " build " in c or c.startswith("mmdebstrap")]
    (tmp_path / "images").write_text("nvidia/cuda:12.9.1-devel-ubuntu22.04\n"
                                      "nvidia/cuda:12.9.1-base-ubuntu22.04\n")
    proc = run_image_script(["cuda"], fake_tools, CUDA_ARCHS="89")
    assert proc.returncode == 0, proc.stderr
    build = next(c for c in (tmp_path / "calls.log").read_text().splitlines() if " build " in c)
    assert "--build-arg BACKEND=cuda" in build and "--build-arg CUDA_ARCHS=89" in build
    assert "BUILD_IMAGE" not in build and "-t vertex-gguf:cuda" in build  # the Dockerfile's bases
