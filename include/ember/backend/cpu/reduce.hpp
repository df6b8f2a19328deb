#pragma once
// CPU reference kernels for reductions (the softmax family: backend/cpu/softmax.hpp).
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

}  // namespace ember::cpu
