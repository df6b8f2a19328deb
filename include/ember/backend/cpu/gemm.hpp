#pragma once
// CPU matrix multiply: a BLAS library (OpenBLAS) when the build found one (EMBER_HAVE_CBLAS, set
// for every consumer of ember::ember alike, so no translation unit sees a different definition),
// else a plain cache-friendly loop. fp16 and bf16 are widened to fp32, multiplied, rounded back.
//
// The BLAS is called through its standard Fortran symbols (sgemm_, dgemm_), declared here, rather
// than through <cblas.h>: OpenBLAS's cblas.h declares a global `bfloat16` type that would clash
// with ember::bfloat16 in any program that says `using namespace ember`. Every BLAS exports them.
//
// fp32 goes to oneDNN's sgemm instead when the build has oneDNN and EMBER_ONEDNN_GEMM (CMake
// option, default ON; defined for every consumer alike). Chosen by measurement (docs/performance.md,
// "GEMM through oneDNN"): on the transformer's, MLP's and 1024^3 shapes it is 10-15% faster than
// OpenBLAS at 1 thread and even or faster at 2, except A-transposed products (the weight
// gradients gy^T x) on more than one thread, where OpenBLAS is up to 1.5x faster: those stay with
// OpenBLAS when the build has it. fp64 stays with the BLAS (oneDNN has no dgemm). oneDNN's CPU
// runtime is OpenMP (libgomp, the pool of ember's kernels and of OpenBLAS's OpenMP build).
// Numerics: for some small-M or small-N shapes oneDNN splits K across threads, so fp32 GEMM
// results can change in the last bits with the thread count (they are the same on every run at a
// given count; the ranks' settings check compares thread counts and this choice).
#include <vector>

#include "ember/backend/cpu/gemm_choice.hpp"
#if defined(EMBER_CPU_GEMM_ONEDNN)
#include <dnnl.h>
#endif
#if defined(_OPENMP)
#include <omp.h>
#endif

#include "ember/backend/cpu/elementwise.hpp"
#include "ember/core/checked_math.hpp"

#if defined(EMBER_HAVE_CBLAS)
extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c, const int* ldc);
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc);
}
#endif

namespace ember::cpu {

namespace detail {
#if defined(EMBER_CPU_GEMM_ONEDNN)
// Row-major, 64-bit dimensions (no int limit), on `threads` threads (1 inside a parallel region,
// where oneDNN stays on the calling thread anyway). Returns false when oneDNN refuses the problem
// (the caller then uses the next library).
inline bool sgemm_onednn(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                         const float* b, int64_t ldb, float beta, float* c, int64_t ldc, [[maybe_unused]] int threads) {
#if defined(_OPENMP)
  // oneDNN sizes its team by this thread's OpenMP setting (omp_get_max_threads), which is also
  // what OpenBLAS's OpenMP build reads (openblas_set_num_threads sets it): set for the call only.
  const ::ember::detail::OmpThreadsForCall omp_threads(threads);
#endif
  return dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) == dnnl_success;
}
#endif
}  // namespace detail

template <class T>
void gemm_plain(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
                int64_t ldb, T beta, T* c, int64_t ldc) {
  std::vector<T> row(static_cast<size_t>(n));
  for (int64_t i = 0; i < m; ++i) {
    std::fill(row.begin(), row.end(), T(0));
    for (int64_t p = 0; p < k; ++p) {
      const T av = ta ? a[p * lda + i] : a[i * lda + p];
      if (av == T(0)) continue;
      if (!tb) {
        const T* br = b + p * ldb;
        for (int64_t j = 0; j < n; ++j) row[static_cast<size_t>(j)] += av * br[j];
      } else {
        for (int64_t j = 0; j < n; ++j) row[static_cast<size_t>(j)] += av * b[j * ldb + p];
      }
    }
    T* cr = c + i * ldc;
    for (int64_t j = 0; j < n; ++j)
      cr[j] = alpha * row[static_cast<size_t>(j)] + (beta == T(0) ? T(0) : beta * cr[j]);
  }
}

template <class T>
void gemm_one(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
              int64_t ldb, T beta, T* c, int64_t ldc) {
#if defined(EMBER_HAVE_CBLAS)
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
    const char tA = ta ? 'T' : 'N', tB = tb ? 'T' : 'N';
    // The Fortran BLAS takes 32-bit ints: a larger dimension would wrap to garbage, so it raises
    // (ShapeError) before any call. No split either: the leading dimension that comes with a
    // large m, n or k is itself too large for the same int.
    const char* op = std::is_same_v<T, float> ? "matmul (BLAS sgemm)" : "matmul (BLAS dgemm)";
    const int im = checked::to_int(m, op, "m"), in = checked::to_int(n, op, "n"), ik = checked::to_int(k, op, "k");
    const int ilda = checked::to_int(lda, op, "lda"), ildb = checked::to_int(ldb, op, "ldb"),
              ildc = checked::to_int(ldc, op, "ldc");
    if (k == 0) {  // BLAS would leave C untouched when alpha*A*B is empty; match beta semantics
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
      return;
    }
    ember::detail::apply_ember_threads_to_blas();
    if constexpr (std::is_same_v<T, float>)
      sgemm_(&tB, &tA, &in, &im, &ik, &alpha, b, &ildb, a, &ilda, &beta, c, &ildc);
    else
      dgemm_(&tB, &tA, &in, &im, &ik, &alpha, b, &ildb, a, &ilda, &beta, c, &ildc);
    return;
  }
#endif
  gemm_plain<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// The fp32 entry: oneDNN where sgemm_uses_onednn chooses it, else the BLAS (or the loop).
// `serial`: on the calling thread alone (the fused attention's block products, so that its
// results never depend on the thread count, whether or not it runs inside a parallel region).
inline void sgemm_one(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                      const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                      [[maybe_unused]] bool serial = false) {
#if defined(EMBER_CPU_GEMM_ONEDNN)
  ember::detail::apply_ember_threads_to_blas();  // EMBER_NUM_THREADS reaches OpenBLAS at the first GEMM
  int threads = serial ? 1 : get_num_threads();
#if defined(_OPENMP)
  if (omp_in_parallel()) threads = 1;
#endif
  if (k > 0 && sgemm_uses_onednn(ta, threads) &&
      detail::sgemm_onednn(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, threads))
    return;
#endif
  gemm_one<float>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// One row-major GEMM of any BLAS type: fp32 through sgemm_one's choice, fp64 through the BLAS.
template <class T>
void gemm_typed(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
                int64_t ldb, T beta, T* c, int64_t ldc, bool serial = false) {
  if constexpr (std::is_same_v<T, float>)
    sgemm_one(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, serial);
  else
    gemm_one<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

inline void gemm(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    for (int64_t i = 0; i < g.batch; ++i)
      gemm_typed<T>(g.trans_a, g.trans_b, g.m, g.n, g.k, static_cast<T>(g.alpha),
                    static_cast<const T*>(g.a) + i * g.stride_a, g.lda, static_cast<const T*>(g.b) + i * g.stride_b,
                    g.ldb, static_cast<T>(g.beta), static_cast<T*>(g.c) + i * g.stride_c, g.ldc);
  };
  switch (g.dtype) {
    case DType::Float32: run(float{}); return;
    case DType::Float64: run(double{}); return;
    case DType::Float16:
    case DType::BFloat16: {
      // Widen each operand to fp32 (its whole strided extent), multiply, round back.
      auto widen = [&](const void* p, int64_t count) {
        std::vector<float> w(static_cast<size_t>(count));
        if (g.dtype == DType::Float16) cast(static_cast<const half*>(p), w.data(), count);
        else cast(static_cast<const bfloat16*>(p), w.data(), count);
        return w;
      };
      // Extent of a row-major matrix with `rows` rows of `cols` used columns and leading dimension ld.
      auto extent = [](int64_t rows, int64_t cols, int64_t ld) { return rows == 0 ? 0 : (rows - 1) * ld + cols; };
      const int64_t a_count = (g.batch - 1) * g.stride_a + (g.trans_a ? extent(g.k, g.m, g.lda) : extent(g.m, g.k, g.lda));
      const int64_t b_count = (g.batch - 1) * g.stride_b + (g.trans_b ? extent(g.n, g.k, g.ldb) : extent(g.k, g.n, g.ldb));
      const int64_t c_count = (g.batch - 1) * g.stride_c + extent(g.m, g.n, g.ldc);
      std::vector<float> a = widen(g.a, a_count), b = widen(g.b, b_count), c = widen(g.c, c_count);
      for (int64_t i = 0; i < g.batch; ++i)
        sgemm_one(g.trans_a, g.trans_b, g.m, g.n, g.k, static_cast<float>(g.alpha), a.data() + i * g.stride_a, g.lda,
                  b.data() + i * g.stride_b, g.ldb, static_cast<float>(g.beta), c.data() + i * g.stride_c, g.ldc);
      if (g.dtype == DType::Float16) cast(c.data(), static_cast<half*>(g.c), c_count);
      else cast(c.data(), static_cast<bfloat16*>(g.c), c_count);
      return;
    }
    default:
      throw DTypeError(::ember::detail::str_cat("gemm: unsupported dtype ", dtype_name(g.dtype), " on cpu"));
  }
}

}  // namespace ember::cpu
