#pragma once
// CPU batch normalisation with batch statistics (training mode), fp32 and fp64, layout [n, c, s]
// (s = the product of the spatial dimensions; BatchNorm1d's [N, C] is s = 1). Replaces the
// composition of mean / subtract / square / mean / rsqrt / multiply / add (about ten passes over
// memory, each its own tensor) by two passes forward and two backward:
//   forward:  per channel, mean and biased variance in double (two passes over the channel);
//             y = (x - mean) * invstd * weight + bias
//   backward: per channel, sum(gy) and sum(gy * xhat) in double;
//             gx = weight * invstd * (gy - sum(gy) / m - xhat * sum(gy * xhat) / m),
//             gweight = sum(gy * xhat), gbias = sum(gy)   (m = n * s, xhat = (x - mean) * invstd)
// Threads: the per-channel reductions are split over channels and the elementwise passes over
// (n, c) planes (parallel_for), so every value is computed by one thread in a fixed order: the
// results are the same bits at any thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ember/backend/cpu/parallel.hpp"

namespace ember::cpu {

// Channels per chunk of a per-channel reduction over m elements. (No cpu::detail namespace here:
// one would hide ember::detail from the unqualified `detail::` lookups of the other CPU headers.)
inline int64_t batch_norm_channel_grain(int64_t m) {
  return std::max<int64_t>(1, kGrainElementwise / std::max<int64_t>(m, 1));
}

// weight and bias may be null (no affine). mean, var (biased) and invstd are [c].
template <class T>
void batch_norm_forward(const T* x, const T* weight, const T* bias, int64_t n, int64_t c, int64_t s, double eps, T* y,
                        T* mean, T* var, T* invstd) {
  const int64_t m = n * s;
  parallel_for(0, c, batch_norm_channel_grain(m), [&](int64_t lo, int64_t hi) {
    for (int64_t ch = lo; ch < hi; ++ch) {
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        const T* p = x + (i * c + ch) * s;
        for (int64_t k = 0; k < s; ++k) sum += static_cast<double>(p[k]);
      }
      const double mu = m > 0 ? sum / static_cast<double>(m) : 0.0;
      double sq = 0;
      for (int64_t i = 0; i < n; ++i) {
        const T* p = x + (i * c + ch) * s;
        for (int64_t k = 0; k < s; ++k) {
          const double d = static_cast<double>(p[k]) - mu;
          sq += d * d;
        }
      }
      const double v = m > 0 ? sq / static_cast<double>(m) : 0.0;
      mean[ch] = static_cast<T>(mu);
      var[ch] = static_cast<T>(v);
      invstd[ch] = static_cast<T>(1.0 / std::sqrt(v + eps));
    }
  });
  parallel_for(0, n * c, row_grain(s), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t ch = r % c;
      const T scale = invstd[ch] * (weight ? weight[ch] : T(1));
      const T shift = (bias ? bias[ch] : T(0)) - mean[ch] * scale;
      const T* p = x + r * s;
      T* q = y + r * s;
      for (int64_t k = 0; k < s; ++k) q[k] = p[k] * scale + shift;
    }
  });
}

// gx, gweight and gbias may each be null (not wanted); weight may be null (no affine: 1).
// gx, gweight and gbias are overwritten.
template <class T>
void batch_norm_backward(const T* x, const T* gy, const T* weight, const T* mean, const T* invstd, int64_t n,
                         int64_t c, int64_t s, T* gx, T* gweight, T* gbias) {
  const int64_t m = n * s;
  std::vector<double> sum_gy(static_cast<size_t>(c)), sum_gy_xhat(static_cast<size_t>(c));
  parallel_for(0, c, batch_norm_channel_grain(m), [&](int64_t lo, int64_t hi) {
    for (int64_t ch = lo; ch < hi; ++ch) {
      const double mu = static_cast<double>(mean[ch]);
      double a = 0, b = 0;
      for (int64_t i = 0; i < n; ++i) {
        const T* p = x + (i * c + ch) * s;
        const T* g = gy + (i * c + ch) * s;
        for (int64_t k = 0; k < s; ++k) {
          const double gk = static_cast<double>(g[k]);
          a += gk;
          b += gk * (static_cast<double>(p[k]) - mu);
        }
      }
      sum_gy[static_cast<size_t>(ch)] = a;
      sum_gy_xhat[static_cast<size_t>(ch)] = b * static_cast<double>(invstd[ch]);
      if (gweight) gweight[ch] = static_cast<T>(sum_gy_xhat[static_cast<size_t>(ch)]);
      if (gbias) gbias[ch] = static_cast<T>(a);
    }
  });
  if (!gx) return;
  const double inv_m = m > 0 ? 1.0 / static_cast<double>(m) : 0.0;
  parallel_for(0, n * c, row_grain(s), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t ch = r % c;
      const auto sc = static_cast<size_t>(ch);
      // gx = k * (gy - xhat * b) - k * a, with xhat = (x - mean) * invstd, folded per channel
      // into gx = k * gy - (x - mean) * (k * invstd * b) - k * a.
      const T is = invstd[ch];
      const T k = is * (weight ? weight[ch] : T(1));
      const T mean_gy = static_cast<T>(sum_gy[sc] * inv_m);
      const T xs = static_cast<T>(static_cast<double>(k) * static_cast<double>(is) * sum_gy_xhat[sc] * inv_m);
      const T mu = mean[ch];
      const T* p = x + r * s;
      const T* g = gy + r * s;
      T* q = gx + r * s;
      for (int64_t j = 0; j < s; ++j) q[j] = k * (g[j] - mean_gy) - (p[j] - mu) * xs;
    }
  });
}

}  // namespace ember::cpu
