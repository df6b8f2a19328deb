#pragma once
// 2-D pooling, NCHW, as torch.nn.functional: max_pool2d (gradient to the first maximum of each
// window), avg_pool2d (count_include_pad, ceil_mode) and adaptive_avg_pool2d.
#include <array>

#include "ember/ops/detail/common.hpp"

namespace ember::op {

struct Pool2dOptions {
  std::array<int64_t, 2> kernel{2, 2};
  std::array<int64_t, 2> stride{0, 0};  // 0: the kernel size (torch's default)
  std::array<int64_t, 2> padding{0, 0};
  bool ceil_mode = false;
  bool count_include_pad = true;  // avg_pool2d only
};

namespace detail {
inline int64_t pool_out_size(int64_t in, int64_t k, int64_t s, int64_t p, bool ceil_mode) {
  // PyTorch's pooling_output_shape: floor (or ceil) division rounding toward -inf, so a window
  // that does not fit gives 0 and raises (C++'s division rounds -1/2 up to 0: an output of 1).
  // (p <= k / 2 was checked, so in + 2p - k <= in; only a huge stride can overflow the sum.)
  int64_t num = checked::add(in + 2 * p - k, ceil_mode ? s - 1 : 0, "pool2d", "output size");
  int64_t q = num / s;
  if (num % s != 0 && num < 0) --q;
  int64_t out = q + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;  // the last window must start inside the input
  return out;
}

inline Pool2dArgs pool_args(const char* op, const AnyTensor& x, const Pool2dOptions& o) {
  check_defined(op, x);
  check_floating(op, x);
  EMBER_CHECK(x.dim() == 4, ShapeError, op, ": input must be [N, C, H, W], got ", x.desc());
  Pool2dArgs p;
  p.dtype = x.dtype();
  p.n = x.shape()[0];
  p.c = x.shape()[1];
  p.h = x.shape()[2];
  p.w = x.shape()[3];
  p.kh = o.kernel[0];
  p.kw = o.kernel[1];
  // 0 means "the kernel size" (torch's default); a negative stride used to become it silently.
  EMBER_CHECK(o.stride[0] >= 0 && o.stride[1] >= 0, ValueError, op, ": stride must be positive (or 0 for the ",
              "kernel size), got ", o.stride[0], "x", o.stride[1]);
  p.stride_h = o.stride[0] > 0 ? o.stride[0] : p.kh;
  p.stride_w = o.stride[1] > 0 ? o.stride[1] : p.kw;
  p.pad_h = o.padding[0];
  p.pad_w = o.padding[1];
  p.count_include_pad = o.count_include_pad;
  EMBER_CHECK(p.kh > 0 && p.kw > 0, ValueError, op, ": kernel must be positive, got ", p.kh, "x", p.kw);
  EMBER_CHECK(p.pad_h >= 0 && p.pad_w >= 0 && p.pad_h <= p.kh / 2 && p.pad_w <= p.kw / 2, ValueError, op,
              ": padding ", p.pad_h, "x", p.pad_w, " must be at most half the kernel ", p.kh, "x", p.kw);
  p.out_h = pool_out_size(p.h, p.kh, p.stride_h, p.pad_h, o.ceil_mode);
  p.out_w = pool_out_size(p.w, p.kw, p.stride_w, p.pad_w, o.ceil_mode);
  EMBER_CHECK(p.out_h > 0 && p.out_w > 0, ShapeError, op, ": input ", x.desc(), " is smaller than the kernel ", p.kh,
              "x", p.kw);
  return p;
}
}  // namespace detail

inline AnyTensor max_pool2d(const AnyTensor& x, const Pool2dOptions& o = {}) {
  detail::OpScope op_scope("max_pool2d", x);
  Pool2dArgs p = detail::pool_args("max_pool2d", x, o);
  AnyTensor y = AnyTensor::empty({p.n, p.c, p.out_h, p.out_w}, x.dtype(), x.device(), "max_pool2d");
  AnyTensor idx = AnyTensor::empty(y.shape(), DType::Int64, x.device());
  if (y.numel() > 0)
    x.backend().max_pool2d_forward(p, x.data_ptr(), y.data_ptr(), static_cast<int64_t*>(idx.data_ptr()));
  autograd::record("max_pool2d", {x}, {y}, [p, idx](const std::vector<AnyTensor>& g) {
    AnyTensor gx = AnyTensor::empty({p.n, p.c, p.h, p.w}, g[0].dtype(), g[0].device());
    if (gx.numel() > 0)
      gx.backend().max_pool2d_backward(p, g[0].data_ptr(), static_cast<const int64_t*>(idx.data_ptr()), gx.data_ptr());
    return std::vector<AnyTensor>{gx};
  });
  return y;
}

namespace detail {
inline AnyTensor avg_pool_impl(const char* name, const AnyTensor& x, const Pool2dArgs& p) {
  detail::OpScope op_scope(name, x);
  AnyTensor y = AnyTensor::empty({p.n, p.c, p.out_h, p.out_w}, x.dtype(), x.device(), name);
  if (y.numel() > 0) x.backend().avg_pool2d_forward(p, x.data_ptr(), y.data_ptr());
  autograd::record(name, {x}, {y}, [p](const std::vector<AnyTensor>& g) {
    AnyTensor gx = AnyTensor::empty({p.n, p.c, p.h, p.w}, g[0].dtype(), g[0].device());
    if (gx.numel() > 0) gx.backend().avg_pool2d_backward(p, g[0].data_ptr(), gx.data_ptr());
    return std::vector<AnyTensor>{gx};
  });
  return y;
}
}  // namespace detail

inline AnyTensor avg_pool2d(const AnyTensor& x, const Pool2dOptions& o = {}) {
  return detail::avg_pool_impl("avg_pool2d", x, detail::pool_args("avg_pool2d", x, o));
}

// Output [N, C, out_h, out_w]; window o spans [floor(o*H/out), ceil((o+1)*H/out)) as in torch.
inline AnyTensor adaptive_avg_pool2d(const AnyTensor& x, std::array<int64_t, 2> output_size) {
  Pool2dOptions o;
  o.kernel = {1, 1};
  Pool2dArgs p = detail::pool_args("adaptive_avg_pool2d", x, o);
  EMBER_CHECK(output_size[0] > 0 && output_size[1] > 0, ValueError, "adaptive_avg_pool2d: output size must be positive, got ",
              output_size[0], "x", output_size[1], " for input ", x.desc());
  p.out_h = output_size[0];
  p.out_w = output_size[1];
  p.adaptive = true;
  return detail::avg_pool_impl("adaptive_avg_pool2d", x, p);
}

}  // namespace ember::op

namespace ember {
template <Element T> Tensor<T> max_pool2d(const Tensor<T>& x, const op::Pool2dOptions& o = {}) {
  return Tensor<T>(op::max_pool2d(x, o));
}
template <Element T> Tensor<T> avg_pool2d(const Tensor<T>& x, const op::Pool2dOptions& o = {}) {
  return Tensor<T>(op::avg_pool2d(x, o));
}
template <Element T> Tensor<T> adaptive_avg_pool2d(const Tensor<T>& x, std::array<int64_t, 2> out) {
  return Tensor<T>(op::adaptive_avg_pool2d(x, out));
}
}  // namespace ember
