#!/usr/bin/env bash
# Builds the vertex-gguf image on this machine, with podman or docker.
#
#   scripts/build-image.sh cpu [TAG]     # default TAG: vertex-gguf:cpu
#   scripts/build-image.sh cuda [TAG]    # default TAG: vertex-gguf:cuda
#
# Environment:
#   ENGINE           podman or docker (default: docker when its engine answers, else podman)
#   BASE_IMAGE       the image both stages start from (default for cpu: debian:bookworm-slim,
#                    or, when no registry answers, a Debian bookworm root made here with
#                    mmdebstrap from Debian's mirror; default for cuda: the Dockerfile's NVIDIA
#                    CUDA images)
#   LLAMA_WHEEL_DIR  a folder from scripts/build-llama-wheel.sh (the wheel and BUILT_FOR): the
#                    build installs that wheel instead of compiling llama.cpp
#   BUILD_JOBS       parallel compile jobs (default: one per core)
#   CUDA_ARCHS       cuda only (default: the Dockerfile's)
#   WITH_FFMPEG=0    build without the video extra (imageio-ffmpeg's ffmpeg, 165 MiB): video
#                    parts are then a 400 (docs/video.md)
#   PULL_TIMEOUT     seconds to wait for a registry before making the local base (default 60)
#   REBUILD_BASE=1   make the local Debian base again even if it exists
#   PODMAN_RUNTIME   the OCI runtime podman uses (default: runc where installed)
#
# Nothing from the host is baked into a layer: with podman, the host's CA bundle (where a TLS
# proxy stands between this machine and PyPI) and a pip configuration naming it are mounted
# read-only into each build step, and leave no trace in the image. The build runs with the host's
# network (apt and pip reach their mirrors the way the host does). Intermediate containers are
# removed even when a step fails, and the failing step's output is what ends the log.
set -euo pipefail

variant="${1:-}"
case "$variant" in
  cpu|cuda) ;;
  *) echo "usage: $0 cpu|cuda [TAG]" >&2; exit 2 ;;
esac
tag="${2:-vertex-gguf:$variant}"
root="$(cd "$(dirname "$0")/.." && pwd)"
jobs="${BUILD_JOBS:-$(nproc)}"
local_base="localhost/vertex-gguf-base:bookworm"

if [ -z "${ENGINE:-}" ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then ENGINE=docker
  elif command -v podman >/dev/null; then ENGINE=podman
  else
    echo "$0: neither a docker engine nor podman is available (Debian: apt-get install podman runc)" >&2
    exit 1
  fi
fi

engine=("$ENGINE")
if [ "$ENGINE" = podman ] && command -v runc >/dev/null; then
  # crun, podman's default where installed, fails on hosts with hybrid cgroups; runc works there
  # and everywhere else. PODMAN_RUNTIME names another.
  engine+=(--runtime "${PODMAN_RUNTIME:-runc}")
fi

# The local base: a minimal Debian bookworm root, from Debian's own mirror with its security
# updates, imported as an image; about half a minute. Like debian:bookworm-slim it leaves out
# manual pages, translations and documentation (copyright files kept), for the packages the
# build installs later too.
make_local_base() {
  if [ -z "${REBUILD_BASE:-}" ] && "$ENGINE" image inspect "$local_base" >/dev/null 2>&1; then
    echo "using the local base $local_base (REBUILD_BASE=1 makes it again)" >&2
    return
  fi
  if ! command -v mmdebstrap >/dev/null; then
    echo "$0: no registry answered and mmdebstrap is missing to make a local base" \
      "(Debian: apt-get install mmdebstrap), or set BASE_IMAGE" >&2
    exit 1
  fi
  echo "making the local base $local_base with mmdebstrap" >&2
  mmdebstrap --quiet --variant=minbase --format=tar \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    bookworm - \
    "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian bookworm-updates main" \
    "deb http://deb.debian.org/debian-security bookworm-security main" \
    | "$ENGINE" import --change 'CMD ["/bin/bash"]' - "$local_base" >/dev/null
}

build_args=(--build-arg "BACKEND=$variant" --build-arg "BUILD_JOBS=$jobs")
if [ -n "${CUDA_ARCHS:-}" ]; then build_args+=(--build-arg "CUDA_ARCHS=$CUDA_ARCHS"); fi
if [ -n "${WITH_FFMPEG:-}" ]; then build_args+=(--build-arg "WITH_FFMPEG=$WITH_FFMPEG"); fi
base="${BASE_IMAGE:-}"
if [ -z "$base" ] && [ "$variant" = cpu ]; then
  base="debian:bookworm-slim"
  if ! "$ENGINE" image inspect "$base" >/dev/null 2>&1 \
      && ! timeout "${PULL_TIMEOUT:-60}" "$ENGINE" pull -q "$base" >/dev/null 2>&1; then
    echo "$base could not be pulled: building on a local Debian base" >&2
    make_local_base
    base="$local_base"
  fi
fi
if [ -n "$base" ]; then
  build_args+=(--build-arg "BUILD_IMAGE=$base" --build-arg "RUNTIME_IMAGE=$base")
elif [ "$variant" = cuda ]; then
  # NVIDIA's CUDA images, as the Dockerfile names them: checked before the build, so a machine
  # that cannot reach them is told so at once rather than by a pull error inside the build.
  cuda_version="$(sed -n 's/^ARG CUDA_VERSION=//p' "$root/Dockerfile")"
  for image in "nvidia/cuda:$cuda_version-devel-ubuntu22.04" "nvidia/cuda:$cuda_version-base-ubuntu22.04"; do
    if ! "$ENGINE" image inspect "$image" >/dev/null 2>&1 \
        && ! timeout "${PULL_TIMEOUT:-60}" "$ENGINE" pull -q "$image" >/dev/null 2>&1; then
      echo "$0: $image could not be pulled: the CUDA image is built on NVIDIA's CUDA images" \
        "(docs/deploy.md, \"The CUDA build\"). Without them, scripts/build-cuda-wheel.sh" \
        "compiles the CUDA wheel from PyPI's CUDA toolchain." >&2
      exit 1
    fi
  done
fi

# What this build is given beyond the repository: a prebuilt wheel, the host's CA bundle.
copied=()
scratch="$(mktemp -d)"
cleanup() {
  if [ "${#copied[@]}" -gt 0 ]; then rm -f "${copied[@]}"; fi
  rm -rf "$scratch"
}
trap cleanup EXIT
if [ -n "${LLAMA_WHEEL_DIR:-}" ]; then
  for f in "$LLAMA_WHEEL_DIR"/llama_cpp_python-*.whl "$LLAMA_WHEEL_DIR/BUILT_FOR"; do
    [ -f "$f" ] || { echo "$0: LLAMA_WHEEL_DIR lacks $(basename "$f")" >&2; exit 1; }
    [ -e "$root/wheels/$(basename "$f")" ] && { echo "$0: wheels/ already holds $(basename "$f")" >&2; exit 1; }
    cp "$f" "$root/wheels/"
    copied+=("$root/wheels/$(basename "$f")")
  done
  echo "with the prebuilt wheel: $(cat "$LLAMA_WHEEL_DIR/BUILT_FOR") $(cd "$LLAMA_WHEEL_DIR" && ls llama_cpp_python-*.whl)" >&2
fi
if [ "$ENGINE" = podman ]; then
  build_args+=(--format docker)  # the OCI format has no HEALTHCHECK
  ca="${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}"
  if [ -f "$ca" ]; then
    # Mounted over /root (root's home, which every base has): pip reads its user configuration
    # there, and a mount on a directory that exists leaves nothing in the layer (a mount on a
    # new path would leave an empty file behind).
    mkdir -p "$scratch/root/.config/pip"
    cp "$ca" "$scratch/root/host-ca.pem"
    printf '[global]\ncert = /root/host-ca.pem\n' > "$scratch/root/.config/pip/pip.conf"
    if [ -n "${PIP_INDEX_URL:-}" ]; then
      echo "index-url = $PIP_INDEX_URL" >> "$scratch/root/.config/pip/pip.conf"
    fi
    build_args+=(-v "$scratch/root:/root:ro")
  fi
fi

revision="$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
echo "building $tag ($variant, $jobs jobs, base ${base:-as the Dockerfile says}) with $ENGINE" >&2
start="$(date +%s)"
"${engine[@]}" build --network host --force-rm \
  --label "org.opencontainers.image.revision=$revision" \
  "${build_args[@]}" -t "$tag" -f "$root/Dockerfile" "$root"
seconds=$(( $(date +%s) - start ))
size="$("$ENGINE" image inspect --format '{{.Size}}' "$tag")"
echo "built $tag in ${seconds} s: $(( size / 1000000 )) MB" >&2
