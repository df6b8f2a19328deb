#pragma once
// Portability and build-mode macros shared by host-only and CUDA translation units.

// ember is C++20 (concepts, designated initialisers, [[likely]]): say so plainly rather than
// with pages of errors from the first concept. MSVC reports the standard in _MSVC_LANG.
#if defined(_MSVC_LANG) && _MSVC_LANG > __cplusplus
#define EMBER_CPLUSPLUS _MSVC_LANG
#else
#define EMBER_CPLUSPLUS __cplusplus
#endif
#if EMBER_CPLUSPLUS < 202002L
#error "ember needs C++20: compile with -std=c++20 (g++ >= 10, clang++ >= 12; nvcc -std=c++20), or link the CMake target ember::ember, which sets it"
#endif
#if defined(__CUDACC__)
#define EMBER_HD __host__ __device__
#else
#define EMBER_HD
#endif

// `#pragma omp simd <clauses>` where OpenMP (or its simd subset, -fopenmp-simd) is enabled, and
// nothing otherwise: a program compiled without -fopenmp gets no -Wunknown-pragmas warnings.
#define EMBER_PRAGMA(x) _Pragma(#x)
#if defined(_OPENMP) || defined(_OPENMP_SIMD)
#define EMBER_OMP_SIMD(clauses) EMBER_PRAGMA(omp simd clauses)
#else
#define EMBER_OMP_SIMD(clauses)
#endif

// EMBER_COMPILED_LIB: ember's compiled library mode (as Asio's ASIO_SEPARATE_COMPILATION or
// spdlog's SPDLOG_COMPILED_LIB). Undefined (the default for a plain compiler), ember is header-only:
// every translation unit compiles what it includes, the CPU backend and the JSON parsing included.
// Defined for every file of a program, the heavy non-template parts (the CPU backend, safetensors
// and optimizer-state files, nn::Module's bookkeeping, the explicit instantiations of the layers
// and of Tensor<T>) are declared only, and compiled once from include/ember/src/*.cpp into a
// library: CMake's ember::ember does both. All files of a program must agree (mixing gives two
// CPU backends, with two allocators); ember::build_info() says which mode a program has.
//
// EMBER_LIB_INLINE marks a function that the headers define inline in header-only mode and the
// library defines once in compiled mode (on its declaration and on its definition, which lives in
// a */detail/*_impl.hpp header that the declaring header includes only when header-only).
#if defined(EMBER_COMPILED_LIB)
#define EMBER_LIB_INLINE
#else
#define EMBER_LIB_INLINE inline
#endif
