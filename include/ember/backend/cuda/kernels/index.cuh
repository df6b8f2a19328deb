#pragma once
// index_select / gather on the middle axis of [outer, n, inner] and their accumulating backwards
// (index_add / scatter_add, with atomics: duplicate indices add up, in an unspecified order).
// Semantics of backend/cpu/index.hpp; indices are int64 and already validated by the ops.
#if defined(__CUDACC__)
#include "ember/backend/cuda/kernels/common.cuh"
#include "ember/backend/cuda/kernels/launch.cuh"

namespace ember::cuda_impl {
namespace {

// Read-modify-write of a 1- or 2-byte element through a CAS loop on its aligned 32-bit word
// (neighbouring elements in the word are written back unchanged).
template <class T, class F>
__device__ __forceinline__ void atomic_update_subword(T* addr, F f) {
  static_assert(sizeof(T) == 1 || sizeof(T) == 2, "sub-word types only");
  using B = typename BitsOf<sizeof(T)>::type;
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  unsigned int* word = reinterpret_cast<unsigned int*>(a & ~static_cast<uintptr_t>(3));
  const unsigned shift = static_cast<unsigned>(a & 3) * 8u;
  const unsigned mask = (sizeof(T) == 1 ? 0xffu : 0xffffu) << shift;
  unsigned old = *word, assumed;
  do {
    assumed = old;
    T cur;
    const B cur_bits = static_cast<B>((assumed & mask) >> shift);
    memcpy(&cur, &cur_bits, sizeof(T));
    const T next = f(cur);
    B next_bits;
    memcpy(&next_bits, &next, sizeof(T));
    old = atomicCAS(word, assumed, (assumed & ~mask) | ((static_cast<unsigned>(next_bits) << shift) & mask));
  } while (assumed != old);
}

// *addr += v, rounding like the CPU's from_calc(calc(*addr) + calc(v)).
template <class T>
__device__ __forceinline__ void atomic_add(T* addr, T v) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, int32_t>) {
    atomicAdd(addr, v);
  } else if constexpr (std::is_same_v<T, int64_t>) {
    // Two's complement: an unsigned add is the signed add (wrapping).
    atomicAdd(reinterpret_cast<unsigned long long*>(addr), static_cast<unsigned long long>(v));
  } else if constexpr (std::is_same_v<T, half>) {
#if __CUDA_ARCH__ >= 700
    atomicAdd(reinterpret_cast<__half*>(addr), __ushort_as_half(v.bits));
#else
    atomic_update_subword(addr, [v](half cur) { return from_calc<half>(to_calc<half>(cur) + to_calc<half>(v)); });
#endif
  } else if constexpr (std::is_same_v<T, bfloat16>) {
#if __CUDA_ARCH__ >= 800
    atomicAdd(reinterpret_cast<__nv_bfloat16*>(addr), __ushort_as_bfloat16(v.bits));
#else
    atomic_update_subword(addr, [v](bfloat16 cur) {
      return from_calc<bfloat16>(to_calc<bfloat16>(cur) + to_calc<bfloat16>(v));
    });
#endif
  } else {
    static_assert(std::is_same_v<T, uint8_t>, "atomic_add: unexpected element type");
    atomic_update_subword(addr, [v](uint8_t cur) { return static_cast<uint8_t>(cur + v); });
  }
}

// k = (o * mid + j) * inner + i  ->  (o, j, i), with 32-bit divisions when everything fits.
template <class I>
__device__ __forceinline__ void split3(I k, I mid, I inner, int64_t& o, int64_t& j, int64_t& i) {
  const I r = k / inner;
  i = static_cast<int64_t>(k - r * inner);
  const I q = r / mid;
  j = static_cast<int64_t>(r - q * mid);
  o = static_cast<int64_t>(q);
}

// Calls f(k, o, j, i) for k in [0, outer * mid * inner) in a grid-stride loop.
template <class F>
__device__ __forceinline__ void for_each_3d(int64_t total, int64_t mid, int64_t inner, F&& f) {
  int64_t o, j, i;
  if (total <= static_cast<int64_t>(UINT32_MAX)) {
    EMBER_GRID_STRIDE_LOOP(k, total) {
      split3<uint32_t>(static_cast<uint32_t>(k), static_cast<uint32_t>(mid), static_cast<uint32_t>(inner), o, j, i);
      f(k, o, j, i);
    }
  } else {
    EMBER_GRID_STRIDE_LOOP(k, total) {
      split3<uint64_t>(static_cast<uint64_t>(k), static_cast<uint64_t>(mid), static_cast<uint64_t>(inner), o, j, i);
      f(k, o, j, i);
    }
  }
}

// out[o, j, i] = x[o, idx[j], i]   (B: element bits; pure data movement)
template <class B>
__global__ void index_select_kernel(const B* __restrict__ x, const int64_t* __restrict__ idx, B* __restrict__ out,
                                    int64_t src_n, int64_t idx_n, int64_t inner, int64_t total) {
  for_each_3d(total, idx_n, inner, [&](int64_t k, int64_t o, int64_t j, int64_t i) {
    out[k] = x[(o * src_n + idx[j]) * inner + i];
  });
}

// gx[o, idx[j], i] += gy[o, j, i]
template <class T>
__global__ void index_add_kernel(const T* __restrict__ gy, const int64_t* __restrict__ idx, T* gx, int64_t src_n,
                                 int64_t idx_n, int64_t inner, int64_t total) {
  for_each_3d(total, idx_n, inner, [&](int64_t k, int64_t o, int64_t j, int64_t i) {
    atomic_add(gx + (o * src_n + idx[j]) * inner + i, gy[k]);
  });
}

// out[o, j, i] = x[o, idx[o, j, i], i]
template <class B>
__global__ void gather_kernel(const B* __restrict__ x, const int64_t* __restrict__ idx, B* __restrict__ out,
                              int64_t src_n, int64_t idx_n, int64_t inner, int64_t total) {
  for_each_3d(total, idx_n, inner, [&](int64_t k, int64_t o, int64_t, int64_t i) {
    out[k] = x[(o * src_n + idx[k]) * inner + i];
  });
}

// gx[o, idx[o, j, i], i] += gy[o, j, i]
template <class T>
__global__ void scatter_add_kernel(const T* __restrict__ gy, const int64_t* __restrict__ idx, T* gx, int64_t src_n,
                                   int64_t idx_n, int64_t inner, int64_t total) {
  for_each_3d(total, idx_n, inner, [&](int64_t k, int64_t o, int64_t, int64_t i) {
    atomic_add(gx + (o * src_n + idx[k]) * inner + i, gy[k]);
  });
}

// The kernel table's index_select, index_add, gather and scatter_add: the four kernels take the
// same arguments, one thread per element of the [outer, idx_n, inner] side. The selections move
// elements (by size), the accumulations add in the dtype.
enum class IndexKernel { Select, Add, Gather, ScatterAdd };

inline void launch_index(const LaunchContext& c, IndexKernel which, DType t, const void* src, const int64_t* idx,
                         void* dst, int64_t outer, int64_t src_n, int64_t idx_n, int64_t inner) {
  const int64_t total = outer * idx_n * inner;
  // kernel: the instance of one of the four kernels for the element type E.
  auto launch = [&](auto tag, auto kernel) {
    using E = decltype(tag);
    kernel<<<grid_for(total, c.sm_count), kThreads, 0, c.stream>>>(static_cast<const E*>(src), idx,
                                                                    static_cast<E*>(dst), src_n, idx_n, inner, total);
  };
  switch (which) {
    case IndexKernel::Select:
      return launch_typed<Elements::Bits>(c, t, total, "index_select",
                                          [&](auto tag) { launch(tag, index_select_kernel<decltype(tag)>); });
    case IndexKernel::Add:
      return launch_typed<Elements::All>(c, t, total, "index_add",
                                         [&](auto tag) { launch(tag, index_add_kernel<decltype(tag)>); });
    case IndexKernel::Gather:
      return launch_typed<Elements::Bits>(c, t, total, "gather",
                                          [&](auto tag) { launch(tag, gather_kernel<decltype(tag)>); });
    case IndexKernel::ScatterAdd:
      return launch_typed<Elements::All>(c, t, total, "scatter_add",
                                         [&](auto tag) { launch(tag, scatter_add_kernel<decltype(tag)>); });
  }
}

}  // namespace
}  // namespace ember::cuda_impl
#endif  // __CUDACC__
