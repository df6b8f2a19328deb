#pragma once
// CPU kernels of the fused scaled dot-product attention (core/backend.hpp AttentionArgs).
//
// Forward, blocked as FlashAttention does: the query rows of a head are taken kQueryBlock at a
// time and the keys kKeyBlock at a time; a block of scores (scale * Q_blk K_blk^T, one small
// GEMM) is made, masked, and folded into running per-row statistics (max m, sum l) and an
// accumulator acc = sum_j exp(s_j - m) v_j that is rescaled by exp(m_old - m) whenever the max
// grows (the online softmax). So at most kQueryBlock x kKeyBlock scores per thread exist at once,
// never the [L, S] matrix of a head, and causal blocks above the diagonal are skipped whole.
// The row's log-sum-exp lse = m + log(l) is saved for the backward.
//
// Backward, per head (one thread per head: no two threads touch the same gradient row, so the
// result does not depend on the thread count): delta_i = gout_i . out_i, then per block pair the
// probabilities are recomputed from lse, P = exp(S - lse), and
//   gv += P^T gout,  dP = gout V^T,  dS = P * (dP - delta),  gq += scale dS K,  gk += scale dS^T Q
// (five small GEMMs). Work is threaded over heads only: a single head runs on one thread.
//
// The small GEMMs go through gemm_typed on the calling thread (fp32: oneDNN's sgemm in builds
// with it, else OpenBLAS; 1 thread, 6 interleaved runs: attention forward + backward 7.5 against
// 9.5 ms with OpenBLAS, docs/performance.md). fp32 uses detail::fast_expf like softmax; fp64
// std::exp. The CUDA twin is backend/cuda/kernels/attention.cuh.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ember/backend/cpu/gemm.hpp"
#include "ember/backend/cpu/norm.hpp"
#include "ember/backend/cpu/softmax.hpp"

namespace ember::cpu {

namespace detail {

inline constexpr int64_t kAttnQueryBlock = 64;
inline constexpr int64_t kAttnKeyBlock = 128;

// Adds the additive mask and the causal -inf to a [rows, cols] block of scores (leading
// dimension ld) for query rows i0.. and key columns j0.. of head b.
template <class T>
void attention_mask_block(const AttentionArgs& a, const T* mask, int64_t b, int64_t i0, int64_t rows, int64_t j0,
                          int64_t cols, T* s, int64_t ld) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const T* mb = mask ? mask + (b / a.mask_group) * a.mask_batch_stride : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    T* sr = s + r * ld;
    const int64_t i = i0 + r;
    if (mb) {
      const T* mr = mb + i * a.S + j0;
      for (int64_t c = 0; c < cols; ++c) sr[c] += mr[c];
    }
    if (a.causal)
      for (int64_t c = std::max<int64_t>(0, i + 1 - j0); c < cols; ++c) sr[c] = neg_inf;
  }
}

// Columns [0, end) of a block row that the causal mask leaves open (all of them without it).
inline int64_t attention_row_end(const AttentionArgs& a, int64_t i, int64_t j0, int64_t cols) {
  return a.causal ? std::clamp<int64_t>(i + 1 - j0, 0, cols) : cols;
}

// The row loops of the kernels. fp32 takes the vector lanes of vector_math.hpp (the plain loops
// below stay scalar under GCC's -ftrapping-math); fp64 keeps the plain loops and std::exp.
template <class T>
T attention_row_max(const T* x, int64_t n) {
  if constexpr (std::is_same_v<T, float>) return row_max(x, n);
  T mx = -std::numeric_limits<T>::infinity();
EMBER_OMP_SIMD(reduction(max : mx))
  for (int64_t c = 0; c < n; ++c) mx = std::max(mx, x[c]);
  return mx;
}
// x[c] = exp(x[c] - sub); returns the sum.
template <class T>
T attention_row_exp(T* x, int64_t n, T sub) {
  if constexpr (std::is_same_v<T, float>) return exp_sub_sum(x, x, n, sub);
  T sum = 0;
EMBER_OMP_SIMD(reduction(+ : sum))
  for (int64_t c = 0; c < n; ++c) {
    const T e = vexp<T>(x[c] - sub);
    x[c] = e;
    sum += e;
  }
  return sum;
}
// ds[c] = p[c] * (ds[c] - delta)
template <class T>
void attention_row_ds(const T* p, T* ds, int64_t n, T delta) {
EMBER_OMP_SIMD()
  for (int64_t c = 0; c < n; ++c) ds[c] = p[c] * (ds[c] - delta);
}

// Keys [0, key_end) that query rows [i0, i1) may see (all of them without the causal mask).
inline int64_t attention_key_end(const AttentionArgs& a, int64_t i1) { return a.causal ? std::min(a.S, i1) : a.S; }

}  // namespace detail

template <class T>
void attention_forward(const AttentionArgs& a, const T* q, const T* k, const T* v, const T* mask, T* out,
                       norm_stat_t<T>* lse) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "attention: float32 and float64 only");
  using detail::kAttnKeyBlock;
  using detail::kAttnQueryBlock;
  const int64_t L = a.L, S = a.S, D = a.D, Dv = a.Dv;
  const int64_t qblocks = (L + kAttnQueryBlock - 1) / kAttnQueryBlock;
  const int64_t tasks = a.bh * qblocks;
  // A task is about kQueryBlock * S * (D + Dv) multiply-adds: keep small problems on one thread.
  const int64_t task_work = std::max<int64_t>(1, std::min(L, kAttnQueryBlock) * std::max<int64_t>(S, 1) * (D + Dv));
  const int64_t grain = std::max<int64_t>(1, kGrainElementwise * 4 / task_work);
  parallel_for(0, tasks, grain, [&](int64_t lo, int64_t hi) {
    std::vector<T> s(static_cast<size_t>(kAttnQueryBlock * kAttnKeyBlock));
    std::vector<T> acc(static_cast<size_t>(kAttnQueryBlock * std::max<int64_t>(Dv, 1)));
    std::vector<T> m(static_cast<size_t>(kAttnQueryBlock)), l(static_cast<size_t>(kAttnQueryBlock));
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t b = task / qblocks, i0 = (task % qblocks) * kAttnQueryBlock;
      const int64_t rows = std::min(kAttnQueryBlock, L - i0);
      const T* qb = q + (b * L + i0) * D;
      const T* kb = k + b * S * D;
      const T* vb = v + b * S * Dv;
      std::fill(acc.begin(), acc.begin() + rows * Dv, T(0));
      std::fill(m.begin(), m.end(), -std::numeric_limits<T>::infinity());
      std::fill(l.begin(), l.end(), T(0));
      const int64_t key_end = detail::attention_key_end(a, i0 + rows);
      for (int64_t j0 = 0; j0 < key_end; j0 += kAttnKeyBlock) {
        const int64_t cols = std::min(kAttnKeyBlock, key_end - j0);
        gemm_typed<T>(false, true, rows, cols, D, static_cast<T>(a.scale), qb, D, kb + j0 * D, D, T(0), s.data(),
                      kAttnKeyBlock, true);
        detail::attention_mask_block(a, mask, b, i0, rows, j0, cols, s.data(), kAttnKeyBlock);
        for (int64_t r = 0; r < rows; ++r) {
          T* sr = s.data() + r * kAttnKeyBlock;
          const int64_t cend = detail::attention_row_end(a, i0 + r, j0, cols);  // causal: the rest is -inf
          const T mx = std::max(m[static_cast<size_t>(r)], detail::attention_row_max(sr, cend));
          T* ar = acc.data() + r * Dv;
          if (mx == -std::numeric_limits<T>::infinity()) {  // every score so far -inf: nothing to add
            std::fill(sr, sr + cols, T(0));
            continue;
          }
          const T alpha = detail::vexp<T>(m[static_cast<size_t>(r)] - mx);  // 0 when the old max was -inf
          const T sum = detail::attention_row_exp(sr, cend, mx);
          std::fill(sr + cend, sr + cols, T(0));
          l[static_cast<size_t>(r)] = l[static_cast<size_t>(r)] * alpha + sum;
          m[static_cast<size_t>(r)] = mx;
          if (alpha != T(1))
            for (int64_t d = 0; d < Dv; ++d) ar[d] *= alpha;
        }
        gemm_typed<T>(false, false, rows, Dv, cols, T(1), s.data(), kAttnKeyBlock, vb + j0 * Dv, Dv, T(1), acc.data(),
                      Dv, true);
      }
      for (int64_t r = 0; r < rows; ++r) {
        const T lr = l[static_cast<size_t>(r)];
        T* orow = out + (b * L + i0 + r) * Dv;
        const T* ar = acc.data() + r * Dv;
        // l == 0 (every score -inf) gives 0/0 = NaN, as softmax does for such a row.
        const T inv = lr == T(0) ? std::numeric_limits<T>::quiet_NaN() : T(1) / lr;
        for (int64_t d = 0; d < Dv; ++d) orow[d] = ar[d] * inv;
        lse[b * L + i0 + r] =
            static_cast<norm_stat_t<T>>(m[static_cast<size_t>(r)] + std::log(lr));  // -inf + log 0 = -inf
      }
    }
  });
}

template <class T>
void attention_backward(const AttentionArgs& a, const T* q, const T* k, const T* v, const T* mask, const T* out,
                        const norm_stat_t<T>* lse, const T* gout, norm_stat_t<T>* delta, T* gq, T* gk, T* gv) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "attention: float32 and float64 only");
  using detail::kAttnKeyBlock;
  using detail::kAttnQueryBlock;
  const int64_t L = a.L, S = a.S, D = a.D, Dv = a.Dv;
  const int64_t head_work = std::max<int64_t>(1, L * std::max<int64_t>(S, 1) * (D + Dv));
  const int64_t grain = std::max<int64_t>(1, kGrainElementwise * 4 / head_work);
  parallel_for(0, a.bh, grain, [&](int64_t lo, int64_t hi) {
    std::vector<T> p(static_cast<size_t>(kAttnQueryBlock * kAttnKeyBlock));
    std::vector<T> dp(static_cast<size_t>(kAttnQueryBlock * kAttnKeyBlock));
    for (int64_t b = lo; b < hi; ++b) {
      const T* qb = q + b * L * D;
      const T* kb = k + b * S * D;
      const T* vb = v + b * S * Dv;
      const T* gob = gout + b * L * Dv;
      T* gqb = gq + b * L * D;
      T* gkb = gk + b * S * D;
      T* gvb = gv + b * S * Dv;
      std::fill(gqb, gqb + L * D, T(0));
      std::fill(gkb, gkb + S * D, T(0));
      std::fill(gvb, gvb + S * Dv, T(0));
      norm_stat_t<T>* db = delta + b * L;
      for (int64_t i = 0; i < L; ++i) {
        const T* gr = gob + i * Dv;
        const T* orow = out + (b * L + i) * Dv;
        T dot = 0;
EMBER_OMP_SIMD(reduction(+ : dot))
        for (int64_t d = 0; d < Dv; ++d) dot += gr[d] * orow[d];
        db[i] = static_cast<norm_stat_t<T>>(dot);
      }
      for (int64_t i0 = 0; i0 < L; i0 += kAttnQueryBlock) {
        const int64_t rows = std::min(kAttnQueryBlock, L - i0);
        const int64_t key_end = detail::attention_key_end(a, i0 + rows);
        for (int64_t j0 = 0; j0 < key_end; j0 += kAttnKeyBlock) {
          const int64_t cols = std::min(kAttnKeyBlock, key_end - j0);
          gemm_typed<T>(false, true, rows, cols, D, static_cast<T>(a.scale), qb + i0 * D, D, kb + j0 * D, D, T(0),
                        p.data(), kAttnKeyBlock, true);
          detail::attention_mask_block(a, mask, b, i0, rows, j0, cols, p.data(), kAttnKeyBlock);
          for (int64_t r = 0; r < rows; ++r) {
            T* pr = p.data() + r * kAttnKeyBlock;
            const T lr = static_cast<T>(lse[b * L + i0 + r]);
            const int64_t cend = detail::attention_row_end(a, i0 + r, j0, cols);
            detail::attention_row_exp(pr, cend, lr);
            std::fill(pr + cend, pr + cols, T(0));  // exp(-inf - lse) (a row with lse = -inf is NaN where open)
          }
          // gv[j] += sum_i p[i, j] gout[i]
          gemm_typed<T>(true, false, cols, Dv, rows, T(1), p.data(), kAttnKeyBlock, gob + i0 * Dv, Dv, T(1),
                        gvb + j0 * Dv, Dv, true);
          // dp = gout V^T, then ds = p * (dp - delta) in place
          gemm_typed<T>(false, true, rows, cols, Dv, T(1), gob + i0 * Dv, Dv, vb + j0 * Dv, Dv, T(0), dp.data(),
                        kAttnKeyBlock, true);
          for (int64_t r = 0; r < rows; ++r) {
            const T* pr = p.data() + r * kAttnKeyBlock;
            T* dr = dp.data() + r * kAttnKeyBlock;
            detail::attention_row_ds(pr, dr, cols, static_cast<T>(db[i0 + r]));
          }
          gemm_typed<T>(false, false, rows, D, cols, static_cast<T>(a.scale), dp.data(), kAttnKeyBlock, kb + j0 * D, D,
                        T(1), gqb + i0 * D, D, true);
          gemm_typed<T>(true, false, cols, D, rows, static_cast<T>(a.scale), dp.data(), kAttnKeyBlock, qb + i0 * D, D,
                        T(1), gkb + j0 * D, D, true);
        }
      }
    }
  });
}

}  // namespace ember::cpu
