#pragma once
// Fused layer norm / RMSNorm (core/kernel_table.hpp NormArgs) with the CPU's semantics
// (backend/cpu/norm.hpp): a warp per row for rows of up to kWarpMaxCols columns, else a block per
// row (the RowGroup and group_reduce of softmax.cuh). Forward: per-thread Welford statistics
// merged across the group with Chan's formula (one read of x for the statistics), then y.
// Backward: the two row sums, then gx; the weight and bias gradients by a second kernel that sums
// columns over rows in a fixed order (deterministic, no atomics). Statistics and sums in float
// (double for fp64).
#if defined(__CUDACC__)
#include "ember/backend/cuda/kernels/common.cuh"
#include "ember/backend/cuda/kernels/softmax.cuh"

namespace ember::cuda_impl {
namespace {

template <class S>
struct Welford {
  S n, mean, m2;
};

template <class S>
__device__ __forceinline__ Welford<S> welford_merge(Welford<S> a, Welford<S> b) {
  const S n = a.n + b.n;
  if (n == S(0)) return a;
  const S d = b.mean - a.mean;
  const S fb = b.n / n;
  return {n, a.mean + d * fb, a.m2 + b.m2 + d * d * a.n * fb};
}

// Merges the Welford states of a warp (kBlock = false) or block (kBlock = true); every thread
// gets the result. smem holds 32 states.
template <bool kBlock, class S>
__device__ __forceinline__ Welford<S> group_welford(Welford<S> v, Welford<S>* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Welford<S> u{__shfl_xor_sync(0xffffffffu, v.n, o), __shfl_xor_sync(0xffffffffu, v.mean, o),
                 __shfl_xor_sync(0xffffffffu, v.m2, o)};
    v = welford_merge(v, u);
  }
  if constexpr (!kBlock) {
    return v;
  } else {
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    const int nwarps = static_cast<int>(blockDim.x) / 32;
    __syncthreads();
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = lane < nwarps ? smem[lane] : Welford<S>{S(0), S(0), S(0)};
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      Welford<S> u{__shfl_xor_sync(0xffffffffu, v.n, o), __shfl_xor_sync(0xffffffffu, v.mean, o),
                   __shfl_xor_sync(0xffffffffu, v.m2, o)};
      v = welford_merge(v, u);
    }
    return v;
  }
}

template <class T>
using norm_stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T, bool kBlock>
__global__ void norm_forward_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                    T* __restrict__ y, norm_stat_t<T>* __restrict__ mean,
                                    norm_stat_t<T>* __restrict__ rstd, int64_t rows, int64_t cols, double eps,
                                    bool rms) {
  using C = calc_t<T>;
  using S = norm_stat_t<T>;
  __shared__ Welford<S> wsm[32];
  __shared__ S ssm[32];
  const RowGroup<kBlock> g;
  for (int64_t r = g.first; r < rows; r += g.step) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    S mu = 0, var = 0;
    if (rms) {
      S sq = 0;
      for (int64_t c = g.lane; c < cols; c += g.size) {
        const S v = static_cast<S>(to_calc<T>(xr[c]));
        sq += v * v;
      }
      sq = group_reduce<kBlock>(sq, SumOp{}, S(0), ssm);
      var = sq / static_cast<S>(cols);
    } else {
      // Welford of x - x[0] (as the CPU: precise for data far from 0)
      const S k = static_cast<S>(to_calc<T>(xr[0]));
      Welford<S> st{S(0), S(0), S(0)};
      for (int64_t c = g.lane; c < cols; c += g.size) {
        const S v = static_cast<S>(to_calc<T>(xr[c])) - k;
        st.n += S(1);
        const S d = v - st.mean;
        st.mean += d / st.n;
        st.m2 += d * (v - st.mean);
      }
      st = group_welford<kBlock>(st, wsm);
      mu = st.mean;  // of x - k
      var = st.m2 / static_cast<S>(cols);
    }
    const C k = rms ? C(0) : to_calc<T>(xr[0]);
    const S rs = S(1) / sqrt(var + static_cast<S>(eps));
    if (g.lane == 0) {
      if (mean) mean[r] = static_cast<S>(k) + mu;
      rstd[r] = rs;
    }
    const C m = static_cast<C>(mu), s = static_cast<C>(rs);
    for (int64_t c = g.lane; c < cols; c += g.size) {
      C o = ((to_calc<T>(xr[c]) - k) - m) * s;
      if (w) o = o * to_calc<T>(w[c]);
      if (b) o = o + to_calc<T>(b[c]);
      yr[c] = from_calc<T>(o);
    }
  }
}

template <class T, bool kBlock>
__global__ void norm_backward_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                     const norm_stat_t<T>* __restrict__ mean, const norm_stat_t<T>* __restrict__ rstd,
                                     const T* __restrict__ gy, T* __restrict__ gx, int64_t rows, int64_t cols,
                                     bool rms) {
  using C = calc_t<T>;
  __shared__ C smem[32];
  const RowGroup<kBlock> g;
  for (int64_t r = g.first; r < rows; r += g.step) {
    const T* xr = x + r * cols;
    const T* gr = gy + r * cols;
    T* out = gx + r * cols;
    const C m = rms ? C(0) : static_cast<C>(mean[r]);
    const C s = static_cast<C>(rstd[r]);
    C sg = 0, sgx = 0;
    for (int64_t c = g.lane; c < cols; c += g.size) {
      const C gv = to_calc<T>(gr[c]) * (w ? to_calc<T>(w[c]) : C(1));
      sg += gv;
      sgx += gv * ((to_calc<T>(xr[c]) - m) * s);
    }
    sg = group_reduce<kBlock>(sg, SumOp{}, C(0), smem);
    sgx = group_reduce<kBlock>(sgx, SumOp{}, C(0), smem);
    const C inv_n = C(1) / static_cast<C>(cols);
    const C mg = rms ? C(0) : sg * inv_n, mgx = sgx * inv_n;
    for (int64_t c = g.lane; c < cols; c += g.size) {
      const C xh = (to_calc<T>(xr[c]) - m) * s;
      const C gv = to_calc<T>(gr[c]) * (w ? to_calc<T>(w[c]) : C(1));
      out[c] = from_calc<T>(s * (gv - mg - xh * mgx));
    }
  }
}

// gw[c] = sum_r gy * xhat, gb[c] = sum_r gy: blocks of 32 columns x 8 row phases; each thread sums
// its rows in order, then the 8 phases are added in order in shared memory.
constexpr int kNormColThreads = 32, kNormRowPhases = 8;

template <class T>
__global__ void norm_param_grad_kernel(const T* __restrict__ x, const norm_stat_t<T>* __restrict__ mean,
                                       const norm_stat_t<T>* __restrict__ rstd, const T* __restrict__ gy,
                                       T* __restrict__ gw, T* __restrict__ gb, int64_t rows, int64_t cols, bool rms) {
  using C = calc_t<T>;
  __shared__ C sw[kNormRowPhases][kNormColThreads];
  __shared__ C sb[kNormRowPhases][kNormColThreads];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kNormColThreads + threadIdx.x;
  C aw = 0, ab = 0;
  if (c < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += kNormRowPhases) {
      const C gv = to_calc<T>(gy[r * cols + c]);
      const C m = rms ? C(0) : static_cast<C>(mean[r]);
      aw += gv * ((to_calc<T>(x[r * cols + c]) - m) * static_cast<C>(rstd[r]));
      ab += gv;
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    C tw = 0, tb = 0;
    for (int p = 0; p < kNormRowPhases; ++p) {
      tw += sw[p][threadIdx.x];
      tb += sb[p][threadIdx.x];
    }
    if (gw) gw[c] = from_calc<T>(tw);
    if (gb) gb[c] = from_calc<T>(tb);
  }
}

}  // namespace
}  // namespace ember::cuda_impl
#endif  // __CUDACC__
