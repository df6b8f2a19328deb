#pragma once
// Portability macros shared by host-only and CUDA translation units.

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
