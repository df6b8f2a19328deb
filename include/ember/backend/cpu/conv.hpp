#pragma once
// CPU convolution, NCHW. Two paths, chosen per call by conv2d_forward / conv2d_backward_input /
// conv2d_backward_weight (the CPU backend's kernel-table entries; the rule and its measurement
// are at the end of this file and in docs/performance-conv.md):
//   - oneDNN (backend/cpu/onednn.hpp) for fp32 at more than one thread, when the build found it
//     (EMBER_HAVE_ONEDNN);
//   - im2col + GEMM (OpenBLAS sgemm/dgemm through gemm.hpp) otherwise: one thread, double
//     (gradient checks), half and bfloat16 (widened by the GEMM), builds without oneDNN, and any
//     problem oneDNN refuses. Images go through in chunks whose columns fit in the L2 cache; within a chunk the
//     im2col / col2im / copies are split over images with parallel_for, and the one GEMM per chunk
//     and group is threaded by the BLAS itself (a BLAS call from inside our threads would start a
//     second team on top of ours).
// Every path overwrites its output (y, gx, gw).
#include <algorithm>
#include <type_traits>
#include <vector>

#include "ember/backend/cpu/elementwise.hpp"
#include "ember/backend/cpu/gemm.hpp"
#include "ember/backend/cpu/onednn.hpp"
#include "ember/backend/cpu/parallel.hpp"

namespace ember::cpu {

// cols[((c*kh + i)*kw + j)*ld + oy*ow + ox] = x[c][oy*sh - ph + i*dh][ox*sw - pw + j*dw] (0 outside):
// one image's columns, row k of them ld elements after row k-1 (ld = L for one image alone,
// nb*L when a chunk's images sit side by side).
template <class T>
void im2col(const T* x, T* cols, int64_t c, int64_t h, int64_t w, const Conv2dArgs& a, int64_t ld) {
  for (int64_t ci = 0; ci < c; ++ci)
    for (int64_t i = 0; i < a.kh; ++i)
      for (int64_t j = 0; j < a.kw; ++j) {
        T* row = cols + ((ci * a.kh + i) * a.kw + j) * ld;
        // Output columns whose input column lies inside the image: ox in [x_lo, x_hi).
        const int64_t off = j * a.dil_w - a.pad_w;
        int64_t x_lo = off >= 0 ? 0 : (-off + a.stride_w - 1) / a.stride_w;
        int64_t x_hi = w - off <= 0 ? 0 : (w - off + a.stride_w - 1) / a.stride_w;
        x_lo = std::min(x_lo, a.out_w);
        x_hi = std::clamp(x_hi, x_lo, a.out_w);
        for (int64_t oy = 0; oy < a.out_h; ++oy) {
          T* r = row + oy * a.out_w;
          const int64_t iy = oy * a.stride_h - a.pad_h + i * a.dil_h;
          if (iy < 0 || iy >= h) {
            std::fill(r, r + a.out_w, T(0));
            continue;
          }
          const T* xr = x + (ci * h + iy) * w;
          std::fill(r, r + x_lo, T(0));
          if (a.stride_w == 1)
            std::copy(xr + x_lo + off, xr + x_hi + off, r + x_lo);
          else
            for (int64_t ox = x_lo; ox < x_hi; ++ox) r[ox] = xr[ox * a.stride_w + off];
          std::fill(r + x_hi, r + a.out_w, T(0));
        }
      }
}

template <class T>
void im2col(const T* x, T* cols, int64_t c, int64_t h, int64_t w, const Conv2dArgs& a) {
  im2col(x, cols, c, h, w, a, a.out_h * a.out_w);
}

// The adjoint of im2col: x[c][iy][ix] += cols[...] (x initialised by the caller).
template <class T>
void col2im(const T* cols, T* x, int64_t c, int64_t h, int64_t w, const Conv2dArgs& a, int64_t ld) {
  using C = calc_t<T>;
  for (int64_t ci = 0; ci < c; ++ci)
    for (int64_t i = 0; i < a.kh; ++i)
      for (int64_t j = 0; j < a.kw; ++j) {
        const T* row = cols + ((ci * a.kh + i) * a.kw + j) * ld;
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
void col2im(const T* cols, T* x, int64_t c, int64_t h, int64_t w, const Conv2dArgs& a) {
  col2im(cols, x, c, h, w, a, a.out_h * a.out_w);
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

// Images are processed in chunks: the im2col columns of a chunk sit side by side, so each group
// does one GEMM per chunk instead of one small GEMM per image. A chunk's columns are kept under
// kConvChunkBytes, about half of a Zen/Skylake core's L2, so that im2col writes them and the GEMM
// reads them from cache; the chunk boundaries depend only on the shape (never on the thread
// count), so every path gives the same bits at any thread count.
inline constexpr int64_t kConvChunkBytes = int64_t{1} << 20;

template <class T>
int64_t conv_chunk(const Conv2dArgs& a, int64_t K, int64_t L) {
  const int64_t per_image = std::max<int64_t>(1, K * L * static_cast<int64_t>(sizeof(T)));
  return std::max<int64_t>(1, std::min(a.n, kConvChunkBytes / per_image));
}

// cols [K, nb*L] for images [n0, n0+nb) of group gr: image b's columns at offset b*L.
template <class T>
void im2col_chunk(const Conv2dArgs& a, const T* x, int64_t n0, int64_t nb, int64_t gr, const ConvGeometry<T>& g,
                  std::vector<T>& cols) {
  parallel_for(0, nb, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b)
      im2col(x + ((n0 + b) * a.c_in + gr * g.cin_g) * a.h * a.w, cols.data() + b * g.L, g.cin_g, a.h, a.w, a,
             nb * g.L);
  });
}

// y[n, co, oy, ox] = sum_{ci, i, j} w[co, ci, i, j] x[n, g*cin_g + ci, ...] (no bias).
template <class T>
void im2col_conv2d_forward(const Conv2dArgs& a, const T* x, const T* w, T* y) {
  ConvGeometry<T> g(a);
  const int64_t chunk = conv_chunk<T>(a, g.K, g.L);
  std::vector<T> cols(static_cast<size_t>(g.K * g.L * chunk)), out(static_cast<size_t>(g.cout_g * g.L * chunk));
  for (int64_t n0 = 0; n0 < a.n; n0 += chunk) {
    const int64_t nb = std::min(chunk, a.n - n0);
    for (int64_t gr = 0; gr < a.groups; ++gr) {
      im2col_chunk(a, x, n0, nb, gr, g, cols);
      // out [cout_g, nb*L] = W_g [cout_g, K] @ cols [K, nb*L]
      T* dst = out.data();
      if (nb == 1) dst = y + (n0 * a.c_out + gr * g.cout_g) * g.L;  // one image: already y's layout
      gemm(gemm_args(a.dtype, false, false, g.cout_g, nb * g.L, g.K, w + gr * g.cout_g * g.K, g.K, cols.data(),
                     nb * g.L, dst, nb * g.L, 0.0));
      if (dst != out.data()) continue;
      parallel_for(0, nb * g.cout_g, row_grain(g.L), [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          const int64_t b = r / g.cout_g, co = r % g.cout_g;
          std::copy(out.begin() + co * nb * g.L + b * g.L, out.begin() + co * nb * g.L + (b + 1) * g.L,
                    y + ((n0 + b) * a.c_out + gr * g.cout_g + co) * g.L);
        }
      });
    }
  }
}

// gy of images [n0, n0+nb), group gr, gathered as [cout_g, nb*L].
template <class T>
void gather_gy(const Conv2dArgs& a, const T* gy, int64_t n0, int64_t nb, int64_t gr, const ConvGeometry<T>& g,
               std::vector<T>& out) {
  parallel_for(0, nb * g.cout_g, row_grain(g.L), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t b = r / g.cout_g, co = r % g.cout_g;
      const T* src = gy + ((n0 + b) * a.c_out + gr * g.cout_g + co) * g.L;
      std::copy(src, src + g.L, out.begin() + co * nb * g.L + b * g.L);
    }
  });
}

template <class T>
void im2col_conv2d_backward_input(const Conv2dArgs& a, const T* gy, const T* w, T* gx) {
  ConvGeometry<T> g(a);
  const int64_t chunk = conv_chunk<T>(a, g.K, g.L);
  std::vector<T> cols(static_cast<size_t>(g.K * g.L * chunk)), gyc(static_cast<size_t>(g.cout_g * g.L * chunk));
  fill(gx, a.n * a.c_in * a.h * a.w, 0.0);
  for (int64_t n0 = 0; n0 < a.n; n0 += chunk) {
    const int64_t nb = std::min(chunk, a.n - n0);
    for (int64_t gr = 0; gr < a.groups; ++gr) {
      gather_gy(a, gy, n0, nb, gr, g, gyc);
      // cols [K, nb*L] = W_g^T [K, cout_g] @ gy_g [cout_g, nb*L]
      gemm(gemm_args(a.dtype, true, false, g.K, nb * g.L, g.cout_g, w + gr * g.cout_g * g.K, g.K, gyc.data(),
                     nb * g.L, cols.data(), nb * g.L, 0.0));
      parallel_for(0, nb, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t b = lo; b < hi; ++b)
          col2im(cols.data() + b * g.L, gx + ((n0 + b) * a.c_in + gr * g.cin_g) * a.h * a.w, g.cin_g, a.h, a.w, a,
                 nb * g.L);
      });
    }
  }
}

template <class T>
void im2col_conv2d_backward_weight(const Conv2dArgs& a, const T* x, const T* gy, T* gw) {
  ConvGeometry<T> g(a);
  const int64_t chunk = conv_chunk<T>(a, g.K, g.L);
  std::vector<T> cols(static_cast<size_t>(g.K * g.L * chunk)), gyc(static_cast<size_t>(g.cout_g * g.L * chunk));
  if (a.n == 0) fill(gw, a.c_out * g.K, 0.0);
  for (int64_t n0 = 0; n0 < a.n; n0 += chunk) {
    const int64_t nb = std::min(chunk, a.n - n0);
    for (int64_t gr = 0; gr < a.groups; ++gr) {
      im2col_chunk(a, x, n0, nb, gr, g, cols);
      gather_gy(a, gy, n0, nb, gr, g, gyc);
      // gW_g [cout_g, K] (+)= gy_g [cout_g, nb*L] @ cols^T [nb*L, K]
      gemm(gemm_args(a.dtype, false, true, g.cout_g, g.K, nb * g.L, gyc.data(), nb * g.L, cols.data(), nb * g.L,
                     gw + gr * g.cout_g * g.K, g.K, n0 == 0 ? 0.0 : 1.0));
    }
  }
}

// The kernel-table entries. Chosen by measurement on the CNN shapes of issue 13 (one interleaved
// run, docs/performance-conv.md): at one thread ember's im2col + GEMM beat oneDNN in five of six
// shape/direction pairs (not the first layer's backward-weight, left on im2col for one simple
// rule); at two threads oneDNN on ember's plain layouts (its gemm:jit convolutions) beat both
// im2col + GEMM and oneDNN's blocked layouts in all six. So: fp32 with more than one thread goes
// to oneDNN (Layouts::Plain) where it is built in and takes the problem, everything else to
// im2col + GEMM.
inline bool conv_prefers_onednn() { return onednn::available() && get_num_threads() > 1; }

template <class T>
void conv2d_forward(const Conv2dArgs& a, const T* x, const T* w, T* y) {
  if constexpr (std::is_same_v<T, float>)
    if (conv_prefers_onednn() && onednn::conv2d_forward(a, x, w, y, onednn::Layouts::Plain)) return;
  im2col_conv2d_forward(a, x, w, y);
}

template <class T>
void conv2d_backward_input(const Conv2dArgs& a, const T* gy, const T* w, T* gx) {
  if constexpr (std::is_same_v<T, float>)
    if (conv_prefers_onednn() && onednn::conv2d_backward_input(a, gy, w, gx, onednn::Layouts::Plain)) return;
  im2col_conv2d_backward_input(a, gy, w, gx);
}

template <class T>
void conv2d_backward_weight(const Conv2dArgs& a, const T* x, const T* gy, T* gw) {
  if constexpr (std::is_same_v<T, float>)
    if (conv_prefers_onednn() && onednn::conv2d_backward_weight(a, x, gy, gw, onednn::Layouts::Plain)) return;
  im2col_conv2d_backward_weight(a, x, gy, gw);
}

}  // namespace ember::cpu
