#!/usr/bin/env bash
# The GPU proof in one command, on a machine that can download nothing: builds llama.cpp from the
# kit's sdist (the library vertex-gguf loads, llama-server and llama-batched-bench, one build),
# makes the models, runs the benchmark against llama-server and llama-batched-bench, and the
# end-to-end tests that do not need sensible text. Results go to $OUT (at most 9 files).
#
#   bench/gpu/prepare.sh                          # here, once: fills bench/gpu/kit (33 MiB)
#   bench/gpu/run.sh [STAGE...]                   # there: device run, carry ["bench/gpu/kit"]
#
# STAGE: build, models, bench, batched, mtp, e2e, diag (default: all but diag, in that order). Each stage
# builds what it needs and finds missing, so a command holding any one of them stands alone, and
# a warm machine reuses what an earlier command built (WORK is inside the repository, ignored).
#
# Environment (defaults for a GPU machine; the rehearsal on a CPU sets BACKEND=cpu and less):
#   BACKEND      cuda or cpu (default: cuda when nvidia-smi answers)
#   CUDA_ARCH    the GPU's architecture, e.g. 90 (default: nvidia-smi's compute capability)
#   JOBS         compile jobs (default: nproc)
#   MODELS       shapes to make and measure, of nearfree, small, 8b (default: all three)
#   LEVELS       concurrent streams (default 1,8,32,64,128)
#   PARALLEL     slots of both servers (default: the highest level)
#   CTX          context per slot (default 512)
#   MAX_TOKENS   tokens per reply, ignore_eos (default 128)
#   THREADS      CPU threads of both servers (default 4 on a GPU, 2 on the CPU)
#   E2E          a pytest -k expression for the e2e stage; E2E_FILES its files, E2E_SHAPE its model
#   OUT          results folder (default: $OUT, else bench/gpu/out)
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
kit="${KIT:-$root/bench/gpu/kit}"
work="${WORK:-$root/bench/gpu/work}"
out="${OUT:-$root/bench/gpu/out}"
mkdir -p "$work" "$out"
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(build models bench batched mtp e2e)
if [ -z "${BACKEND:-}" ]; then
  if nvidia-smi >/dev/null 2>&1; then BACKEND=cuda; else BACKEND=cpu; fi
fi
JOBS="${JOBS:-$(nproc)}"
MODELS="${MODELS:-nearfree,small,8b}"
export -n MODELS  # the kit's shapes, not the server's MODELS (docs/models.md): keep it from children
LEVELS="${LEVELS:-1,8,32,64,128}"
PARALLEL="${PARALLEL:-$(tr ',' '\n' <<<"$LEVELS" | sort -n | tail -1)}"
CTX="${CTX:-512}"
MAX_TOKENS="${MAX_TOKENS:-128}"
if [ "$BACKEND" = cuda ]; then THREADS="${THREADS:-4}"; NGL=999; else THREADS="${THREADS:-2}"; NGL=0; fi
# The end-to-end files that pass on a random-weight model of the default model's vocabulary
# (checked here on the CPU: 133 passed, 3 skipped, in 247 s; then issue 53's test_mtp*.py, 15
# tests on tiny GGUFs of their own, in about 40 s; test_deterministic.py, early: whether
# DETERMINISTIC's bytes repeat on the GPU, about 2 minutes on the CPU). The others check what a reply
# says (a tool call the model chose, "Paris", embeddings that differ), which noise cannot do.
E2E_FILES="${E2E_FILES:-tests/e2e/test_server.py tests/e2e/test_deterministic.py
  tests/e2e/test_streaming.py tests/e2e/test_batching.py
  tests/e2e/test_anthropic.py tests/e2e/test_tools.py tests/e2e/test_response_format.py
  tests/e2e/test_generation_bounds.py tests/e2e/test_metrics.py tests/e2e/test_ops.py
  tests/e2e/test_introspection.py tests/e2e/test_logprobs.py tests/e2e/test_reasoning.py
  tests/e2e/test_sleep.py tests/e2e/test_streams.py tests/e2e/test_mtp.py tests/e2e/test_mtp_probe.py}"
# small: the default model's shape and tokenizer (the tests' templates use its special tokens);
# E2E_SHAPE=8b tries the Llama-3-shaped one, not yet checked
E2E_SHAPE="${E2E_SHAPE:-small}"
summary="$out/summary.md"

log() { printf '==> [%(%T)T] %s\n' -1 "$*" | tee -a "$out/run.log" >&2; }
die() { log "FAILED: $*"; exit 1; }
timed() {  # timed NAME CMD...: runs CMD, logs its time into the summary
  local t0=$SECONDS
  "${@:2}"
  printf '| %s | %d s |\n' "$1" $((SECONDS - t0)) >>"$summary"
}
[ -f "$kit/llama-cpp-python.tar.xz" ] || die "no kit at $kit: run bench/gpu/prepare.sh here and carry bench/gpu/kit"
[ -f "$summary" ] || printf '# bench/gpu/run.sh on %s\n\n| step | time |\n|---|---|\n' "$(hostname)" >"$summary"

# ---- Python: the kit's wheels where the machine lacks a package ---------------------------------
py="${PYTHON:-$(command -v python3)}"
site="$work/site"
if ! "$py" -c 'import flask, gevent, gunicorn, pydantic_settings, google.cloud.storage, openai, anthropic' 2>/dev/null; then
  if [ ! -f "$site/.done" ]; then
    log "installing the kit's wheels into $site"
    "$py" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" "$kit"/wheels/*.whl
    touch "$site/.done"
  fi
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi

# ---- build: llama.cpp once, for the library, llama-server and llama-batched-bench --------------
src="$work/src"
build="$work/build-$BACKEND"
pkg="$work/py"  # llama_cpp (the sdist's Python package) with lib -> the build's libraries
build_llama() {
  if [ ! -d "$src" ]; then
    mkdir -p "$src"
    tar -xJf "$kit/llama-cpp-python.tar.xz" -C "$src" --strip-components=1
  fi
  local args=(-DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF)
  if [ "$BACKEND" = cuda ]; then
    arch="${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)}"
    # the image's flags: machine code for this GPU, uncompressed (docs/deploy.md)
    args+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$arch" -DGGML_CUDA_COMPRESSION_MODE=none)
    log "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1), sm_$arch"
    log "nvcc: $(nvcc --version 2>&1 | tail -1); cmake: $(cmake --version | head -1)"
  fi
  if [ ! -x "$build/bin/llama-server" ] || [ ! -e "$build/bin/libllama.so" ]; then
    log "building llama.cpp ($BACKEND, $JOBS jobs)"
    local gen=()
    if command -v ninja >/dev/null; then gen=(-G Ninja); fi
    cmake -S "$src/vendor/llama.cpp" -B "$build" "${gen[@]}" "${args[@]}" >"$work/build.log" 2>&1 \
      || { tail -30 "$work/build.log"; die "cmake configure"; }
    timed "build llama.cpp ($BACKEND)" cmake --build "$build" -j "$JOBS" \
      --target llama mtmd llama-server llama-batched-bench >>"$work/build.log" 2>&1 \
      || { tail -40 "$work/build.log"; die "cmake build"; }
  fi
  if [ ! -d "$pkg/llama_cpp" ]; then
    mkdir -p "$pkg"
    cp -r "$src/llama_cpp" "$pkg/llama_cpp"
  fi
  ln -sfn "$build/bin" "$pkg/llama_cpp/lib"
}
use_llama() {
  build_llama
  export PYTHONPATH="$pkg:$root${PYTHONPATH:+:$PYTHONPATH}"
  "$py" -c 'import llama_cpp; from llama_cpp import llama_cpp as ll; print("llama-cpp-python", llama_cpp.__version__, ll.llama_print_system_info().decode())' \
    | tee -a "$out/run.log"
}

# ---- models: random weights on real tokenizers ----------------------------------------------------
models_dir="$work/models"
model_path() { echo "$models_dir/$1.gguf"; }
make_models() {
  mkdir -p "$models_dir"
  local gguf_py=()
  "$py" -c 'import gguf' 2>/dev/null || gguf_py=(env "PYTHONPATH=$src/vendor/llama.cpp/gguf-py${PYTHONPATH:+:$PYTHONPATH}")
  [ -d "$src" ] || build_llama
  for shape in ${MODELS//,/ }; do
    [ -f "$(model_path "$shape")" ] && continue
    case "$shape" in 8b) vocab="$kit/vocab/llama3.gguf" ;; *) vocab="$kit/vocab/smollm2.gguf" ;; esac
    timed "model $shape" "${gguf_py[@]}" "$py" "$root/bench/gpu/models.py" build "$shape" "$vocab" \
      "$(model_path "$shape")"
  done
}

# A way round a load crash that diag found (LD_PRELOAD=...), for the stages that start vertex-gguf
workaround() {
  [ -f "$work/workaround.env" ] || return 0
  export "$(cat "$work/workaround.env")"
  log "using diag's workaround: $(cat "$work/workaround.env")"
  printf '| workaround | %s |\n' "$(cat "$work/workaround.env")" >>"$summary"
}

# ---- bench: vertex-gguf against llama-server, same build, same model, same run -------------------
bench() {
  use_llama
  make_models
  workaround
  for shape in ${MODELS//,/ }; do
    log "bench $shape: levels $LEVELS, $PARALLEL slots x $CTX, $MAX_TOKENS tokens"
    timed "bench $shape" "$py" "$root/bench/batching.py" --model "$(model_path "$shape")" \
      --llama-server "$build/bin/llama-server" --levels "$LEVELS" --parallel "$PARALLEL" \
      --ctx "$CTX" --threads "$THREADS" --max-tokens "$MAX_TOKENS" --ignore-eos --ngl "$NGL" \
      --out "$out/bench-$shape.md" 2>>"$out/run.log" || log "bench $shape failed (see run.log)"
  done
}

# ---- batched: llama-batched-bench, the ceiling of this build on each model -------------------------
batched() {
  build_llama
  make_models
  for shape in ${MODELS//,/ }; do
    log "llama-batched-bench $shape"
    local ctx=$((PARALLEL * (MAX_TOKENS + 128)))
    timed "batched-bench $shape" "$build/bin/llama-batched-bench" -m "$(model_path "$shape")" \
      -c "$ctx" -b 2048 -ub 512 -npp 128 -ntg "$MAX_TOKENS" -npl "$LEVELS" -ngl "$NGL" \
      -t "$THREADS" --output-format md >>"$out/batched.md" 2>>"$out/run.log" \
      || log "batched-bench $shape failed"
  done
}

# ---- mtp: multi-token prediction against llama-server's draft-mtp (issue 53) ---------------------
# the tiny hy_v3 GGUFs with a NextN layer (echo and random weights), made by the bench itself: the
# path on this device and its overhead, not a real MTP model's speedup (the kit has none)
mtp() {
  use_llama
  workaround
  log "mtp: SPEC_MTP against llama-server --spec-type draft-mtp, tiny hy_v3"
  local gguf_py=()  # the bench makes its models with gguf-py
  "$py" -c 'import gguf' 2>/dev/null || gguf_py=(env "PYTHONPATH=$src/vendor/llama.cpp/gguf-py:$PYTHONPATH")
  timed "mtp" "${gguf_py[@]}" "$py" "$root/bench/speculative.py" --only-mtp --repeat 1 --ngl "$NGL" \
    --threads "$THREADS" --llama-server "$build/bin/llama-server" >"$out/mtp.md" 2>>"$out/run.log" \
    || log "mtp failed (see run.log)"
}

# ---- e2e: the end-to-end tests on this build ------------------------------------------------------
e2e() {
  use_llama
  make_models
  local model
  model="$(model_path "$E2E_SHAPE")"
  [ -f "$model" ] || MODELS="$E2E_SHAPE" make_models
  workaround
  # test_mtp*.py make their own tiny GGUFs with gguf-py
  "$py" -c 'import gguf' 2>/dev/null || export PYTHONPATH="$src/vendor/llama.cpp/gguf-py:$PYTHONPATH"
  log "e2e on $model: $E2E_FILES"
  local files
  read -ra files -d '' <<<"$E2E_FILES" || true
  # E2E_MODEL: the suite's model instead of the default one (tests/conftest.py)
  timed "e2e" env E2E_MODEL="$model" MODEL="$model" GPU_LAYERS="$NGL" "$py" -m pytest -p no:cacheprovider -q \
    --continue-on-collection-errors ${E2E:+-k "$E2E"} "${files[@]}" >"$out/e2e.log" 2>&1 || log "e2e failed (see e2e.log)"
  tail -3 "$out/e2e.log" | tee -a "$out/run.log"
}

# Which C++ runtimes this machine and this build hold (docs/crashes.md, "Two C++ runtimes"): the
# toolchain, the libstdc++ the loader finds, and for each library of the build what it needs and
# what of libstdc++ it exports (nm -D: the dynamic table only; a hidden copy is harmless) or
# merely carries (nm: the whole symbol table), the compilers that made it, and its link line
runtimes() {
  echo "== runtimes: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"); $(g++ --version 2>/dev/null | head -1)"
  echo "   loader's libstdc++: $(ldconfig -p 2>/dev/null | grep -m1 'libstdc++.so.6 ' | sed 's/.*=> //') -> $(readlink -f "$(ldconfig -p 2>/dev/null | grep -m1 'libstdc++.so.6 ' | sed 's/.*=> //')" 2>/dev/null)"
  echo "   newest GLIBCXX: $(strings "$(ldconfig -p 2>/dev/null | grep -m1 'libstdc++.so.6 ' | sed 's/.*=> //')" 2>/dev/null | grep -E '^GLIBCXX_[0-9.]+$' | sort -V | tail -1)"
  echo "   environment: $(env | grep -E '^(LD_|[A-Z]*FLAGS|CC|CXX|CUDAHOSTCXX)=' | tr '\n' ' ')"
  local lib dyn exp uniq ids carried
  for lib in "$build"/bin/lib{llama,ggml,ggml-base,ggml-cpu,ggml-cuda,mtmd}.so; do
    [ -e "$lib" ] || continue
    dyn="$(nm -D --defined-only "$lib" 2>/dev/null | sed 's/@.*//')"
    exp="$(grep -cE ' (_ZN?K?St|_ZTVSt|_ZTISt)' <<<"$dyn" || true)"
    uniq="$(grep -c ' u ' <<<"$dyn" || true)"
    ids="$(grep -cE ' [TW] _ZNSt6locale| u _ZNSt[^ ]*2idE$' <<<"$dyn" || true)"
    carried="$(nm --defined-only "$lib" 2>/dev/null | grep -cE '_ZNSt6locale|codecvtIDsc11__mbstate_tE10do_unshift|collateIcE2idE' || true)"
    echo "   $(basename "$lib"): needs $(readelf -d "$lib" 2>/dev/null | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
    echo "     exports $exp std symbols, $uniq unique, $ids std::locale/facet ids; carries $carried locale/codecvt/collate-id symbols in its whole table"
    echo "     made by: $(readelf -p .comment "$lib" 2>/dev/null | sed -n 's/^ *\[ *[0-9]*\] *//p' | sort -u | tr '\n' ';')"
  done
  if [ -f "$build/build.ninja" ]; then
    echo "   ggml-cuda's link: $(ninja -C "$build" -t commands ggml-cuda 2>/dev/null | tail -1 | tr ' ' '\n' | grep -E '^-(static|Wl|l|L|shared|fuse)|\.(a|so)' | tr '\n' ' ')"
  elif [ -f "$build/ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/link.txt" ]; then
    echo "   ggml-cuda's link: $(cat "$build/ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/link.txt")"
  fi
}

# ---- diag: which step of vertex-gguf's load fails here (a GPU-only crash), with a backtrace -------
diag() {
  use_llama
  MODELS=small make_models
  local model
  model="$(model_path small)"
  runtimes | tee -a "$out/diag.log"
  log "diag: each load step alone"
  GPU_LAYERS="$NGL" "$py" "$root/bench/gpu/diag_load.py" "$model" 2>&1 | tee -a "$out/diag.log"
  local wa
  wa="$(sed -n 's/^workaround: //p' "$out/diag.log" | tail -1)"
  rm -f "$work/workaround.env"
  if [ -n "$wa" ]; then
    echo "$wa" >"$work/workaround.env"
    log "diag: the engine died, and loads with $wa; bench and e2e will use it"
  fi
  local first
  first="$(sed -n 's/^== \([a-z]*\): rc -\?[1-9].*/\1/p' "$out/diag.log" | head -1)"
  if [ -n "$first" ] && command -v cuda-gdb >/dev/null; then
    log "diag: cuda-gdb on $first"
    GPU_LAYERS="$NGL" timeout 60 cuda-gdb -q -batch -ex 'set pagination off' -ex run -ex 'bt 40' \
      -ex 'info threads' --args "$py" "$root/bench/gpu/diag_load.py" "$model" "$first" \
      >>"$out/diag.log" 2>&1 || true
    grep -n -A45 'received signal' "$out/diag.log" | head -80
  fi
}

for stage in "${stages[@]}"; do
  case "$stage" in
    build) use_llama ;;
    models) make_models ;;
    bench) bench ;;
    batched) batched ;;
    mtp) mtp ;;
    e2e) e2e ;;
    diag) diag ;;
    *) die "unknown stage $stage (build, models, bench, batched, mtp, e2e, diag)" ;;
  esac
done
log "done: $out"
