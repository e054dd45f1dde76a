# syntax=docker/dockerfile:1
# vertex-gguf: one image for Vertex AI, Cloud Run (GPU) and `docker run`.
#
# GPU (default): llama.cpp built with CUDA for A100 (sm_80), L4 (sm_89), H100 and H200 (sm_90)
# and RTX PRO 6000 (sm_120), by nvcc in NVIDIA's CUDA 12.9 devel image (PyPI's CUDA 12 wheels
# hold no compiler: docs/deploy.md, "The CUDA build"). CUDA 12.9 is the last CUDA 12 release:
# it runs on Cloud Run's L4 driver (R535, CUDA 12.2) by CUDA minor-version compatibility (any
# 12.x application runs on a driver >= 525) as long as the driver has nothing to JIT-compile or
# decompress: the image carries machine code (SASS) for every architecture in CUDA_ARCHS, and
# uncompressed (R535 cannot load a fatbinary compressed by CUDA >= 12.4).
# The runtime stage is the CUDA `base` image (the CUDA runtime) plus the only CUDA libraries
# ggml-cuda links: cuBLAS (libcublas, libcublasLt) and NCCL (GGML_CUDA_NCCL is on by default
# and the devel image has it); libcuda comes from the host's driver. A check at the end of the
# build fails it if any other library is missing. At start the server logs the driver, the
# CUDA runtime and each GPU it finds, and says so when one cannot be used.
# CPU variant (scripts/build-image.sh cpu does this, on a local Debian base where Docker Hub
# cannot be reached):
#   docker build --build-arg BACKEND=cpu --build-arg BUILD_IMAGE=debian:bookworm-slim \
#     --build-arg RUNTIME_IMAGE=debian:bookworm-slim -t vertex-gguf:cpu .
# A model baked into the image (for Cloud Run models too big to download within its startup
# window): put the GGUF (or a split GGUF's shards) into baked-model/ before building (Cloud
# Build's _BAKE_MODEL substitution does it from the bucket); it lands in /opt/model, which
# MODEL=/opt/model serves.

ARG CUDA_VERSION=12.9.1
ARG BUILD_IMAGE=nvidia/cuda:${CUDA_VERSION}-devel-ubuntu22.04
ARG RUNTIME_IMAGE=nvidia/cuda:${CUDA_VERSION}-base-ubuntu22.04

# ---- build: compile llama-cpp-python and install the app into /opt/venv -------------------------
# checkov:skip=CKV_DOCKER_7:the base images are pinned through the CUDA_VERSION build arg, which checkov cannot resolve
FROM ${BUILD_IMAGE} AS build

ARG BACKEND=cuda
ARG CUDA_ARCHS="80;89;90;120"
ARG WITH_DEFAULT_MODEL=1
# Parallel compile jobs. nvcc compiling llama.cpp's CUDA template instances for four
# architectures can take several GB per job; unbounded (one job per core) a 32-core build machine
# with 32 GB runs out of memory. 8 jobs leave about 4 GB each on E2_HIGHCPU_32.
ARG BUILD_JOBS=8

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv ca-certificates \
    && apt-get clean && rm -rf /var/lib/apt/lists/*

RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# The Python dependencies, all from requirements/image.lock: every package pinned (==) with the
# sha256 of its files, which pip checks (--require-hashes), so two builds of one commit install the
# same files. After changing pyproject.toml's dependencies, regenerate the lock (runtime
# dependencies and the video extra, for this image's Python 3.11 on Linux x86_64; any host) with
#   uv pip compile --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_35 \
#     --extra video --output-file requirements/image.lock pyproject.toml
# or, on Linux with Python 3.11, pip-tools:
#   pip-compile --generate-hashes --extra video --output-file requirements/image.lock pyproject.toml
# The video extra is imageio-ffmpeg: one ffmpeg binary that needs nothing but glibc, which
# extracts video frames in a limited child process (app/core/video.py, docs/video.md): 165 MiB
# installed (a 68 MB download). WITH_FFMPEG=0 builds without it (it is uninstalled before the
# venv reaches the runtime stage); video parts are then a 400.
# (tests/deploy/test_artifacts.py checks the lock against pyproject.toml).
# llama-cpp-python is the exception that compiles: scripts/build-llama-wheel.sh builds its wheel
# from the lock's hash-checked sdist for the chosen backend, with GGML_NATIVE off (the binary runs
# on any host CPU) and without llama.cpp's AMX kernels (they crash on CPUs that have AMX: GCP's
# C3, C4 and A3 hosts; docs/crashes.md). It is the slow layer (the CUDA compile), rebuilt only when
# the lock or the script changes. A wheel that script made beforehand may be put into wheels/
# (scripts/build-image.sh LLAMA_WHEEL_DIR=... does it; CI builds the wheel once for the virtualenv
# and the image): it is used instead of compiling when its BUILT_FOR matches this build's backend.
# The compilers are installed only to compile, and only in this stage.
COPY requirements/image.lock scripts/build-llama-wheel.sh /tmp/build/
COPY wheels/ /tmp/build/wheels/
ARG WITH_FFMPEG=1
# hadolint ignore=DL3008
RUN pip install --upgrade "pip==25.3" \
    && want="$BACKEND" \
    && if [ "$BACKEND" = "cuda" ]; then want="cuda ${CUDA_ARCHS}"; fi \
    && if ls /tmp/build/wheels/llama_cpp_python-*.whl >/dev/null 2>&1; then \
        got="$(cat /tmp/build/wheels/BUILT_FOR 2>/dev/null || echo unknown)"; \
        if [ "$got" != "$want" ]; then \
            echo "wheels/ holds a llama-cpp-python wheel built for '$got', not '$want'"; exit 1; \
        fi; \
        echo "using the prebuilt wheel: $(sha256sum /tmp/build/wheels/llama_cpp_python-*.whl)"; \
    else \
        apt-get update \
        && apt-get install -y --no-install-recommends python3.11-dev build-essential cmake git \
        && apt-get clean && rm -rf /var/lib/apt/lists/* \
        && BUILD_JOBS="${BUILD_JOBS}" CUDA_ARCHS="${CUDA_ARCHS}" PYTHON=/opt/venv/bin/python \
           LOCK=/tmp/build/image.lock /tmp/build/build-llama-wheel.sh "$BACKEND" /tmp/build/wheels; \
    fi \
    && pip install --no-deps /tmp/build/wheels/llama_cpp_python-*.whl \
    && pip install --require-hashes -r /tmp/build/image.lock \
    && if [ "$WITH_FFMPEG" != "1" ]; then pip uninstall -y imageio-ffmpeg; fi \
    && rm -rf /tmp/build

# The app itself, without its dependencies (the lock installed them); `pip check` fails the build
# when the lock no longer satisfies pyproject.toml's requirements.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY app ./app
RUN pip install --no-deps . && pip check && rm -rf /src/build

# The CUDA libraries the runtime stage installs, at the versions this build linked against (the
# devel image's own packages: libcublas-MAJOR-MINOR and the libnccl2 built for this CUDA), so the
# runtime never picks up a newer NCCL built for another CUDA major. Empty for the CPU variant.
RUN if [ "$BACKEND" = "cuda" ]; then \
        cuda_mm="$(echo "${CUDA_VERSION:?the CUDA image sets CUDA_VERSION}" | cut -d. -f1,2 | tr . -)"; \
        dpkg-query -W -f='${Package}=${Version}\n' "libcublas-${cuda_mm}" libnccl2; \
    fi > /opt/cuda-runtime-packages.txt \
    && cat /opt/cuda-runtime-packages.txt

# The embedded default model (SmolLM2-135M-Instruct, sha256-checked), so `docker run` with no
# model configured serves something.
RUN mkdir -p /var/cache/vertex-gguf \
    && if [ "$WITH_DEFAULT_MODEL" = "1" ]; then \
        vertex-gguf fetch-default-model --model-cache-dir /var/cache/vertex-gguf; \
    fi

# ---- runtime: no compilers, no gcloud ----------------------------------------------------------
FROM ${RUNTIME_IMAGE} AS runtime

ENV DEBIAN_FRONTEND=noninteractive
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# cuBLAS and NCCL from NVIDIA's apt repository (configured in the CUDA base image), the exact
# versions the build stage linked against. No distribution ffmpeg: Debian bookworm's package
# would add about 440 MB (Mesa and LLVM through libavdevice); the venv's imageio-ffmpeg (above)
# is the server's ffmpeg.
# Ubuntu 24.04 images already have a user with uid 1000 (`ubuntu`): it is removed first, so that
# uid 1000 is `app` on every base.
COPY --from=build /opt/cuda-runtime-packages.txt /tmp/cuda-runtime-packages.txt
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 libgomp1 ca-certificates \
    && if [ -s /tmp/cuda-runtime-packages.txt ]; then \
        xargs apt-get install -y --no-install-recommends < /tmp/cuda-runtime-packages.txt; \
    fi \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /tmp/cuda-runtime-packages.txt \
    && if getent passwd 1000 >/dev/null; then userdel --remove "$(getent passwd 1000 | cut -d: -f1)"; fi \
    && useradd --uid 1000 --create-home --shell /usr/sbin/nologin app

COPY --from=build /opt/venv /opt/venv
COPY --from=build --chown=1000:1000 /var/cache/vertex-gguf /var/cache/vertex-gguf
COPY --chown=1000:1000 baked-model/ /opt/model/

# Every shared library llama.cpp loads must resolve here, except libcuda.so.1, which the GPU
# host's driver mounts at run time: a missing CUDA library fails the build, not the deployment.
RUN missing="$(find /opt/venv -name '*.so*' -path '*llama_cpp*' -exec ldd {} + 2>/dev/null \
        | grep 'not found' | grep -v 'libcuda\.so\.1' | sort -u || true)" \
    && if [ -n "$missing" ]; then echo "missing shared libraries:"; echo "$missing"; exit 1; fi

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MODEL_CACHE_DIR=/var/cache/vertex-gguf

USER 1000
WORKDIR /home/app
# The port comes from AIP_HTTP_PORT (Vertex) or PORT (Cloud Run) at run time; 8080 otherwise.
EXPOSE 8080
# For `docker run` (Vertex AI and Cloud Run use their own probes): healthy once the model is ready.
HEALTHCHECK --interval=30s --timeout=10s --start-period=600s --retries=3 CMD ["vertex-gguf", "probe"]
ENTRYPOINT ["vertex-gguf"]
CMD ["serve"]
