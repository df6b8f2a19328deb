#pragma once
// CPU reference kernels for fills, casts, random numbers and elementwise ops.
//
// Threading (backend/cpu/parallel.hpp): every kernel splits its output into contiguous chunks
// with parallel_for; each output element is computed by one chunk with the same arithmetic as
// the serial loop, so results never depend on the thread count. Below the grain (kGrain*) a
// kernel runs on the calling thread. The float/double fast paths are plain loops over contiguous
// memory that the compiler vectorises.
#include <cstring>
#include <type_traits>

#include "ember/backend/cpu/parallel.hpp"
#include "ember/backend/cpu/vector_math.hpp"
#include "ember/backend/elementwise_math.hpp"
#include "ember/core/random.hpp"

namespace ember::cpu {

// The arithmetic type of a kernel and the conversion back (backend/elementwise_math.hpp).
using math::calc_t;
using math::from_calc;

// Walks rows [row_lo, row_hi) of a StridedArgs view (a row: the last dimension), calling
// row(out_index, offset_a, offset_b, offset_c, inner) once per row; the row's element i is at
// out_index + i and offset_x + i * stride_x[last].
template <class F>
inline void for_each_strided_rows(const StridedArgs& s, int64_t row_lo, int64_t row_hi, F&& row) {
  const int last = s.ndim - 1;
  const int64_t inner = s.shape[last];
  int64_t idx[kMaxDims] = {};
  int64_t oa = 0, ob = 0, oc = 0;
  {  // the multi-index of row_lo
    int64_t r = row_lo;
    for (int d = last - 1; d >= 0; --d) {
      idx[d] = r % s.shape[d];
      r /= s.shape[d];
      oa += idx[d] * s.stride_a[d];
      ob += idx[d] * s.stride_b[d];
      oc += idx[d] * s.stride_c[d];
    }
  }
  for (int64_t rr = row_lo; rr < row_hi; ++rr) {
    row(rr * inner, oa, ob, oc, inner);
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

// Walks the N-d index of a StridedArgs view, calling f(out_index, offset_a, offset_b, offset_c),
// rows split over threads when the view is large (f must only write out_index).
template <class F>
inline void for_each_strided(const StridedArgs& s, F&& f, int64_t grain = kGrainElementwise) {
  const int64_t total = s.numel();
  if (total == 0) return;
  if (s.ndim == 0) {
    f(int64_t{0}, int64_t{0}, int64_t{0}, int64_t{0});
    return;
  }
  const int last = s.ndim - 1;
  const int64_t inner = s.shape[last];
  const int64_t sa = s.stride_a[last], sb = s.stride_b[last], sc = s.stride_c[last];
  const int64_t rows = total / inner;
  parallel_for(0, rows, std::max<int64_t>(1, grain / inner), [&](int64_t lo, int64_t hi) {
    for_each_strided_rows(s, lo, hi, [&](int64_t out, int64_t oa, int64_t ob, int64_t oc, int64_t n) {
      for (int64_t i = 0; i < n; ++i) f(out + i, oa + i * sa, ob + i * sb, oc + i * sc);
    });
  });
}

// Runs f(lo, hi) over [0, n) in chunks (threads) of at least `grain` elements.
template <class F>
inline void parallel_elements(int64_t n, int64_t grain, F&& f) {
  parallel_for(0, n, grain, std::forward<F>(f));
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
  parallel_elements(n, kGrainElementwise, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) dst[i] = v;
  });
}

template <class T>
void arange(T* dst, int64_t n, double start, double step) {
  for (int64_t i = 0; i < n; ++i) dst[i] = from_calc<T>(static_cast<calc_t<T>>(start + step * static_cast<double>(i)));
}

template <class S, class D>
void cast(const S* src, D* dst, int64_t n) {
  parallel_elements(n, kGrainElementwise, [&](int64_t lo, int64_t hi) {
    if constexpr (std::is_same_v<S, D>) {
      if (hi > lo) std::memcpy(dst + lo, src + lo, static_cast<size_t>(hi - lo) * sizeof(S));
    } else {
      for (int64_t i = lo; i < hi; ++i) dst[i] = from_calc<D>(static_cast<calc_t<D>>(static_cast<calc_t<S>>(src[i])));
    }
  });
}

template <class T>
void random_uniform(T* dst, int64_t n, uint64_t seed, uint64_t offset, double lo, double hi) {
  using C = calc_t<T>;
  parallel_elements(n, kGrainTranscendental, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float u = ::ember::detail::philox_uniform(seed, offset, i);
      dst[i] = from_calc<T>(static_cast<C>(lo + (hi - lo) * static_cast<double>(u)));
    }
  });
}

template <class T>
void random_normal(T* dst, int64_t n, uint64_t seed, uint64_t offset, double mean, double stddev) {
  using C = calc_t<T>;
  parallel_elements(n, kGrainTranscendental, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      dst[i] = from_calc<T>(static_cast<C>(mean + stddev * ::ember::detail::philox_normal(seed, offset, i)));
  });
}

template <class T>
void unary(UnaryOp op, const T* x, T* out, int64_t n, double a, double b) {
  using C = calc_t<T>;
  const C ca = static_cast<C>(a), cb = static_cast<C>(b);
  // fp32 tanh, tanh GELU (the transformer MLP's activation) and ReLU on vector lanes
  // (vector_math.hpp): libm's tanhf is scalar and was a third of a transformer training step, and
  // GCC leaves the select loops below scalar (-ftrapping-math).
  if constexpr (std::is_same_v<T, float>) {
    if (detail::kHaveVectorMath && (op == UnaryOp::Tanh || op == UnaryOp::GeluTanh)) {
      parallel_elements(n, kGrainTranscendental, [&](int64_t lo, int64_t hi) {
        if (op == UnaryOp::Tanh)
          detail::tanh_f32(x + lo, out + lo, hi - lo);
        else
          detail::gelu_tanh_f32(x + lo, out + lo, hi - lo);
      });
      return;
    }
    if (detail::kHaveVectorMath && op == UnaryOp::Relu) {  // the select loop below stays scalar
      parallel_elements(n, kGrainElementwise,
                        [&](int64_t lo, int64_t hi) { detail::relu_f32(x + lo, out + lo, hi - lo); });
      return;
    }
  }
  // The common ops get their own loops so that the compiler vectorises them.
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    auto run = [&](auto body) {
      parallel_elements(n, kGrainElementwise, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) out[i] = body(x[i]);
      });
    };
    switch (op) {
      case UnaryOp::Neg: run([](T v) { return -v; }); return;
      case UnaryOp::Relu:  // NaN propagates (x <= 0 is false for NaN), as torch.relu
        run([](T v) { return v <= T(0) ? T(0) : v; });
        return;
      case UnaryOp::MulScalar: run([ca](T v) { return v * ca; }); return;
      case UnaryOp::AddScalar: run([ca](T v) { return v + ca; }); return;
      case UnaryOp::Square: run([](T v) { return v * v; }); return;
      default: break;
    }
  }
  parallel_elements(n, kGrainTranscendental, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) out[i] = from_calc<T>(math::unary<C>(op, static_cast<C>(x[i]), ca, cb));
  });
}

template <class T>
void unary_backward(UnaryOp op, const T* x, const T* y, const T* gy, T* gx, int64_t n, double a, double b) {
  using C = calc_t<T>;
  const C ca = static_cast<C>(a), cb = static_cast<C>(b);
  if constexpr (std::is_same_v<T, float>) {
    if (detail::kHaveVectorMath && op == UnaryOp::Relu && x) {
      parallel_elements(n, kGrainElementwise, [&](int64_t lo, int64_t hi) {
        detail::relu_backward_f32(x + lo, gy + lo, gx + lo, hi - lo);
      });
      return;
    }
    if (detail::kHaveVectorMath && op == UnaryOp::GeluTanh && x) {
      parallel_elements(n, kGrainTranscendental, [&](int64_t lo, int64_t hi) {
        detail::gelu_tanh_backward_f32(x + lo, gy + lo, gx + lo, hi - lo);
      });
      return;
    }
    if (op == UnaryOp::Tanh && y) {  // 1 - y^2: the same formula as math::unary_derivative, in a plain loop
      parallel_elements(n, kGrainElementwise, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) gx[i] = gy[i] * (1.0f - y[i] * y[i]);
      });
      return;
    }
  }
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (op == UnaryOp::Relu && x) {  // the common backward (float64; float32 without vector extensions)
      parallel_elements(n, kGrainElementwise, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) gx[i] = gy[i] * math::unary_derivative<C>(op, x[i], C(0), ca, cb);
      });
      return;
    }
  }
  parallel_elements(n, kGrainTranscendental, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      C xv = x ? static_cast<C>(x[i]) : C(0);
      C yv = y ? static_cast<C>(y[i]) : C(0);
      gx[i] = from_calc<T>(static_cast<C>(gy[i]) * math::unary_derivative<C>(op, xv, yv, ca, cb));
    }
  });
}

template <class T, class Op>
inline void dense_binary_loop(const T* a, const T* b, T* out, int64_t n, Op op) {
  parallel_elements(n, kGrainElementwise, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) out[i] = op(a[i], b[i]);
  });
}

// One row of a broadcast binary op with the inner strides given at compile time where they are
// the common 1 / 0 patterns (x + bias, x * scale[:, None]), so that those loops vectorise.
template <class T, class Op>
inline void binary_row(const T* a, int64_t sa, const T* b, int64_t sb, T* out, int64_t n, Op op) {
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) out[i] = op(a[i], b[i]);
  } else if (sa == 1 && sb == 0) {
    const T bv = b[0];
    for (int64_t i = 0; i < n; ++i) out[i] = op(a[i], bv);
  } else if (sa == 0 && sb == 1) {
    const T av = a[0];
    for (int64_t i = 0; i < n; ++i) out[i] = op(av, b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = op(a[i * sa], b[i * sb]);
  }
}

template <class T, class Op>
inline void broadcast_binary_loop(const T* a, const T* b, T* out, const StridedArgs& s, Op op) {
  const int last = s.ndim - 1;
  const int64_t inner = s.shape[last];
  const int64_t rows = s.numel() / inner;
  const int64_t sa = s.stride_a[last], sb = s.stride_b[last];
  parallel_for(0, rows, std::max<int64_t>(1, kGrainElementwise / inner), [&](int64_t lo, int64_t hi) {
    for_each_strided_rows(s, lo, hi, [&](int64_t o, int64_t oa, int64_t ob, int64_t, int64_t n) {
      binary_row(a + oa, sa, b + ob, sb, out + o, n, op);
    });
  });
}

template <class T>
void binary(BinaryOp op, const T* a, const T* b, T* out, const StridedArgs& s) {
  using C = calc_t<T>;
  const int64_t n = s.numel();
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (n == 0) return;
    const bool dense = is_dense(s, true);
    auto go = [&](auto f) {
      if (dense)
        dense_binary_loop(a, b, out, n, f);
      else if (s.ndim > 0)
        broadcast_binary_loop(a, b, out, s, f);
      else
        out[0] = f(a[0], b[0]);
    };
    switch (op) {  // fast paths that vectorise
      case BinaryOp::Add: go([](T p, T q) { return p + q; }); return;
      case BinaryOp::Sub: go([](T p, T q) { return p - q; }); return;
      case BinaryOp::Mul: go([](T p, T q) { return p * q; }); return;
      case BinaryOp::Div: go([](T p, T q) { return p / q; }); return;
      default: break;
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
    std::atomic<bool> any{false};
    parallel_elements(n, kGrainElementwise, [&](int64_t lo, int64_t hi) {
      bool bad = false;
      for (int64_t i = lo; i < hi; ++i) {
        C v = static_cast<C>(x[i]);
        bad |= !(v - v == C(0));  // false for inf and nan
      }
      if (bad) any.store(true, std::memory_order_relaxed);
    });
    if (any.load()) *flag = 1;
  }
}

}  // namespace ember::cpu
