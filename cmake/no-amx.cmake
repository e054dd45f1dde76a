# Included into llama-cpp-python's CMake build (CMAKE_ARGS="-DCMAKE_PROJECT_INCLUDE=<this file>")
# by the README's install command, .ci/run and the Dockerfile.
#
# llama.cpp's AMX kernels crash on Intel CPUs that have AMX (Sapphire Rapids and later: GCP's C3,
# C4 and the A3 hosts of H100 GPUs): a native build (-march=native) compiles them, the weights go
# into an "AMX model buffer", and the first decode dies with SIGSEGV in ggml_backend_amx_mul_mat
# (upstream: https://github.com/ggml-org/llama.cpp/issues/20824, closed without a fix). These
# options turn the three AMX instruction sets off for C and C++ and keep everything else
# -march=native enables (AVX-512, VNNI, ...: the CPU speed). GCC and Clang honour an explicit
# -mno-X whatever its place beside -march, so the order against ggml's own flags does not matter.
# Only x86 GCC/Clang builds get them (an ARM compiler refuses the options); nvcc never sees them.
include_guard(GLOBAL)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64|i[3-6]86|x86)$" AND NOT MSVC)
  add_compile_options(
    "$<$<COMPILE_LANGUAGE:C,CXX>:-mno-amx-tile;-mno-amx-int8;-mno-amx-bf16>")
  message(STATUS "vertex-gguf: llama.cpp built without AMX (cmake/no-amx.cmake)")
endif()
