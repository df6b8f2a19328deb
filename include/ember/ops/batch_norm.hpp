#pragma once
// Batch normalisation with batch statistics (what nn::BatchNorm1d/2d compute in training) as one
// fused op with its own backward (Backend::batch_norm_forward/backward) instead of the seven-op
// composition. Not every backend has the kernel (the CPU does, for fp32 and fp64; CUDA does not):
// batch_norm_fused_applies() asks the input's backend (Backend::runs_batch_norm) and checks the
// parameters; where it says no (CUDA tensors, fp16/bf16 activations, parameters of another dtype
// than the input) nn::BatchNorm keeps the composition, which computes the same function. The
// backward is not itself differentiable (no double backward), like conv2d's.
#include <string>
#include <vector>

#include "ember/ops/detail/common.hpp"

namespace ember::op {

struct BatchNormOutput {
  AnyTensor y;          // like x
  AnyTensor mean, var;  // [C], the batch mean and biased variance (no gradient)
};

namespace detail {
// x [N, C, ...] as the kernel's [n, c, s] problem.
inline BatchNormArgs batch_norm_args(const AnyTensor& x, double eps) {
  const int64_t n = x.shape()[0], c = x.shape()[1], s = c > 0 && n > 0 ? x.numel() / (n * c) : 0;
  return BatchNormArgs{x.dtype(), n, c, s, eps};
}

// weight and bias each undefined or [C] of x's dtype on x's device.
inline bool batch_norm_params_fit(const AnyTensor& x, const AnyTensor& weight, const AnyTensor& bias) {
  for (const AnyTensor* p : {&weight, &bias})
    if (p->defined() && (p->dtype() != x.dtype() || p->device() != x.device() || p->dim() != 1 ||
                         p->shape()[0] != x.shape()[1]))
      return false;
  return true;
}
}  // namespace detail

// Whether batch_norm_train takes these tensors: x [N, C, ...] whose backend runs the fused kernel
// for its dtype (the CPU: fp32 and fp64), weight and bias each undefined or [C] of x's dtype and
// device.
inline bool batch_norm_fused_applies(const AnyTensor& x, const AnyTensor& weight, const AnyTensor& bias) {
  if (!x.defined() || x.dim() < 2) return false;
  return detail::batch_norm_params_fit(x, weight, bias) && x.backend().runs_batch_norm(detail::batch_norm_args(x, 0.0));
}

// y = (x - mean) / sqrt(var + eps) * weight + bias over dimensions 0, 2, 3, ... (per channel),
// with the batch's mean and biased variance. Recorded for autograd (x, weight, bias).
inline BatchNormOutput batch_norm_train(const AnyTensor& x, const AnyTensor& weight, const AnyTensor& bias,
                                        double eps) {
  detail::OpScope op_scope("batch_norm", x, weight, bias);
  auto given = [&] {
    return ::ember::detail::str_cat("; got input ", x.desc(), ", weight ",
                                    weight.defined() ? weight.desc() : std::string("(none)"), ", bias ",
                                    bias.defined() ? bias.desc() : std::string("(none)"));
  };
  detail::check_defined("batch_norm", x);
  EMBER_CHECK(x.dim() >= 2 && detail::batch_norm_params_fit(x, weight, bias), ValueError,
              "batch_norm: the fused op takes an input [N, C, ...] and weight/bias [C] of its dtype and device",
              given());
  const BatchNormArgs a = detail::batch_norm_args(x, eps);
  EMBER_CHECK(x.backend().runs_batch_norm(a), ValueError, "batch_norm: the ", x.device().str(),
              " backend has no fused kernel for a ", dtype_name(x.dtype()),
              " input (the CPU's takes float32 and float64; nn::BatchNorm uses the composition elsewhere)", given());
  const Shape cs{a.c};
  BatchNormOutput out;
  out.y = AnyTensor::empty(x.shape(), x.dtype(), x.device(), "batch_norm");
  out.mean = AnyTensor::empty(cs, x.dtype(), x.device(), "batch_norm");
  out.var = AnyTensor::empty(cs, x.dtype(), x.device(), "batch_norm");
  AnyTensor invstd = AnyTensor::empty(cs, x.dtype(), x.device(), "batch_norm");
  auto ptr = [](const AnyTensor& t) -> void* { return t.defined() ? t.data_ptr() : nullptr; };
  x.backend().batch_norm_forward(a, x.data_ptr(), ptr(weight), ptr(bias), out.y.data_ptr(), out.mean.data_ptr(),
                                 out.var.data_ptr(), invstd.data_ptr());
  if (autograd::any_requires_grad({x, weight, bias})) {
    const bool gx = x.requires_grad(), gw = weight.defined() && weight.requires_grad(),
               gb = bias.defined() && bias.requires_grad();
    AnyTensor sx = x.detach(), sw = weight.defined() ? weight.detach() : AnyTensor(), smean = out.mean;
    autograd::record("batch_norm", {x, weight, bias}, {out.y},
                     [sx, sw, smean, invstd, gx, gw, gb, a](const std::vector<AnyTensor>& g) {
                       const AnyTensor& gy = g[0];
                       AnyTensor dx, dw, db;
                       if (gx) dx = AnyTensor::empty(sx.shape(), sx.dtype(), sx.device());
                       if (gw) dw = AnyTensor::empty(Shape{a.c}, sx.dtype(), sx.device());
                       if (gb) db = AnyTensor::empty(Shape{a.c}, sx.dtype(), sx.device());
                       auto p = [](const AnyTensor& t) -> void* { return t.defined() ? t.data_ptr() : nullptr; };
                       sx.backend().batch_norm_backward(a, sx.data_ptr(), p(sw), smean.data_ptr(), invstd.data_ptr(),
                                                        gy.data_ptr(), p(dx), p(dw), p(db));
                       return std::vector<AnyTensor>{dx, dw, db};
                     });
  }
  return out;
}

}  // namespace ember::op
