#!/usr/bin/env bash
# Builds the llama-cpp-python wheel pinned in requirements/image.lock (its sdist, hash-checked) with
# CUDA 12.9, from NVIDIA's CUDA wheels on PyPI instead of an nvidia/cuda devel image, then checks it:
# ldd of every library (only libcuda.so.1, the host driver's, may be missing) and the GPU
# architectures of the machine code in libggml-cuda.so.
#
# Usage: scripts/build-cuda-wheel.sh [OUT_DIR]          (default: $WORK/wheels)
# Environment:
#   CUDA_ARCHS       CMAKE_CUDA_ARCHITECTURES (default "80;89;90;120": A100, L4, H100/H200, RTX PRO
#                    6000 Blackwell; ggml turns 120 into 120a)
#   BUILD_JOBS       parallel compile jobs (default: nproc)
#   WORK             scratch folder: venv, toolkit, compiler, build tree (default: .cuda-build in the
#                    repository, git-ignored)
#   PYTHON           interpreter for the venv (default: python3.11, else python3)
#   CLANGXX          the clang++ to compile CUDA with (>= 20); default clang++-22 from PATH, else
#                    Debian's clang-22 packages fetched with `apt-get download` and unpacked in WORK
#                    (no root needed, nothing installed on the system)
#   FATBIN_COMPRESS  fatbinary compression: none (default), or default|speed|balance|size
#   SETUP_ONLY=1     stop once the toolkit folder and compiler are ready (to try them by hand)
#
# Why clang and not nvcc: NVIDIA's CUDA 12 wheels do not contain a CUDA compiler for Linux.
# nvidia-cuda-nvcc-cu12 (every release, 12.0.76 to 12.9.86) holds bin/ptxas, nvvm/lib64/libnvvm.so,
# nvvm/libdevice and include/crt only: no nvcc driver, no cicc (CUDA C++ -> NVVM IR), no cudafe++,
# no fatbinary, no nvlink, and no other wheel of the cuda-toolkit==12.9.1[all] set has them either.
# PyPI has a complete nvcc only from CUDA 13.0 on (nvidia-cuda-nvcc 13.x), whose binaries need a
# driver >= 580, not the R535 driver of Cloud Run's L4 that the image targets. So here:
#   * clang compiles the CUDA sources (host and device code) against the 12.9 wheels' headers and
#     libdevice, and emits PTX;
#   * NVIDIA's ptxas 12.9 (nvidia-cuda-nvcc-cu12) turns the PTX into SASS for each architecture;
#   * NVIDIA's libnvfatbin 12.9 (nvidia-nvfatbin-cu12) packs the SASS into the fatbinary clang
#     embeds (clang runs a `fatbinary` program for that step: bin/fatbinary below is a small
#     stand-in that calls the library);
#   * the result links against the wheels' libcudart.so.12, libcublas(Lt).so.12 and libnccl.so.2.
# The binary holds SASS for each architecture (and its PTX, as the nvcc build does for CMake's
# plain architecture numbers). A driver runs the SASS of its GPU and compiles no PTX, so a CUDA
# 12.x driver >= 525 runs it (minor-version compatibility), like the nvcc build. The fatbinary
# is left uncompressed by default: fatbins compressed with CUDA >= 12.4's compressor need a driver
# >= R550 ("device kernel image is invalid" on R535).
#
# What goes into WORK/cuda, a CUDA-toolkit-shaped folder of symlinks into the venv's nvidia/* trees:
#   bin/ptxas                 the wheel's ptxas
#   bin/fatbinary             generated: packs cubins/PTX with libnvfatbin
#   bin/nvcc                  generated probe, NOT a compiler: CMake (3.x and 4.x alike) will only take
#                             clang as the CUDA compiler if it can run `nvcc -v __cmake_determine_cuda`
#                             (toolkit root) and `nvcc --version` (toolkit version) in the toolkit;
#                             it answers those two and fails on anything else
#   bin/clang-cuda            generated: CMAKE_CUDA_COMPILER; runs clang++ and translates the few
#                             nvcc-only flags ggml-cuda's CMakeLists.txt passes (-use_fast_math,
#                             -extended-lambda, -compress-mode=, -Xcompiler) and defines
#                             __CUDA_ARCH_LIST__ as nvcc does (ggml picks kernels by it)
#   include/                  the runtime, crt, CCCL, cuBLAS, cuRAND, nvFatbin and NCCL headers
#   nvvm/                     libdevice (clang links it into device code)
#   lib64/ (and lib -> lib64) the wheels' libraries plus the unversioned .so links CMake looks for
#   lib64/stubs/libcuda.so    see make_libcuda_stub
#   version.txt               "CUDA Version 12.9.x", for FindCUDAToolkit
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${WORK:-$ROOT/.cuda-build}"
OUT_DIR="${1:-$WORK/wheels}"
CUDA_ARCHS="${CUDA_ARCHS:-80;89;90;120}"
BUILD_JOBS="${BUILD_JOBS:-$(nproc)}"
FATBIN_COMPRESS="${FATBIN_COMPRESS:-none}"
CLANG_MAJOR=22
LOCK="$ROOT/requirements/cuda-toolchain.lock"
IMAGE_LOCK="$ROOT/requirements/image.lock"

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

[ "$(uname -m)" = x86_64 ] || die "the locked CUDA wheels are for Linux x86_64"
[[ $CUDA_ARCHS =~ ^[0-9]+a?(-real|-virtual)?(\;[0-9]+a?(-real|-virtual)?)*$ ]] \
    || die "CUDA_ARCHS=$CUDA_ARCHS: want e.g. 80;89;90;120"
[[ $BUILD_JOBS =~ ^[1-9][0-9]*$ ]] || die "BUILD_JOBS=$BUILD_JOBS: want a positive integer"
case "$FATBIN_COMPRESS" in none | default | speed | balance | size) ;;
    *) die "FATBIN_COMPRESS=$FATBIN_COMPRESS: want none, default, speed, balance or size" ;; esac
for tool in gcc g++ cmake unzip readelf objcopy ldd sha256sum; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install build-essential cmake unzip)"
done
mkdir -p "$WORK" "$OUT_DIR"
WORK="$(cd "$WORK" && pwd)"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
# CMAKE_ARGS is split on whitespace: the paths that go into it must have none.
[[ $WORK != *[[:space:]]* ]] || die "WORK must not contain whitespace: $WORK"

# Nothing from another CUDA installation may take part: no nvcc, ptxas or fatbinary from PATH (a
# machine may carry a CUDA 13 toolkit, as this script's first test machine did in /usr/local/bin),
# and none of the variables CMake, clang or nvcc consult.
unset CUDA_HOME CUDA_PATH CUDA_ROOT CUDAToolkit_ROOT CUDACXX CUDAHOSTCXX NVCC_PREPEND_FLAGS \
    NVCC_APPEND_FLAGS NCCL_ROOT
clean_path=""
IFS=: read -ra path_dirs <<<"$PATH"
for dir in "${path_dirs[@]}"; do
    if [ -n "$dir" ] && { [ -e "$dir/nvcc" ] || [ -e "$dir/ptxas" ] || [ -e "$dir/fatbinary" ]; }; then
        log "leaving $dir out of PATH (it holds CUDA tools)"
        continue
    fi
    clean_path="${clean_path:+$clean_path:}$dir"
done
export PATH="$clean_path"

# ---- 1. the venv with the hash-locked CUDA wheels ------------------------------------------------
VENV="$WORK/venv"
lock_sum="$(sha256sum "$LOCK" | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/.cuda-toolchain.lock.sha256" 2>/dev/null)" != "$lock_sum" ]; then
    PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
    log "creating $VENV with $PYTHON and installing $LOCK"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    # the pip the Dockerfile builds with
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade "pip==25.3"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps \
        --only-binary=:all: -r "$LOCK"
    echo "$lock_sum" >"$VENV/.cuda-toolchain.lock.sha256"
fi
NV="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia"
wheel_version() { "$VENV/bin/python" -c 'import sys, importlib.metadata as m; print(m.version(sys.argv[1]))' "$1"; }
NVCC_WHEEL_VERSION="$(wheel_version nvidia-cuda-nvcc-cu12)"  # 12.9.86: what nvcc 12.9.1 reports
log "CUDA wheels: $(for p in nvidia-cuda-nvcc-cu12 nvidia-cuda-runtime-cu12 nvidia-cuda-cccl-cu12 \
    nvidia-cublas-cu12 nvidia-curand-cu12 nvidia-nvfatbin-cu12 nvidia-nccl-cu12; do printf '%s==%s ' "$p" "$(wheel_version "$p")"; done)"
[ ! -e "$NV/cuda_nvcc/bin/nvcc" ] || log "note: this nvcc wheel does ship bin/nvcc; the script still uses clang"

# ---- 2. the CUDA compiler: clang ----------------------------------------------------------------
LLVM_LIBDIR=""
if [ -n "${CLANGXX:-}" ]; then
    CLANG="$CLANGXX"
elif command -v "clang++-$CLANG_MAJOR" >/dev/null; then
    CLANG="$(command -v "clang++-$CLANG_MAJOR")"
else
    # Debian 12 carries clang-22 in bookworm-security (Debian 13 in its main archive). Unpacked
    # rather than installed: nothing outside WORK changes. apt checks the packages' hashes against
    # the signed archive index as it downloads them.
    llvm_root="$WORK/llvm-$CLANG_MAJOR"
    CLANG="$llvm_root/usr/lib/llvm-$CLANG_MAJOR/bin/clang++"
    if [ ! -x "$CLANG" ]; then
        command -v apt-get >/dev/null || die "no clang++-$CLANG_MAJOR and no apt-get: set CLANGXX to a clang++ >= 20"
        log "fetching Debian's clang-$CLANG_MAJOR packages into $WORK/llvm-debs"
        rm -rf "$WORK/llvm-debs" "$llvm_root"
        mkdir -p "$WORK/llvm-debs"
        (cd "$WORK/llvm-debs" && apt-get download "clang-$CLANG_MAJOR" "libclang-cpp$CLANG_MAJOR" \
            "libllvm$CLANG_MAJOR" "libclang-common-$CLANG_MAJOR-dev") \
            || die "apt-get download clang-$CLANG_MAJOR failed (Debian 12 needs bookworm-security in its sources)"
        for deb in "$WORK"/llvm-debs/*.deb; do dpkg-deb -x "$deb" "$llvm_root"; done
    fi
    LLVM_LIBDIR="$llvm_root/usr/lib/x86_64-linux-gnu"
fi
if ! clang_version="$(LD_LIBRARY_PATH="$LLVM_LIBDIR" "$CLANG" --version 2>&1 | head -1)"; then
    die "$CLANG does not run: $clang_version (its libraries: libz3-4 libxml2 libedit2 libffi8 from apt)"
fi
log "CUDA compiler: $CLANG ($clang_version)"

# ---- 3. the toolkit folder ----------------------------------------------------------------------
TK="$WORK/cuda"
rm -rf "$TK"
mkdir -p "$TK/bin" "$TK/include" "$TK/lib64/stubs" "$WORK/tools"
ln -s "$NV/cuda_nvcc/bin/ptxas" "$TK/bin/ptxas"
ln -s "$NV/cuda_nvcc/nvvm" "$TK/nvvm"
for pkg in cuda_runtime cuda_nvcc cuda_cccl cublas curand nvfatbin nccl; do
    for entry in "$NV/$pkg/include"/*; do
        name="${entry##*/}"
        case "$name" in __init__.py | __pycache__) continue ;; esac
        [ ! -e "$TK/include/$name" ] || die "two wheels ship include/$name"
        ln -s "$entry" "$TK/include/$name"
    done
done
for pkg in cuda_runtime cublas nvfatbin nccl; do
    for lib in "$NV/$pkg/lib"/lib*; do
        name="${lib##*/}"
        ln -s "$lib" "$TK/lib64/$name"
        # libcudart.so -> libcudart.so.12 and so on: the names find_library() and -l look for
        case "$name" in *.so.*) ln -sfn "$name" "$TK/lib64/${name%%.so.*}.so" ;; esac
    done
done
ln -s lib64 "$TK/lib"
printf 'CUDA Version %s\n' "$NVCC_WHEEL_VERSION" >"$TK/version.txt"

# libcuda: ggml-cuda links the driver library (CUDA::cuda_driver, for its VMM memory pool) unless
# GGML_CUDA_NO_VMM, which would change how the image allocates GPU memory. No PyPI wheel ships
# libcuda or NVIDIA's link stub for it (lib64/stubs/libcuda.so in a toolkit), and the machine that
# builds has no driver. So this makes the same kind of stub NVIDIA's is: a shared library whose
# soname is libcuda.so.1, exporting every function cuda.h declares (under the names cuda.h maps
# them to, e.g. cuMemAlloc_v2) with empty bodies, used only by the linker. The libraries then
# record NEEDED libcuda.so.1, which the host's driver provides at run time. The stub is named
# libcuda.so only (no libcuda.so.1 file anywhere here), so the loader can never pick it up, even
# through an RPATH that names this folder; it never enters the wheel, and the check below fails
# unless libcuda.so.1 is "not found" on this driverless machine.
make_libcuda_stub() {
    local names="$WORK/tools/libcuda-symbols.txt" src="$WORK/tools/libcuda-stub.c"
    gcc -E -P -I"$TK/include" -x c "$TK/include/cuda.h" \
        | grep -oE '\bCUresult +cu[A-Za-z0-9_]+ *\(' | sed -E 's/^CUresult +//; s/ *\($//' | sort -u >"$names"
    [ "$(wc -l <"$names")" -gt 300 ] || die "found only $(wc -l <"$names") driver functions in cuda.h"
    {
        echo "/* link-time stub for libcuda.so.1, generated by scripts/build-cuda-wheel.sh from cuda.h */"
        sed 's/.*/void &(void) {}/' "$names"
    } >"$src"
    gcc -shared -fPIC -O0 -Wl,-soname,libcuda.so.1 -o "$TK/lib64/stubs/libcuda.so" "$src"
}
make_libcuda_stub

# bin/fatbinary: clang runs `fatbinary -64 --create OUT --image3=kind=elf,sm=90,file=X.cubin ...`
# (and kind=ptx for PTX it is asked to keep); this does the same with NVIDIA's libnvfatbin.
cat >"$TK/bin/fatbinary" <<EOF
#!$VENV/bin/python
"""fatbinary stand-in generated by scripts/build-cuda-wheel.sh: packs cubins/PTX with libnvfatbin."""
import ctypes, os, sys

LIB = ctypes.CDLL("$NV/nvfatbin/lib/libnvfatbin.so.12")
COMPRESS = "$FATBIN_COMPRESS"


def fail(msg):
    sys.exit("fatbinary (libnvfatbin stand-in): " + msg)


def check(res, what):
    if res != 0:
        LIB.nvFatbinGetErrorString.restype = ctypes.c_char_p
        fail("%s: %s" % (what, LIB.nvFatbinGetErrorString(res).decode()))


out, images, args = None, [], sys.argv[1:]
i = 0
while i < len(args):
    a = args[i]
    if a in ("-64", "--64", "-cuda", "--cuda"):
        pass
    elif a in ("--create", "-create"):
        i += 1
        out = args[i]
    elif a.startswith("--create="):
        out = a.split("=", 1)[1]
    elif a.startswith("--image3="):  # kind=elf|ptx,sm=90a,file=PATH
        f = dict(kv.split("=", 1) for kv in a[len("--image3="):].split(","))
        images.append((f["kind"], f["sm"], f["file"]))
    elif a.startswith("--image="):  # profile=sm_90|compute_90,file=PATH
        f = dict(kv.split("=", 1) for kv in a[len("--image="):].split(","))
        prof = f["profile"]
        images.append(("ptx" if prof.startswith("compute_") else "elf", prof.split("_", 1)[1], f["file"]))
    else:
        fail("unsupported argument %r" % a)
    i += 1
if not out or not images:
    fail("usage: fatbinary -64 --create OUT --image3=kind=elf,sm=NN,file=F ...")

opts = [b"-64", b"-host=linux", b"-compress-mode=" + COMPRESS.encode()]
handle = ctypes.c_void_p()
check(LIB.nvFatbinCreate(ctypes.byref(handle), (ctypes.c_char_p * len(opts))(*opts), ctypes.c_size_t(len(opts))),
      "nvFatbinCreate")
for kind, sm, path in images:
    with open(path, "rb") as fh:
        data = fh.read()
    name = os.path.basename(path).encode()
    if kind == "elf":
        check(LIB.nvFatbinAddCubin(handle, data, ctypes.c_size_t(len(data)), sm.encode(), name), "add cubin " + path)
    elif kind == "ptx":
        data += b"\\0"
        check(LIB.nvFatbinAddPTX(handle, data, ctypes.c_size_t(len(data)), sm.encode(), name, b""), "add PTX " + path)
    else:
        fail("unsupported image kind %r" % kind)
size = ctypes.c_size_t()
check(LIB.nvFatbinSize(handle, ctypes.byref(size)), "nvFatbinSize")
buf = ctypes.create_string_buffer(size.value)
check(LIB.nvFatbinGet(handle, buf), "nvFatbinGet")
LIB.nvFatbinDestroy(ctypes.byref(handle))
with open(out, "wb") as fh:
    fh.write(buf.raw)
EOF

cat >"$TK/bin/nvcc" <<EOF
#!/bin/sh
# Generated by scripts/build-cuda-wheel.sh. NOT nvcc, and not a compiler: CUDA 12.9's PyPI wheels
# ship no nvcc, and CMake accepts clang as the CUDA compiler only after running these two probes in
# the toolkit. Anything else fails.
case "\$*" in
"-v __cmake_determine_cuda")
    echo '#\$ TOP=$TK' >&2
    echo '#\$ NVVMIR_LIBRARY_DIR=$TK/nvvm/libdevice' >&2
    echo 'nvcc probe: no input files' >&2
    exit 1 ;;
--version)
    echo 'CUDA toolkit probe for CMake, not a compiler (nvidia-cuda-nvcc-cu12 $NVCC_WHEEL_VERSION ships no nvcc)'
    echo 'Cuda compilation tools, release ${NVCC_WHEEL_VERSION%.*}, V$NVCC_WHEEL_VERSION'
    exit 0 ;;
esac
echo "\$0 is not nvcc (CUDA 12.9's PyPI wheels ship none); the CUDA compiler is $TK/bin/clang-cuda. Called with: \$*" >&2
exit 2
EOF

# bin/clang-cuda: what ggml-cuda's nvcc flags mean for clang.
#   -use_fast_math: nvcc's = flush denormals to zero, approximate division, square root and
#     transcendentals, fused multiply-add. Not clang's -ffast-math, which also assumes no NaN/Inf
#     (ggml's softmax masks with -INFINITY).
#   -extended-lambda: clang allows __device__ lambdas without it. -compress-mode=: the fatbinary
#     step's business (FATBIN_COMPRESS). -Xcompiler A,B: host compiler flags, passed as they are.
#   __CUDA_ARCH_LIST__: nvcc defines it (e.g. 800,890,900,1200) in every pass; ggml's host code uses
#     it to know which kernels were compiled for which GPU.
#   --no-offload-new-driver: clang 22 otherwise links CUDA programs it compiles in the same step
#     (CMake's compiler identification does) through clang-linker-wrapper, a separate package; the
#     classic driver embeds the fatbinary at compile time and links with the system linker, as nvcc.
cat >"$TK/bin/clang-cuda" <<EOF
#!/usr/bin/env bash
# Generated by scripts/build-cuda-wheel.sh: the CUDA compiler (clang) with nvcc's flags translated.
set -euo pipefail
if [ -n "$LLVM_LIBDIR" ]; then export LD_LIBRARY_PATH="$LLVM_LIBDIR\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"; fi
args=(--cuda-path="$TK" --no-offload-new-driver -Wno-unused-command-line-argument -Wno-unknown-cuda-version)
archs=()
fast_math=(-fgpu-flush-denormals-to-zero -fgpu-approx-transcendentals -ffp-contract=fast
           -Xarch_device -mllvm=-nvptx-prec-divf32=0 -Xarch_device -mllvm=-nvptx-prec-sqrtf32=0)
while [ \$# -gt 0 ]; do
    case "\$1" in
    -use_fast_math | --use_fast_math) args+=("\${fast_math[@]}") ;;
    -extended-lambda | --extended-lambda | -expt-extended-lambda | --expt-extended-lambda) ;;
    -expt-relaxed-constexpr | --expt-relaxed-constexpr) ;;
    -compress-mode=* | --compress-mode=*) ;;
    -Xcompiler | --compiler-options) shift; read -ra host_flags <<<"\${1//,/ }"; args+=("\${host_flags[@]}") ;;
    -Xcompiler=* | --compiler-options=*) v="\${1#*=}"; read -ra host_flags <<<"\${v//,/ }"; args+=("\${host_flags[@]}") ;;
    --cuda-gpu-arch=sm_* | --offload-arch=sm_*) a="\${1#*=sm_}"; archs+=("\$(( \${a%%[!0-9]*} * 10 ))"); args+=("\$1") ;;
    *) args+=("\$1") ;;
    esac
    shift
done
if [ \${#archs[@]} -gt 0 ]; then
    list="\$(printf '%s\n' "\${archs[@]}" | sort -nu | paste -sd, -)"
    args+=("-D__CUDA_ARCH_LIST__=\$list")
fi
exec "$CLANG" "\${args[@]}"
EOF
chmod +x "$TK/bin/fatbinary" "$TK/bin/nvcc" "$TK/bin/clang-cuda"
if [ "${SETUP_ONLY:-0}" = 1 ]; then
    log "toolkit ready in $TK; CUDA compiler: $TK/bin/clang-cuda"
    exit 0
fi

# ---- 4. the wheel, from the hash-checked sdist ---------------------------------------------------
req="$WORK/llama-cpp-python.req"
awk '/^llama-cpp-python==/ {p = 1} p {print; if ($0 !~ /\\$/) exit}' "$IMAGE_LOCK" >"$req"
grep -q -- '--hash=sha256:' "$req" || die "no hash-pinned llama-cpp-python entry in $IMAGE_LOCK"
log "building $(head -1 "$req" | cut -d' ' -f1) for CUDA archs $CUDA_ARCHS with $BUILD_JOBS jobs"

# the Dockerfile's CUDA flags, then the toolkit and compiler from above
cmake_args="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS} -DGGML_NATIVE=off"
cmake_args+=" -DGGML_AMX_TILE=off -DGGML_AMX_INT8=off -DGGML_AMX_BF16=off"
cmake_args+=" -DCUDAToolkit_ROOT=$TK -DCMAKE_CUDA_COMPILER=$TK/bin/clang-cuda -DNCCL_ROOT=$TK"
cmake_args+=" -DGGML_CUDA_COMPRESSION_MODE=$FATBIN_COMPRESS -DCMAKE_EXPORT_COMPILE_COMMANDS=ON"
build_dir="$WORK/build"
rm -rf "$build_dir"
rm -f "$OUT_DIR"/llama_cpp_python-*.whl "$OUT_DIR/BUILT_FOR"
start=$(date +%s)
# --no-cache-dir: no wheel cached by an earlier (CPU) build may stand in; --no-binary: only the sdist
# whose hash the lock pins; SKBUILD_BUILD_DIR: scikit-build-core keeps the build tree there for
# inspection (wiped above, so every run is a full compile).
CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="$BUILD_JOBS" SKBUILD_BUILD_DIR="$build_dir" \
    "$VENV/bin/python" -m pip wheel --disable-pip-version-check --no-deps --no-cache-dir \
    --no-binary llama-cpp-python --require-hashes -r "$req" -w "$OUT_DIR" -v
elapsed=$(($(date +%s) - start))

# ---- 5. the checks --------------------------------------------------------------------------------
wheel="$(ls "$OUT_DIR"/llama_cpp_python-*.whl)"
check_dir="$(mktemp -d)"
trap 'rm -rf "$check_dir"' EXIT
unzip -q "$wheel" -d "$check_dir"
lib_path="$NV/cuda_runtime/lib:$NV/cublas/lib:$NV/nccl/lib"
mapfile -t libs < <(find "$check_dir/llama_cpp" -name '*.so*' -type f | sort)
[ ${#libs[@]} -gt 0 ] || die "no shared libraries in $wheel"
missing=""
echo
echo "ldd, with LD_LIBRARY_PATH=$lib_path"
for so in "${libs[@]}"; do
    echo "--- ${so#"$check_dir"/} (RUNPATH: $(readelf -d "$so" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p'))"
    out="$(LD_LIBRARY_PATH="$lib_path" ldd "$so")"
    echo "$out"
    missing+="$(echo "$out" | grep 'not found' | grep -v 'libcuda\.so\.1 ' || true)"
done
[ -z "$missing" ] || die "libraries not found: $missing"
cuda_so="$(find "$check_dir/llama_cpp" -name 'libggml-cuda.so*' -type f | head -1)"
[ -n "$cuda_so" ] || die "no libggml-cuda.so in the wheel: it was not built with CUDA"
readelf -d "$cuda_so" | grep -q 'NEEDED.*\[libcuda\.so\.1\]' || die "libggml-cuda.so does not link libcuda.so.1"
LD_LIBRARY_PATH="$lib_path" ldd "$cuda_so" | grep -q 'libcuda\.so\.1 => not found' \
    || die "libcuda.so.1 resolved on a machine without a driver: the stub leaked"
unzip -l "$wheel" | grep -q 'libcuda' && die "the wheel carries a libcuda"

# The GPU code in libggml-cuda.so: its .nv_fatbin section is a run of fatbinaries, each a header
# (magic 0xBA55ED50) and entries of kind 1 (PTX) or 2 (ELF = SASS), each naming its sm_XX. (The
# 12.9 wheels have no cuobjdump; this reads the format cuobjdump --list-elf lists.)
objcopy -O binary --only-section=.nv_fatbin "$cuda_so" "$check_dir/nv_fatbin"
arch_report="$("$VENV/bin/python" - "$check_dir/nv_fatbin" <<'PY'
import collections, struct, sys
data = open(sys.argv[1], "rb").read()
kinds = collections.Counter()
compressed = 0
pos = blobs = 0
while True:
    pos = data.find(struct.pack("<I", 0xBA55ED50), pos)  # past the padding between objects' fatbins
    if pos < 0 or pos + 16 > len(data):
        break
    _magic, _ver, hsize, size = struct.unpack_from("<IHHQ", data, pos)
    blobs += 1
    entry, end = pos + hsize, pos + hsize + size
    while entry < end:
        kind, _v, ehsize, payload = struct.unpack_from("<HHIQ", data, entry)
        arch = struct.unpack_from("<I", data, entry + 28)[0]
        flags = struct.unpack_from("<Q", data, entry + 40)[0]
        compressed += bool(flags & 0x2000)
        kinds[({1: "PTX", 2: "ELF"}.get(kind, "kind%d" % kind), arch)] += 1
        entry += ehsize + payload
    pos = end
print("fatbinaries: %d, compressed entries: %d" % (blobs, compressed))
for (kind, arch), n in sorted(kinds.items()):
    print("  %s sm_%d: %d" % (kind, arch, n))
print("ELF archs:", " ".join("sm_%d" % a for a in sorted({a for k, a in kinds if k == "ELF"})))
print("PTX archs:", " ".join("sm_%d" % a for a in sorted({a for k, a in kinds if k == "PTX"})) or "none")
PY
)"
echo
echo "GPU code in ${cuda_so#"$check_dir"/}:"
echo "$arch_report"
want="$(for a in ${CUDA_ARCHS//;/ }; do a="${a%-*}"; echo "sm_${a%a}"; done | sort -u | paste -sd' ' -)"
have="$(echo "$arch_report" | sed -n 's/^ELF archs: //p' | tr ' ' '\n' | sort -u | paste -sd' ' -)"
[ "$have" = "$want" ] || die "SASS for $have, want $want"

# The line the Dockerfile compares with its own BACKEND and CUDA_ARCHS before it takes a wheel
# from wheels/ instead of compiling (scripts/build-llama-wheel.sh writes the same).
echo "cuda $CUDA_ARCHS" >"$OUT_DIR/BUILT_FOR"
echo
echo "wheel:   $wheel ($(du -m "$wheel" | cut -f1) MB)"
echo "archs:   SASS for $have (CUDA_ARCHS=$CUDA_ARCHS)"
echo "compile: ${elapsed}s ($((elapsed / 60)) min) with $BUILD_JOBS jobs on $(nproc) CPUs"
