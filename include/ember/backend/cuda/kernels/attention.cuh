#pragma once
// Fused scaled dot-product attention on CUDA (core/backend.hpp AttentionArgs), with the
// formulas of the CPU twin backend/cpu/attention.hpp (its parity test: tests/test_attention.cpp).
//
// A flash-style kernel on the CUDA cores (no tensor cores): one warp per row, the online softmax,
// no [L, S] score matrix anywhere, no atomics, so every result is deterministic. A lane holds
// kE = ceil(max(D, Dv) / 32) elements of a row (elements lane, lane + 32, ...; kE in 1, 2, 4, 8,
// so D and Dv up to kAttnMaxHeadDim = 256; the op sends larger heads elsewhere) and accumulates
// in float (double for fp64).
//
// Forward, warp per query row i: keys in chunks of 32; the score of each key is a warp
// all-reduce of the lanes' partial dot products (bitwise the same in every lane), lane t keeps
// the score of key j0 + t, adds the mask; the chunk max updates the running max m, the running
// sum l (a share per lane) and the accumulators are rescaled by alpha = exp(m_old - m), then
// acc += p_t v[j0 + t] with p_t = exp(s_t - m) broadcast from lane t. As on the CPU, a chunk is
// skipped while every score so far is -inf (so no -inf - -inf), and a row with no finite score
// ends with l = 0: out = NaN (as softmax) and lse = m + log l = -inf. Causal rows stop at key i.
//
// Backward, two kernels on the same stream (no atomics: each writes only its own rows):
//   A, warp per query row i: delta_i = gout_i . out_i (written, the workspace of B), then over
//      the keys p = exp(s - lse_i), dp = gout_i . v_j, ds = p (dp - delta_i), gq_i = scale sum ds k_j;
//   B, warp per key row j: over the queries (causal: i >= j) the same s, p, dp, ds, then
//      gv_j = sum p gout_i and gk_j = scale sum ds q_i.
// The three kernels compute the scores the same way (same products, same reduction order).
// A 2-D grid (rows of a head x heads, grid-stride loops over both: any bh) with no 64-bit division.
#if defined(__CUDACC__)
#include <algorithm>
#include <type_traits>

#include "ember/backend/cuda/kernels/common.cuh"
#include "ember/backend/cuda/kernels/launch.cuh"
#include "ember/backend/cuda/kernels/norm.cuh"     // norm_stat_t
#include "ember/backend/cuda/kernels/softmax.cuh"  // SumOp, MaxOp, group_reduce

namespace ember::cuda_impl {
namespace {

constexpr int kAttnWarps = 4;  // rows per block
constexpr int kAttnThreads = kAttnWarps * 32;
constexpr int64_t kAttnMaxHeadDim = 256;  // 32 lanes x 8 elements
constexpr unsigned kFullMask = 0xffffffffu;

// Blocks per SM the register allocation must allow (__launch_bounds__): 4 (<= 128 registers a
// thread), 2 for the largest heads. ptxas's own choice spilled a few registers in most variants.
constexpr int attn_min_blocks(int elems_per_lane) { return elems_per_lane >= 8 ? 2 : 4; }

template <class A>
__device__ __forceinline__ A attn_warp_sum(A v) {
  return group_reduce<false>(v, SumOp{}, A(0), static_cast<A*>(nullptr));
}

// Two sums at once (independent shuffles, for instruction-level parallelism).
template <class A>
__device__ __forceinline__ void attn_warp_sum2(A& x, A& y) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const A xo = __shfl_xor_sync(kFullMask, x, o), yo = __shfl_xor_sync(kFullMask, y, o);
    x += xo;
    y += yo;
  }
}

// The lane's elements of a row of n (row[lane + 32 e], 0 past the end).
template <int E, class T>
__device__ __forceinline__ void attn_load(const T* __restrict__ row, int64_t n, int lane, calc_t<T> (&r)[E]) {
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int64_t d = lane + 32 * e;
    r[e] = d < n ? to_calc<T>(row[d]) : calc_t<T>(0);
  }
}

// The lane's share of x . row (x holds the lane's elements of the other row).
template <int E, class T>
__device__ __forceinline__ calc_t<T> attn_lane_dot(const T* __restrict__ row, int64_t n, int lane,
                                                   const calc_t<T> (&x)[E]) {
  calc_t<T> s = 0;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int64_t d = lane + 32 * e;
    if (d < n) s += x[e] * to_calc<T>(row[d]);
  }
  return s;
}

// acc += c * row (the lane's elements).
template <int E, class T>
__device__ __forceinline__ void attn_axpy(calc_t<T> c, const T* __restrict__ row, int64_t n, int lane,
                                          calc_t<T> (&acc)[E]) {
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int64_t d = lane + 32 * e;
    if (d < n) acc[e] += c * to_calc<T>(row[d]);
  }
}

template <int E, class T>
__device__ __forceinline__ void attn_store(T* __restrict__ row, int64_t n, int lane, const calc_t<T> (&x)[E],
                                           calc_t<T> c) {
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int64_t d = lane + 32 * e;
    if (d < n) row[d] = from_calc<T>(x[e] * c);
  }
}

// The work of a warp: heads b = blockIdx.y, + gridDim.y, ... and in each head the rows
// blockIdx.x * kAttnWarps + warp, + gridDim.x * kAttnWarps, ... (of L queries or S keys). A 2-D
// grid, so that no 64-bit division is needed (a slow subroutine call on the GPU): b / mask_group
// is tracked as the heads advance. grid.y <= 65535 with the loop covering any bh.
struct AttnHeads {
  int64_t b, mq, mr;  // head, b / mask_group, b % mask_group
  int64_t g, sq, sr;  // mask_group, and gridDim.y / g, gridDim.y % g
  __device__ explicit AttnHeads(int64_t mask_group) : g(mask_group) {
    b = blockIdx.y;
    const int64_t step = gridDim.y;
    if (g > step) {  // b = blockIdx.y < gridDim.y < g: quotient 0, no division
      mq = 0;
      mr = b;
      sq = 0;
      sr = step;
    } else {  // g <= gridDim.y <= 65535: a 32-bit division, once
      const uint32_t g32 = static_cast<uint32_t>(g);
      mq = blockIdx.y / g32;
      mr = blockIdx.y % g32;
      sq = gridDim.y / g32;
      sr = gridDim.y % g32;
    }
  }
  __device__ void next() {
    b += gridDim.y;
    mq += sq;
    mr += sr;
    if (mr >= g) {
      mr -= g;
      ++mq;
    }
  }
};
__device__ __forceinline__ int64_t attn_first_row() {
  return static_cast<int64_t>(blockIdx.x) * kAttnWarps + static_cast<int64_t>(threadIdx.x / 32);
}
__device__ __forceinline__ int64_t attn_row_step() { return static_cast<int64_t>(gridDim.x) * kAttnWarps; }

template <class T, int E>
__global__ void __launch_bounds__(kAttnThreads, attn_min_blocks(E))
    attention_forward_kernel(const AttentionArgs a, const T* __restrict__ q, const T* __restrict__ k,
                             const T* __restrict__ v, const T* __restrict__ mask, T* __restrict__ out,
                             norm_stat_t<T>* __restrict__ lse) {
  using C = calc_t<T>;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const C scale = static_cast<C>(a.scale);
  const C neg_inf = C(-INFINITY);
  // The row is the same in all lanes of a warp, and so are the loop bounds below (the shuffles need it).
  for (AttnHeads h(a.mask_group); h.b < a.bh; h.next()) {
    for (int64_t i = attn_first_row(); i < a.L; i += attn_row_step()) {
      const int64_t b = h.b, r = b * a.L + i;
      const T* kb = k + b * a.S * a.D;
      const T* vb = v + b * a.S * a.Dv;
      const T* mr = mask ? mask + h.mq * a.mask_batch_stride + i * a.S : nullptr;
      const int64_t key_end = a.causal ? (i + 1 < a.S ? i + 1 : a.S) : a.S;
      C qr[E], acc[E];
      attn_load<E>(q + r * a.D, a.D, lane, qr);
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] = C(0);
      C m = neg_inf;  // running max (the same in every lane)
      C l = 0;        // this lane's share of the running sum
      for (int64_t j0 = 0; j0 < key_end; j0 += 32) {
        const int nk = static_cast<int>(key_end - j0 < 32 ? key_end - j0 : 32);
        C s = neg_inf;  // the score of key j0 + lane
#pragma unroll 4
        for (int t = 0; t < nk; ++t) {
          const C dot = attn_warp_sum(attn_lane_dot<E>(kb + (j0 + t) * a.D, a.D, lane, qr));
          if (lane == t) s = dot;
        }
        if (lane < nk) {
          s = scale * s;
          if (mr) s += to_calc<T>(mr[j0 + lane]);
        }
        // Max over the chunk, NaN ignored (as the CPU's s > mx comparisons).
        const C cm = group_reduce<false>(s == s ? s : neg_inf, MaxOp{}, neg_inf, static_cast<C*>(nullptr));
        const C mn = cm > m ? cm : m;
        if (mn == neg_inf) continue;  // every score so far -inf: nothing to add
        const C alpha = math::exp_(m - mn);  // 0 when the old max was -inf
        const C p = math::exp_(s - mn);      // 0 for lanes past nk (s = -inf)
        l = l * alpha + p;
        m = mn;
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] *= alpha;
#pragma unroll 4
        for (int t = 0; t < nk; ++t) {
          const C pt = __shfl_sync(kFullMask, p, t);
          attn_axpy<E>(pt, vb + (j0 + t) * a.Dv, a.Dv, lane, acc);
        }
      }
      l = attn_warp_sum(l);
      // l == 0 (every score -inf) gives NaN, as softmax does for such a row.
      const C inv = l == C(0) ? C(NAN) : C(1) / l;
      attn_store<E>(out + r * a.Dv, a.Dv, lane, acc, inv);
      if (lane == 0) lse[r] = static_cast<norm_stat_t<T>>(m + math::log_(l));  // -inf + log 0 = -inf
    }
  }
}

// Backward A: warp per query row; writes delta[r] and gq[r].
template <class T, int E>
__global__ void __launch_bounds__(kAttnThreads, attn_min_blocks(E))
    attention_backward_q_kernel(const AttentionArgs a, const T* __restrict__ q, const T* __restrict__ k,
                                const T* __restrict__ v, const T* __restrict__ mask, const T* __restrict__ out,
                                const norm_stat_t<T>* __restrict__ lse, const T* __restrict__ gout,
                                norm_stat_t<T>* __restrict__ delta, T* __restrict__ gq) {
  using C = calc_t<T>;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const C scale = static_cast<C>(a.scale);
  for (AttnHeads h(a.mask_group); h.b < a.bh; h.next()) {
    for (int64_t i = attn_first_row(); i < a.L; i += attn_row_step()) {
      const int64_t b = h.b, r = b * a.L + i;
      const T* kb = k + b * a.S * a.D;
      const T* vb = v + b * a.S * a.Dv;
      const T* mr = mask ? mask + h.mq * a.mask_batch_stride + i * a.S : nullptr;
      const int64_t key_end = a.causal ? (i + 1 < a.S ? i + 1 : a.S) : a.S;
      C gr[E], qr[E], acc[E];
      attn_load<E>(gout + r * a.Dv, a.Dv, lane, gr);
      // delta in the statistics type and read back from it, as the CPU does.
      const norm_stat_t<T> dstat =
          static_cast<norm_stat_t<T>>(attn_warp_sum(attn_lane_dot<E>(out + r * a.Dv, a.Dv, lane, gr)));
      if (lane == 0) delta[r] = dstat;
      const C dl = static_cast<C>(dstat);
      const C lr = static_cast<C>(lse[r]);
      attn_load<E>(q + r * a.D, a.D, lane, qr);
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] = C(0);
      for (int64_t j0 = 0; j0 < key_end; j0 += 32) {
        const int nk = static_cast<int>(key_end - j0 < 32 ? key_end - j0 : 32);
        C s = 0, dp = 0;  // of key j0 + lane
#pragma unroll 4
        for (int t = 0; t < nk; ++t) {
          C ps = attn_lane_dot<E>(kb + (j0 + t) * a.D, a.D, lane, qr);
          C pd = attn_lane_dot<E>(vb + (j0 + t) * a.Dv, a.Dv, lane, gr);
          attn_warp_sum2(ps, pd);
          if (lane == t) {
            s = ps;
            dp = pd;
          }
        }
        C ds = 0;
        if (lane < nk) {
          C sc = scale * s;
          if (mr) sc += to_calc<T>(mr[j0 + lane]);
          ds = math::exp_(sc - lr) * (dp - dl);
        }
#pragma unroll 4
        for (int t = 0; t < nk; ++t) {
          const C dt = __shfl_sync(kFullMask, ds, t);
          attn_axpy<E>(dt, kb + (j0 + t) * a.D, a.D, lane, acc);
        }
      }
      attn_store<E>(gq + r * a.D, a.D, lane, acc, scale);
    }
  }
}

// Backward B: warp per key row; reads delta from A and writes gk[r] and gv[r].
template <class T, int E>
__global__ void __launch_bounds__(kAttnThreads, attn_min_blocks(E))
    attention_backward_kv_kernel(const AttentionArgs a, const T* __restrict__ q, const T* __restrict__ k,
                                 const T* __restrict__ v, const T* __restrict__ mask,
                                 const norm_stat_t<T>* __restrict__ lse, const T* __restrict__ gout,
                                 const norm_stat_t<T>* __restrict__ delta, T* __restrict__ gk, T* __restrict__ gv) {
  using C = calc_t<T>;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const C scale = static_cast<C>(a.scale);
  for (AttnHeads h(a.mask_group); h.b < a.bh; h.next()) {
    for (int64_t j = attn_first_row(); j < a.S; j += attn_row_step()) {
      const int64_t b = h.b, r = b * a.S + j;
      const T* qb = q + b * a.L * a.D;
      const T* gb = gout + b * a.L * a.Dv;
      const norm_stat_t<T>* lb = lse + b * a.L;
      const norm_stat_t<T>* db = delta + b * a.L;
      // mask(b, i, j) at mc[i * S]
      const T* mc = mask ? mask + h.mq * a.mask_batch_stride + j : nullptr;
      C kr[E], vr[E], ak[E], av[E];
      attn_load<E>(k + r * a.D, a.D, lane, kr);
      attn_load<E>(v + r * a.Dv, a.Dv, lane, vr);
#pragma unroll
      for (int e = 0; e < E; ++e) {
        ak[e] = C(0);
        av[e] = C(0);
      }
      for (int64_t i0 = a.causal ? j : 0; i0 < a.L; i0 += 32) {
        const int nq = static_cast<int>(a.L - i0 < 32 ? a.L - i0 : 32);
        C s = 0, dp = 0;  // of query i0 + lane
#pragma unroll 4
        for (int t = 0; t < nq; ++t) {
          C ps = attn_lane_dot<E>(qb + (i0 + t) * a.D, a.D, lane, kr);
          C pd = attn_lane_dot<E>(gb + (i0 + t) * a.Dv, a.Dv, lane, vr);
          attn_warp_sum2(ps, pd);
          if (lane == t) {
            s = ps;
            dp = pd;
          }
        }
        C p = 0, ds = 0;
        if (lane < nq) {
          const int64_t i = i0 + lane;
          C sc = scale * s;
          if (mc) sc += to_calc<T>(mc[i * a.S]);
          p = math::exp_(sc - static_cast<C>(lb[i]));
          ds = p * (dp - static_cast<C>(db[i]));
        }
#pragma unroll 4
        for (int t = 0; t < nq; ++t) {
          const C pt = __shfl_sync(kFullMask, p, t);
          const C dt = __shfl_sync(kFullMask, ds, t);
          attn_axpy<E>(pt, gb + (i0 + t) * a.Dv, a.Dv, lane, av);
          attn_axpy<E>(dt, qb + (i0 + t) * a.D, a.D, lane, ak);
        }
      }
      attn_store<E>(gk + r * a.D, a.D, lane, ak, scale);
      attn_store<E>(gv + r * a.Dv, a.Dv, lane, av, C(1));
    }
  }
}

// Calls f(T{}, std::integral_constant<int, E>{}) for the dtype and head size of `a`: float32 or
// float64 (else DTypeError), max(D, Dv) <= kAttnMaxHeadDim (else ValueError).
template <class F>
void attention_dispatch(const AttentionArgs& a, int device, F&& f) {
  auto by_dim = [&](auto tag) {
    const int64_t dmax = std::max(a.D, a.Dv);
    if (dmax > kAttnMaxHeadDim)
      throw ValueError(::ember::detail::str_cat("scaled_dot_product_attention: head dimension D = ", a.D,
                                                ", Dv = ", a.Dv, " on cuda:", device,
                                                " exceeds the CUDA kernel's limit of ", kAttnMaxHeadDim));
    if (dmax <= 32) f(tag, std::integral_constant<int, 1>{});
    else if (dmax <= 64) f(tag, std::integral_constant<int, 2>{});
    else if (dmax <= 128) f(tag, std::integral_constant<int, 4>{});
    else f(tag, std::integral_constant<int, 8>{});
  };
  switch (a.dtype) {
    case DType::Float32: by_dim(float{}); return;
    case DType::Float64: by_dim(double{}); return;
    default:
      throw DTypeError(::ember::detail::str_cat("scaled_dot_product_attention: unsupported dtype ",
                                                dtype_name(a.dtype), " on cuda:", device,
                                                " (float32 and float64 are supported)"));
  }
}

// Grid of the kernels for bh heads of n rows (a warp per row): x over the rows of a head, y over
// the heads (at most 65535, the kernels loop over the rest), about 32 blocks per SM in all.
inline dim3 attention_grid(int64_t bh, int64_t n, int sm_count) {
  const int64_t cap = static_cast<int64_t>(sm_count > 0 ? sm_count : 1) * 32;
  const int64_t bx = std::min<int64_t>((n + kAttnWarps - 1) / kAttnWarps, cap);
  const int64_t by = std::min<int64_t>({bh, int64_t{65535}, std::max<int64_t>(1, cap / bx)});
  return dim3(static_cast<unsigned>(bx), static_cast<unsigned>(by));
}

inline void launch_attention_forward(const LaunchContext& c, const AttentionArgs& args, const void* q,
                                     const void* k, const void* v, const void* mask, void* out, void* lse) {
  DeviceGuard g(c.device);
  attention_dispatch(args, c.device, [&](auto tag, auto e) {
    using T = decltype(tag);
    constexpr int E = decltype(e)::value;
    if (args.bh <= 0 || args.L <= 0) return;
    AttentionArgs a = args;
    if (a.mask_group < 1) a.mask_group = 1;
    attention_forward_kernel<T, E><<<attention_grid(a.bh, a.L, c.sm_count), kAttnThreads, 0, c.stream>>>(
        a, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
        static_cast<const T*>(mask), static_cast<T*>(out), static_cast<norm_stat_t<T>*>(lse));
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

inline void launch_attention_backward(const LaunchContext& c, const AttentionArgs& args, const void* q,
                                      const void* k, const void* v, const void* mask, const void* out,
                                      const void* lse, const void* gout, void* delta, void* gq, void* gk, void* gv) {
  DeviceGuard g(c.device);
  attention_dispatch(args, c.device, [&](auto tag, auto e) {
    using T = decltype(tag);
    using S = norm_stat_t<T>;
    constexpr int E = decltype(e)::value;
    if (args.bh <= 0) return;
    AttentionArgs a = args;
    if (a.mask_group < 1) a.mask_group = 1;
    const T* qt = static_cast<const T*>(q);
    const T* kt = static_cast<const T*>(k);
    const T* vt = static_cast<const T*>(v);
    const T* mt = static_cast<const T*>(mask);
    const S* lt = static_cast<const S*>(lse);
    const T* gt = static_cast<const T*>(gout);
    S* dt = static_cast<S*>(delta);
    if (a.L > 0) {  // gq (0 when S == 0) and delta
      attention_backward_q_kernel<T, E><<<attention_grid(a.bh, a.L, c.sm_count), kAttnThreads, 0, c.stream>>>(
          a, qt, kt, vt, mt, static_cast<const T*>(out), lt, gt, dt, static_cast<T*>(gq));
      EMBER_CUDA_CHECK_LAUNCH();
    }
    if (a.S > 0) {  // gk and gv (0 when L == 0); after A on the same stream: delta is ready
      attention_backward_kv_kernel<T, E><<<attention_grid(a.bh, a.S, c.sm_count), kAttnThreads, 0, c.stream>>>(
          a, qt, kt, vt, mt, lt, gt, dt, static_cast<T*>(gk), static_cast<T*>(gv));
      EMBER_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace
}  // namespace ember::cuda_impl
#endif  // __CUDACC__
