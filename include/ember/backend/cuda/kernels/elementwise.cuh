#pragma once
// Fills, conversions, random numbers and elementwise kernels. Each computes what the CPU reference
// (backend/cpu/elementwise.hpp) computes: the same scalar code (elementwise_math.hpp) in the same
// arithmetic type, with explicit round-to-nearest double operations (__dadd_rn / __dmul_rn) where
// bit-equality matters (random numbers, fills, conversions). Elsewhere nvcc may contract a multiply
// and an add of the shared formulas into one FMA (its default), so results such as GELU or its
// derivative can differ from the CPU in the last bits; the parity tests allow for that.
//
// The launch_* functions at the end are the kernel table's fill, arange, cast, random_uniform,
// random_normal, unary, unary_backward, binary, compare, where, strided_copy and nonfinite_check.
#if defined(__CUDACC__)
#include <cstring>
#include <type_traits>

#include "ember/backend/cuda/device_copy.hpp"
#include "ember/backend/cuda/kernels/common.cuh"
#include "ember/backend/cuda/kernels/launch.cuh"

namespace ember::cuda_impl {
namespace {

// B: an unsigned integer of the element's size; v: the element's bits, converted on the host.
template <class B>
__global__ void fill_kernel(B* __restrict__ dst, int64_t n, B v) {
  EMBER_GRID_STRIDE_LOOP(i, n) dst[i] = v;
}

template <class T>
__global__ void arange_kernel(T* __restrict__ dst, int64_t n, double start, double step) {
  EMBER_GRID_STRIDE_LOOP(i, n) dst[i] = from_double<T>(__dadd_rn(start, __dmul_rn(step, static_cast<double>(i))));
}

template <class S, class D>
__global__ void cast_kernel(const S* __restrict__ src, D* __restrict__ dst, int64_t n) {
  EMBER_GRID_STRIDE_LOOP(i, n) dst[i] = from_calc<D>(static_cast<calc_t<D>>(to_calc<S>(src[i])));
}

// One thread per Philox block of four numbers (element i uses block offset + i/4, lane i%4; see
// core/random.hpp, whose per-element formulas these reproduce).
template <class T>
__global__ void random_uniform_kernel(T* __restrict__ dst, int64_t n, uint64_t seed, uint64_t offset, double lo,
                                      double range) {
  const int64_t blocks = (n + 3) / 4;
  EMBER_GRID_STRIDE_LOOP(b, blocks) {
    const ::ember::detail::Philox4x32 r = ::ember::detail::philox4x32_10(seed, offset + static_cast<uint64_t>(b));
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      const int64_t i = 4 * b + lane;
      if (i < n) {
        const float u = static_cast<float>(r.v[lane] >> 8) * 5.9604644775390625e-8f;
        dst[i] = from_double<T>(__dadd_rn(lo, __dmul_rn(range, static_cast<double>(u))));
      }
    }
  }
}

template <class T>
__global__ void random_normal_kernel(T* __restrict__ dst, int64_t n, uint64_t seed, uint64_t offset, double mean,
                                     double stddev) {
  const int64_t blocks = (n + 3) / 4;
  EMBER_GRID_STRIDE_LOOP(b, blocks) {
    const ::ember::detail::Philox4x32 r = ::ember::detail::philox4x32_10(seed, offset + static_cast<uint64_t>(b));
#pragma unroll
    for (int pair = 0; pair < 4; pair += 2) {
      const int64_t i = 4 * b + pair;
      if (i < n) {
        // Box-Muller over lanes (pair, pair + 1), as detail::philox_normal.
        const double u1 = (static_cast<double>(r.v[pair] >> 8) + 1.0) * 5.9604644775390625e-8;
        const double u2 = static_cast<double>(r.v[pair + 1] >> 8) * 5.9604644775390625e-8;
        const double rad = sqrt(-2.0 * log(u1));
        const double theta = 6.283185307179586 * u2;
        dst[i] = from_double<T>(__dadd_rn(mean, __dmul_rn(stddev, __dmul_rn(rad, cos(theta)))));
        if (i + 1 < n) dst[i + 1] = from_double<T>(__dadd_rn(mean, __dmul_rn(stddev, __dmul_rn(rad, sin(theta)))));
      }
    }
  }
}

// Integer pow goes through double pow and truncates, as on the CPU, where glibc's pow is exact
// whenever the result is representable (3^4 is 81, not 80.99999999999999). CUDA's pow promises
// 2 ulp; a result within 1e-12 of an integer is taken as that integer so that truncation agrees.
__device__ __forceinline__ double snap_to_integer(double r) {
  const double k = rint(r);
  return fabs(r - k) <= 1e-12 * fabs(k) ? k : r;
}

// out may alias x.
template <class T>
__global__ void unary_kernel(UnaryOp op, const T* x, T* out, int64_t n, calc_t<T> a, calc_t<T> b) {
  using C = calc_t<T>;
  EMBER_GRID_STRIDE_LOOP(i, n) {
    C r = math::unary<C>(op, to_calc<T>(x[i]), a, b);
    if constexpr (std::is_integral_v<T>) {
      if (op == UnaryOp::Pow) r = snap_to_integer(r);
    }
    out[i] = from_calc<T>(r);
  }
}

// ---------------------------------------------------------------- dense, 16-byte packs
// The dense elementwise kernels move 16 bytes per load and store (ld.global.v4): with one element
// per thread, the grid-stride kernels above reached about 2.8 TB/s on the H200 where PyTorch's
// vectorised kernels reached 3.6-3.9 (bench_core add / relu). The arithmetic per
// element is unchanged, so the results are the same bits. Used when every dense operand is 16-byte
// aligned; the tail of fewer than one pack is done element by element.
// Pack<T> and aligned16: kernels/common.cuh.

template <class T>
__device__ __forceinline__ calc_t<T> unary_one(UnaryOp op, T x, calc_t<T> a, calc_t<T> b) {
  calc_t<T> r = math::unary<calc_t<T>>(op, to_calc<T>(x), a, b);
  if constexpr (std::is_integral_v<T>) {
    if (op == UnaryOp::Pow) r = snap_to_integer(r);
  }
  return r;
}

// out may alias x (each pack is read before it is written, by the same thread).
template <class T>
__global__ void unary_dense_kernel(UnaryOp op, const T* x, T* out, int64_t n, calc_t<T> a, calc_t<T> b) {
  constexpr int K = Pack<T>::kSize;
  const int64_t packs = n / K;
  const Pack<T>* xp = reinterpret_cast<const Pack<T>*>(x);
  Pack<T>* outp = reinterpret_cast<Pack<T>*>(out);
  EMBER_GRID_STRIDE_LOOP(p, packs) {
    const Pack<T> v = xp[p];
    Pack<T> r;
#pragma unroll
    for (int k = 0; k < K; ++k) r.v[k] = from_calc<T>(unary_one<T>(op, v.v[k], a, b));
    outp[p] = r;
  }
  EMBER_GRID_STRIDE_LOOP(t, n - packs * K) {
    const int64_t i = packs * K + t;
    out[i] = from_calc<T>(unary_one<T>(op, x[i], a, b));
  }
}

template <class T>
__device__ __forceinline__ calc_t<T> binary_one(BinaryOp op, calc_t<T> a, calc_t<T> b) {
  calc_t<T> r = math::binary<calc_t<T>>(op, a, b);
  if constexpr (std::is_integral_v<T>) {
    if (op == BinaryOp::Pow) r = snap_to_integer(r);
  }
  return r;
}

// a and b dense (stride 1) or one element broadcast (a_scalar / b_scalar: stride 0).
template <class T>
__global__ void binary_dense_kernel(BinaryOp op, const T* a, const T* b, T* out, int64_t n, bool a_scalar,
                                    bool b_scalar) {
  using C = calc_t<T>;
  constexpr int K = Pack<T>::kSize;
  const int64_t packs = n / K;
  const C as = a_scalar ? to_calc<T>(a[0]) : C(0), bs = b_scalar ? to_calc<T>(b[0]) : C(0);
  EMBER_GRID_STRIDE_LOOP(p, packs) {
    Pack<T> va, vb, r;
    if (!a_scalar) va = reinterpret_cast<const Pack<T>*>(a)[p];
    if (!b_scalar) vb = reinterpret_cast<const Pack<T>*>(b)[p];
#pragma unroll
    for (int k = 0; k < K; ++k)
      r.v[k] = from_calc<T>(binary_one<T>(op, a_scalar ? as : to_calc<T>(va.v[k]), b_scalar ? bs : to_calc<T>(vb.v[k])));
    reinterpret_cast<Pack<T>*>(out)[p] = r;
  }
  EMBER_GRID_STRIDE_LOOP(t, n - packs * K) {
    const int64_t i = packs * K + t;
    out[i] = from_calc<T>(binary_one<T>(op, a_scalar ? as : to_calc<T>(a[i]), b_scalar ? bs : to_calc<T>(b[i])));
  }
}

// x or y may be null for ops whose derivative does not read them (they read as 0, as on the CPU).
template <class T>
__global__ void unary_backward_kernel(UnaryOp op, const T* x, const T* y, const T* gy, T* gx, int64_t n, calc_t<T> a,
                                      calc_t<T> b) {
  using C = calc_t<T>;
  EMBER_GRID_STRIDE_LOOP(i, n) {
    const C xv = x ? to_calc<T>(x[i]) : C(0);
    const C yv = y ? to_calc<T>(y[i]) : C(0);
    gx[i] = from_calc<T>(to_calc<T>(gy[i]) * math::unary_derivative<C>(op, xv, yv, a, b));
  }
}

template <class T>
__global__ void binary_kernel(BinaryOp op, const T* a, const T* b, T* out, Strided s, int64_t n) {
  using C = calc_t<T>;
  for_each_strided<2>(s, n, [&](int64_t o, const int64_t (&off)[2]) {
    C r = math::binary<C>(op, to_calc<T>(a[off[0]]), to_calc<T>(b[off[1]]));
    if constexpr (std::is_integral_v<T>) {
      if (op == BinaryOp::Pow) r = snap_to_integer(r);
    }
    out[o] = from_calc<T>(r);
  });
}

template <class T>
__global__ void compare_kernel(CompareOp op, const T* a, const T* b, uint8_t* out, Strided s, int64_t n) {
  using C = calc_t<T>;
  for_each_strided<2>(s, n, [&](int64_t o, const int64_t (&off)[2]) {
    out[o] = math::compare<C>(op, to_calc<T>(a[off[0]]), to_calc<T>(b[off[1]])) ? 1 : 0;
  });
}

template <class B>
__global__ void where_kernel(const uint8_t* cond, const B* a, const B* b, B* out, Strided s, int64_t n) {
  for_each_strided<3>(s, n, [&](int64_t o, const int64_t (&off)[3]) { out[o] = cond[off[2]] ? a[off[0]] : b[off[1]]; });
}

template <class B>
__global__ void strided_copy_kernel(const B* src, B* out, Strided s, int64_t n) {
  for_each_strided<1>(s, n, [&](int64_t o, const int64_t (&off)[1]) { out[o] = src[off[0]]; });
}

// Sets *flag = 1 when an element is inf or nan (never clears it). Floating types only.
template <class T>
__global__ void nonfinite_kernel(const T* __restrict__ x, int64_t n, uint8_t* flag) {
  using C = calc_t<T>;
  bool bad = false;
  EMBER_GRID_STRIDE_LOOP(i, n) {
    const C v = to_calc<T>(x[i]);
    bad |= !(v - v == C(0));  // false for inf and nan
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

// ---------------------------------------------------------------- launches
// fill: the value converted on the host exactly as the CPU converts it, then stored as bits (a
// memset when they are all zero).
inline void launch_fill(const LaunchContext& c, DType t, void* dst, int64_t n, double value) {
  if (n <= 0) return;
  DeviceGuard g(c.device);
  dispatch_all(t, [&](auto tag) {
    using T = decltype(tag);
    using B = typename BitsOf<sizeof(T)>::type;
    const T v = ::ember::math::from_calc<T>(static_cast<calc_t<T>>(value));  // converted exactly as the CPU does
    B bits;
    std::memcpy(&bits, &v, sizeof(T));
    if (bits == 0) {
      EMBER_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<size_t>(n) * sizeof(T), c.stream));
    } else {
      fill_kernel<B><<<grid_for(n, c.sm_count), kThreads, 0, c.stream>>>(static_cast<B*>(dst), n, bits);
      EMBER_CUDA_CHECK_LAUNCH();
    }
  });
}

inline void launch_arange(const LaunchContext& c, DType t, void* dst, int64_t n, double start, double step) {
  launch_typed<Elements::All>(c, t, n, "arange", [&](auto tag) {
    using T = decltype(tag);
    arange_kernel<T><<<grid_for(n, c.sm_count), kThreads, 0, c.stream>>>(static_cast<T*>(dst), n, start, step);
  });
}

// The same dtype on both sides is a copy.
inline void launch_cast(const LaunchContext& c, DType st, const void* src, DType dt, void* dst, int64_t n) {
  if (n <= 0) return;
  if (st == dt) {
    ::ember::cuda::copy_device(c, dst, src, static_cast<size_t>(n) * dtype_size(st));
    return;
  }
  launch_typed<Elements::All>(c, st, n, "cast", [&](auto s) {
    dispatch_all(dt, [&](auto d) {
      using S = decltype(s);
      using D = decltype(d);
      if constexpr (!std::is_same_v<S, D>)
        cast_kernel<S, D><<<grid_for(n, c.sm_count), kThreads, 0, c.stream>>>(static_cast<const S*>(src),
                                                                              static_cast<D*>(dst), n);
    });
  });
}

// One thread per Philox block of four elements.
inline void launch_random_uniform(const LaunchContext& c, DType t, void* dst, int64_t n, uint64_t seed,
                                  uint64_t offset, double lo, double hi) {
  launch_typed<Elements::All>(c, t, n, "random_uniform", [&](auto tag) {
    using T = decltype(tag);
    random_uniform_kernel<T><<<grid_for((n + 3) / 4, c.sm_count), kThreads, 0, c.stream>>>(
        static_cast<T*>(dst), n, seed, offset, lo, hi - lo);
  });
}
inline void launch_random_normal(const LaunchContext& c, DType t, void* dst, int64_t n, uint64_t seed,
                                 uint64_t offset, double mean, double stddev) {
  launch_typed<Elements::All>(c, t, n, "random_normal", [&](auto tag) {
    using T = decltype(tag);
    random_normal_kernel<T><<<grid_for((n + 3) / 4, c.sm_count), kThreads, 0, c.stream>>>(
        static_cast<T*>(dst), n, seed, offset, mean, stddev);
  });
}

// The packed kernel when both pointers are 16-byte aligned.
inline void launch_unary(const LaunchContext& c, UnaryOp op, DType t, const void* x, void* out, int64_t n, double a,
                         double b) {
  launch_typed<Elements::All>(c, t, n, "unary", [&](auto tag) {
    using T = decltype(tag);
    using C = calc_t<T>;
    if (aligned16(x) && aligned16(out))
      unary_dense_kernel<T><<<grid_for(n / Pack<T>::kSize + 1, c.sm_count), kThreads, 0, c.stream>>>(
          op, static_cast<const T*>(x), static_cast<T*>(out), n, static_cast<C>(a), static_cast<C>(b));
    else
      unary_kernel<T><<<grid_for(n, c.sm_count), kThreads, 0, c.stream>>>(
          op, static_cast<const T*>(x), static_cast<T*>(out), n, static_cast<C>(a), static_cast<C>(b));
  });
}
inline void launch_unary_backward(const LaunchContext& c, UnaryOp op, DType t, const void* x, const void* y,
                                  const void* gy, void* gx, int64_t n, double a, double b) {
  launch_typed<Elements::All>(c, t, n, "unary_backward", [&](auto tag) {
    using T = decltype(tag);
    using C = calc_t<T>;
    unary_backward_kernel<T><<<grid_for(n, c.sm_count), kThreads, 0, c.stream>>>(
        op, static_cast<const T*>(x), static_cast<const T*>(y), static_cast<const T*>(gy), static_cast<T*>(gx), n,
        static_cast<C>(a), static_cast<C>(b));
  });
}

// The broadcasting kernels index through the coalesced view of `args` (common.cuh).
inline void launch_binary(const LaunchContext& c, BinaryOp op, DType t, const void* a, const void* b, void* out,
                          const StridedArgs& args) {
  const int64_t n = args.numel();
  launch_typed<Elements::All>(c, t, n, "binary", [&](auto tag) {
    using T = decltype(tag);
    const Strided s = coalesce(args, 2);
    // One dense dimension, each input dense or a broadcast element, aligned: the packed kernel.
    const bool one_dim = s.ndim == 1 && (s.stride[0][0] == 0 || s.stride[0][0] == 1) &&
                         (s.stride[1][0] == 0 || s.stride[1][0] == 1);
    const bool a_scalar = one_dim && s.stride[0][0] == 0, b_scalar = one_dim && s.stride[1][0] == 0;
    if (one_dim && (a_scalar || aligned16(a)) && (b_scalar || aligned16(b)) && aligned16(out))
      binary_dense_kernel<T><<<grid_for(n / Pack<T>::kSize + 1, c.sm_count), kThreads, 0, c.stream>>>(
          op, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n, a_scalar, b_scalar);
    else
      binary_kernel<T><<<grid_for(n, c.sm_count), kThreads, 0, c.stream>>>(
          op, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), s, n);
  });
}
inline void launch_compare(const LaunchContext& c, CompareOp op, DType t, const void* a, const void* b, uint8_t* out,
                           const StridedArgs& args) {
  const int64_t n = args.numel();
  launch_typed<Elements::All>(c, t, n, "compare", [&](auto tag) {
    using T = decltype(tag);
    compare_kernel<T><<<grid_for(n, c.sm_count), kThreads, 0, c.stream>>>(
        op, static_cast<const T*>(a), static_cast<const T*>(b), out, coalesce(args, 2), n);
  });
}
inline void launch_where(const LaunchContext& c, DType t, const uint8_t* cond, const void* a, const void* b,
                         void* out, const StridedArgs& args) {
  const int64_t n = args.numel();
  launch_typed<Elements::Bits>(c, t, n, "where", [&](auto tag) {
    using B = decltype(tag);
    where_kernel<B><<<grid_for(n, c.sm_count), kThreads, 0, c.stream>>>(
        cond, static_cast<const B*>(a), static_cast<const B*>(b), static_cast<B*>(out), coalesce(args, 3), n);
  });
}
// What is already contiguous is a copy.
inline void launch_strided_copy(const LaunchContext& c, DType t, const void* src, void* out,
                                const StridedArgs& args) {
  const int64_t n = args.numel();
  if (n <= 0) return;
  const Strided s = coalesce(args, 1);
  if (s.ndim <= 1 && (s.ndim == 0 || s.stride[0][0] == 1)) {  // already contiguous
    ::ember::cuda::copy_device(c, out, src, static_cast<size_t>(n) * dtype_size(t));
    return;
  }
  launch_typed<Elements::Bits>(c, t, n, "strided_copy", [&](auto tag) {
    using B = decltype(tag);
    strided_copy_kernel<B><<<grid_for(n, c.sm_count), kThreads, 0, c.stream>>>(static_cast<const B*>(src),
                                                                               static_cast<B*>(out), s, n);
  });
}

// Integers are always finite (as on the CPU): nothing to check.
inline void launch_nonfinite_check(const LaunchContext& c, DType t, const void* x, int64_t n, uint8_t* flag) {
  if (!is_floating(t)) return;
  launch_typed<Elements::Floating>(c, t, n, "nonfinite_check", [&](auto tag) {
    using T = decltype(tag);
    nonfinite_kernel<T><<<grid_for(n, c.sm_count), kThreads, 0, c.stream>>>(static_cast<const T*>(x), n, flag);
  });
}

}  // namespace
}  // namespace ember::cuda_impl
#endif  // __CUDACC__
