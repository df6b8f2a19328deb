#pragma once
// Fused layer norm / RMSNorm (core/backend.hpp NormArgs) with the CPU's semantics
// (backend/cpu/norm.hpp): a warp per row for rows of up to kWarpMaxCols columns, else a block per
// row (the RowGroup and group_reduce of softmax.cuh). Forward: per-thread Welford statistics
// merged across the group with Chan's formula (one read of x for the statistics), then y.
// Backward: the two row sums, then gx (a warp per row keeps its row in registers between the
// passes, the forward too); the weight and bias gradients by a second kernel that sums
// columns over rows in a fixed order (deterministic, no atomics). Statistics and sums in float
// (double for fp64).
#if defined(__CUDACC__)
#include "ember/backend/cuda/kernels/common.cuh"
#include "ember/backend/cuda/kernels/launch.cuh"
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
  if constexpr (!kBlock) {
    // A warp per row of at most kWarpMaxCols: x read once into registers (lane l holds columns
    // l, l + 32, ...), not once for the statistics and again for y; the operations and their
    // order are those of the block-per-row path below.
    constexpr int K = static_cast<int>(kWarpMaxCols / 32);
    for (int64_t r = g.first; r < rows; r += g.step) {
      const T* xr = x + r * cols;
      T* yr = y + r * cols;
      C v[K];
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int64_t c = g.lane + 32 * k;
        v[k] = c < cols ? to_calc<T>(xr[c]) : C(0);
      }
      S mu = 0, var = 0;
      const C k0 = rms ? C(0) : to_calc<T>(xr[0]);
      if (rms) {
        S sq = 0;
#pragma unroll
        for (int k = 0; k < K; ++k) {
          if (g.lane + 32 * k < cols) {
            const S u = static_cast<S>(v[k]);
            sq += u * u;
          }
        }
        sq = group_reduce<false>(sq, SumOp{}, S(0), ssm);
        var = sq / static_cast<S>(cols);
      } else {
        const S ks = static_cast<S>(k0);
        Welford<S> st{S(0), S(0), S(0)};
#pragma unroll
        for (int k = 0; k < K; ++k) {
          if (g.lane + 32 * k < cols) {
            const S u = static_cast<S>(v[k]) - ks;
            st.n += S(1);
            const S d = u - st.mean;
            st.mean += d / st.n;
            st.m2 += d * (u - st.mean);
          }
        }
        st = group_welford<false>(st, wsm);
        mu = st.mean;
        var = st.m2 / static_cast<S>(cols);
      }
      const S rs = S(1) / sqrt(var + static_cast<S>(eps));
      if (g.lane == 0) {
        if (mean) mean[r] = static_cast<S>(k0) + mu;
        rstd[r] = rs;
      }
      const C m = static_cast<C>(mu), sc = static_cast<C>(rs);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int64_t c = g.lane + 32 * k;
        if (c < cols) {
          C o = ((v[k] - k0) - m) * sc;
          if (w) o = o * to_calc<T>(w[c]);
          if (b) o = o + to_calc<T>(b[c]);
          yr[c] = from_calc<T>(o);
        }
      }
    }
  } else {
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
}

template <class T, bool kBlock>
__global__ void norm_backward_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                     const norm_stat_t<T>* __restrict__ mean, const norm_stat_t<T>* __restrict__ rstd,
                                     const T* __restrict__ gy, T* __restrict__ gx, int64_t rows, int64_t cols,
                                     bool rms) {
  using C = calc_t<T>;
  __shared__ C smem[32];
  const RowGroup<kBlock> g;
  if constexpr (!kBlock) {
    // As the forward: x and gy (times w) read once into registers; same operations, same order.
    constexpr int K = static_cast<int>(kWarpMaxCols / 32);
    for (int64_t r = g.first; r < rows; r += g.step) {
      const T* xr = x + r * cols;
      const T* gr = gy + r * cols;
      T* out = gx + r * cols;
      const C m = rms ? C(0) : static_cast<C>(mean[r]);
      const C s = static_cast<C>(rstd[r]);
      C xh[K], gv[K];
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int64_t c = g.lane + 32 * k;
        xh[k] = c < cols ? (to_calc<T>(xr[c]) - m) * s : C(0);
        gv[k] = c < cols ? to_calc<T>(gr[c]) * (w ? to_calc<T>(w[c]) : C(1)) : C(0);
      }
      C sg = 0, sgx = 0;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (g.lane + 32 * k < cols) {
          sg += gv[k];
          sgx += gv[k] * xh[k];
        }
      }
      sg = group_reduce<false>(sg, SumOp{}, C(0), smem);
      sgx = group_reduce<false>(sgx, SumOp{}, C(0), smem);
      const C inv_n = C(1) / static_cast<C>(cols);
      const C mg = rms ? C(0) : sg * inv_n, mgx = sgx * inv_n;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int64_t c = g.lane + 32 * k;
        if (c < cols) out[c] = from_calc<T>(s * (gv[k] - mg - xh[k] * mgx));
      }
    }
  } else {
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
}

// The row kernels' launches (the backend's norm_forward / norm_backward): a warp or a block per
// row. (Rows as 16-byte packs with fewer registers: commit 9c46403, waiting for a GPU run.)
template <class T>
inline void launch_norm_forward(const T* x, const T* w, const T* b, T* y, norm_stat_t<T>* mean,
                                norm_stat_t<T>* rstd, int64_t rows, int64_t cols, double eps, bool rms, int sm_count,
                                cudaStream_t stream) {
  const SoftmaxLaunch l = softmax_launch(rows, cols, sm_count);
  if (l.block_per_row) {
    norm_forward_kernel<T, true><<<l.grid, l.threads, 0, stream>>>(x, w, b, y, mean, rstd, rows, cols, eps, rms);
  } else {
    norm_forward_kernel<T, false><<<l.grid, l.threads, 0, stream>>>(x, w, b, y, mean, rstd, rows, cols, eps, rms);
  }
}
template <class T>
inline void launch_norm_backward(const T* x, const T* w, const norm_stat_t<T>* mean, const norm_stat_t<T>* rstd,
                                 const T* gy, T* gx, int64_t rows, int64_t cols, bool rms, int sm_count,
                                 cudaStream_t stream) {
  const SoftmaxLaunch l = softmax_launch(rows, cols, sm_count);
  if (l.block_per_row) {
    norm_backward_kernel<T, true><<<l.grid, l.threads, 0, stream>>>(x, w, mean, rstd, gy, gx, rows, cols, rms);
  } else {
    norm_backward_kernel<T, false><<<l.grid, l.threads, 0, stream>>>(x, w, mean, rstd, gy, gx, rows, cols, rms);
  }
}

// gw[c] = sum_r gy * xhat, gb[c] = sum_r gy: blocks of 32 columns x 8 row phases over a chunk of
// rows (blockIdx.y); each thread sums its rows in order, then the 8 phases are added in order in
// shared memory. With one chunk the block writes gw/gb; with several (rows split so that the grid
// fills the GPU: 32 blocks for 1024 columns left most of the H200's 132 SMs idle) each
// writes its partial sums to pw/pb [chunks, cols], which norm_param_grad_finish_kernel adds in
// chunk order. The order is fixed for a shape and device: deterministic, no atomics.
constexpr int kNormColThreads = 32, kNormRowPhases = 8;

template <class T>
__global__ void norm_param_grad_kernel(const T* __restrict__ x, const norm_stat_t<T>* __restrict__ mean,
                                       const norm_stat_t<T>* __restrict__ rstd, const T* __restrict__ gy,
                                       T* __restrict__ gw, T* __restrict__ gb, calc_t<T>* __restrict__ pw,
                                       calc_t<T>* __restrict__ pb, int64_t rows, int64_t cols, int64_t chunk,
                                       bool rms) {
  using C = calc_t<T>;
  __shared__ C sw[kNormRowPhases][kNormColThreads];
  __shared__ C sb[kNormRowPhases][kNormColThreads];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kNormColThreads + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t r1 = r0 + chunk < rows ? r0 + chunk : rows;
  C aw = 0, ab = 0;
  if (c < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kNormRowPhases) {
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
    if (pw) {
      pw[blockIdx.y * cols + c] = tw;
      pb[blockIdx.y * cols + c] = tb;
    } else {
      if (gw) gw[c] = from_calc<T>(tw);
      if (gb) gb[c] = from_calc<T>(tb);
    }
  }
}

template <class T>
__global__ void norm_param_grad_finish_kernel(const calc_t<T>* __restrict__ pw, const calc_t<T>* __restrict__ pb,
                                              T* __restrict__ gw, T* __restrict__ gb, int64_t chunks, int64_t cols) {
  using C = calc_t<T>;
  EMBER_GRID_STRIDE_LOOP(c, cols) {
    C tw = 0, tb = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      tw += pw[k * cols + c];
      tb += pb[k * cols + c];
    }
    if (gw) gw[c] = from_calc<T>(tw);
    if (gb) gb[c] = from_calc<T>(tb);
  }
}

// Rows per chunk: enough blocks to fill the GPU a few times over, at least 64 rows per chunk.
inline int64_t norm_param_grad_chunk(int64_t rows, int64_t cols, int sm_count) {
  const int64_t col_blocks = (cols + kNormColThreads - 1) / kNormColThreads;
  const int64_t target = static_cast<int64_t>(sm_count > 0 ? sm_count : 1) * 4;
  int64_t chunks = (target + col_blocks - 1) / col_blocks;
  const int64_t most = (rows + 63) / 64;
  if (chunks > most) chunks = most;
  if (chunks > 65535) chunks = 65535;
  if (chunks < 1) chunks = 1;
  return (rows + chunks - 1) / chunks;
}

// gw and gb (either may be null; zeros when there are no rows): one pass of norm_param_grad_kernel
// when the rows fit one chunk, else partial sums per chunk in scratch memory and the finishing pass.
template <class T>
inline void launch_norm_param_grad(const LaunchContext& c, const NormArgs& a, const T* xt,
                                   const norm_stat_t<T>* mt, const norm_stat_t<T>* rt, const T* gyt, void* gw,
                                   void* gb) {
  using C = calc_t<T>;
  const unsigned blocks = static_cast<unsigned>((a.cols + kNormColThreads - 1) / kNormColThreads);
  const int64_t chunk = a.rows > 0 ? norm_param_grad_chunk(a.rows, a.cols, c.sm_count) : 1;
  const int64_t chunks = a.rows > 0 ? (a.rows + chunk - 1) / chunk : 1;
  const dim3 grid(blocks, static_cast<unsigned>(chunks)), block(kNormColThreads, kNormRowPhases);
  if (chunks == 1) {
    norm_param_grad_kernel<T><<<grid, block, 0, c.stream>>>(xt, mt, rt, gyt, static_cast<T*>(gw),
                                                            static_cast<T*>(gb), nullptr, nullptr, a.rows, a.cols,
                                                            chunk, a.rms);
    EMBER_CUDA_CHECK_LAUNCH();
  } else {
    const size_t bytes = static_cast<size_t>(2 * chunks * a.cols) * sizeof(C);
    C* pw = static_cast<C*>(c.scratch(bytes));
    C* pb = pw + chunks * a.cols;
    norm_param_grad_kernel<T><<<grid, block, 0, c.stream>>>(xt, mt, rt, gyt, nullptr, nullptr, pw, pb, a.rows,
                                                            a.cols, chunk, a.rms);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) {
      norm_param_grad_finish_kernel<T><<<grid_for(a.cols, c.sm_count), kThreads, 0, c.stream>>>(
          pw, pb, static_cast<T*>(gw), static_cast<T*>(gb), chunks, a.cols);
      e = cudaGetLastError();
    }
    c.release(pw, bytes);
    ::ember::cuda::internal::check_cuda(e, "norm_param_grad kernel launch", __FILE__, __LINE__);
  }
}

// The kernel table's norm_forward and norm_backward: the typed launches above for a floating dtype.
inline void launch_norm_forward(const LaunchContext& c, const NormArgs& a, const void* x, const void* w,
                                const void* b, void* y, void* mean, void* rstd) {
  dispatch_floating(a.dtype, a.rms ? "rms_norm" : "layer_norm", c.device, [&](auto tag) {
    using T = decltype(tag);
    using S = norm_stat_t<T>;
    if (a.rows <= 0 || a.cols <= 0) return;
    DeviceGuard g(c.device);
    launch_norm_forward<T>(static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(b),
                           static_cast<T*>(y), static_cast<S*>(mean), static_cast<S*>(rstd), a.rows, a.cols, a.eps,
                           a.rms, c.sm_count, c.stream);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}
inline void launch_norm_backward(const LaunchContext& c, const NormArgs& a, const void* x, const void* w,
                                 const void* mean, const void* rstd, const void* gy, void* gx, void* gw, void* gb) {
  dispatch_floating(a.dtype, a.rms ? "rms_norm_backward" : "layer_norm_backward", c.device, [&](auto tag) {
    using T = decltype(tag);
    using S = norm_stat_t<T>;
    if (a.cols <= 0) return;
    DeviceGuard g(c.device);
    if (a.rows > 0) {
      launch_norm_backward<T>(static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const S*>(mean),
                              static_cast<const S*>(rstd), static_cast<const T*>(gy), static_cast<T*>(gx), a.rows,
                              a.cols, a.rms, c.sm_count, c.stream);
      EMBER_CUDA_CHECK_LAUNCH();
    }
    if (gw || gb)
      launch_norm_param_grad<T>(c, a, static_cast<const T*>(x), static_cast<const S*>(mean),
                                static_cast<const S*>(rstd), static_cast<const T*>(gy), gw, gb);
  });
}

}  // namespace
}  // namespace ember::cuda_impl
#endif  // __CUDACC__
