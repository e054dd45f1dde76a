# syntax=docker/dockerfile:1
# vertex-gguf: one image for Vertex AI, Cloud Run (GPU) and `docker run`.
#
# GPU (default): llama.cpp built with CUDA for A100 (sm_80), L4 (sm_89) and H100 (sm_90).
# CUDA 12.2 matches Cloud Run's L4 driver (535, CUDA 12.2): a newer toolkit would need a newer
# driver than Cloud Run guarantees.
# CPU variant, for a laptop without a GPU:
#   docker build --build-arg BACKEND=cpu \
#     --build-arg BUILD_IMAGE=ubuntu:22.04 --build-arg RUNTIME_IMAGE=ubuntu:22.04 -t vertex-gguf:cpu .

ARG CUDA_VERSION=12.2.2
ARG BUILD_IMAGE=nvidia/cuda:${CUDA_VERSION}-devel-ubuntu22.04
ARG RUNTIME_IMAGE=nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu22.04

# ---- build: compile llama-cpp-python and install the app into /opt/venv -------------------------
# checkov:skip=CKV_DOCKER_7:the base images are pinned through the CUDA_VERSION build arg, which checkov cannot resolve
FROM ${BUILD_IMAGE} AS build

ARG BACKEND=cuda
ARG CUDA_ARCHS="80;89;90"
ARG LLAMA_CPP_PYTHON_VERSION=0.3.36
ARG WITH_DEFAULT_MODEL=1

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
       python3.11 python3.11-venv python3.11-dev build-essential cmake git ca-certificates \
    && rm -rf /var/lib/apt/lists/*

RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# llama-cpp-python first (the slow, rarely changing layer), built for the chosen backend with
# GGML_NATIVE off so the binary runs on any host CPU.
RUN if [ "$BACKEND" = "cuda" ]; then \
        export CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS} -DGGML_NATIVE=off"; \
    else \
        export CMAKE_ARGS="-DGGML_NATIVE=off"; \
    fi \
    && pip install --upgrade "pip==25.3" \
    && pip install "llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION}"

# The app, by the same route CI installs it: `pip install .`
WORKDIR /src
COPY pyproject.toml README.md ./
COPY app ./app
RUN pip install . && rm -rf /src/build

# The embedded default model (SmolLM2-135M-Instruct, sha256-checked), so `docker run` with no
# model configured serves something.
RUN mkdir -p /var/cache/vertex-gguf \
    && if [ "$WITH_DEFAULT_MODEL" = "1" ]; then \
        vertex-gguf fetch-default-model --model-cache-dir /var/cache/vertex-gguf; \
    fi

# ---- runtime: no compilers, no gcloud ----------------------------------------------------------
FROM ${RUNTIME_IMAGE} AS runtime

ENV DEBIAN_FRONTEND=noninteractive

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 libgomp1 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 1000 --create-home --shell /usr/sbin/nologin app

COPY --from=build /opt/venv /opt/venv
COPY --from=build --chown=1000:1000 /var/cache/vertex-gguf /var/cache/vertex-gguf

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
