#pragma once
// CPU reference convolution (im2col + GEMM) and pooling kernels, NCHW layout.
#include <algorithm>
#include <limits>
#include <vector>

#include "ember/backend/cpu/elementwise.hpp"
#include "ember/backend/cpu/gemm.hpp"
#include "ember/backend/pool_math.hpp"

namespace ember::cpu {

// cols[(c*kh + i)*kw + j][oy*ow + ox] = x[c][oy*sh - ph + i*dh][ox*sw - pw + j*dw] (0 outside).
template <class T>
void im2col(const T* x, T* cols, int64_t c, int64_t h, int64_t w, const Conv2dArgs& a) {
  const int64_t L = a.out_h * a.out_w;
  for (int64_t ci = 0; ci < c; ++ci)
    for (int64_t i = 0; i < a.kh; ++i)
      for (int64_t j = 0; j < a.kw; ++j) {
        T* row = cols + ((ci * a.kh + i) * a.kw + j) * L;
        for (int64_t oy = 0; oy < a.out_h; ++oy) {
          const int64_t iy = oy * a.stride_h - a.pad_h + i * a.dil_h;
          for (int64_t ox = 0; ox < a.out_w; ++ox) {
            const int64_t ix = ox * a.stride_w - a.pad_w + j * a.dil_w;
            row[oy * a.out_w + ox] = (iy >= 0 && iy < h && ix >= 0 && ix < w) ? x[(ci * h + iy) * w + ix] : T(0);
          }
        }
      }
}

// The adjoint of im2col: x[c][iy][ix] += cols[...] (x initialised by the caller).
template <class T>
void col2im(const T* cols, T* x, int64_t c, int64_t h, int64_t w, const Conv2dArgs& a) {
  using C = calc_t<T>;
  const int64_t L = a.out_h * a.out_w;
  for (int64_t ci = 0; ci < c; ++ci)
    for (int64_t i = 0; i < a.kh; ++i)
      for (int64_t j = 0; j < a.kw; ++j) {
        const T* row = cols + ((ci * a.kh + i) * a.kw + j) * L;
        for (int64_t oy = 0; oy < a.out_h; ++oy) {
          const int64_t iy = oy * a.stride_h - a.pad_h + i * a.dil_h;
          if (iy < 0 || iy >= h) continue;
          for (int64_t ox = 0; ox < a.out_w; ++ox) {
            const int64_t ix = ox * a.stride_w - a.pad_w + j * a.dil_w;
            if (ix < 0 || ix >= w) continue;
            T& d = x[(ci * h + iy) * w + ix];
            d = from_calc<T>(static_cast<C>(d) + static_cast<C>(row[oy * a.out_w + ox]));
          }
        }
      }
}

template <class T>
struct ConvGeometry {
  int64_t cin_g, cout_g, K, L;
  explicit ConvGeometry(const Conv2dArgs& a)
      : cin_g(a.c_in / a.groups), cout_g(a.c_out / a.groups), K(a.c_in / a.groups * a.kh * a.kw), L(a.out_h * a.out_w) {}
};

inline GemmArgs gemm_args(DType t, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                          const void* b, int64_t ldb, void* c, int64_t ldc, double beta) {
  GemmArgs g;
  g.dtype = t;
  g.trans_a = ta;
  g.trans_b = tb;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = a;
  g.lda = lda;
  g.b = b;
  g.ldb = ldb;
  g.c = c;
  g.ldc = ldc;
  g.beta = beta;
  return g;
}

// Images are processed in chunks: the im2col columns of a whole chunk sit side by side, so each
// group does one large GEMM per chunk instead of one small GEMM per image (BLAS is far more
// efficient on the large one). A chunk's columns are kept under kConvChunkBytes.
inline constexpr int64_t kConvChunkBytes = int64_t{32} << 20;

template <class T>
int64_t conv_chunk(const Conv2dArgs& a, int64_t K, int64_t L) {
  const int64_t per_image = std::max<int64_t>(1, K * L * static_cast<int64_t>(sizeof(T)));
  return std::max<int64_t>(1, std::min(a.n, kConvChunkBytes / per_image));
}

// cols [K, nb*L] for images [n0, n0+nb) of group gr: image b's columns at offset b*L.
template <class T>
void im2col_chunk(const Conv2dArgs& a, const T* x, int64_t n0, int64_t nb, int64_t gr, const ConvGeometry<T>& g,
                  std::vector<T>& cols, std::vector<T>& tmp) {
  for (int64_t b = 0; b < nb; ++b) {
    im2col(x + ((n0 + b) * a.c_in + gr * g.cin_g) * a.h * a.w, tmp.data(), g.cin_g, a.h, a.w, a);
    for (int64_t k = 0; k < g.K; ++k)
      std::copy(tmp.begin() + k * g.L, tmp.begin() + (k + 1) * g.L, cols.begin() + k * nb * g.L + b * g.L);
  }
}

// y[n, co, oy, ox] = sum_{ci, i, j} w[co, ci, i, j] x[n, g*cin_g + ci, ...] (no bias).
template <class T>
void conv2d_forward(const Conv2dArgs& a, const T* x, const T* w, T* y) {
  ConvGeometry<T> g(a);
  const int64_t chunk = conv_chunk<T>(a, g.K, g.L);
  std::vector<T> cols(static_cast<size_t>(g.K * g.L * chunk)), tmp(static_cast<size_t>(g.K * g.L)),
      out(static_cast<size_t>(g.cout_g * g.L * chunk));
  for (int64_t n0 = 0; n0 < a.n; n0 += chunk) {
    const int64_t nb = std::min(chunk, a.n - n0);
    for (int64_t gr = 0; gr < a.groups; ++gr) {
      im2col_chunk(a, x, n0, nb, gr, g, cols, tmp);
      // out [cout_g, nb*L] = W_g [cout_g, K] @ cols [K, nb*L]
      gemm(gemm_args(a.dtype, false, false, g.cout_g, nb * g.L, g.K, w + gr * g.cout_g * g.K, g.K, cols.data(),
                     nb * g.L, out.data(), nb * g.L, 0.0));
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t co = 0; co < g.cout_g; ++co)
          std::copy(out.begin() + co * nb * g.L + b * g.L, out.begin() + co * nb * g.L + (b + 1) * g.L,
                    y + ((n0 + b) * a.c_out + gr * g.cout_g + co) * g.L);
    }
  }
}

// gy of images [n0, n0+nb), group gr, gathered as [cout_g, nb*L].
template <class T>
void gather_gy(const Conv2dArgs& a, const T* gy, int64_t n0, int64_t nb, int64_t gr, const ConvGeometry<T>& g,
               std::vector<T>& out) {
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t co = 0; co < g.cout_g; ++co) {
      const T* src = gy + ((n0 + b) * a.c_out + gr * g.cout_g + co) * g.L;
      std::copy(src, src + g.L, out.begin() + co * nb * g.L + b * g.L);
    }
}

template <class T>
void conv2d_backward_input(const Conv2dArgs& a, const T* gy, const T* w, T* gx) {
  ConvGeometry<T> g(a);
  const int64_t chunk = conv_chunk<T>(a, g.K, g.L);
  std::vector<T> cols(static_cast<size_t>(g.K * g.L * chunk)), gyc(static_cast<size_t>(g.cout_g * g.L * chunk)),
      tmp(static_cast<size_t>(g.K * g.L));
  fill(gx, a.n * a.c_in * a.h * a.w, 0.0);
  for (int64_t n0 = 0; n0 < a.n; n0 += chunk) {
    const int64_t nb = std::min(chunk, a.n - n0);
    for (int64_t gr = 0; gr < a.groups; ++gr) {
      gather_gy(a, gy, n0, nb, gr, g, gyc);
      // cols [K, nb*L] = W_g^T [K, cout_g] @ gy_g [cout_g, nb*L]
      gemm(gemm_args(a.dtype, true, false, g.K, nb * g.L, g.cout_g, w + gr * g.cout_g * g.K, g.K, gyc.data(),
                     nb * g.L, cols.data(), nb * g.L, 0.0));
      for (int64_t b = 0; b < nb; ++b) {
        for (int64_t k = 0; k < g.K; ++k)
          std::copy(cols.begin() + k * nb * g.L + b * g.L, cols.begin() + k * nb * g.L + (b + 1) * g.L,
                    tmp.begin() + k * g.L);
        col2im(tmp.data(), gx + ((n0 + b) * a.c_in + gr * g.cin_g) * a.h * a.w, g.cin_g, a.h, a.w, a);
      }
    }
  }
}

template <class T>
void conv2d_backward_weight(const Conv2dArgs& a, const T* x, const T* gy, T* gw) {
  ConvGeometry<T> g(a);
  const int64_t chunk = conv_chunk<T>(a, g.K, g.L);
  std::vector<T> cols(static_cast<size_t>(g.K * g.L * chunk)), gyc(static_cast<size_t>(g.cout_g * g.L * chunk)),
      tmp(static_cast<size_t>(g.K * g.L));
  if (a.n == 0) fill(gw, a.c_out * g.K, 0.0);
  for (int64_t n0 = 0; n0 < a.n; n0 += chunk) {
    const int64_t nb = std::min(chunk, a.n - n0);
    for (int64_t gr = 0; gr < a.groups; ++gr) {
      im2col_chunk(a, x, n0, nb, gr, g, cols, tmp);
      gather_gy(a, gy, n0, nb, gr, g, gyc);
      // gW_g [cout_g, K] (+)= gy_g [cout_g, nb*L] @ cols^T [nb*L, K]
      gemm(gemm_args(a.dtype, false, true, g.cout_g, g.K, nb * g.L, gyc.data(), nb * g.L, cols.data(), nb * g.L,
                     gw + gr * g.cout_g * g.K, g.K, n0 == 0 ? 0.0 : 1.0));
    }
  }
}

template <class T>
void max_pool2d_forward(const Pool2dArgs& p, const T* x, T* y, int64_t* indices) {
  using C = calc_t<T>;
  for (int64_t nc = 0; nc < p.n * p.c; ++nc) {
    const T* xp = x + nc * p.h * p.w;
    for (int64_t oy = 0; oy < p.out_h; ++oy)
      for (int64_t ox = 0; ox < p.out_w; ++ox) {
        int64_t y0, y1, x0, x1;
        pool_math::window(p, true, oy, y0, y1);
        pool_math::window(p, false, ox, x0, x1);
        C best = -std::numeric_limits<C>::infinity();
        int64_t arg = -1;
        for (int64_t iy = std::max<int64_t>(y0, 0); iy < std::min(y1, p.h); ++iy)
          for (int64_t ix = std::max<int64_t>(x0, 0); ix < std::min(x1, p.w); ++ix) {
            C v = static_cast<C>(xp[iy * p.w + ix]);
            // The first maximum wins; a nan wins over numbers and then stays (torch's rule).
            if (arg < 0 || (!math::isnan_(best) && (v > best || math::isnan_(v)))) {
              best = v;
              arg = iy * p.w + ix;
            }
          }
        const int64_t o = nc * p.out_h * p.out_w + oy * p.out_w + ox;
        y[o] = from_calc<T>(best);
        indices[o] = arg;
      }
  }
}

template <class T>
void max_pool2d_backward(const Pool2dArgs& p, const T* gy, const int64_t* indices, T* gx) {
  using C = calc_t<T>;
  fill(gx, p.n * p.c * p.h * p.w, 0.0);
  const int64_t L = p.out_h * p.out_w;
  for (int64_t nc = 0; nc < p.n * p.c; ++nc)
    for (int64_t o = 0; o < L; ++o) {
      const int64_t i = indices[nc * L + o];
      if (i < 0) continue;
      T& d = gx[nc * p.h * p.w + i];
      d = from_calc<T>(static_cast<C>(d) + static_cast<C>(gy[nc * L + o]));
    }
}

template <class T>
void avg_pool2d_forward(const Pool2dArgs& p, const T* x, T* y) {
  using C = calc_t<T>;
  for (int64_t nc = 0; nc < p.n * p.c; ++nc) {
    const T* xp = x + nc * p.h * p.w;
    for (int64_t oy = 0; oy < p.out_h; ++oy)
      for (int64_t ox = 0; ox < p.out_w; ++ox) {
        int64_t y0, y1, x0, x1;
        pool_math::window(p, true, oy, y0, y1);
        pool_math::window(p, false, ox, x0, x1);
        double s = 0;
        for (int64_t iy = std::max<int64_t>(y0, 0); iy < std::min(y1, p.h); ++iy)
          for (int64_t ix = std::max<int64_t>(x0, 0); ix < std::min(x1, p.w); ++ix)
            s += static_cast<double>(static_cast<C>(xp[iy * p.w + ix]));
        y[nc * p.out_h * p.out_w + oy * p.out_w + ox] =
            from_calc<T>(static_cast<C>(s / static_cast<double>(pool_math::avg_divisor(p, y0, y1, x0, x1))));
      }
  }
}

template <class T>
void avg_pool2d_backward(const Pool2dArgs& p, const T* gy, T* gx) {
  using C = calc_t<T>;
  fill(gx, p.n * p.c * p.h * p.w, 0.0);
  for (int64_t nc = 0; nc < p.n * p.c; ++nc) {
    T* gp = gx + nc * p.h * p.w;
    for (int64_t oy = 0; oy < p.out_h; ++oy)
      for (int64_t ox = 0; ox < p.out_w; ++ox) {
        int64_t y0, y1, x0, x1;
        pool_math::window(p, true, oy, y0, y1);
        pool_math::window(p, false, ox, x0, x1);
        const C g = static_cast<C>(gy[nc * p.out_h * p.out_w + oy * p.out_w + ox]) /
                    static_cast<C>(pool_math::avg_divisor(p, y0, y1, x0, x1));
        for (int64_t iy = std::max<int64_t>(y0, 0); iy < std::min(y1, p.h); ++iy)
          for (int64_t ix = std::max<int64_t>(x0, 0); ix < std::min(x1, p.w); ++ix) {
            T& d = gp[iy * p.w + ix];
            d = from_calc<T>(static_cast<C>(d) + g);
          }
      }
  }
}

}  // namespace ember::cpu
