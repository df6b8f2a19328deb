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

inline GemmArgs gemm_args(DType t, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                          const void* b, int64_t ldb, void* c, int64_t ldc, double beta) {
  return GemmArgs{.dtype = t, .trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k, .a = a, .lda = lda, .b = b,
                  .ldb = ldb, .c = c, .ldc = ldc, .beta = beta};
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

// A convolution's sizes per group, its chunks of images, and a chunk's two work buffers: the
// im2col columns [K, nb*L] and the rows of y or gy [cout_g, nb*L] (row co holds image b's output
// channel co at offset b*L).
template <class T>
struct ConvChunks {
  const Conv2dArgs& a;
  int64_t cin_g, cout_g, K, L, chunk;
  std::vector<T> cols, rows;

  explicit ConvChunks(const Conv2dArgs& args)
      : a(args),
        cin_g(a.c_in / a.groups),
        cout_g(a.c_out / a.groups),
        K(a.c_in / a.groups * a.kh * a.kw),
        L(a.out_h * a.out_w),
        chunk(conv_chunk<T>(a, K, L)),
        cols(static_cast<size_t>(K * L * chunk)),
        rows(static_cast<size_t>(cout_g * L * chunk)) {}

  // f(n0, nb, gr) for the images [n0, n0 + nb) of each chunk and each group gr, in that order.
  template <class F>
  void for_each(F&& f) {
    for (int64_t n0 = 0; n0 < a.n; n0 += chunk) {
      const int64_t nb = std::min(chunk, a.n - n0);
      for (int64_t gr = 0; gr < a.groups; ++gr) f(n0, nb, gr);
    }
  }

  // Where image n's input channels of group gr start in x (or gx), and its output channel co of
  // group gr in y (or gy).
  int64_t x_offset(int64_t n, int64_t gr) const { return (n * a.c_in + gr * cin_g) * a.h * a.w; }
  int64_t y_offset(int64_t n, int64_t gr, int64_t co) const { return (n * a.c_out + gr * cout_g + co) * L; }

  // For images [n0, n0 + nb) of group gr: cols = im2col(x), and its adjoint gx += col2im(cols).
  void im2col_chunk(const T* x, int64_t n0, int64_t nb, int64_t gr) {
    parallel_for(0, nb, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t b = lo; b < hi; ++b)
        im2col(x + x_offset(n0 + b, gr), cols.data() + b * L, cin_g, a.h, a.w, a, nb * L);
    });
  }
  void col2im_chunk(T* gx, int64_t n0, int64_t nb, int64_t gr) const {
    parallel_for(0, nb, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t b = lo; b < hi; ++b)
        col2im(cols.data() + b * L, gx + x_offset(n0 + b, gr), cin_g, a.h, a.w, a, nb * L);
    });
  }

  // For images [n0, n0 + nb) of group gr: rows = their gy, or their y = rows.
  void gather_rows(const T* gy, int64_t n0, int64_t nb, int64_t gr) {
    for_each_row(n0, nb, gr, [&](T* row, int64_t at) { std::copy(gy + at, gy + at + L, row); });
  }
  void scatter_rows(T* y, int64_t n0, int64_t nb, int64_t gr) {
    for_each_row(n0, nb, gr, [&](T* row, int64_t at) { std::copy(row, row + L, y + at); });
  }

 private:
  // f(row of `rows`, its offset in y's layout) for each image and output channel, in parallel.
  template <class F>
  void for_each_row(int64_t n0, int64_t nb, int64_t gr, F&& f) {
    parallel_for(0, nb * cout_g, row_grain(L), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t b = r / cout_g, co = r % cout_g;
        f(rows.data() + co * nb * L + b * L, y_offset(n0 + b, gr, co));
      }
    });
  }
};

// y[n, co, oy, ox] = sum_{ci, i, j} w[co, ci, i, j] x[n, g*cin_g + ci, ...] (no bias).
template <class T>
void im2col_conv2d_forward(const Conv2dArgs& a, const T* x, const T* w, T* y) {
  ConvChunks<T> c(a);
  c.for_each([&](int64_t n0, int64_t nb, int64_t gr) {
    c.im2col_chunk(x, n0, nb, gr);
    // rows [cout_g, nb*L] = W_g [cout_g, K] @ cols [K, nb*L]
    T* dst = c.rows.data();
    if (nb == 1) dst = y + c.y_offset(n0, gr, 0);  // one image: already y's layout
    gemm(gemm_args(a.dtype, false, false, c.cout_g, nb * c.L, c.K, w + gr * c.cout_g * c.K, c.K, c.cols.data(),
                   nb * c.L, dst, nb * c.L, 0.0));
    if (dst == c.rows.data()) c.scatter_rows(y, n0, nb, gr);
  });
}

template <class T>
void im2col_conv2d_backward_input(const Conv2dArgs& a, const T* gy, const T* w, T* gx) {
  ConvChunks<T> c(a);
  fill(gx, a.n * a.c_in * a.h * a.w, 0.0);
  c.for_each([&](int64_t n0, int64_t nb, int64_t gr) {
    c.gather_rows(gy, n0, nb, gr);
    // cols [K, nb*L] = W_g^T [K, cout_g] @ gy_g [cout_g, nb*L]
    gemm(gemm_args(a.dtype, true, false, c.K, nb * c.L, c.cout_g, w + gr * c.cout_g * c.K, c.K, c.rows.data(), nb * c.L,
                   c.cols.data(), nb * c.L, 0.0));
    c.col2im_chunk(gx, n0, nb, gr);
  });
}

template <class T>
void im2col_conv2d_backward_weight(const Conv2dArgs& a, const T* x, const T* gy, T* gw) {
  ConvChunks<T> c(a);
  if (a.n == 0) fill(gw, a.c_out * c.K, 0.0);
  c.for_each([&](int64_t n0, int64_t nb, int64_t gr) {
    c.im2col_chunk(x, n0, nb, gr);
    c.gather_rows(gy, n0, nb, gr);
    // gW_g [cout_g, K] (+)= gy_g [cout_g, nb*L] @ cols^T [nb*L, K]
    gemm(gemm_args(a.dtype, false, true, c.cout_g, c.K, nb * c.L, c.rows.data(), nb * c.L, c.cols.data(), nb * c.L,
                   gw + gr * c.cout_g * c.K, c.K, n0 == 0 ? 0.0 : 1.0));
  });
}

// The kernel-table entries. Chosen by measurement on the CNN step's shapes (one interleaved
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
