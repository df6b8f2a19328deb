#pragma once
// cuBLAS (host code): error checks, one handle per device bound to the device's ember stream, and
// the row-major GEMM of the kernel table (GemmArgs, core/backend.hpp).
#include <cublas_v2.h>

#include <cstdint>
#include <memory>
#include <mutex>

#include "ember/backend/cuda/runtime.hpp"
#include "ember/core/backend.hpp"

namespace ember::cuda {

namespace internal {
inline void check_cublas(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw CublasError(::ember::detail::str_cat("cuBLAS error ", static_cast<int>(s), " (", cublasGetStatusString(s),
                                               ")", where_str(call, file, line)));
}
}  // namespace internal

#define EMBER_CUBLAS_CHECK(call) ::ember::cuda::internal::check_cublas((call), #call, __FILE__, __LINE__)

// The cuBLAS handle of a device, created on first use and bound to current_stream(device). Its math
// mode forbids TF32 (fp32 GEMMs match the CPU) and reduced-precision split-K reductions (fp16/bf16
// GEMMs accumulate in fp32 all the way). Never destroyed: it must outlive static destruction.
inline cublasHandle_t cublas_handle(int device) {
  return internal::stream_bound_handle<cublasHandle_t>(device, "cublas_handle", [](cudaStream_t stream) {
    cublasHandle_t h = nullptr;
    EMBER_CUBLAS_CHECK(cublasCreate(&h));
    EMBER_CUBLAS_CHECK(cublasSetStream(h, stream));
    EMBER_CUBLAS_CHECK(cublasSetMathMode(
        h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    return h;
  });
}

// C[m,n] = alpha op(A)[m,k] op(B)[k,n] + beta C, row-major, batched with element strides, on the
// device's stream. Column-major cuBLAS computes the transpose: C^T = op(B)^T op(A)^T, where a
// row-major matrix with leading dimension ld is its own transpose in column-major with the same ld.
// fp32 computes in fp32 (CUBLAS_COMPUTE_32F: no TF32), fp64 in fp64, fp16/bf16 on tensor cores
// with fp32 accumulation and fp32 alpha/beta. Other dtypes throw DTypeError.
inline void gemm(int device, const GemmArgs& g) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  cudaDataType_t data_type;
  cublasComputeType_t compute;
  switch (g.dtype) {
    case DType::Float32: data_type = CUDA_R_32F; compute = CUBLAS_COMPUTE_32F; break;
    case DType::Float64: data_type = CUDA_R_64F; compute = CUBLAS_COMPUTE_64F; break;
    case DType::Float16: data_type = CUDA_R_16F; compute = CUBLAS_COMPUTE_32F; break;
    case DType::BFloat16: data_type = CUDA_R_16BF; compute = CUBLAS_COMPUTE_32F; break;
    default:
      throw DTypeError(::ember::detail::str_cat("gemm: unsupported dtype ", dtype_name(g.dtype), " on cuda:", device,
                                                " (float32, float64, float16 and bfloat16 are supported)"));
  }
  EMBER_CHECK(g.m > 0 && g.n > 0 && g.k >= 0 && g.batch > 0, ValueError, "gemm: bad sizes m=", g.m, " n=", g.n,
              " k=", g.k, " batch=", g.batch, " on cuda:", device);
  // cuBLAS wants ld >= max(1, rows of the column-major operand); a leading dimension is never used
  // for addressing when the operand has a single column or no rows (k = 0), so callers may pass
  // anything there (the CPU backend accepts that too).
  auto fix_ld = [](int64_t ld, int64_t rows, int64_t cols) {
    const int64_t need = rows > 1 ? rows : 1;
    return ((cols <= 1 || rows == 0) && ld < need) ? need : ld;
  };
  // Rows and columns of each operand as cuBLAS sees it stored (column-major, the transpose).
  const int64_t b_rows = g.trans_b ? g.k : g.n, b_cols = g.trans_b ? g.n : g.k;
  const int64_t a_rows = g.trans_a ? g.m : g.k, a_cols = g.trans_a ? g.k : g.m;
  const int64_t ldb = fix_ld(g.ldb, b_rows, b_cols);
  const int64_t lda = fix_ld(g.lda, a_rows, a_cols);
  const int64_t ldc = fix_ld(g.ldc, g.n, g.m);
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;

  float alpha_f = static_cast<float>(g.alpha), beta_f = static_cast<float>(g.beta);
  double alpha_d = g.alpha, beta_d = g.beta;
  const void* alpha = compute == CUBLAS_COMPUTE_64F ? static_cast<const void*>(&alpha_d) : &alpha_f;
  const void* beta = compute == CUBLAS_COMPUTE_64F ? static_cast<const void*>(&beta_d) : &beta_f;

  cublasHandle_t h = cublas_handle(device);
  DeviceGuard guard(device);
  EMBER_CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(h, op_b, op_a, g.n, g.m, g.k, alpha, g.b, data_type, ldb,
                                                   static_cast<long long>(g.stride_b), g.a, data_type, lda,
                                                   static_cast<long long>(g.stride_a), beta, g.c, data_type, ldc,
                                                   static_cast<long long>(g.stride_c), g.batch, compute,
                                                   CUBLAS_GEMM_DEFAULT));
}

}  // namespace ember::cuda
