#pragma once
// Row softmax / log_softmax over the last axis of [rows, cols] and their backward, with the CPU's
// semantics (backend/cpu/softmax.hpp): the row maximum ignores NaN and is taken as 0 for a row of
// -inf (which then gives NaN, like PyTorch). Rows of up to kWarpMaxCols columns get one warp each,
// longer rows one block each. The rows are read three times (max, sum, output): a version that
// held the row in registers as 32 scalars per lane with two exps per element took 116 registers
// (16 warps per SM) and 513 us for [65536, 1024] fp32 on the H200, against 248 us for these loops
// and PyTorch's 141-152 (bench_core softmax_rows). Sums accumulate in float (double for fp64).
// Floating types only.
#if defined(__CUDACC__)
#include "ember/backend/cuda/kernels/common.cuh"
#include "ember/backend/cuda/kernels/launch.cuh"

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

// The maximum of row xr [n] over the group (every thread gets it), ignoring NaN; 0 for a row of
// -inf, so that x - max stays finite. smem as group_reduce's.
template <bool kBlock, class T>
__device__ __forceinline__ calc_t<T> group_row_max(const RowGroup<kBlock>& g, const T* xr, int64_t n, calc_t<T>* smem) {
  using C = calc_t<T>;
  C mx = C(-INFINITY);
  for (int64_t c = g.lane; c < n; c += g.size) {
    const C v = to_calc<T>(xr[c]);
    mx = v > mx ? v : mx;
  }
  mx = group_reduce<kBlock>(mx, MaxOp{}, C(-INFINITY), smem);
  if (mx == C(-INFINITY)) mx = C(0);
  return mx;
}

template <class T, bool kBlock>
__global__ void softmax_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t cols, bool log) {
  using C = calc_t<T>;
  __shared__ C smem[32];
  const RowGroup<kBlock> g;
  // r is the same for all threads of a group (warp or block), as the reductions need.
  for (int64_t r = g.first; r < rows; r += g.step) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    const C mx = group_row_max(g, xr, cols, smem);
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

// gx = gy - exp(y) * sum(gy) for log_softmax, gx = y * (gy - sum(gy * y)) for softmax.
template <class T, bool kBlock>
__global__ void softmax_backward_kernel(const T* __restrict__ y, const T* __restrict__ gy, T* __restrict__ gx,
                                        int64_t rows, int64_t cols, bool log) {
  using C = calc_t<T>;
  __shared__ C smem[32];
  const RowGroup<kBlock> g;
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

// The softmax forward and backward launches (the backend's softmax / softmax_backward): a warp or
// a block per row. (A version holding each row in registers as 16-byte packs is prepared in commit
// 9c46403 and waits for a GPU run: docs/gpu-status.md.)
template <class T>
inline void launch_softmax_forward(const T* x, T* y, int64_t rows, int64_t cols, bool log, int sm_count,
                                   cudaStream_t stream) {
  const SoftmaxLaunch l = softmax_launch(rows, cols, sm_count);
  if (l.block_per_row) {
    softmax_kernel<T, true><<<l.grid, l.threads, 0, stream>>>(x, y, rows, cols, log);
  } else {
    softmax_kernel<T, false><<<l.grid, l.threads, 0, stream>>>(x, y, rows, cols, log);
  }
}
template <class T>
inline void launch_softmax_backward(const T* y, const T* gy, T* gx, int64_t rows, int64_t cols, bool log,
                                    int sm_count, cudaStream_t stream) {
  const SoftmaxLaunch l = softmax_launch(rows, cols, sm_count);
  if (l.block_per_row) {
    softmax_backward_kernel<T, true><<<l.grid, l.threads, 0, stream>>>(y, gy, gx, rows, cols, log);
  } else {
    softmax_backward_kernel<T, false><<<l.grid, l.threads, 0, stream>>>(y, gy, gx, rows, cols, log);
  }
}

// The kernel table's softmax and softmax_backward: the typed launches above for a floating dtype.
inline void launch_softmax_forward(const LaunchContext& c, DType t, const void* x, void* y, int64_t rows,
                                   int64_t cols, bool log) {
  dispatch_floating(t, log ? "log_softmax" : "softmax", c.device, [&](auto tag) {
    using T = decltype(tag);
    if (rows <= 0 || cols <= 0) return;
    DeviceGuard g(c.device);
    launch_softmax_forward<T>(static_cast<const T*>(x), static_cast<T*>(y), rows, cols, log, c.sm_count, c.stream);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}
inline void launch_softmax_backward(const LaunchContext& c, DType t, const void* y, const void* gy, void* gx,
                                    int64_t rows, int64_t cols, bool log) {
  dispatch_floating(t, log ? "log_softmax_backward" : "softmax_backward", c.device, [&](auto tag) {
    using T = decltype(tag);
    if (rows <= 0 || cols <= 0) return;
    DeviceGuard g(c.device);
    launch_softmax_backward<T>(static_cast<const T*>(y), static_cast<const T*>(gy), static_cast<T*>(gx), rows, cols,
                               log, c.sm_count, c.stream);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace
}  // namespace ember::cuda_impl
#endif  // __CUDACC__
