#pragma once
// CPU max and average pooling, NCHW, threaded over the (n, c) planes with parallel_for: each plane
// is computed by one thread with the same arithmetic, so the results never depend on the thread
// count. The window bounds of every output row and column are computed once per call (not once
// per output element), which is most of the work for small windows.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "ember/backend/cpu/elementwise.hpp"
#include "ember/backend/cpu/parallel.hpp"
#include "ember/backend/pool_math.hpp"

namespace ember::cpu {

// Not cpu::detail: that would hide ember::detail from the `detail::` lookups of other CPU headers.
namespace pool_detail {

// Clipped window [lo, hi) of each output position along one axis, plus the unclipped bounds
// (average pooling's divisor counts padding).
struct PoolWindows {
  std::vector<int64_t> lo, hi, raw_lo, raw_hi;
  PoolWindows(const Pool2dArgs& p, bool rows) {
    const int64_t n = rows ? p.out_h : p.out_w, extent = rows ? p.h : p.w;
    lo.resize(static_cast<size_t>(n));
    hi.resize(static_cast<size_t>(n));
    raw_lo.resize(static_cast<size_t>(n));
    raw_hi.resize(static_cast<size_t>(n));
    for (int64_t o = 0; o < n; ++o) {
      int64_t a, b;
      pool_math::window(p, rows, o, a, b);
      const auto i = static_cast<size_t>(o);
      raw_lo[i] = a;
      raw_hi[i] = b;
      lo[i] = std::max<int64_t>(a, 0);
      hi[i] = std::max(lo[i], std::min(b, extent));
    }
  }
};

// Planes per parallel_for chunk: about kGrainElementwise input elements.
inline int64_t pool_grain(const Pool2dArgs& p) { return row_grain(p.h * p.w); }

}  // namespace pool_detail

// Max pooling where every window lies inside the input (no padding reached, not adaptive: the
// common kernel-2 stride-2 case) and a plane's offsets fit in int32. An output row at a time, tap
// by tap in the window's row-major order, with selects over the row: the same first-maximum and
// nan rules as the general loop below and the same results and indices, but branch-free and
// vectorised. The per-element branch on `v > best`, a coin toss on real activations, made the
// general loop 3x slower: kernel-2 pooling of 64x32x28x28 and 64x64x14x14, 1 thread, 17.5-21.1
// against 5.2-7.9 ms (interleaved; it was 20-29% of the CNN training step in bench_vs_torch).
// kStrideW: the width stride as a constant (1 or 2, so that the loads over a row vectorise), or 0
// for any other, read from p.
template <class T, int32_t kStrideW>
void max_pool2d_forward_full_windows(const Pool2dArgs& p, const T* x, T* y, int64_t* indices) {
  using C = calc_t<T>;
  parallel_for(0, p.n * p.c, pool_detail::pool_grain(p), [&p, x, y, indices](int64_t lo, int64_t hi) {
    // Locals, not captures: read through the closure, the sizes would be reloaded after every
    // store and the row loops would not vectorise.
    const int64_t L = p.out_h * p.out_w, P = p.h * p.w;
    const auto W = static_cast<int32_t>(p.w), OW = static_cast<int32_t>(p.out_w), OH = static_cast<int32_t>(p.out_h);
    const auto sh = static_cast<int32_t>(p.stride_h);
    const int32_t sw = kStrideW > 0 ? kStrideW : static_cast<int32_t>(p.stride_w);
    const auto kh = static_cast<int32_t>(p.kh), kw = static_cast<int32_t>(p.kw);
    std::vector<C> best_row(static_cast<size_t>(OW));
    std::vector<int32_t> arg_row(static_cast<size_t>(OW));
    C* __restrict best = best_row.data();
    int32_t* __restrict arg = arg_row.data();
    for (int64_t nc = lo; nc < hi; ++nc) {
      const T* xp = x + nc * P;
      for (int32_t oy = 0; oy < OH; ++oy) {
        const int32_t first = oy * sh * W;
        for (int32_t ox = 0; ox < OW; ++ox) {
          best[ox] = static_cast<C>(xp[first + ox * sw]);
          arg[ox] = first + ox * sw;
        }
        for (int32_t ky = 0; ky < kh; ++ky)
          for (int32_t kx = ky == 0 ? 1 : 0; kx < kw; ++kx) {
            const int32_t off = first + ky * W + kx;
            const T* __restrict xr = xp + off;
            for (int32_t ox = 0; ox < OW; ++ox) {
              const C v = static_cast<C>(xr[ox * sw]), b = best[ox];
              // The first maximum wins; a nan wins over numbers and then stays (torch's rule).
              const bool take = (b == b) & ((v > b) | (v != v));
              best[ox] = take ? v : b;
              arg[ox] = take ? off + ox * sw : arg[ox];
            }
          }
        T* yr = y + nc * L + static_cast<int64_t>(oy) * OW;
        int64_t* ir = indices + nc * L + static_cast<int64_t>(oy) * OW;
        for (int32_t ox = 0; ox < OW; ++ox) {
          yr[ox] = from_calc<T>(best[ox]);
          ir[ox] = arg[ox];
        }
      }
    }
  });
}

template <class T>
void max_pool2d_forward(const Pool2dArgs& p, const T* x, T* y, int64_t* indices) {
  using C = calc_t<T>;
  const pool_detail::PoolWindows wy(p, true), wx(p, false);
  const int64_t L = p.out_h * p.out_w;
  const auto unclipped = [](const pool_detail::PoolWindows& w) {
    return w.lo == w.raw_lo && w.hi == w.raw_hi;
  };
  if (!p.adaptive && p.kh >= 1 && p.kw >= 1 && p.out_h > 0 && p.out_w > 0 && unclipped(wy) && unclipped(wx) &&
      p.h * p.w <= std::numeric_limits<int32_t>::max()) {
    if (p.stride_w == 2) max_pool2d_forward_full_windows<T, 2>(p, x, y, indices);
    else if (p.stride_w == 1) max_pool2d_forward_full_windows<T, 1>(p, x, y, indices);
    else max_pool2d_forward_full_windows<T, 0>(p, x, y, indices);
    return;
  }
  parallel_for(0, p.n * p.c, pool_detail::pool_grain(p), [&](int64_t lo, int64_t hi) {
    for (int64_t nc = lo; nc < hi; ++nc) {
      const T* xp = x + nc * p.h * p.w;
      for (int64_t oy = 0; oy < p.out_h; ++oy) {
        const int64_t y0 = wy.lo[static_cast<size_t>(oy)], y1 = wy.hi[static_cast<size_t>(oy)];
        for (int64_t ox = 0; ox < p.out_w; ++ox) {
          const int64_t x0 = wx.lo[static_cast<size_t>(ox)], x1 = wx.hi[static_cast<size_t>(ox)];
          C best = -std::numeric_limits<C>::infinity();
          int64_t arg = -1;
          for (int64_t iy = y0; iy < y1; ++iy)
            for (int64_t ix = x0; ix < x1; ++ix) {
              const C v = static_cast<C>(xp[iy * p.w + ix]);
              // The first maximum wins; a nan wins over numbers and then stays (torch's rule).
              if (arg < 0 || (!math::isnan_(best) && (v > best || math::isnan_(v)))) {
                best = v;
                arg = iy * p.w + ix;
              }
            }
          const int64_t o = nc * L + oy * p.out_w + ox;
          y[o] = from_calc<T>(best);
          indices[o] = arg;
        }
      }
    }
  });
}

// gx = 0, then gx[index] += gy per output. Windows that overlap (stride < kernel) can send two
// outputs to one input; they stay in one plane, so a plane's sums keep their serial order.
template <class T>
void max_pool2d_backward(const Pool2dArgs& p, const T* gy, const int64_t* indices, T* gx) {
  using C = calc_t<T>;
  const int64_t L = p.out_h * p.out_w, P = p.h * p.w;
  parallel_for(0, p.n * p.c, pool_detail::pool_grain(p), [&](int64_t lo, int64_t hi) {
    fill(gx + lo * P, (hi - lo) * P, 0.0);
    for (int64_t nc = lo; nc < hi; ++nc) {
      T* gp = gx + nc * P;
      const int64_t* ip = indices + nc * L;
      const T* g = gy + nc * L;
      for (int64_t o = 0; o < L; ++o) {
        const int64_t i = ip[o];
        if (i < 0) continue;
        gp[i] = from_calc<T>(static_cast<C>(gp[i]) + static_cast<C>(g[o]));
      }
    }
  });
}

template <class T>
void avg_pool2d_forward(const Pool2dArgs& p, const T* x, T* y) {
  using C = calc_t<T>;
  const pool_detail::PoolWindows wy(p, true), wx(p, false);
  parallel_for(0, p.n * p.c, pool_detail::pool_grain(p), [&](int64_t lo, int64_t hi) {
    for (int64_t nc = lo; nc < hi; ++nc) {
      const T* xp = x + nc * p.h * p.w;
      for (int64_t oy = 0; oy < p.out_h; ++oy) {
        const auto sy = static_cast<size_t>(oy);
        for (int64_t ox = 0; ox < p.out_w; ++ox) {
          const auto sx = static_cast<size_t>(ox);
          double s = 0;
          for (int64_t iy = wy.lo[sy]; iy < wy.hi[sy]; ++iy)
            for (int64_t ix = wx.lo[sx]; ix < wx.hi[sx]; ++ix) s += static_cast<double>(static_cast<C>(xp[iy * p.w + ix]));
          const double div =
              static_cast<double>(pool_math::avg_divisor(p, wy.raw_lo[sy], wy.raw_hi[sy], wx.raw_lo[sx], wx.raw_hi[sx]));
          y[nc * p.out_h * p.out_w + oy * p.out_w + ox] = from_calc<T>(static_cast<C>(s / div));
        }
      }
    }
  });
}

template <class T>
void avg_pool2d_backward(const Pool2dArgs& p, const T* gy, T* gx) {
  using C = calc_t<T>;
  const pool_detail::PoolWindows wy(p, true), wx(p, false);
  const int64_t P = p.h * p.w;
  parallel_for(0, p.n * p.c, pool_detail::pool_grain(p), [&](int64_t lo, int64_t hi) {
    fill(gx + lo * P, (hi - lo) * P, 0.0);
    for (int64_t nc = lo; nc < hi; ++nc) {
      T* gp = gx + nc * P;
      for (int64_t oy = 0; oy < p.out_h; ++oy) {
        const auto sy = static_cast<size_t>(oy);
        for (int64_t ox = 0; ox < p.out_w; ++ox) {
          const auto sx = static_cast<size_t>(ox);
          const C g = static_cast<C>(gy[nc * p.out_h * p.out_w + oy * p.out_w + ox]) /
                      static_cast<C>(pool_math::avg_divisor(p, wy.raw_lo[sy], wy.raw_hi[sy], wx.raw_lo[sx], wx.raw_hi[sx]));
          for (int64_t iy = wy.lo[sy]; iy < wy.hi[sy]; ++iy)
            for (int64_t ix = wx.lo[sx]; ix < wx.hi[sx]; ++ix) {
              T& d = gp[iy * p.w + ix];
              d = from_calc<T>(static_cast<C>(d) + g);
            }
        }
      }
    }
  });
}

}  // namespace ember::cpu
