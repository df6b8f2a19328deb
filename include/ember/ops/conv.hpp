#pragma once
// 2-D convolution, NCHW: conv2d(x [N, C_in, H, W], weight [C_out, C_in/groups, kh, kw], bias [C_out])
// with stride, padding, dilation and groups, as torch.nn.functional.conv2d. im2col + GEMM on the
// CPU; cuDNN on CUDA (algorithm chosen once per shape and cached).
#include <array>

#include "ember/ops/elementwise.hpp"
#include "ember/ops/reduce.hpp"

namespace ember::op {

struct Conv2dOptions {
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
};

namespace detail {
inline Conv2dArgs conv_args(const AnyTensor& x, const AnyTensor& w, const Conv2dOptions& o) {
  Conv2dArgs a;
  a.dtype = x.dtype();
  a.n = x.shape()[0];
  a.c_in = x.shape()[1];
  a.h = x.shape()[2];
  a.w = x.shape()[3];
  a.c_out = w.shape()[0];
  a.kh = w.shape()[2];
  a.kw = w.shape()[3];
  a.stride_h = o.stride[0];
  a.stride_w = o.stride[1];
  a.pad_h = o.padding[0];
  a.pad_w = o.padding[1];
  a.dil_h = o.dilation[0];
  a.dil_w = o.dilation[1];
  a.groups = o.groups;
  // The window must fit the padded input (a negative numerator would round toward zero to an
  // output of 1 where PyTorch raises); conv2d checks `fits` before using the sizes.
  // Checked: padding or dilation near 2^62 would overflow (ShapeError naming conv2d).
  auto span = [](int64_t in, int64_t pad, int64_t dil, int64_t k) {
    const int64_t padded = checked::add(in, checked::mul(2, pad, "conv2d", "padding"), "conv2d", "padded input");
    const int64_t window = checked::mul(dil, k - 1, "conv2d", "dilated kernel");
    return padded - window - 1;  // both non-negative, so no overflow
  };
  const int64_t num_h = span(a.h, a.pad_h, a.dil_h, a.kh);
  const int64_t num_w = span(a.w, a.pad_w, a.dil_w, a.kw);
  a.out_h = num_h >= 0 ? num_h / a.stride_h + 1 : 0;
  a.out_w = num_w >= 0 ? num_w / a.stride_w + 1 : 0;
  return a;
}
}  // namespace detail

inline AnyTensor conv2d(const AnyTensor& x, const AnyTensor& weight, const AnyTensor& bias = AnyTensor(),
                        const Conv2dOptions& o = {}) {
  detail::OpScope op_scope("conv2d", x, weight, bias);
  detail::check_operands("conv2d", x, weight, "input", "weight");
  detail::check_floating("conv2d", x);
  EMBER_CHECK(x.dim() == 4, ShapeError, "conv2d: input must be [N, C, H, W], got ", x.desc());
  EMBER_CHECK(weight.dim() == 4, ShapeError, "conv2d: weight must be [C_out, C_in/groups, kh, kw], got ", weight.desc());
  EMBER_CHECK(o.groups >= 1 && o.stride[0] >= 1 && o.stride[1] >= 1 && o.dilation[0] >= 1 && o.dilation[1] >= 1 &&
                  o.padding[0] >= 0 && o.padding[1] >= 0,
              ValueError, "conv2d: stride, dilation and groups must be positive and padding non-negative, got stride ",
              o.stride[0], "x", o.stride[1], ", padding ", o.padding[0], "x", o.padding[1], ", dilation ",
              o.dilation[0], "x", o.dilation[1], ", groups ", o.groups, " for input ", x.desc());
  const int64_t cin = x.shape()[1], cout = weight.shape()[0];
  EMBER_CHECK(cin % o.groups == 0 && cout % o.groups == 0 && weight.shape()[1] * o.groups == cin, ShapeError,
              "conv2d: input ", x.desc(), " and weight ", weight.desc(), " do not match with groups=", o.groups,
              " (weight.shape[1] * groups must equal the input channels, and both channel counts divide by groups)");
  if (bias.defined()) {
    detail::check_same_device("conv2d", x, bias);
    detail::check_same_dtype("conv2d", x, bias);
    EMBER_CHECK(bias.dim() == 1 && bias.shape()[0] == cout, ShapeError, "conv2d: bias ", bias.desc(), " must be [",
                cout, "]");
  }
  EMBER_CHECK(weight.shape()[2] > 0 && weight.shape()[3] > 0, ShapeError, "conv2d: the kernel of weight ",
              weight.desc(), " is empty (", weight.shape()[2], "x", weight.shape()[3], ")");
  Conv2dArgs a = detail::conv_args(x, weight, o);
  EMBER_CHECK(a.out_h > 0 && a.out_w > 0, ShapeError, "conv2d: input ", x.desc(), " is too small for kernel ",
              a.kh, "x", a.kw, " with padding ", a.pad_h, "x", a.pad_w, " and dilation ", a.dil_h, "x", a.dil_w,
              " (the dilated kernel must fit the padded input, as in PyTorch)");
  AnyTensor y = AnyTensor::empty({a.n, cout, a.out_h, a.out_w}, x.dtype(), x.device(), "conv2d");
  if (y.numel() > 0) x.backend().conv2d_forward(a, x.data_ptr(), weight.data_ptr(), y.data_ptr());
  AnyTensor out = y;
  if (bias.defined()) {
    NoGradGuard raw;  // the bias add is folded into this op's backward
    out = add(y, bias.reshape(Shape{1, cout, 1, 1}));
  }
  if (autograd::any_requires_grad({x, weight, bias})) {
    const bool gx = x.requires_grad(), gw = weight.requires_grad(), gb = bias.defined() && bias.requires_grad();
    AnyTensor sx = x.detach(), sw = weight.detach();
    autograd::record("conv2d", {x, weight, bias}, {out}, [a, sx, sw, gx, gw, gb](const std::vector<AnyTensor>& g) {
      const AnyTensor& gy = g[0];
      AnyTensor dx, dw, db;
      if (gx) {
        dx = AnyTensor::empty(sx.shape(), sx.dtype(), sx.device());
        if (dx.numel() > 0) dx.backend().conv2d_backward_input(a, gy.data_ptr(), sw.data_ptr(), dx.data_ptr());
      }
      if (gw) {
        dw = AnyTensor::empty(sw.shape(), sw.dtype(), sw.device());
        if (dw.numel() > 0) dw.backend().conv2d_backward_weight(a, sx.data_ptr(), gy.data_ptr(), dw.data_ptr());
      }
      if (gb) db = detail::reduce_raw(ReduceOp::Sum, gy, {0, 2, 3}, false);
      return std::vector<AnyTensor>{dx, dw, db};
    });
  }
  return out;
}

}  // namespace ember::op

namespace ember {
template <Element T>
Tensor<T> conv2d(const Tensor<T>& x, const Tensor<T>& weight, const Tensor<T>& bias = Tensor<T>(),
                 const op::Conv2dOptions& o = {}) {
  return Tensor<T>(op::conv2d(x, weight, bias, o));
}
}  // namespace ember
