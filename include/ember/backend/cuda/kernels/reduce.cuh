#pragma once
// Reductions of a [outer, n, inner] view over its middle axis, with the CPU's semantics
// (backend/cpu/reduce.hpp): NaN propagates through Max/Min; ArgMax/ArgMin return the first index of
// the extreme value, a NaN counting as the extreme (so the first NaN wins). Sums accumulate in
// float for fp32/fp16/bf16, double for fp64 and int64 for the integers (exact; Mean then divides
// in double like the CPU).
//
// One kernel serves every shape: a block of 256 threads is bx (<= 32, along inner) by by (along n)
// threads, so that reads are coalesced whether inner is 1 or large. When there are too few output
// tiles to fill the GPU, the n axis is split: a first pass writes partial states to a workspace
// [outer, splits, inner], and the same kernel reduces those.
#if defined(__CUDACC__)
#include "ember/backend/cuda/kernels/common.cuh"
#include "ember/backend/cuda/kernels/launch.cuh"

namespace ember::cuda_impl {
namespace {

template <class T>
using sum_state_t = std::conditional_t<std::is_integral_v<T>, int64_t, std::conditional_t<std::is_same_v<T, double>, double, float>>;

template <class T>
struct SumReducer {
  using State = sum_state_t<T>;
  using Out = T;
  double scale;  // 1 for Sum, 1/n for Mean
  __device__ State identity() const { return State(0); }
  template <class In>
  __device__ State load(In v, int64_t) const {
    if constexpr (std::is_same_v<In, State>) {
      return v;
    } else if constexpr (std::is_integral_v<T>) {
      return static_cast<State>(v);
    } else {
      return static_cast<State>(to_calc<T>(v));
    }
  }
  __device__ State combine(State a, State b) const { return a + b; }
  __device__ Out finalize(State s) const { return from_double<T>(static_cast<double>(s) * scale); }
};

template <class T>
struct MaxMinReducer {
  using State = calc_t<T>;
  using Out = T;
  bool is_max;
  __device__ State identity() const { return is_max ? State(-INFINITY) : State(INFINITY); }
  template <class In>
  __device__ State load(In v, int64_t) const {
    if constexpr (std::is_same_v<In, State>) return v;
    else return to_calc<T>(v);
  }
  __device__ State combine(State a, State b) const {
    if (math::isnan_(a)) return a;
    if (math::isnan_(b)) return b;
    return is_max ? (b > a ? b : a) : (b < a ? b : a);
  }
  __device__ Out finalize(State s) const { return from_calc<T>(s); }
};

template <class C>
struct ArgState {
  C v;
  int64_t i;  // -1: empty
};

template <class T>
struct ArgReducer {
  using State = ArgState<calc_t<T>>;
  using Out = int64_t;
  bool is_max;
  __device__ State identity() const { return State{calc_t<T>(0), -1}; }
  template <class In>
  __device__ State load(In v, int64_t j) const {
    if constexpr (std::is_same_v<In, State>) return v;
    else return State{to_calc<T>(v), j};
  }
  __device__ State combine(State a, State b) const {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    const bool an = math::isnan_(a.v), bn = math::isnan_(b.v);
    if (an || bn) {
      if (an && bn) return a.i < b.i ? a : b;
      return an ? a : b;
    }
    if (a.v == b.v) return a.i < b.i ? a : b;
    return (is_max ? a.v > b.v : a.v < b.v) ? a : b;
  }
  __device__ Out finalize(State s) const { return s.i < 0 ? 0 : s.i; }
};

// Reduces x[outer, n, inner] over j in [split * chunk, (split + 1) * chunk) for split = blockIdx.y.
// kFinal: writes R::Out to out[outer, inner]; else the State to out[outer, splits, inner].
template <class R, class In, class Out, bool kFinal>
__global__ void __launch_bounds__(kThreads) reduce_kernel(const In* __restrict__ x, Out* __restrict__ out,
                                                           int64_t outer, int64_t n, int64_t inner, int64_t tiles_i,
                                                           int64_t chunk, R r) {
  using State = typename R::State;
  __shared__ State sh[kThreads];
  const int bx = static_cast<int>(blockDim.x), by = static_cast<int>(blockDim.y);
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int tid = ty * bx + tx;
  const int64_t split = blockIdx.y, splits = gridDim.y;
  const int64_t j0 = split * chunk;
  const int64_t j1 = j0 + chunk < n ? j0 + chunk : n;
  const int64_t tiles = outer * tiles_i;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t o = tile / tiles_i;
    const int64_t i = (tile - o * tiles_i) * bx + tx;
    State s = r.identity();
    if (i < inner) {
      const In* p = x + o * n * inner + i;
      for (int64_t j = j0 + ty; j < j1; j += by) s = r.combine(s, r.load(p[j * inner], j));
    }
    sh[tid] = s;
    __syncthreads();
    for (int stride = by / 2; stride > 0; stride >>= 1) {
      if (ty < stride) sh[tid] = r.combine(sh[tid], sh[tid + stride * bx]);
      __syncthreads();
    }
    if (ty == 0 && i < inner) {
      if constexpr (kFinal) out[o * inner + i] = r.finalize(sh[tx]);
      else out[(o * splits + split) * inner + i] = sh[tx];
    }
    __syncthreads();  // sh is reused by the next tile
  }
}

// inner == 1 (a reduction along contiguous rows): one warp per row, the lanes reading 32
// consecutive elements at a time, then a tree over the warp in shared memory (__syncwarp only:
// any State, the argmax pair too). A block per row with a 256-thread tree spent most of its time
// in __syncthreads: sum over rows of [65536, 1024] took 194 us on the H200 against PyTorch's 85
// (bench_core sum_rows).
template <class R, class In, class Out>
__global__ void __launch_bounds__(kThreads) reduce_rows_warp_kernel(const In* __restrict__ x, Out* __restrict__ out,
                                                                     int64_t rows, int64_t n, R r) {
  using State = typename R::State;
  __shared__ State sh[kThreads];
  const int lane = static_cast<int>(threadIdx.x) % 32;
  State* w = sh + (threadIdx.x / 32) * 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / 32);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32; row < rows; row += warps) {
    const In* p = x + row * n;
    State s = r.identity();
#pragma unroll 4
    for (int64_t j = lane; j < n; j += 32) s = r.combine(s, r.load(p[j], j));
    w[lane] = s;
    __syncwarp();
#pragma unroll
    for (int stride = 16; stride > 0; stride >>= 1) {
      if (lane < stride) w[lane] = r.combine(w[lane], w[lane + stride]);
      __syncwarp();
    }
    if (lane == 0) out[row] = r.finalize(w[0]);
    __syncwarp();  // w is reused by the next row
  }
}

// Host side: picks the block shape and the split of n, and launches one or two passes (the
// partial states of the first in the context's scratch memory).
template <class R, class T>
void launch_reduce_with(const LaunchContext& c, const T* x, typename R::Out* out, int64_t outer, int64_t n,
                        int64_t inner, const R& r) {
  const int sm_count = c.sm_count;
  const cudaStream_t stream = c.stream;
  using State = typename R::State;
  using Out = typename R::Out;
  if (outer == 0 || inner == 0) return;
  int bx = 1;
  while (bx < 32 && bx < inner) bx *= 2;
  const int by = kThreads / bx;
  const int64_t tiles_i = (inner + bx - 1) / bx;
  const int64_t tiles = outer * tiles_i;
  const int64_t target = static_cast<int64_t>(sm_count > 0 ? sm_count : 1) * 8;  // blocks that fill the GPU
  constexpr int64_t kMinPerThread = 32;  // elements of n each thread should get at least
  int64_t splits = 1;
  if (tiles < target && n > by * kMinPerThread) {
    splits = (target + tiles - 1) / tiles;
    const int64_t by_work = n / (by * kMinPerThread);
    if (splits > by_work) splits = by_work;
    if (splits > 65535) splits = 65535;
    if (splits < 1) splits = 1;
  }
  const dim3 block(static_cast<unsigned>(bx), static_cast<unsigned>(by));
  const unsigned grid_x = static_cast<unsigned>(tiles < INT32_MAX ? tiles : INT32_MAX);
  if (splits == 1 && inner == 1) {
    const int64_t blocks = (outer + kThreads / 32 - 1) / (kThreads / 32);
    const int64_t cap = static_cast<int64_t>(sm_count > 0 ? sm_count : 1) * 32;
    reduce_rows_warp_kernel<R, T, Out><<<static_cast<unsigned>(blocks < cap ? blocks : cap), kThreads, 0, stream>>>(
        x, out, outer, n, r);
    EMBER_CUDA_CHECK_LAUNCH();
    return;
  }
  if (splits == 1) {
    reduce_kernel<R, T, Out, true><<<dim3(grid_x, 1), block, 0, stream>>>(x, out, outer, n, inner, tiles_i, n, r);
    EMBER_CUDA_CHECK_LAUNCH();
    return;
  }
  const int64_t chunk = (n + splits - 1) / splits;
  splits = (n + chunk - 1) / chunk;
  const size_t bytes = static_cast<size_t>(outer * splits * inner) * sizeof(State);
  State* partial = static_cast<State*>(c.scratch(bytes));
  reduce_kernel<R, T, State, false><<<dim3(grid_x, static_cast<unsigned>(splits)), block, 0, stream>>>(
      x, partial, outer, n, inner, tiles_i, chunk, r);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) {
    reduce_kernel<R, State, Out, true><<<dim3(grid_x, 1), block, 0, stream>>>(partial, out, outer, splits, inner,
                                                                               tiles_i, splits, r);
    e = cudaGetLastError();
  }
  c.release(partial, bytes);
  ::ember::cuda::internal::check_cuda(e, "reduce kernel launch", __FILE__, __LINE__);
}

// The kernel table's reduce: the reducer of `op` for the dtype.
inline void launch_reduce(const LaunchContext& c, ReduceOp op, DType t, const void* x, void* out, int64_t outer,
                          int64_t n, int64_t inner) {
  if (outer <= 0 || inner <= 0) return;
  DeviceGuard g(c.device);
  dispatch_all(t, [&](auto tag) {
    using T = decltype(tag);
    const T* xt = static_cast<const T*>(x);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Mean: {
        const SumReducer<T> r{op == ReduceOp::Mean ? 1.0 / static_cast<double>(n) : 1.0};
        launch_reduce_with(c, xt, static_cast<T*>(out), outer, n, inner, r);
        return;
      }
      case ReduceOp::Max:
      case ReduceOp::Min: {
        const MaxMinReducer<T> r{op == ReduceOp::Max};
        launch_reduce_with(c, xt, static_cast<T*>(out), outer, n, inner, r);
        return;
      }
      case ReduceOp::ArgMax:
      case ReduceOp::ArgMin: {
        const ArgReducer<T> r{op == ReduceOp::ArgMax};
        launch_reduce_with(c, xt, static_cast<int64_t*>(out), outer, n, inner, r);
        return;
      }
    }
    throw ValueError(::ember::detail::str_cat("reduce: unknown op ", static_cast<int>(op), " on cuda:", c.device));
  });
}

}  // namespace
}  // namespace ember::cuda_impl
#endif  // __CUDACC__
