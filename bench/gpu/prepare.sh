#!/usr/bin/env bash
# Fills bench/gpu/kit/ (git-ignored) with what bench/gpu/run.sh needs on a GPU machine that
# cannot download anything, within the 60 MiB a device call may carry beside the repository:
#   llama-cpp-python.tar.xz  the pinned llama-cpp-python sdist (its hash checked against
#                            requirements/image.lock), trimmed to what a CPU or CUDA build and
#                            llama-server need
#   wheels/                  cp312 manylinux wheels of the server's and the tests' dependencies
#                            that the GPU machine's Python 3.12 lacks
#   vocab/smollm2.gguf       the default model's tokenizer and chat template, no weights
#   vocab/llama3.gguf        Llama 3's tokenizer (llama.cpp's vocabulary test file)
#   MANIFEST                 what is in it, with sizes and hashes
#
#   bench/gpu/prepare.sh [KIT_DIR]
# Run it here (PyPI reachable), then carry the kit: device run with carry ["bench/gpu/kit"].
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
kit="${1:-$root/bench/gpu/kit}"
limit_mib="${KIT_LIMIT_MIB:-60}"
python="${PYTHON:-$root/.venv/bin/python}"
[ -x "$python" ] || python="$(command -v python3)"
model="${DEFAULT_MODEL:-}"

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'prepare.sh: %s\n' "$*" >&2; exit 1; }

for tool in tar xz sha256sum; do command -v "$tool" >/dev/null || die "$tool not found"; done
"$python" -c 'import gguf, numpy' 2>/dev/null || die "$python lacks gguf and numpy (pip install gguf)"
if [ -z "$model" ]; then
  model="$("$python" -c 'from app.model.default import default_model_path
from app.settings import DEFAULT_CACHE_DIR
print(default_model_path(DEFAULT_CACHE_DIR))' 2>/dev/null || true)"
fi
[ -f "$model" ] || die "the default model is missing ($model): run \`vertex-gguf fetch-default-model\` or set DEFAULT_MODEL"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
rm -rf "$kit"
mkdir -p "$kit/wheels" "$kit/vocab"

# ---- the sdist, hash-checked, trimmed -----------------------------------------------------------
req="$scratch/llama.req"
awk '/^llama-cpp-python==/ {p = 1} p {print; if ($0 !~ /\\$/) exit}' "$root/requirements/image.lock" >"$req"
grep -q -- '--hash=sha256:' "$req" || die "no hash-pinned llama-cpp-python in requirements/image.lock"
version="$(sed -n 's/^llama-cpp-python==\([^ ]*\).*/\1/p' "$req")"
log "llama-cpp-python $version: the sdist, checked against the lock's hash"
"$python" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
  --require-hashes -r "$req" -d "$scratch/dl"
tar -xzf "$scratch/dl/llama_cpp_python-$version.tar.gz" -C "$scratch"
src="$scratch/llama_cpp_python-$version"
cpp="$src/vendor/llama.cpp"
[ -f "$cpp/CMakeLists.txt" ] || die "no vendor/llama.cpp in the sdist"
cp "$cpp/models/ggml-vocab-llama-bpe.gguf" "$kit/vocab/llama3.gguf"
# What neither a CPU/CUDA build of the library, llama-server, llama-batched-bench nor gguf-py
# reads: the other backends, the test models and documentation, the web UI's sources.
# The sdist also carries llama.cpp's git objects (37 MB): the build needs none of them.
(cd "$src" && rm -rf .git docs examples tests docker .github)
(cd "$cpp" && rm -rf .git models docs media .github .devops benches ci pocs app skills \
  tools/ui/src tools/ui/static tools/ui/tests tools/ui/e2e tools/ui/node_modules)
for backend in "$cpp"/ggml/src/ggml-*/; do
  name="$(basename "$backend")"
  case "$name" in ggml-cpu | ggml-cuda) ;; *) rm -rf "$backend" ;; esac
done
find "$cpp/ggml/src" -maxdepth 1 -name 'ggml-*' -type d | sed 's|.*/||' | sort | paste -sd' ' - >"$scratch/backends"
log "kept backends: $(cat "$scratch/backends")"
tar -C "$scratch" -cf - "llama_cpp_python-$version" | xz -T0 -9 >"$kit/llama-cpp-python.tar.xz"

# ---- wheels for the GPU machine's Python 3.12 ----------------------------------------------------
# The server's dependencies and the test clients, without what that machine has (numpy, jinja2,
# prometheus-client, pytest, requests: its package list, /work/.library/device/KINDS.md) and
# without llama-cpp-python (built there).
log "cp312 wheels"
deps=(
  "flask>=3.0,<4" "gunicorn[gevent]>=23,<28" "gevent>=24.2" "google-cloud-storage>=2.16,<4"
  "pydantic>=2.7,<3" "pydantic-settings>=2.3,<3" "redis>=5.0,<8"
  "openai>=2.20" "anthropic>=2.12"
  "diskcache>=5.6.3"  # llama-cpp-python's own (its package is copied, not installed, there)
  "httpx-sse>=0.4"    # tests/e2e/test_streams.py
)
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
  manylinux2014_x86_64 manylinux1_x86_64; do platforms+=(--platform "$p"); done
"$python" -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none "${platforms[@]}" \
  -d "$kit/wheels" "${deps[@]}"
for have in numpy jinja2 markupsafe prometheus_client pytest requests urllib3 idna certifi \
  charset_normalizer pluggy iniconfig packaging; do
  rm -f "$kit/wheels/$have"-[0-9]*.whl
done

# ---- vocabularies ---------------------------------------------------------------------------------
log "the default model's tokenizer, without its weights"
"$python" "$root/bench/gpu/models.py" vocab "$model" "$kit/vocab/smollm2.gguf"

# ---- the manifest and the limit ---------------------------------------------------------------------
(cd "$kit" && find . -type f ! -name MANIFEST -printf '%P\n' | sort | while read -r f; do
  printf '%s  %8d  %s\n' "$(sha256sum "$f" | cut -c1-16)" "$(stat -c %s "$f")" "$f"
done) >"$kit/MANIFEST"
total_kib="$(du -sk "$kit" | cut -f1)"
log "kit: $kit, $((total_kib / 1024)) MiB ($(find "$kit/wheels" -name '*.whl' | wc -l) wheels)"
[ "$total_kib" -le $((limit_mib * 1024)) ] || die "the kit is $((total_kib / 1024)) MiB, over $limit_mib MiB"
# What a device call carries: the tracked and untracked-but-not-ignored files, and the kit.
tree_bytes="$(cd "$root" && git ls-files -z -co --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null \
  | awk '{s += $1} END {print s + 0}')"
travel_mib=$(( (tree_bytes + total_kib * 1024) / 1048576 ))
log "a device call with carry [\"bench/gpu/kit\"] sends about $travel_mib MiB (limit 64)"
[ "$travel_mib" -lt 64 ] || die "the working tree and the kit make $travel_mib MiB, over the 64 MiB a call carries"
