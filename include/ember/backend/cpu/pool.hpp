#pragma once
// CPU max and average pooling, NCHW, threaded over the (n, c) planes with parallel_for: each plane
// is computed by one thread with the same arithmetic, so the results never depend on the thread
// count. The window bounds of every output row and column are computed once per call (not once
// per output element), which is most of the work for small windows.
#include <algorithm>
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

template <class T>
void max_pool2d_forward(const Pool2dArgs& p, const T* x, T* y, int64_t* indices) {
  using C = calc_t<T>;
  const pool_detail::PoolWindows wy(p, true), wx(p, false);
  const int64_t L = p.out_h * p.out_w;
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
