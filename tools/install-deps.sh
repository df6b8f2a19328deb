#!/usr/bin/env bash
# Installs, from Debian/Ubuntu packages, what ember's build, tests, examples and benchmarks need
# and the machine lacks. Idempotent: installs nothing when everything is there. The CUDA toolkit
# (nvcc, cuBLAS, cuDNN, NCCL) is not installed here: it comes from NVIDIA; without it ember builds
# its CPU backend only.
set -euo pipefail
packages=(cmake ninja-build g++ pkg-config catch2 libbenchmark-dev libopenblas-dev nlohmann-json3-dev
          zlib1g-dev python3 python3-sklearn libopenmpi-dev openmpi-bin
          liblmdb-dev lmdb-utils libpng-dev libjpeg-dev dataset-fashion-mnist python3-venv
          clang libclang-rt-14-dev libomp-14-dev clang-19 libc++-19-dev libc++abi-19-dev
          libdnnl-dev libopenblas0-openmp libhdf5-dev)
# libopenblas0-openmp: OpenBLAS's OpenMP build, which ember links when its kernels use OpenMP (one
# thread pool; cmake/EmberBlas.cmake). libopenblas.so.0 keeps naming the pthread build.
# libhdf5-dev: HDF5's C library for data/hdf5.hpp (optional in CMake: HDF5 datasets off without it).
# libdnnl-dev: oneDNN, ember's fp32 CPU convolutions (optional in CMake: im2col + GEMM without it).
# libomp-14-dev: LLVM's OpenMP runtime and Archer for clang 14, which ThreadSanitizer understands
# (tools/sanitize.sh tsan-openmp).
# clang-19 with libc++ 19: the second compiler and standard library of the header self-tests
# (tests/headers), whose stricter includes catch what g++ 12's libstdc++ hides.
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "install-deps: CUDA toolkit found; ember builds its CUDA backend"
else
  echo "install-deps: no CUDA toolkit (nvcc); ember builds its CPU backend only"
fi
