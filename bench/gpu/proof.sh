#!/usr/bin/env bash
# The GPU proof in one device call of at most 10 minutes, the stages in the order of their worth,
# each given what is left of a deadline: the CUDA build (with the models made beside it), the
# load diagnosis (run.sh diag: about 40 s, 90 if the engine dies: then cuda-gdb's backtrace, the
# linker's bindings and a way round it that the later stages use), the
# benchmark on the 8B shape, then the small and the near-free ones, llama-batched-bench, MTP
# against llama-server's draft-mtp on the tiny hy_v3 models (bench/speculative.py --only-mtp), and as
# much of the end-to-end suite as the time left allows. GPU memory is sampled every second into
# $OUT/gpumem.csv. Everything else is bench/gpu/run.sh's; its variables pass through.
#
#   device run, carry ["bench/gpu/kit"], timeout_s 600:  bench/gpu/proof.sh
#   DEADLINE  seconds from the start by which the last stage must end (default 560)
set -uo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
run="$root/bench/gpu/run.sh"
work="${WORK:-$root/bench/gpu/work}"
export OUT="${OUT:-$root/bench/gpu/out}"
export MODELS="${MODELS:-8b,small,nearfree}"
deadline="${DEADLINE:-560}"
mkdir -p "$OUT" "$work"
left() { echo $((deadline - SECONDS)); }

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -l 1 >"$OUT/gpumem.csv" 2>&1 &
  smi=$!
  trap 'kill $smi 2>/dev/null' EXIT
fi

# The sources first, so the models (gguf-py comes with them) are made while llama.cpp compiles.
if [ ! -d "$work/src" ]; then
  mkdir -p "$work/src"
  tar -xJf "$root/bench/gpu/kit/llama-cpp-python.tar.xz" -C "$work/src" --strip-components=1
fi
"$run" models &
models=$!
# run.sh installs the kit's wheels where the machine lacks them: one install at a time
if ! "${PYTHON:-python3}" -c 'import flask, gevent, gunicorn, pydantic_settings, openai, anthropic' 2>/dev/null; then
  for _ in $(seq 120); do [ -f "$work/site/.done" ] && break; sleep 0.5; done
fi
timeout "$(left)" "$run" build || { wait "$models"; exit 1; }
wait "$models" || exit 1

for stage in diag bench batched mtp; do
  [ "$(left)" -gt 30 ] || { echo "proof.sh: no time left for $stage" >&2; exit 1; }
  timeout "$(left)" "$run" "$stage"
done
# pytest prints its summary on SIGINT, so a cut suite still says what passed
[ "$(left)" -gt 30 ] && timeout -s INT "$(left)" "$run" e2e
echo "proof.sh: done at ${SECONDS} s"
