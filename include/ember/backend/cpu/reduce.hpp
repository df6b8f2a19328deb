#pragma once
// CPU reference kernels for reductions and the softmax family.
#include <limits>
#include <vector>

#include "ember/backend/cpu/elementwise.hpp"

namespace ember::cpu {

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
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        const T* p = x + o * n * inner + i;
        int64_t best = 0;
        C bv = static_cast<C>(p[0]);
        for (int64_t j = 1; j < n && !math::isnan_(bv); ++j) {
          C v = static_cast<C>(p[j * inner]);
          if (math::isnan_(v) || (is_max ? v > bv : v < bv)) {
            bv = v;
            best = j;
          }
        }
        out[o * inner + i] = best;
      }
    return;
  }
  T* out = static_cast<T*>(out_raw);
  if (op == ReduceOp::Sum || op == ReduceOp::Mean) {
    const double scale = op == ReduceOp::Mean ? 1.0 / static_cast<double>(n) : 1.0;
    if (inner == 1) {
      for (int64_t o = 0; o < outer; ++o) {
        const T* p = x + o * n;
        // Eight independent partial sums: the adds of one pass do not wait on each other (and
        // the compiler may use vector registers), while the result stays deterministic.
        double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t j = 0;
        for (; j + 8 <= n; j += 8)
          for (int k = 0; k < 8; ++k) part[k] += static_cast<double>(static_cast<C>(p[j + k]));
        double acc = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
        for (; j < n; ++j) acc += static_cast<double>(static_cast<C>(p[j]));
        out[o] = from_calc<T>(static_cast<C>(acc * scale));
      }
    } else {
      std::vector<double> acc(static_cast<size_t>(inner));
      for (int64_t o = 0; o < outer; ++o) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < n; ++j) {
          const T* p = x + (o * n + j) * inner;
          for (int64_t i = 0; i < inner; ++i) acc[static_cast<size_t>(i)] += static_cast<double>(static_cast<C>(p[i]));
        }
        for (int64_t i = 0; i < inner; ++i) out[o * inner + i] = from_calc<T>(static_cast<C>(acc[static_cast<size_t>(i)] * scale));
      }
    }
    return;
  }
  const bool is_max = op == ReduceOp::Max;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const T* p = x + o * n * inner + i;
      C best = static_cast<C>(p[0]);
      for (int64_t j = 1; j < n; ++j) {
        C v = static_cast<C>(p[j * inner]);
        best = math::binary<C>(is_max ? BinaryOp::Maximum : BinaryOp::Minimum, best, v);
        if (math::isnan_(v)) best = v;
      }
      out[o * inner + i] = from_calc<T>(best);
    }
}

template <class T>
void softmax(const T* x, T* y, int64_t rows, int64_t cols, bool log) {
  using C = calc_t<T>;
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    C mx = -std::numeric_limits<C>::infinity();
    for (int64_t c = 0; c < cols; ++c) mx = static_cast<C>(xr[c]) > mx ? static_cast<C>(xr[c]) : mx;
    if (mx == -std::numeric_limits<C>::infinity()) mx = C(0);  // a row of -inf gives nan like PyTorch
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
      for (int64_t c = 0; c < cols; ++c) sum += static_cast<double>(math::exp_(static_cast<C>(xr[c]) - mx));
      C inv = static_cast<C>(1.0 / sum);
      for (int64_t c = 0; c < cols; ++c) yr[c] = from_calc<T>(math::exp_(static_cast<C>(xr[c]) - mx) * inv);
    }
  }
}

template <class T>
void softmax_backward(const T* y, const T* gy, T* gx, int64_t rows, int64_t cols, bool log) {
  using C = calc_t<T>;
  for (int64_t r = 0; r < rows; ++r) {
    const T* yr = y + r * cols;
    const T* gr = gy + r * cols;
    T* out = gx + r * cols;
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

}  // namespace ember::cpu
