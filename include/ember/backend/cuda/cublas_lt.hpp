#pragma once
// cuBLASLt (host code): Linear with its bias and activation in the GEMM's epilogue, for the
// kernel table's linear_act_forward (LinearActArgs, core/backend.hpp). One GEMM writes
// y = act(x W^T + b), and for GELU also its input z (the epilogue's aux output), instead of a
// broadcast of the bias, a GEMM that reads it back (beta = 1) and an activation kernel that reads
// z and writes y.
//
// Row-major y[rows, out] = x[rows, in] W[out, in]^T is, column-major, D[out, rows] =
// op(A) B with A = W stored [in, out] (ld in, transposed), B = x stored [in, rows] (ld in), so
// cuBLASLt's m = out, n = rows, k = in, and its bias (one per row of D) is one per output feature.
//
// What the epilogue covers: float32, float16 and bfloat16 (fp32 accumulation and scale, no TF32,
// split-K reductions only in fp32), ReLU and GELU with the tanh approximation (cuBLASLt's GELU;
// the exact, erf GELU has no epilogue), with or without a bias; GELU's aux output needs
// out % 8 == 0. Everything else, or a problem for which cuBLASLt's heuristic has no algorithm,
// returns false and the backend runs the composite (backend/composite.hpp).
#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "ember/backend/cuda/cublas.hpp"
#include "ember/core/backend.hpp"

namespace ember::cuda {

// The cuBLASLt handle of a device, created on first use (the stream is passed per call). Never
// destroyed: it must outlive static destruction, as the cuBLAS handle.
inline cublasLtHandle_t cublaslt_handle(int device) {
  return internal::once_per_device<cublasLtHandle_t>(device, "cublaslt_handle", [&] {
    DeviceGuard guard(device);
    cublasLtHandle_t h = nullptr;
    EMBER_CUBLAS_CHECK(cublasLtCreate(&h));
    return h;
  });
}

namespace internal {
// Owners of the per-call descriptors (cheap host objects), destroyed on every path.
struct LtMatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  ~LtMatmulDesc() {
    if (d) cublasLtMatmulDescDestroy(d);
  }
};
struct LtLayout {
  cublasLtMatrixLayout_t d = nullptr;
  ~LtLayout() {
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
};
struct LtPreference {
  cublasLtMatmulPreference_t d = nullptr;
  ~LtPreference() {
    if (d) cublasLtMatmulPreferenceDestroy(d);
  }
};

template <class V>
void lt_set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v) {
  EMBER_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}

// The algorithm cuBLASLt's heuristic chose for a problem, cached: the heuristic costs host time
// on every call otherwise. Its choice depends on the pointers' alignment, which is in the key.
struct LtKey {
  int device;
  int dtype;
  int64_t rows, in, out;
  int epilogue;
  int align;  // the largest of 16, 8, 4, 2 that divides every pointer's address
  bool operator<(const LtKey& o) const {
    return std::tie(device, dtype, rows, in, out, epilogue, align) <
           std::tie(o.device, o.dtype, o.rows, o.in, o.out, o.epilogue, o.align);
  }
};
struct LtChoice {
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
};
inline constexpr size_t kLtCacheMaxEntries = 4096;
inline std::mutex& lt_cache_mutex() {
  static std::mutex* m = new std::mutex;  // never freed, as the handles
  return *m;
}
inline std::map<LtKey, LtChoice>& lt_cache() {
  static auto* c = new std::map<LtKey, LtChoice>;
  return *c;
}

inline int pointer_alignment(std::initializer_list<const void*> ptrs) {
  uintptr_t bits = 16;
  for (const void* p : ptrs)
    if (p != nullptr) bits |= reinterpret_cast<uintptr_t>(p);
  return static_cast<int>(bits & (~bits + 1));  // the lowest set bit, at most 16
}
}  // namespace internal

// The largest workspace the epilogue GEMM may use (cuBLAS's default for Hopper is 32 MiB); taken
// from the device's memory pool for the call only.
inline constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;

// Runs linear_act_forward in one cuBLASLt GEMM, on `stream`, with the workspace from `allocate` /
// `release` (the backend's pool); false (nothing written) where the epilogue does not cover the
// problem (see the top of this file).
template <class Allocate, class Release>
bool linear_act_lt(int device, cudaStream_t stream, const LinearActArgs& a, const void* x, const void* w,
                   const void* b, void* z, void* y, Allocate&& allocate, Release&& release) {
  cudaDataType_t data_type;
  switch (a.dtype) {
    case DType::Float32: data_type = CUDA_R_32F; break;
    case DType::Float16: data_type = CUDA_R_16F; break;
    case DType::BFloat16: data_type = CUDA_R_16BF; break;
    default: return false;  // float64: no epilogue kernels worth having
  }
  if (a.rows <= 0 || a.out <= 0 || a.in <= 0) return false;
  const bool has_bias = b != nullptr;
  cublasLtEpilogue_t epilogue;
  switch (a.act) {
    case LinearActivation::Relu: epilogue = has_bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU; break;
    case LinearActivation::GeluTanh:
      if (a.out % 8 != 0 || z == nullptr) return false;  // the aux output's leading dimension
      epilogue = has_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
      break;
    case LinearActivation::None:
      if (!has_bias) return false;  // a plain GEMM: op::linear's cuBLAS call
      epilogue = CUBLASLT_EPILOGUE_BIAS;
      break;
    default: return false;  // the exact GELU
  }
  const bool aux = epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epilogue == CUBLASLT_EPILOGUE_GELU_AUX;

  using internal::lt_set;
  internal::LtMatmulDesc desc;
  EMBER_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  lt_set(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  lt_set(desc.d, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  lt_set(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  if (has_bias) lt_set(desc.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, b);
  if (aux) {
    lt_set(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, z);
    lt_set(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(a.out));
  }
  internal::LtLayout la, lb, ld;
  EMBER_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la.d, data_type, static_cast<uint64_t>(a.in),
                                                static_cast<uint64_t>(a.out), a.in));
  EMBER_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb.d, data_type, static_cast<uint64_t>(a.in),
                                                static_cast<uint64_t>(a.rows), a.in));
  EMBER_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld.d, data_type, static_cast<uint64_t>(a.out),
                                                static_cast<uint64_t>(a.rows), a.out));

  cublasLtHandle_t h = cublaslt_handle(device);
  const internal::LtKey key{device, static_cast<int>(a.dtype), a.rows, a.in, a.out, static_cast<int>(epilogue),
                            internal::pointer_alignment({x, w, b, z, y})};
  internal::LtChoice choice;
  bool cached = false;
  {
    std::lock_guard<std::mutex> lock(internal::lt_cache_mutex());
    auto it = internal::lt_cache().find(key);
    if (it != internal::lt_cache().end()) {
      choice = it->second;
      cached = true;
    }
  }
  DeviceGuard guard(device);
  if (!cached) {
    internal::LtPreference pref;
    EMBER_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.d));
    const uint64_t max_ws = kLtWorkspaceBytes;
    EMBER_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.d, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws,
                                                            sizeof(max_ws)));
    // fp16/bf16 accumulate in fp32 all the way, as the cuBLAS handle's math mode says for op::linear:
    // no split-K partial sums rounded to the output type.
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    EMBER_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.d, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                            &schemes, sizeof(schemes)));
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(h, desc.d, la.d, lb.d, ld.d, ld.d, pref.d, 1, &result, &returned);
    if (st == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
      choice.found = true;
      choice.algo = result.algo;
      choice.workspace = result.workspaceSize;
    } else if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) {
      internal::check_cublas(st, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
    }
    std::lock_guard<std::mutex> lock(internal::lt_cache_mutex());
    // A program whose batch shapes keep changing would grow the cache without end: start over.
    if (internal::lt_cache().size() >= internal::kLtCacheMaxEntries) internal::lt_cache().clear();
    internal::lt_cache().emplace(key, choice);  // "none found" is cached too: the composite then
  }
  if (!choice.found) return false;

  void* workspace = choice.workspace > 0 ? allocate(choice.workspace) : nullptr;
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t st = cublasLtMatmul(h, desc.d, &alpha, w, la.d, x, lb.d, &beta, y, ld.d, y, ld.d, &choice.algo,
                                           workspace, choice.workspace, stream);
  if (workspace != nullptr) release(workspace, choice.workspace);  // stream-ordered: safe to reuse after the GEMM
  internal::check_cublas(st, "cublasLtMatmul", __FILE__, __LINE__);
  return true;
}

}  // namespace ember::cuda
