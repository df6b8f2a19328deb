#pragma once
// CPU reference kernels for fills, casts, random numbers and elementwise ops.
#include <cstring>
#include <type_traits>

#include "ember/backend/elementwise_math.hpp"
#include "ember/core/random.hpp"

namespace ember::cpu {

// Arithmetic type of a kernel: float for the 16-bit floats, double for integers, else T.
template <class T>
using calc_t = std::conditional_t<std::is_integral_v<T>, double, compute_t<T>>;

template <class T>
inline T from_calc(calc_t<T> v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(v);
  } else {
    return T(v);
  }
}

// Walks the N-d index of a StridedArgs view, calling f(out_index, offset_a, offset_b, offset_c).
template <class F>
inline void for_each_strided(const StridedArgs& s, F&& f) {
  const int64_t total = s.numel();
  if (total == 0) return;
  if (s.ndim == 0) {
    f(int64_t{0}, int64_t{0}, int64_t{0}, int64_t{0});
    return;
  }
  int64_t idx[kMaxDims] = {};
  const int last = s.ndim - 1;
  const int64_t inner = s.shape[last];
  const int64_t sa = s.stride_a[last], sb = s.stride_b[last], sc = s.stride_c[last];
  int64_t oa = 0, ob = 0, oc = 0;
  for (int64_t out = 0; out < total; out += inner) {
    for (int64_t i = 0; i < inner; ++i) f(out + i, oa + i * sa, ob + i * sb, oc + i * sc);
    // advance the outer dimensions like an odometer
    for (int d = last - 1; d >= 0; --d) {
      if (++idx[d] < s.shape[d]) {
        oa += s.stride_a[d];
        ob += s.stride_b[d];
        oc += s.stride_c[d];
        break;
      }
      oa -= s.stride_a[d] * (s.shape[d] - 1);
      ob -= s.stride_b[d] * (s.shape[d] - 1);
      oc -= s.stride_c[d] * (s.shape[d] - 1);
      idx[d] = 0;
    }
  }
}

// True when both inputs are read contiguously in output order (no broadcasting).
inline bool is_dense(const StridedArgs& s, bool check_b) {
  int64_t acc = 1;
  for (int d = s.ndim - 1; d >= 0; --d) {
    if (s.shape[d] != 1) {
      if (s.stride_a[d] != acc) return false;
      if (check_b && s.stride_b[d] != acc) return false;
    }
    acc *= s.shape[d];
  }
  return true;
}

template <class T>
void fill(T* dst, int64_t n, double value) {
  const T v = from_calc<T>(static_cast<calc_t<T>>(value));
  for (int64_t i = 0; i < n; ++i) dst[i] = v;
}

template <class T>
void arange(T* dst, int64_t n, double start, double step) {
  for (int64_t i = 0; i < n; ++i) dst[i] = from_calc<T>(static_cast<calc_t<T>>(start + step * static_cast<double>(i)));
}

template <class S, class D>
void cast(const S* src, D* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<S, D>) {
      dst[i] = src[i];
    } else {
      dst[i] = from_calc<D>(static_cast<calc_t<D>>(static_cast<calc_t<S>>(src[i])));
    }
  }
}

template <class T>
void random_uniform(T* dst, int64_t n, uint64_t seed, uint64_t offset, double lo, double hi) {
  using C = calc_t<T>;
  for (int64_t i = 0; i < n; ++i) {
    float u = detail::philox_uniform(seed, offset, i);
    dst[i] = from_calc<T>(static_cast<C>(lo + (hi - lo) * static_cast<double>(u)));
  }
}

template <class T>
void random_normal(T* dst, int64_t n, uint64_t seed, uint64_t offset, double mean, double stddev) {
  using C = calc_t<T>;
  for (int64_t i = 0; i < n; ++i)
    dst[i] = from_calc<T>(static_cast<C>(mean + stddev * detail::philox_normal(seed, offset, i)));
}

template <class T>
void unary(UnaryOp op, const T* x, T* out, int64_t n, double a, double b) {
  using C = calc_t<T>;
  const C ca = static_cast<C>(a), cb = static_cast<C>(b);
  // The common ops get their own loops so that the compiler vectorises them.
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    switch (op) {
      case UnaryOp::Neg: for (int64_t i = 0; i < n; ++i) out[i] = -x[i]; return;
      case UnaryOp::Relu:  // NaN propagates (x <= 0 is false for NaN), as torch.relu
        for (int64_t i = 0; i < n; ++i) out[i] = x[i] <= T(0) ? T(0) : x[i];
        return;
      case UnaryOp::MulScalar: for (int64_t i = 0; i < n; ++i) out[i] = x[i] * ca; return;
      case UnaryOp::AddScalar: for (int64_t i = 0; i < n; ++i) out[i] = x[i] + ca; return;
      case UnaryOp::Square: for (int64_t i = 0; i < n; ++i) out[i] = x[i] * x[i]; return;
      default: break;
    }
  }
  for (int64_t i = 0; i < n; ++i) out[i] = from_calc<T>(math::unary<C>(op, static_cast<C>(x[i]), ca, cb));
}

template <class T>
void unary_backward(UnaryOp op, const T* x, const T* y, const T* gy, T* gx, int64_t n, double a, double b) {
  using C = calc_t<T>;
  const C ca = static_cast<C>(a), cb = static_cast<C>(b);
  for (int64_t i = 0; i < n; ++i) {
    C xv = x ? static_cast<C>(x[i]) : C(0);
    C yv = y ? static_cast<C>(y[i]) : C(0);
    gx[i] = from_calc<T>(static_cast<C>(gy[i]) * math::unary_derivative<C>(op, xv, yv, ca, cb));
  }
}

template <class T, class Op>
inline void dense_binary_loop(const T* a, const T* b, T* out, int64_t n, Op op) {
  for (int64_t i = 0; i < n; ++i) out[i] = op(a[i], b[i]);
}

template <class T>
void binary(BinaryOp op, const T* a, const T* b, T* out, const StridedArgs& s) {
  using C = calc_t<T>;
  const int64_t n = s.numel();
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (is_dense(s, true)) {  // fast paths that vectorise
      switch (op) {
        case BinaryOp::Add: dense_binary_loop(a, b, out, n, [](T p, T q) { return p + q; }); return;
        case BinaryOp::Sub: dense_binary_loop(a, b, out, n, [](T p, T q) { return p - q; }); return;
        case BinaryOp::Mul: dense_binary_loop(a, b, out, n, [](T p, T q) { return p * q; }); return;
        case BinaryOp::Div: dense_binary_loop(a, b, out, n, [](T p, T q) { return p / q; }); return;
        default: break;
      }
    }
  }
  for_each_strided(s, [&](int64_t o, int64_t ia, int64_t ib, int64_t) {
    out[o] = from_calc<T>(math::binary<C>(op, static_cast<C>(a[ia]), static_cast<C>(b[ib])));
  });
}

template <class T>
void compare(CompareOp op, const T* a, const T* b, uint8_t* out, const StridedArgs& s) {
  using C = calc_t<T>;
  for_each_strided(s, [&](int64_t o, int64_t ia, int64_t ib, int64_t) {
    out[o] = math::compare<C>(op, static_cast<C>(a[ia]), static_cast<C>(b[ib])) ? 1 : 0;
  });
}

template <class T>
void where(const uint8_t* cond, const T* a, const T* b, T* out, const StridedArgs& s) {
  for_each_strided(s, [&](int64_t o, int64_t ia, int64_t ib, int64_t ic) { out[o] = cond[ic] ? a[ia] : b[ib]; });
}

template <class T>
void strided_copy(const T* src, T* out, const StridedArgs& s) {
  for_each_strided(s, [&](int64_t o, int64_t ia, int64_t, int64_t) { out[o] = src[ia]; });
}

template <class T>
void nonfinite_check(const T* x, int64_t n, uint8_t* flag) {
  if constexpr (std::is_integral_v<T>) {
    return;
  } else {
    using C = compute_t<T>;
    bool bad = false;
    for (int64_t i = 0; i < n; ++i) {
      C v = static_cast<C>(x[i]);
      bad |= !(v - v == C(0));  // false for inf and nan
    }
    if (bad) *flag = 1;
  }
}

}  // namespace ember::cpu
