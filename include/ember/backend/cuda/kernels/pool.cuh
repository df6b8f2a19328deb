#pragma once
// CUDA pooling kernels, NCHW, with the window rules of backend/pool_math.hpp (shared with the
// CPU kernels). Backward passes gather over the windows that contain each input element (no
// atomics, deterministic).
#if defined(__CUDACC__)
#include "ember/backend/cuda/kernels/common.cuh"
#include "ember/backend/cuda/kernels/launch.cuh"
#include "ember/backend/pool_math.hpp"

namespace ember::cuda_impl {
namespace {

// Output indices along one axis whose window may contain input index i: [lo, hi].
__device__ __forceinline__ void covering_outputs(const Pool2dArgs& p, bool rows, int64_t i, int64_t& lo, int64_t& hi) {
  const int64_t out = rows ? p.out_h : p.out_w;
  if (p.adaptive) {  // few outputs: let the caller test each
    lo = 0;
    hi = out - 1;
    return;
  }
  const int64_t k = rows ? p.kh : p.kw, s = rows ? p.stride_h : p.stride_w, pad = rows ? p.pad_h : p.pad_w;
  // o*s - pad <= i < o*s - pad + k  <=>  (i + pad - k) / s < o <= (i + pad) / s
  const int64_t num = i + pad - k + 1;
  lo = num <= 0 ? 0 : (num + s - 1) / s;
  hi = (i + pad) / s;
  if (hi > out - 1) hi = out - 1;
}

// Output element o (flat over [n*c, out_h, out_w]): its plane nc, and the input rows [y0, y1) and
// columns [x0, x1) its window spans (not yet clipped to the input).
struct OutputWindow {
  int64_t nc, y0, y1, x0, x1;
};
__device__ __forceinline__ OutputWindow output_window(const Pool2dArgs& p, int64_t o) {
  const int64_t ox = o % p.out_w, oy = (o / p.out_w) % p.out_h;
  OutputWindow w;
  w.nc = o / (p.out_w * p.out_h);
  pool_math::window(p, true, oy, w.y0, w.y1);
  pool_math::window(p, false, ox, w.x0, w.x1);
  return w;
}

template <class T>
__global__ void max_pool2d_forward_kernel(Pool2dArgs p, const T* x, T* y, int64_t* indices) {
  using C = calc_t<T>;
  const int64_t total = p.n * p.c * p.out_h * p.out_w;
  EMBER_GRID_STRIDE_LOOP(o, total) {
    const auto [nc, y0, y1, x0, x1] = output_window(p, o);
    const T* xp = x + nc * p.h * p.w;
    C best = C(0);
    int64_t arg = -1;
    for (int64_t iy = max(y0, int64_t{0}); iy < min(y1, p.h); ++iy)
      for (int64_t ix = max(x0, int64_t{0}); ix < min(x1, p.w); ++ix) {
        const C v = to_calc(xp[iy * p.w + ix]);
        if (arg < 0 || (!math::isnan_(best) && (v > best || math::isnan_(v)))) {
          best = v;
          arg = iy * p.w + ix;
        }
      }
    y[o] = from_calc<T>(arg < 0 ? C(-INFINITY) : best);
    indices[o] = arg;
  }
}

template <class T>
__global__ void max_pool2d_backward_kernel(Pool2dArgs p, const T* gy, const int64_t* indices, T* gx) {
  using C = calc_t<T>;
  const int64_t total = p.n * p.c * p.h * p.w;
  EMBER_GRID_STRIDE_LOOP(i, total) {
    const int64_t ix = i % p.w, iy = (i / p.w) % p.h, nc = i / (p.w * p.h);
    const int64_t self = iy * p.w + ix;
    int64_t oy0, oy1, ox0, ox1;
    covering_outputs(p, true, iy, oy0, oy1);
    covering_outputs(p, false, ix, ox0, ox1);
    C acc = C(0);
    for (int64_t oy = oy0; oy <= oy1; ++oy)
      for (int64_t ox = ox0; ox <= ox1; ++ox) {
        const int64_t o = (nc * p.out_h + oy) * p.out_w + ox;
        if (indices[o] == self) acc += to_calc(gy[o]);
      }
    gx[i] = from_calc<T>(acc);
  }
}

template <class T>
__global__ void avg_pool2d_forward_kernel(Pool2dArgs p, const T* x, T* y) {
  using C = calc_t<T>;
  using Acc = std::conditional_t<std::is_same_v<C, double>, double, float>;
  const int64_t total = p.n * p.c * p.out_h * p.out_w;
  EMBER_GRID_STRIDE_LOOP(o, total) {
    const auto [nc, y0, y1, x0, x1] = output_window(p, o);
    const T* xp = x + nc * p.h * p.w;
    Acc s = 0;
    for (int64_t iy = max(y0, int64_t{0}); iy < min(y1, p.h); ++iy)
      for (int64_t ix = max(x0, int64_t{0}); ix < min(x1, p.w); ++ix) s += static_cast<Acc>(to_calc(xp[iy * p.w + ix]));
    y[o] = from_calc<T>(static_cast<C>(s / static_cast<Acc>(pool_math::avg_divisor(p, y0, y1, x0, x1))));
  }
}

template <class T>
__global__ void avg_pool2d_backward_kernel(Pool2dArgs p, const T* gy, T* gx) {
  using C = calc_t<T>;
  const int64_t total = p.n * p.c * p.h * p.w;
  EMBER_GRID_STRIDE_LOOP(i, total) {
    const int64_t ix = i % p.w, iy = (i / p.w) % p.h, nc = i / (p.w * p.h);
    int64_t oy0, oy1, ox0, ox1;
    covering_outputs(p, true, iy, oy0, oy1);
    covering_outputs(p, false, ix, ox0, ox1);
    C acc = C(0);
    for (int64_t oy = oy0; oy <= oy1; ++oy) {
      int64_t y0, y1;
      pool_math::window(p, true, oy, y0, y1);
      if (iy < y0 || iy >= y1) continue;
      for (int64_t ox = ox0; ox <= ox1; ++ox) {
        int64_t x0, x1;
        pool_math::window(p, false, ox, x0, x1);
        if (ix < x0 || ix >= x1) continue;
        acc += to_calc(gy[(nc * p.out_h + oy) * p.out_w + ox]) / static_cast<C>(pool_math::avg_divisor(p, y0, y1, x0, x1));
      }
    }
    gx[i] = from_calc<T>(acc);
  }
}

// The kernel table's pooling entries: one thread per element of the output (forward) or of the
// input (backward), floating dtypes.
inline void launch_max_pool2d_forward(const LaunchContext& c, const Pool2dArgs& p, const void* x, void* y,
                                      int64_t* indices) {
  const int64_t total = p.n * p.c * p.out_h * p.out_w;
  launch_typed<Elements::Floating>(c, p.dtype, total, "max_pool2d", [&](auto tag) {
    using T = decltype(tag);
    max_pool2d_forward_kernel<T><<<grid_for(total, c.sm_count), kThreads, 0, c.stream>>>(
        p, static_cast<const T*>(x), static_cast<T*>(y), indices);
  });
}
inline void launch_max_pool2d_backward(const LaunchContext& c, const Pool2dArgs& p, const void* gy,
                                       const int64_t* indices, void* gx) {
  const int64_t total = p.n * p.c * p.h * p.w;
  launch_typed<Elements::Floating>(c, p.dtype, total, "max_pool2d_backward", [&](auto tag) {
    using T = decltype(tag);
    max_pool2d_backward_kernel<T><<<grid_for(total, c.sm_count), kThreads, 0, c.stream>>>(
        p, static_cast<const T*>(gy), indices, static_cast<T*>(gx));
  });
}
inline void launch_avg_pool2d_forward(const LaunchContext& c, const Pool2dArgs& p, const void* x, void* y) {
  const int64_t total = p.n * p.c * p.out_h * p.out_w;
  launch_typed<Elements::Floating>(c, p.dtype, total, "avg_pool2d", [&](auto tag) {
    using T = decltype(tag);
    avg_pool2d_forward_kernel<T><<<grid_for(total, c.sm_count), kThreads, 0, c.stream>>>(
        p, static_cast<const T*>(x), static_cast<T*>(y));
  });
}
inline void launch_avg_pool2d_backward(const LaunchContext& c, const Pool2dArgs& p, const void* gy, void* gx) {
  const int64_t total = p.n * p.c * p.h * p.w;
  launch_typed<Elements::Floating>(c, p.dtype, total, "avg_pool2d_backward", [&](auto tag) {
    using T = decltype(tag);
    avg_pool2d_backward_kernel<T><<<grid_for(total, c.sm_count), kThreads, 0, c.stream>>>(
        p, static_cast<const T*>(gy), static_cast<T*>(gx));
  });
}

}  // namespace
}  // namespace ember::cuda_impl
#endif  // __CUDACC__
