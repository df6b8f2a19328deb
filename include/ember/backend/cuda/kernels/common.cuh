#pragma once
// Device-side helpers shared by ember's CUDA kernels: element conversions that reproduce the CPU
// backend bit for bit, launch geometry, and the N-d strided indexer of the broadcasting kernels.
#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "ember/backend/cuda/runtime.hpp"
#include "ember/backend/elementwise_math.hpp"
#include "ember/core/backend.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/random.hpp"

namespace ember::cuda_impl {
namespace {

// 16 bytes of T, loaded and stored as one ld/st.global.v4 (the dense elementwise kernels).
template <class T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / static_cast<int>(sizeof(T));
  T v[kSize];
};

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Arithmetic type of a kernel, the CPU's (backend/elementwise_math.hpp): float for the 16-bit
// floats, double for the integers, T itself for float and double.
using ::ember::math::calc_t;

// double -> integer as the CPU reference does it on x86-64 (g++ emits cvttsd2si): truncation, and
// the "integer indefinite" value (INT_MIN) for NaN and out-of-range values; uint8 goes through
// int32 and keeps the low byte. C++ leaves those cases undefined and CUDA saturates instead; doing
// it the x86 way keeps the two backends equal even there.
__device__ __forceinline__ int32_t d2i32(double v) {
  return (v > -2147483649.0 && v < 2147483648.0) ? static_cast<int32_t>(v) : INT32_MIN;
}
__device__ __forceinline__ int64_t d2i64(double v) {
  return (v >= -9223372036854775808.0 && v < 9223372036854775808.0) ? static_cast<int64_t>(v) : INT64_MIN;
}

// T -> calc_t<T>: exact for every type (hardware conversions for the 16-bit floats).
template <class T>
__device__ __forceinline__ calc_t<T> to_calc(T v) {
  if constexpr (std::is_same_v<T, half>) {
    return __half2float(__ushort_as_half(v.bits));
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return __uint_as_float(static_cast<uint32_t>(v.bits) << 16);
  } else {
    return static_cast<calc_t<T>>(v);
  }
}

// calc_t<T> -> T, rounding like the CPU's from_calc: round-to-nearest-even for the 16-bit floats
// (only the payload of a NaN may differ), the x86 conversions above for the integers.
template <class T>
__device__ __forceinline__ T from_calc(calc_t<T> v) {
  if constexpr (std::is_same_v<T, half>) {
    return half::from_bits(__half_as_ushort(__float2half_rn(v)));
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return bfloat16::from_bits(__bfloat16_as_ushort(__float2bfloat16_rn(v)));
  } else if constexpr (std::is_same_v<T, int32_t>) {
    return d2i32(v);
  } else if constexpr (std::is_same_v<T, int64_t>) {
    return d2i64(v);
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    return static_cast<uint8_t>(d2i32(v));
  } else {
    return static_cast<T>(v);
  }
}

// A double converted the way the CPU stores a double result into T: first to calc_t<T>, then to T.
template <class T>
__device__ __forceinline__ T from_double(double v) {
  return from_calc<T>(static_cast<calc_t<T>>(v));
}

// Unsigned integer of the same size, for kernels that only move elements.
template <size_t N> struct BitsOf;
template <> struct BitsOf<1> { using type = uint8_t; };
template <> struct BitsOf<2> { using type = uint16_t; };
template <> struct BitsOf<4> { using type = uint32_t; };
template <> struct BitsOf<8> { using type = uint64_t; };

// ---------------------------------------------------------------- launch geometry
constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items: enough to fill the device a few times over, no more.
inline unsigned grid_for(int64_t n, int sm_count, int threads = kThreads) {
  const int64_t want = (n + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(sm_count > 0 ? sm_count : 1) * 32;
  return static_cast<unsigned>(want < cap ? (want > 0 ? want : 1) : cap);
}

#define EMBER_GRID_STRIDE_LOOP(i, n)                                                          \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);     \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// ---------------------------------------------------------------- N-d strided indexing
// A StridedArgs with unit dimensions dropped and mergeable neighbours merged, for up to three
// operands (0: a / src, 1: b, 2: the condition of `where`). A dense operation ends up with one
// dimension of stride 1, where the indexer does no division at all.
struct Strided {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride[3][kMaxDims] = {};
};

inline Strided coalesce(const StridedArgs& s, int nops) {
  Strided r;
  const int64_t* src_strides[3] = {s.stride_a, s.stride_b, s.stride_c};
  for (int d = 0; d < s.ndim; ++d) {
    if (s.shape[d] == 1) continue;
    r.shape[r.ndim] = s.shape[d];
    for (int k = 0; k < nops; ++k) r.stride[k][r.ndim] = src_strides[k][d];
    ++r.ndim;
  }
  if (r.ndim == 0) return r;  // a single element
  // Merge dimension d into d+1 when every operand walks them as one: stride[d] == stride[d+1] * shape[d+1].
  // m is filled from the back; w is the dimension being merged into.
  Strided m;
  int w = kMaxDims - 1;
  m.shape[w] = r.shape[r.ndim - 1];
  for (int k = 0; k < nops; ++k) m.stride[k][w] = r.stride[k][r.ndim - 1];
  for (int d = r.ndim - 2; d >= 0; --d) {
    bool merge = true;
    for (int k = 0; k < nops; ++k)
      if (r.stride[k][d] != m.stride[k][w] * m.shape[w]) merge = false;
    if (merge) {
      m.shape[w] *= r.shape[d];
    } else {
      --w;
      m.shape[w] = r.shape[d];
      for (int k = 0; k < nops; ++k) m.stride[k][w] = r.stride[k][d];
    }
  }
  // Shift to the front.
  Strided f;
  f.ndim = kMaxDims - w;
  for (int d = 0; d < f.ndim; ++d) {
    f.shape[d] = m.shape[w + d];
    for (int k = 0; k < nops; ++k) f.stride[k][d] = m.stride[k][w + d];
  }
  return f;
}

// Element offsets of the operands for output element `linear` (row-major over s.shape). I is the
// index type of the divisions: 32-bit when the whole range fits (much faster on the GPU).
template <int NOPS, class I>
__device__ __forceinline__ void strided_offsets(const Strided& s, I linear, int64_t (&off)[NOPS]) {
#pragma unroll
  for (int k = 0; k < NOPS; ++k) off[k] = 0;
  for (int d = s.ndim - 1; d > 0; --d) {
    const I size = static_cast<I>(s.shape[d]);
    const I q = linear / size;
    const int64_t c = static_cast<int64_t>(linear - q * size);
#pragma unroll
    for (int k = 0; k < NOPS; ++k) off[k] += c * s.stride[k][d];
    linear = q;
  }
  if (s.ndim > 0) {
#pragma unroll
    for (int k = 0; k < NOPS; ++k) off[k] += static_cast<int64_t>(linear) * s.stride[k][0];
  }
}

// Calls f(output index, offsets) for every output element of a grid-stride loop.
template <int NOPS, class F>
__device__ __forceinline__ void for_each_strided(const Strided& s, int64_t n, F&& f) {
  int64_t off[NOPS];
  if (n <= static_cast<int64_t>(UINT32_MAX)) {
    EMBER_GRID_STRIDE_LOOP(i, n) {
      strided_offsets<NOPS, uint32_t>(s, static_cast<uint32_t>(i), off);
      f(i, off);
    }
  } else {
    EMBER_GRID_STRIDE_LOOP(i, n) {
      strided_offsets<NOPS, uint64_t>(s, static_cast<uint64_t>(i), off);
      f(i, off);
    }
  }
}

}  // namespace
}  // namespace ember::cuda_impl
#endif  // __CUDACC__
