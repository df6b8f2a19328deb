#pragma once
// Row softmax / log_softmax over the last axis of [rows, cols] and their backward, with the CPU's
// semantics (backend/cpu/reduce.hpp): the row maximum ignores NaN and is taken as 0 for a row of
// -inf (which then gives NaN, like PyTorch). Rows of up to kWarpMaxCols columns get one warp each
// (held in registers as 16-byte packs where the row allows: the packed kernels below), longer
// rows one block each. Sums accumulate in float (double for fp64). Floating types only.
#if defined(__CUDACC__)
#include <initializer_list>
#include <type_traits>

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

// ---------------------------------------------------------------- packed rows in registers
// A warp per row of at most kWarpMaxCols whose length is a multiple of a 16-byte pack (and whose
// tensors are 16-byte aligned): lane l holds packs l, l + 32, ... of the row, read once with one
// ld.global.v4 each; exp is taken once per element. kPacks (packs per lane) is the row length
// rounded up to a power of two, so short rows keep few registers and the SM many warps.
//
// Why (H200, 2026-12-04, [65536, 1024] fp32): the loops above read the row three times (248 us
// against PyTorch's 141); a version holding the row as 32 scalars per lane with two exps per
// element took 116 registers (16 warps per SM) and 513 us. The arithmetic per element is that of
// the loops (same max, exp, sum in float / double, same division); only the order in which each
// lane adds its elements differs, so the last bits of the sum may.
template <class T, int kPacks>
__global__ void __launch_bounds__(kSoftmaxWarpThreads)
    softmax_packed_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t cols, bool log) {
  using C = calc_t<T>;
  constexpr int P = Pack<T>::kSize;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t packs = cols / P;
  const int64_t warps = blockDim.x / 32;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * warps + threadIdx.x / 32; r < rows;
       r += static_cast<int64_t>(gridDim.x) * warps) {
    const Pack<T>* xr = reinterpret_cast<const Pack<T>*>(x + r * cols);
    Pack<T>* yr = reinterpret_cast<Pack<T>*>(y + r * cols);
    C v[kPacks][P];
    C mx = C(-INFINITY);
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      if (lane + 32 * j < packs) {
        const Pack<T> pk = xr[lane + 32 * j];
#pragma unroll
        for (int e = 0; e < P; ++e) {
          v[j][e] = to_calc<T>(pk.v[e]);
          mx = v[j][e] > mx ? v[j][e] : mx;  // NaN never enters
        }
      }
    }
    mx = group_reduce<false>(mx, MaxOp{}, C(-INFINITY), static_cast<C*>(nullptr));
    if (mx == C(-INFINITY)) mx = C(0);
    C sum = 0;
    if (log) {
#pragma unroll
      for (int j = 0; j < kPacks; ++j)
        if (lane + 32 * j < packs) {
#pragma unroll
          for (int e = 0; e < P; ++e) {
            v[j][e] = v[j][e] - mx;
            sum += math::exp_(v[j][e]);
          }
        }
    } else {
#pragma unroll
      for (int j = 0; j < kPacks; ++j)
        if (lane + 32 * j < packs) {
#pragma unroll
          for (int e = 0; e < P; ++e) {
            v[j][e] = math::exp_(v[j][e] - mx);
            sum += v[j][e];
          }
        }
    }
    sum = group_reduce<false>(sum, SumOp{}, C(0), static_cast<C*>(nullptr));
    // softmax: e * (1 / sum), as the loops; log_softmax: (x - max) - log(sum)
    const C k = log ? math::log_(sum) : C(1) / sum;
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      if (lane + 32 * j < packs) {
        Pack<T> o;
#pragma unroll
        for (int e = 0; e < P; ++e) o.v[e] = from_calc<T>(log ? v[j][e] - k : v[j][e] * k);
        yr[lane + 32 * j] = o;
      }
    }
  }
}

// The backward of the packed forward: y and gy read once, as 16-byte packs.
template <class T, int kPacks>
__global__ void __launch_bounds__(kSoftmaxWarpThreads)
    softmax_backward_packed_kernel(const T* __restrict__ y, const T* __restrict__ gy, T* __restrict__ gx,
                                   int64_t rows, int64_t cols, bool log) {
  using C = calc_t<T>;
  constexpr int P = Pack<T>::kSize;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t packs = cols / P;
  const int64_t warps = blockDim.x / 32;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * warps + threadIdx.x / 32; r < rows;
       r += static_cast<int64_t>(gridDim.x) * warps) {
    const Pack<T>* yr = reinterpret_cast<const Pack<T>*>(y + r * cols);
    const Pack<T>* gr = reinterpret_cast<const Pack<T>*>(gy + r * cols);
    Pack<T>* out = reinterpret_cast<Pack<T>*>(gx + r * cols);
    C yv[kPacks][P], gv[kPacks][P];
    C dot = 0;
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      if (lane + 32 * j < packs) {
        const Pack<T> py = yr[lane + 32 * j], pg = gr[lane + 32 * j];
#pragma unroll
        for (int e = 0; e < P; ++e) {
          yv[j][e] = to_calc<T>(py.v[e]);
          gv[j][e] = to_calc<T>(pg.v[e]);
          dot += log ? gv[j][e] : gv[j][e] * yv[j][e];
        }
      }
    }
    dot = group_reduce<false>(dot, SumOp{}, C(0), static_cast<C*>(nullptr));
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      if (lane + 32 * j < packs) {
        Pack<T> o;
#pragma unroll
        for (int e = 0; e < P; ++e)
          o.v[e] = from_calc<T>(log ? gv[j][e] - math::exp_(yv[j][e]) * dot : yv[j][e] * (gv[j][e] - dot));
        out[lane + 32 * j] = o;
      }
    }
  }
}

// At most 8 packs a lane (32 floats, 64 halves, 16 doubles): fp64 rows of more than 512 columns
// take the loops (16 packs of doubles took 242 registers in the backward).
template <class T>
inline constexpr int kMaxPacksPerLane =
    static_cast<int>(kWarpMaxCols / 32) / Pack<T>::kSize < 8 ? static_cast<int>(kWarpMaxCols / 32) / Pack<T>::kSize : 8;

// Packs per lane for the packed kernels: 0 where they do not apply (a row longer than
// kWarpMaxCols, a length not a multiple of the pack, a tensor not 16-byte aligned), else the
// smallest power of two >= the row's packs / 32.
template <class T>
inline int softmax_packs_per_lane(int64_t cols, std::initializer_list<const void*> ptrs) {
  constexpr int P = Pack<T>::kSize;
  if (cols > kWarpMaxCols || cols % P != 0) return 0;
  for (const void* p : ptrs)
    if (!aligned16(p)) return 0;  // a null pointer (no weight, no bias) counts as aligned
  const int64_t per_lane = (cols / P + 31) / 32;
  if (per_lane > kMaxPacksPerLane<T>) return 0;
  int k = 1;
  while (k < per_lane) k *= 2;
  return k;
}

// Runs `launch(std::integral_constant<int, K>{})` for the packs-per-lane bucket k (1, 2, 4, ...,
// kWarpMaxCols / 32 / P).
template <class T, class F>
inline void with_packs_per_lane(int k, F&& launch) {
  constexpr int kMax = kMaxPacksPerLane<T>;
  if constexpr (kMax >= 1) if (k == 1) return launch(std::integral_constant<int, 1>{});
  if constexpr (kMax >= 2) if (k == 2) return launch(std::integral_constant<int, 2>{});
  if constexpr (kMax >= 4) if (k == 4) return launch(std::integral_constant<int, 4>{});
  if constexpr (kMax >= 8) if (k == 8) return launch(std::integral_constant<int, 8>{});
  if constexpr (kMax >= 16) if (k == 16) return launch(std::integral_constant<int, 16>{});
}

// The softmax forward and backward launches (the backend's softmax / softmax_backward): the
// packed kernels where they apply, else a warp or a block per row.
template <class T>
inline void launch_softmax_forward(const T* x, T* y, int64_t rows, int64_t cols, bool log, int sm_count,
                                   cudaStream_t stream) {
  const SoftmaxLaunch l = softmax_launch(rows, cols, sm_count);
  if (const int k = softmax_packs_per_lane<T>(cols, {x, y}); k > 0) {
    with_packs_per_lane<T>(k, [&](auto kp) {
      softmax_packed_kernel<T, decltype(kp)::value><<<l.grid, l.threads, 0, stream>>>(x, y, rows, cols, log);
    });
  } else if (l.block_per_row) {
    softmax_kernel<T, true><<<l.grid, l.threads, 0, stream>>>(x, y, rows, cols, log);
  } else {
    softmax_kernel<T, false><<<l.grid, l.threads, 0, stream>>>(x, y, rows, cols, log);
  }
}
template <class T>
inline void launch_softmax_backward(const T* y, const T* gy, T* gx, int64_t rows, int64_t cols, bool log,
                                    int sm_count, cudaStream_t stream) {
  const SoftmaxLaunch l = softmax_launch(rows, cols, sm_count);
  if (const int k = softmax_packs_per_lane<T>(cols, {y, gy, gx}); k > 0) {
    with_packs_per_lane<T>(k, [&](auto kp) {
      softmax_backward_packed_kernel<T, decltype(kp)::value><<<l.grid, l.threads, 0, stream>>>(y, gy, gx, rows, cols,
                                                                                                 log);
    });
  } else if (l.block_per_row) {
    softmax_backward_kernel<T, true><<<l.grid, l.threads, 0, stream>>>(y, gy, gx, rows, cols, log);
  } else {
    softmax_backward_kernel<T, false><<<l.grid, l.threads, 0, stream>>>(y, gy, gx, rows, cols, log);
  }
}

}  // namespace
}  // namespace ember::cuda_impl
#endif  // __CUDACC__
