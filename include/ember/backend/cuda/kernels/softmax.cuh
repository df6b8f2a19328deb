#pragma once
// Row softmax / log_softmax over the last axis of [rows, cols] and their backward, with the CPU's
// semantics (backend/cpu/reduce.hpp): the row maximum ignores NaN and is taken as 0 for a row of
// -inf (which then gives NaN, like PyTorch). Rows of up to kWarpMaxCols columns get one warp each,
// longer rows one block each. Sums accumulate in float (double for fp64). Floating types only.
#if defined(__CUDACC__)
#include "ember/backend/cuda/kernels/common.cuh"

namespace ember::cuda_impl {
namespace {

constexpr int64_t kWarpMaxCols = 1024;
constexpr int kSoftmaxWarpThreads = 128;  // 4 rows per block

struct SumOp {
  template <class A>
  __device__ A operator()(A a, A b) const { return a + b; }
};
struct MaxOp {  // NaN never enters: the loads skip it (v > mx is false for NaN)
  template <class A>
  __device__ A operator()(A a, A b) const { return b > a ? b : a; }
};

// Reduces v over the lanes of a warp (kBlock = false) or the threads of a block (kBlock = true);
// every thread gets the result. `smem` holds 32 values; `identity` pads missing warps.
template <bool kBlock, class A, class Op>
__device__ __forceinline__ A group_reduce(A v, Op op, A identity, A* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if constexpr (!kBlock) {
    return v;
  } else {
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    const int nwarps = static_cast<int>(blockDim.x) / 32;
    __syncthreads();  // smem may still be read by a previous reduction
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = lane < nwarps ? smem[lane] : identity;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
  }
}

// Row r and the thread's position in its group, for a warp per row or a block per row.
template <bool kBlock>
struct RowGroup {
  int64_t first, step;  // first row of this group, rows between consecutive rows of the group
  int lane, size;
  __device__ RowGroup() {
    if constexpr (kBlock) {
      first = blockIdx.x;
      step = gridDim.x;
      lane = static_cast<int>(threadIdx.x);
      size = static_cast<int>(blockDim.x);
    } else {
      const int warps = static_cast<int>(blockDim.x) / 32;
      first = static_cast<int64_t>(blockIdx.x) * warps + threadIdx.x / 32;
      step = static_cast<int64_t>(gridDim.x) * warps;
      lane = static_cast<int>(threadIdx.x) % 32;
      size = 32;
    }
  }
};

template <class T, bool kBlock>
__global__ void softmax_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t cols, bool log) {
  using C = calc_t<T>;
  __shared__ C smem[32];
  const RowGroup<kBlock> g;
  if constexpr (!kBlock) {
    // A warp per row of at most kWarpMaxCols: the row is read once into registers (lane l holds
    // columns l, l + 32, ...), where the block-per-row path below reads it three times (from L2 at best: softmax
    // over [65536, 1024] took 248 us on the H200 against PyTorch's 152, 2026-12-04). Same
    // operations in the same order: the same bits.
    constexpr int K = static_cast<int>(kWarpMaxCols / 32);
    for (int64_t r = g.first; r < rows; r += g.step) {
      const T* xr = x + r * cols;
      T* yr = y + r * cols;
      C v[K];
      C mx = C(-INFINITY);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int64_t c = g.lane + 32 * k;
        v[k] = c < cols ? to_calc<T>(xr[c]) : C(0);
        if (c < cols) mx = v[k] > mx ? v[k] : mx;
      }
      mx = group_reduce<false>(mx, MaxOp{}, C(-INFINITY), smem);
      if (mx == C(-INFINITY)) mx = C(0);
      C sum = 0;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (g.lane + 32 * k < cols) {
          v[k] = v[k] - mx;
          sum += math::exp_(v[k]);
        }
      }
      sum = group_reduce<false>(sum, SumOp{}, C(0), smem);
      if (log) {
        const C lse = math::log_(sum);
#pragma unroll
        for (int k = 0; k < K; ++k) {
          const int64_t c = g.lane + 32 * k;
          if (c < cols) yr[c] = from_calc<T>(v[k] - lse);
        }
      } else {
        const C inv = C(1) / sum;
#pragma unroll
        for (int k = 0; k < K; ++k) {
          const int64_t c = g.lane + 32 * k;
          if (c < cols) yr[c] = from_calc<T>(math::exp_(v[k]) * inv);
        }
      }
    }
  } else {
    // r is the same for all threads of a group (warp or block), as the reductions need.
    for (int64_t r = g.first; r < rows; r += g.step) {
      const T* xr = x + r * cols;
      T* yr = y + r * cols;
      C mx = C(-INFINITY);
      for (int64_t c = g.lane; c < cols; c += g.size) {
        const C v = to_calc<T>(xr[c]);
        mx = v > mx ? v : mx;
      }
      mx = group_reduce<kBlock>(mx, MaxOp{}, C(-INFINITY), smem);
      if (mx == C(-INFINITY)) mx = C(0);
      C sum = 0;
      for (int64_t c = g.lane; c < cols; c += g.size) sum += math::exp_(to_calc<T>(xr[c]) - mx);
      sum = group_reduce<kBlock>(sum, SumOp{}, C(0), smem);
      if (log) {
        const C lse = math::log_(sum);
        for (int64_t c = g.lane; c < cols; c += g.size) yr[c] = from_calc<T>(to_calc<T>(xr[c]) - mx - lse);
      } else {
        const C inv = C(1) / sum;
        for (int64_t c = g.lane; c < cols; c += g.size) yr[c] = from_calc<T>(math::exp_(to_calc<T>(xr[c]) - mx) * inv);
      }
    }
  }
}

// gx = gy - exp(y) * sum(gy) for log_softmax, gx = y * (gy - sum(gy * y)) for softmax.
template <class T, bool kBlock>
__global__ void softmax_backward_kernel(const T* __restrict__ y, const T* __restrict__ gy, T* __restrict__ gx,
                                        int64_t rows, int64_t cols, bool log) {
  using C = calc_t<T>;
  __shared__ C smem[32];
  const RowGroup<kBlock> g;
  if constexpr (!kBlock) {
    // As the forward: y and gy read once into registers; same operations, same order.
    constexpr int K = static_cast<int>(kWarpMaxCols / 32);
    for (int64_t r = g.first; r < rows; r += g.step) {
      const T* yr = y + r * cols;
      const T* gr = gy + r * cols;
      T* out = gx + r * cols;
      C yv[K], gv[K];
      C dot = 0;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int64_t c = g.lane + 32 * k;
        yv[k] = c < cols ? to_calc<T>(yr[c]) : C(0);
        gv[k] = c < cols ? to_calc<T>(gr[c]) : C(0);
      }
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (g.lane + 32 * k < cols) dot += log ? gv[k] : gv[k] * yv[k];
      dot = group_reduce<false>(dot, SumOp{}, C(0), smem);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int64_t c = g.lane + 32 * k;
        if (c < cols) out[c] = from_calc<T>(log ? gv[k] - math::exp_(yv[k]) * dot : yv[k] * (gv[k] - dot));
      }
    }
  } else {
    for (int64_t r = g.first; r < rows; r += g.step) {
      const T* yr = y + r * cols;
      const T* gr = gy + r * cols;
      T* out = gx + r * cols;
      C dot = 0;
      if (log) {
        for (int64_t c = g.lane; c < cols; c += g.size) dot += to_calc<T>(gr[c]);
      } else {
        for (int64_t c = g.lane; c < cols; c += g.size) dot += to_calc<T>(gr[c]) * to_calc<T>(yr[c]);
      }
      dot = group_reduce<kBlock>(dot, SumOp{}, C(0), smem);
      if (log) {
        for (int64_t c = g.lane; c < cols; c += g.size)
          out[c] = from_calc<T>(to_calc<T>(gr[c]) - math::exp_(to_calc<T>(yr[c])) * dot);
      } else {
        for (int64_t c = g.lane; c < cols; c += g.size)
          out[c] = from_calc<T>(to_calc<T>(yr[c]) * (to_calc<T>(gr[c]) - dot));
      }
    }
  }
}

// Launch geometry shared by both kernels: a warp per row, or a block per row for long rows.
struct SoftmaxLaunch {
  bool block_per_row;
  unsigned grid, threads;
};
inline SoftmaxLaunch softmax_launch(int64_t rows, int64_t cols, int sm_count) {
  const int64_t cap = static_cast<int64_t>(sm_count > 0 ? sm_count : 1) * 64;
  SoftmaxLaunch l;
  l.block_per_row = cols > kWarpMaxCols;
  if (l.block_per_row) {
    l.threads = cols > 8 * kWarpMaxCols ? 1024 : 256;
    l.grid = static_cast<unsigned>(rows < cap ? rows : cap);
  } else {
    const int64_t rows_per_block = kSoftmaxWarpThreads / 32;
    const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
    l.threads = kSoftmaxWarpThreads;
    l.grid = static_cast<unsigned>(blocks < cap ? blocks : cap);
  }
  return l;
}

}  // namespace
}  // namespace ember::cuda_impl
#endif  // __CUDACC__
