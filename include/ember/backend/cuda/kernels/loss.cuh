#pragma once
// Fused cross-entropy from logits (core/backend.hpp CrossEntropyArgs) with the CPU's
// formulas (backend/cpu/loss.hpp): a warp per row for up to kWarpMaxCols classes, else a block
// per row (softmax.cuh's RowGroup, group_reduce and group_row_max). Forward: row max, sum of exp
// and (with label smoothing) the weighted sum of logits; backward recomputes p = exp(x - lse).
// Sums in float (double for fp64).
#if defined(__CUDACC__)
#include <type_traits>

#include "ember/backend/cuda/kernels/common.cuh"
#include "ember/backend/cuda/kernels/launch.cuh"
#include "ember/backend/cuda/kernels/norm.cuh"
#include "ember/backend/cuda/kernels/softmax.cuh"

namespace ember::cuda_impl {
namespace {

template <class T, bool kBlock>
__global__ void cross_entropy_forward_kernel(const T* __restrict__ x, const int64_t* __restrict__ target,
                                             const T* __restrict__ w, T* __restrict__ loss,
                                             norm_stat_t<T>* __restrict__ lse_out, T* __restrict__ wt, int64_t rows,
                                             int64_t n, int64_t ignore_index, double smoothing) {
  using C = calc_t<T>;
  __shared__ C smem[32];
  const RowGroup<kBlock> g;
  const C eps = static_cast<C>(smoothing);
  for (int64_t r = g.first; r < rows; r += g.step) {
    const T* xr = x + r * n;
    const C mx = group_row_max(g, xr, n, smem);
    C se = 0, sx = 0, ws = 0;
    for (int64_t c = g.lane; c < n; c += g.size) {
      const C v = to_calc<T>(xr[c]);
      const C wc = w ? to_calc<T>(w[c]) : C(1);
      se += math::exp_(v - mx);
      sx += wc * v;
      ws += wc;
    }
    se = group_reduce<kBlock>(se, SumOp{}, C(0), smem);
    if (eps != C(0)) {
      sx = group_reduce<kBlock>(sx, SumOp{}, C(0), smem);
      ws = group_reduce<kBlock>(ws, SumOp{}, C(0), smem);
    }
    if (g.lane == 0) {
      const C lse = mx + math::log_(se);
      lse_out[r] = static_cast<norm_stat_t<T>>(lse);
      const int64_t y = target[r];
      if (y == ignore_index || y < 0 || y >= n) {
        loss[r] = from_calc<T>(C(0));
        wt[r] = from_calc<T>(C(0));
      } else {
        const C wy = w ? to_calc<T>(w[y]) : C(1);
        C l = -(C(1) - eps) * wy * (to_calc<T>(xr[y]) - lse);
        if (eps != C(0)) l -= eps / static_cast<C>(n) * (sx - ws * lse);
        loss[r] = from_calc<T>(l);
        wt[r] = from_calc<T>(wy);
      }
    }
  }
}

template <class T, bool kBlock>
__global__ void cross_entropy_backward_kernel(const T* __restrict__ x, const int64_t* __restrict__ target,
                                              const T* __restrict__ w, const norm_stat_t<T>* __restrict__ lse_in,
                                              const T* __restrict__ gloss, T* __restrict__ gx, int64_t rows, int64_t n,
                                              int64_t ignore_index, double smoothing) {
  using C = calc_t<T>;
  __shared__ C smem[32];
  const RowGroup<kBlock> g;
  const C eps = static_cast<C>(smoothing), es = eps / static_cast<C>(n);
  for (int64_t r = g.first; r < rows; r += g.step) {
    const T* xr = x + r * n;
    T* out = gx + r * n;
    const int64_t y = target[r];
    if (y == ignore_index || y < 0 || y >= n) {
      for (int64_t c = g.lane; c < n; c += g.size) out[c] = from_calc<T>(C(0));
      continue;
    }
    C ws = 0;
    if (w && eps != C(0)) {
      for (int64_t c = g.lane; c < n; c += g.size) ws += to_calc<T>(w[c]);
      ws = group_reduce<kBlock>(ws, SumOp{}, C(0), smem);
    } else {
      ws = static_cast<C>(n);
    }
    const C gv = to_calc<T>(gloss[r]);
    const C lse = static_cast<C>(lse_in[r]);
    const C wy = w ? to_calc<T>(w[y]) : C(1);
    const C A = ((C(1) - eps) * wy + es * ws) * gv;
    for (int64_t c = g.lane; c < n; c += g.size) {
      C o = math::exp_(to_calc<T>(xr[c]) - lse) * A - es * (w ? to_calc<T>(w[c]) : C(1)) * gv;
      if (c == y) o -= (C(1) - eps) * wy * gv;
      out[c] = from_calc<T>(o);
    }
  }
}

// The kernel table's cross_entropy_forward and cross_entropy_backward (floating dtypes), with
// softmax's launch geometry: launch(T{}, kBlock, geometry) queues the kernel, kBlock an
// integral_constant: a block per row (true) or a warp per row.
template <class F>
inline void launch_cross_entropy(const LaunchContext& c, const CrossEntropyArgs& a, const char* op, F&& launch) {
  dispatch_floating(a.dtype, op, c.device, [&](auto tag) {
    if (a.rows <= 0 || a.classes <= 0) return;
    DeviceGuard g(c.device);
    const SoftmaxLaunch l = softmax_launch(a.rows, a.classes, c.sm_count);
    if (l.block_per_row)
      launch(tag, std::true_type{}, l);
    else
      launch(tag, std::false_type{}, l);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

inline void launch_cross_entropy_forward(const LaunchContext& c, const CrossEntropyArgs& a, const void* x,
                                         const int64_t* target, const void* w, void* loss, void* lse, void* wt) {
  launch_cross_entropy(c, a, "cross_entropy", [&](auto tag, auto block, const SoftmaxLaunch& l) {
    using T = decltype(tag);
    cross_entropy_forward_kernel<T, decltype(block)::value><<<l.grid, l.threads, 0, c.stream>>>(
        static_cast<const T*>(x), target, static_cast<const T*>(w), static_cast<T*>(loss),
        static_cast<norm_stat_t<T>*>(lse), static_cast<T*>(wt), a.rows, a.classes, a.ignore_index,
        a.label_smoothing);
  });
}
inline void launch_cross_entropy_backward(const LaunchContext& c, const CrossEntropyArgs& a, const void* x,
                                          const int64_t* target, const void* w, const void* lse, const void* gloss,
                                          void* gx) {
  launch_cross_entropy(c, a, "cross_entropy_backward", [&](auto tag, auto block, const SoftmaxLaunch& l) {
    using T = decltype(tag);
    cross_entropy_backward_kernel<T, decltype(block)::value><<<l.grid, l.threads, 0, c.stream>>>(
        static_cast<const T*>(x), target, static_cast<const T*>(w), static_cast<const norm_stat_t<T>*>(lse),
        static_cast<const T*>(gloss), static_cast<T*>(gx), a.rows, a.classes, a.ignore_index, a.label_smoothing);
  });
}

}  // namespace
}  // namespace ember::cuda_impl
#endif  // __CUDACC__
