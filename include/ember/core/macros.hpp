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
