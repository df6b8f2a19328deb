#pragma once
// Portability macros shared by host-only and CUDA translation units.
#if defined(__CUDACC__)
#define EMBER_HD __host__ __device__
#else
#define EMBER_HD
#endif
