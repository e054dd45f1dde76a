#!/usr/bin/env bash
# Builds llama-cpp-python's wheel once, from the sdist pinned with its sha256 in
# requirements/image.lock, for the image: GGML_NATIVE off (the binary runs on any x86-64 CPU
# with AVX2, not only on the build machine's) and llama.cpp's AMX kernels left out (they crash on
# CPUs that have AMX: docs/crashes.md). The Dockerfile compiles through this script when it is
# given no wheel; .ci/run builds the wheel with it once and gives the same file to the
# virtualenv and to the image (scripts/build-image.sh LLAMA_WHEEL_DIR=...).
#
#   scripts/build-llama-wheel.sh cpu|cuda OUT_DIR
#
# Environment: CUDA_ARCHS (cuda only; default 80;89;90;120), BUILD_JOBS (parallel compile jobs;
# default: one per core), PYTHON (the interpreter whose pip builds; default python3), LOCK (the
# lock file; default requirements/image.lock beside this script), EXTRA_CMAKE_ARGS (appended:
# where the CUDA toolkit is, say).
# OUT_DIR receives the wheel and BUILT_FOR, one line naming the backend (and the CUDA
# architectures), which the Dockerfile checks against its own build arguments.
set -euo pipefail

backend="${1:?usage: $0 cpu|cuda OUT_DIR}"
out="${2:?usage: $0 cpu|cuda OUT_DIR}"
here="$(cd "$(dirname "$0")" && pwd)"
lock="${LOCK:-$here/../requirements/image.lock}"
python="${PYTHON:-python3}"
jobs="${BUILD_JOBS:-$(nproc)}"
no_amx="-DGGML_AMX_TILE=off -DGGML_AMX_INT8=off -DGGML_AMX_BF16=off"

case "$backend" in
  cpu)
    cmake_args="-DGGML_NATIVE=off $no_amx"
    built_for="cpu" ;;
  cuda)
    # Uncompressed machine code: a fatbinary compressed by CUDA >= 12.4 (ggml asks for it from
    # 12.8 on) fails on drivers older than R550 with "device kernel image is invalid", and
    # Cloud Run's L4 hosts run R535 (docs/deploy.md, "The CUDA build").
    archs="${CUDA_ARCHS:-80;89;90;120}"
    cmake_args="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$archs -DGGML_CUDA_COMPRESSION_MODE=none"
    cmake_args="$cmake_args -DGGML_NATIVE=off $no_amx"
    built_for="cuda $archs" ;;
  *)
    echo "$0: the backend is cpu or cuda, not '$backend'" >&2
    exit 2 ;;
esac
cmake_args="$cmake_args ${EXTRA_CMAKE_ARGS:-}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The lock's llama-cpp-python entry alone (its line and the --hash lines continuing it): pip
# checks the sdist against that hash (--require-hashes) and builds nothing else (--no-deps).
awk '/^llama-cpp-python==/ {on = 1} on {print} on && !/\\$/ {exit}' "$lock" > "$work/llama.lock"
if ! grep -q -- '--hash=sha256:' "$work/llama.lock"; then
  echo "$0: no hashed llama-cpp-python entry in $lock" >&2
  exit 1
fi

echo "building $(awk 'NR == 1 {print $1}' "$work/llama.lock") for $built_for" \
  "($jobs jobs; CMAKE_ARGS=$cmake_args)"
start="$(date +%s)"
# --no-cache-dir: a wheel pip cached from another build (other flags) must not stand in for this.
CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="$jobs" \
  "$python" -m pip wheel --quiet --no-deps --no-cache-dir --require-hashes \
  -r "$work/llama.lock" -w "$work/wheel"
mkdir -p "$out"
rm -f "$out"/llama_cpp_python-*.whl
mv "$work"/wheel/llama_cpp_python-*.whl "$out/"
echo "$built_for" > "$out/BUILT_FOR"
echo "built $(cd "$out" && ls llama_cpp_python-*.whl) in $(( $(date +%s) - start )) s:" \
  "$(cd "$out" && sha256sum llama_cpp_python-*.whl | cut -d' ' -f1)"
