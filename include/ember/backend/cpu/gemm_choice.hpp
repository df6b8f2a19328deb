#pragma once
// Which library the CPU's fp32 GEMM uses (backend/cpu/gemm.hpp has the why). A header of its own,
// free of the kernels, so that the ranks' settings check (dist/same_settings.hpp) and the
// benchmarks can name the choice.
#if defined(EMBER_HAVE_ONEDNN) && defined(EMBER_ONEDNN_GEMM)
#define EMBER_CPU_GEMM_ONEDNN 1
#endif

namespace ember::cpu {

// Whether an fp32 GEMM of this form, run on `threads` threads, goes to oneDNN (the top of
// gemm.hpp says why); else to the BLAS, or to gemm_plain without one.
inline bool sgemm_uses_onednn([[maybe_unused]] bool trans_a, [[maybe_unused]] int threads) {
#if defined(EMBER_CPU_GEMM_ONEDNN) && defined(EMBER_HAVE_CBLAS)
  return !(trans_a && threads > 1);
#elif defined(EMBER_CPU_GEMM_ONEDNN)
  return true;
#else
  return false;
#endif
}

// A one-line description for benchmarks and the ranks' settings check.
inline const char* sgemm_libraries() {
#if defined(EMBER_CPU_GEMM_ONEDNN) && defined(EMBER_HAVE_CBLAS)
  return "oneDNN sgemm (A-transposed on >1 thread: BLAS)";
#elif defined(EMBER_CPU_GEMM_ONEDNN)
  return "oneDNN sgemm";
#elif defined(EMBER_HAVE_CBLAS)
  return "BLAS sgemm";
#else
  return "plain loop";
#endif
}

}  // namespace ember::cpu

// For programs built against several ember trees (benchmarks/bench_vs_torch.cpp).
#define EMBER_CPU_HAVE_SGEMM_LIBRARIES 1
