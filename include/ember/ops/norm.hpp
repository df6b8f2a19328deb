#pragma once
// Fused layer norm and RMSNorm over the trailing dimensions (Backend::norm_forward/norm_backward):
// one kernel per direction instead of the ~ten elementwise and reduction ops of the composite.
//
//   op::layer_norm(x, cols, weight, bias, eps)   (x - mean) / sqrt(var + eps) * weight + bias
//   op::rms_norm(x, cols, weight, eps)           x / sqrt(mean(x^2) + eps) * weight
//
// over the last `cols` elements of each row (x viewed as [numel / cols, cols]). weight and bias are
// optional, with `cols` elements and x's dtype and device. The statistics are computed in fp32
// (fp64 for float64 inputs); y is rounded once to x's dtype. The backward is a kernel too (first
// derivatives only: a graph made inside backward does not go through it).
#include <cmath>

#include "ember/ops/shape.hpp"

namespace ember::op {

namespace detail {

inline AnyTensor fused_norm(const char* name, const AnyTensor& x, int64_t cols, const AnyTensor& weight,
                            const AnyTensor& bias, double eps, bool rms) {
  OpScope op_scope(name, x);
  check_defined(name, x);
  check_floating(name, x);
  EMBER_CHECK(cols >= 1 && x.dim() >= 1 && x.numel() % cols == 0, ShapeError, name, ": input ", x.desc(),
              " cannot be normalised over its last ", cols, " elements");
  EMBER_CHECK(eps >= 0.0 && std::isfinite(eps), ValueError, name, ": eps must be finite and non-negative, got ", eps);
  for (const AnyTensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    const char* what = p == &weight ? "weight" : "bias";
    EMBER_CHECK(p->numel() == cols, ShapeError, name, ": ", what, " ", p->desc(), " must have ", cols,
                " elements (the normalised size of input ", x.desc(), ")");
    EMBER_CHECK(p->dtype() == x.dtype(), DTypeError, name, ": ", what, " ", p->desc(), " must have the input's dtype ",
                dtype_name(x.dtype()));
    EMBER_CHECK(p->device() == x.device(), DeviceError, name, ": ", what, " ", p->desc(),
                " must be on the input's device ", x.device().str());
  }
  const int64_t rows = x.numel() / cols;
  const DType stat = x.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
  AnyTensor y = AnyTensor::empty(x.shape(), x.dtype(), x.device());
  AnyTensor mean = rms ? AnyTensor() : AnyTensor::empty({rows}, stat, x.device());
  AnyTensor rstd = AnyTensor::empty({rows}, stat, x.device());
  NormArgs a{x.dtype(), rows, cols, eps, rms};
  auto ptr = [](const AnyTensor& t) -> const void* { return t.defined() ? t.data_ptr() : nullptr; };
  if (rows > 0)
    x.backend().norm_forward(a, x.data_ptr(), ptr(weight), ptr(bias), y.data_ptr(),
                             mean.defined() ? mean.data_ptr() : nullptr, rstd.data_ptr());
  if (autograd::any_requires_grad({x, weight, bias})) {
    AnyTensor sx = x.detach(), sw = weight.defined() ? weight.detach() : AnyTensor();
    const bool has_w = weight.defined(), has_b = bias.defined();
    const Shape bshape = has_b ? bias.shape() : Shape{};
    autograd::record(name, {x, weight, bias}, {y},
                     [sx, sw, mean, rstd, a, has_w, has_b, bshape](const std::vector<AnyTensor>& g) {
      const AnyTensor& gy = g[0];
      AnyTensor gx = AnyTensor::empty(sx.shape(), sx.dtype(), sx.device());
      AnyTensor gw = has_w ? AnyTensor::empty({a.cols}, sx.dtype(), sx.device()) : AnyTensor();
      AnyTensor gb = has_b ? AnyTensor::empty({a.cols}, sx.dtype(), sx.device()) : AnyTensor();
      auto p = [](const AnyTensor& t) -> void* { return t.defined() ? t.data_ptr() : nullptr; };
      sx.backend().norm_backward(a, sx.data_ptr(), has_w ? sw.data_ptr() : nullptr,
                                 mean.defined() ? mean.data_ptr() : nullptr, rstd.data_ptr(), gy.data_ptr(),
                                 gx.data_ptr(), p(gw), p(gb));
      return std::vector<AnyTensor>{gx, has_w ? gw.reshape(sw.shape()) : gw, has_b ? gb.reshape(bshape) : gb};
    });
  }
  return y;
}

}  // namespace detail

inline AnyTensor layer_norm(const AnyTensor& x, int64_t cols, const AnyTensor& weight = {}, const AnyTensor& bias = {},
                            double eps = 1e-5) {
  return detail::fused_norm("layer_norm", x, cols, weight, bias, eps, false);
}
inline AnyTensor rms_norm(const AnyTensor& x, int64_t cols, const AnyTensor& weight = {}, double eps = 1e-6) {
  return detail::fused_norm("rms_norm", x, cols, weight, AnyTensor(), eps, true);
}

}  // namespace ember::op
