#pragma once
// CPU reference kernels for reductions and the softmax family.
//
// Threaded over independent outputs (rows, columns) with parallel_for: each output is computed
// by one thread in the serial order, so results do not depend on the thread count. A reduction
// to a single value over many elements is split into fixed blocks of kReduceBlock elements whose
// partial sums are added in order (the split depends on the size only, never on the threads).
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "ember/backend/cpu/elementwise.hpp"
#include "ember/backend/cpu/vector_math.hpp"
#include "ember/core/macros.hpp"

namespace ember::cpu {

inline constexpr int64_t kReduceBlock = 1 << 16;

namespace detail {

template <class C>
inline C vexp(C x) {
  if constexpr (std::is_same_v<C, float>) {
    return fast_expf(x);
  } else {
    return math::exp_(x);
  }
}

// f(p, k) for each output k = o * inner + i of a reduction of x [outer, n, inner] over n, p
// pointing at x[o, 0, i] (its n elements lie inner apart); threaded over the outputs.
template <class T, class F>
void for_each_output(const T* x, int64_t outer, int64_t n, int64_t inner, F&& f) {
  parallel_for(0, outer * inner, std::max<int64_t>(1, kGrainElementwise / std::max<int64_t>(n, 1)),
               [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) f(x + (k / inner) * n * inner + k % inner, k);
  });
}

}  // namespace detail

// Accumulation type: double for every floating type on the CPU (the reference backend favours
// accuracy), double for integers too.
template <class T>
using acc_t = double;

template <class T>
void reduce(ReduceOp op, const T* x, void* out_raw, int64_t outer, int64_t n, int64_t inner) {
  using C = calc_t<T>;
  if (op == ReduceOp::ArgMax || op == ReduceOp::ArgMin) {
    int64_t* out = static_cast<int64_t*>(out_raw);
    const bool is_max = op == ReduceOp::ArgMax;
    detail::for_each_output(x, outer, n, inner, [&](const T* p, int64_t k) {
      int64_t best = 0;
      C bv = static_cast<C>(p[0]);
      for (int64_t j = 1; j < n && !math::isnan_(bv); ++j) {
        C v = static_cast<C>(p[j * inner]);
        if (math::isnan_(v) || (is_max ? v > bv : v < bv)) {
          bv = v;
          best = j;
        }
      }
      out[k] = best;
    });
    return;
  }
  T* out = static_cast<T*>(out_raw);
  if (op == ReduceOp::Sum || op == ReduceOp::Mean) {
    const double scale = op == ReduceOp::Mean ? 1.0 / static_cast<double>(n) : 1.0;
    // Eight independent partial sums: the adds of one pass do not wait on each other (and the
    // compiler may use vector registers), while the result stays deterministic.
    auto sum_run = [](const T* p, int64_t len) {
      double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t j = 0;
      for (; j + 8 <= len; j += 8)
        for (int k = 0; k < 8; ++k) part[k] += static_cast<double>(static_cast<C>(p[j + k]));
      double acc = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
      for (; j < len; ++j) acc += static_cast<double>(static_cast<C>(p[j]));
      return acc;
    };
    if (inner == 1 && outer == 1 && n > kReduceBlock) {
      // One long sum: fixed blocks (threads take whole blocks), partials added in order.
      const int64_t blocks = (n + kReduceBlock - 1) / kReduceBlock;
      std::vector<double> part(static_cast<size_t>(blocks));
      parallel_for(0, blocks, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t b = lo; b < hi; ++b)
          part[static_cast<size_t>(b)] = sum_run(x + b * kReduceBlock, std::min(kReduceBlock, n - b * kReduceBlock));
      });
      double acc = 0;
      for (double v : part) acc += v;
      out[0] = from_calc<T>(static_cast<C>(acc * scale));
    } else if (inner == 1) {
      parallel_for(0, outer, std::max<int64_t>(1, kGrainElementwise / std::max<int64_t>(n, 1)),
                   [&](int64_t lo, int64_t hi) {
        for (int64_t o = lo; o < hi; ++o) out[o] = from_calc<T>(static_cast<C>(sum_run(x + o * n, n) * scale));
      });
    } else {
      // Columns of [outer, n, inner]: threads take (o, column block) pairs; each column is summed
      // over j in order.
      constexpr int64_t kCols = 256;
      const int64_t col_blocks = (inner + kCols - 1) / kCols;
      parallel_for(0, outer * col_blocks, std::max<int64_t>(1, kGrainElementwise / std::max<int64_t>(n * kCols, 1)),
                   [&](int64_t lo, int64_t hi) {
        double acc[kCols];
        for (int64_t ob = lo; ob < hi; ++ob) {
          const int64_t o = ob / col_blocks, c0 = (ob % col_blocks) * kCols;
          const int64_t w = std::min(kCols, inner - c0);
          std::fill(acc, acc + w, 0.0);
          for (int64_t j = 0; j < n; ++j) {
            const T* p = x + (o * n + j) * inner + c0;
            for (int64_t i = 0; i < w; ++i) acc[i] += static_cast<double>(static_cast<C>(p[i]));
          }
          for (int64_t i = 0; i < w; ++i) out[o * inner + c0 + i] = from_calc<T>(static_cast<C>(acc[i] * scale));
        }
      });
    }
    return;
  }
  const bool is_max = op == ReduceOp::Max;
  detail::for_each_output(x, outer, n, inner, [&](const T* p, int64_t k) {
    C best = static_cast<C>(p[0]);
    for (int64_t j = 1; j < n; ++j) {
      C v = static_cast<C>(p[j * inner]);
      best = math::binary<C>(is_max ? BinaryOp::Maximum : BinaryOp::Minimum, best, v);
      if (math::isnan_(v)) best = v;
    }
    out[k] = from_calc<T>(best);
  });
}

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
