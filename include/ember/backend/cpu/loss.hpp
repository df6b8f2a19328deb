#pragma once
// CPU kernels of the fused cross-entropy from logits (core/backend.hpp CrossEntropyArgs):
// per row, the log-sum-exp and the picked and smoothed terms in one read of the logits, no
// probabilities stored; the backward recomputes p = exp(x - lse) from the saved lse. Threaded
// over rows; each row's arithmetic is serial (the result does not depend on the thread count).
//   loss_i = -(1 - eps) w[y_i] (x[i, y_i] - lse_i) - (eps / C) sum_c w[c] (x[i, c] - lse_i)
//   d loss_i / d x[i, c] = p_c ((1 - eps) w[y_i] + (eps / C) W) - (1 - eps) w[y_i] [c == y_i] - (eps / C) w[c]
// with W = sum_c w[c] (w = 1 without class weights); rows whose target is ignore_index give 0.
#include <cmath>
#include <cstdint>

#include "ember/backend/cpu/norm.hpp"
#include "ember/backend/cpu/reduce.hpp"
#include "ember/core/macros.hpp"

namespace ember::cpu {

// W = sum_c w[c], accumulated in double; C without class weights.
template <class T>
calc_t<T> class_weight_sum(const T* w, int64_t n) {
  using C = calc_t<T>;
  if (!w) return static_cast<C>(static_cast<double>(n));
  double s = 0;
  for (int64_t c = 0; c < n; ++c) s += static_cast<double>(static_cast<C>(w[c]));
  return static_cast<C>(s);
}

template <class T>
void cross_entropy_forward(const CrossEntropyArgs& a, const T* x, const int64_t* target, const T* w, T* loss,
                           norm_stat_t<T>* lse_out, T* wt) {
  using C = calc_t<T>;
  const int64_t n = a.classes;
  const C eps = static_cast<C>(a.label_smoothing);
  const C wsum = class_weight_sum(w, n);
  parallel_for(0, a.rows, std::max<int64_t>(1, kGrainTranscendental / std::max<int64_t>(n, 1)),
               [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const T* xr = x + i * n;
      C mx = -std::numeric_limits<C>::infinity();
      for (int64_t c = 0; c < n; ++c) {
        const C v = static_cast<C>(xr[c]);
        mx = v > mx ? v : mx;
      }
      if (mx == -std::numeric_limits<C>::infinity()) mx = C(0);
      C se = 0, sx = 0;
      if constexpr (std::is_same_v<C, float>) {
EMBER_OMP_SIMD(reduction(+ : se))
        for (int64_t c = 0; c < n; ++c) se += detail::fast_expf(static_cast<C>(xr[c]) - mx);
      } else {
        for (int64_t c = 0; c < n; ++c) se += std::exp(static_cast<C>(xr[c]) - mx);
      }
      if (eps != C(0)) {
        if (w) {
          for (int64_t c = 0; c < n; ++c) sx += static_cast<C>(w[c]) * static_cast<C>(xr[c]);
        } else {
          for (int64_t c = 0; c < n; ++c) sx += static_cast<C>(xr[c]);
        }
      }
      const C lse = mx + std::log(se);
      lse_out[i] = static_cast<norm_stat_t<T>>(lse);
      const int64_t y = target[i];
      if (y == a.ignore_index || y < 0 || y >= n) {  // out-of-range targets were rejected by the op
        loss[i] = from_calc<T>(C(0));
        wt[i] = from_calc<T>(C(0));
        continue;
      }
      const C wy = w ? static_cast<C>(w[y]) : C(1);
      C l = -(C(1) - eps) * wy * (static_cast<C>(xr[y]) - lse);
      if (eps != C(0)) l -= eps / static_cast<C>(n) * (sx - wsum * lse);
      loss[i] = from_calc<T>(l);
      wt[i] = from_calc<T>(wy);
    }
  });
}

template <class T>
void cross_entropy_backward(const CrossEntropyArgs& a, const T* x, const int64_t* target, const T* w,
                            const norm_stat_t<T>* lse_in, const T* gloss, T* gx) {
  using C = calc_t<T>;
  const int64_t n = a.classes;
  const C eps = static_cast<C>(a.label_smoothing);
  const C wsum = class_weight_sum(w, n), es = eps / static_cast<C>(n);
  parallel_for(0, a.rows, std::max<int64_t>(1, kGrainTranscendental / std::max<int64_t>(n, 1)),
               [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const T* xr = x + i * n;
      T* out = gx + i * n;
      const int64_t y = target[i];
      if (y == a.ignore_index || y < 0 || y >= n) {
        for (int64_t c = 0; c < n; ++c) out[c] = from_calc<T>(C(0));
        continue;
      }
      const C g = static_cast<C>(gloss[i]);
      const C lse = static_cast<C>(lse_in[i]);
      const C wy = w ? static_cast<C>(w[y]) : C(1);
      const C A = ((C(1) - eps) * wy + es * wsum) * g;
      if constexpr (std::is_same_v<C, float>) {
        if (w) {
          for (int64_t c = 0; c < n; ++c)
            out[c] = from_calc<T>(detail::fast_expf(static_cast<C>(xr[c]) - lse) * A - es * static_cast<C>(w[c]) * g);
        } else {
          const C b = es * g;
          for (int64_t c = 0; c < n; ++c) out[c] = from_calc<T>(detail::fast_expf(static_cast<C>(xr[c]) - lse) * A - b);
        }
      } else {
        for (int64_t c = 0; c < n; ++c)
          out[c] = from_calc<T>(std::exp(static_cast<C>(xr[c]) - lse) * A - es * (w ? static_cast<C>(w[c]) : C(1)) * g);
      }
      out[y] = from_calc<T>(static_cast<C>(out[y]) - (C(1) - eps) * wy * g);
    }
  });
}

}  // namespace ember::cpu
