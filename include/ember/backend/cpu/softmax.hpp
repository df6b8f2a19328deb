#pragma once
// CPU reference kernels for softmax and log_softmax over rows, and their backward.
//
// Threaded over rows with parallel_for: each row is computed by one thread in the serial order, so
// results do not depend on the thread count.
#include <cmath>
#include <cstring>
#include <limits>

#include "ember/backend/cpu/elementwise.hpp"
#include "ember/backend/cpu/vector_math.hpp"
#include "ember/core/macros.hpp"

namespace ember::cpu {

namespace detail {

// exp in the type a kernel computes in: the vectorisable fast_expf for float, else exp.
template <class C>
inline C vexp(C x) {
  if constexpr (std::is_same_v<C, float>) {
    return fast_expf(x);
  } else {
    return math::exp_(x);
  }
}

}  // namespace detail

// Softmax over rows, threaded over rows. fp32: the exponentials by detail::fast_expf (vectorised;
// within 2 ulp of expf, so the last bits differ from the scalar loop), sums in fp32 lanes and
// the row maximum, exp and the scaling each one vectorised loop over the row (which is in cache:
// the row is read from memory once). fp64 keeps std::exp and double sums; fp16/bf16 compute in fp32.
template <class T>
void softmax_rows(const T* x, T* y, int64_t r, int64_t cols, bool log) {
  using C = calc_t<T>;
  const T* xr = x + r * cols;
  T* yr = y + r * cols;
  C mx = -std::numeric_limits<C>::infinity();
  if constexpr (std::is_same_v<T, float>) {
    mx = detail::row_max(xr, cols);
  } else {
    for (int64_t c = 0; c < cols; ++c) {
      const C v = static_cast<C>(xr[c]);
      mx = v > mx ? v : mx;
    }
  }
  if (mx == -std::numeric_limits<C>::infinity()) mx = C(0);  // a row of -inf gives nan like PyTorch
  if constexpr (std::is_same_v<T, float>) {
    float sum = 0.0f;
    if (log) {
      sum = detail::exp_sub_sum(xr, yr, cols, mx);  // the exponentials go to yr, overwritten next
      const float lse = std::log(sum);
      for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - mx) - lse;
    } else {
      sum = detail::exp_sub_sum(xr, yr, cols, mx);
      const float inv = 1.0f / sum;
      for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
    }
    return;
  } else {
    double sum = 0;
    if (log) {
      for (int64_t c = 0; c < cols; ++c) sum += static_cast<double>(math::exp_(static_cast<C>(xr[c]) - mx));
      C lse = static_cast<C>(std::log(sum));
      for (int64_t c = 0; c < cols; ++c) yr[c] = from_calc<T>(static_cast<C>(xr[c]) - mx - lse);
    } else if constexpr (std::is_same_v<T, C>) {
      // One exp per element: keep exp(x - max) in the output, then scale it.
      for (int64_t c = 0; c < cols; ++c) {
        yr[c] = math::exp_(xr[c] - mx);
        sum += static_cast<double>(yr[c]);
      }
      C inv = static_cast<C>(1.0 / sum);
      for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
    } else {  // 16-bit outputs: keep the exponentials in fp32 until the final rounding
      for (int64_t c = 0; c < cols; ++c) sum += static_cast<double>(detail::vexp(static_cast<C>(xr[c]) - mx));
      C inv = static_cast<C>(1.0 / sum);
      for (int64_t c = 0; c < cols; ++c) yr[c] = from_calc<T>(detail::vexp(static_cast<C>(xr[c]) - mx) * inv);
    }
  }
}

template <class T>
void softmax(const T* x, T* y, int64_t rows, int64_t cols, bool log) {
  parallel_for(0, rows, std::max<int64_t>(1, kGrainTranscendental / std::max<int64_t>(cols, 1)),
               [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) softmax_rows(x, y, r, cols, log);
  });
}

template <class T>
void softmax_backward(const T* y, const T* gy, T* gx, int64_t rows, int64_t cols, bool log) {
  using C = calc_t<T>;
  parallel_for(0, rows, row_grain(cols), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* yr = y + r * cols;
      const T* gr = gy + r * cols;
      T* out = gx + r * cols;
      if constexpr (std::is_same_v<T, float>) {
        float dot = 0.0f;
        if (log) {
EMBER_OMP_SIMD(reduction(+ : dot))
          for (int64_t c = 0; c < cols; ++c) dot += gr[c];
          for (int64_t c = 0; c < cols; ++c) out[c] = gr[c] - detail::fast_expf(yr[c]) * dot;
        } else {
EMBER_OMP_SIMD(reduction(+ : dot))
          for (int64_t c = 0; c < cols; ++c) dot += gr[c] * yr[c];
          for (int64_t c = 0; c < cols; ++c) out[c] = yr[c] * (gr[c] - dot);
        }
      } else {
        double dot = 0;
        if (log) {
          for (int64_t c = 0; c < cols; ++c) dot += static_cast<double>(static_cast<C>(gr[c]));
          for (int64_t c = 0; c < cols; ++c)
            out[c] = from_calc<T>(static_cast<C>(gr[c]) - math::exp_(static_cast<C>(yr[c])) * static_cast<C>(dot));
        } else {
          for (int64_t c = 0; c < cols; ++c) dot += static_cast<double>(static_cast<C>(gr[c])) * static_cast<C>(yr[c]);
          for (int64_t c = 0; c < cols; ++c)
            out[c] = from_calc<T>(static_cast<C>(yr[c]) * (static_cast<C>(gr[c]) - static_cast<C>(dot)));
        }
      }
    }
  });
}

}  // namespace ember::cpu
