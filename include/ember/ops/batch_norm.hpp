#pragma once
// Batch normalisation with batch statistics (what nn::BatchNorm1d/2d compute in training), fused
// on the CPU for fp32 and fp64: one op with its own backward (backend/cpu/batch_norm.hpp) instead
// of the seven-op composition. batch_norm_fused_applies() says when it runs; elsewhere (CUDA
// tensors, fp16/bf16 activations, parameters of another dtype than the input) nn::BatchNorm keeps
// the composition, which computes the same function. The backward is not itself differentiable
// (no double backward), like conv2d's.
#include <string>
#include <vector>

#include "ember/backend/cpu/batch_norm.hpp"
#include "ember/ops/detail/common.hpp"

namespace ember::op {

struct BatchNormOutput {
  AnyTensor y;          // like x
  AnyTensor mean, var;  // [C], the batch mean and biased variance (no gradient)
};

// x [N, C, ...] on the CPU, fp32 or fp64; weight and bias each undefined or [C] of x's dtype.
inline bool batch_norm_fused_applies(const AnyTensor& x, const AnyTensor& weight, const AnyTensor& bias) {
  if (!x.defined() || !x.device().is_cpu() || x.dim() < 2) return false;
  if (x.dtype() != DType::Float32 && x.dtype() != DType::Float64) return false;
  for (const AnyTensor* p : {&weight, &bias})
    if (p->defined() && (p->dtype() != x.dtype() || !p->device().is_cpu() || p->dim() != 1 ||
                         p->shape()[0] != x.shape()[1]))
      return false;
  return true;
}

// y = (x - mean) / sqrt(var + eps) * weight + bias over dimensions 0, 2, 3, ... (per channel),
// with the batch's mean and biased variance. Recorded for autograd (x, weight, bias).
inline BatchNormOutput batch_norm_train(const AnyTensor& x, const AnyTensor& weight, const AnyTensor& bias,
                                        double eps) {
  detail::OpScope op_scope("batch_norm", x, weight, bias);
  EMBER_CHECK(batch_norm_fused_applies(x, weight, bias), ValueError, "batch_norm: the fused CPU kernel takes an fp32 ",
              "or fp64 CPU input [N, C, ...] and weight/bias [C] of its dtype; got input ", x.desc(), ", weight ",
              weight.defined() ? weight.desc() : std::string("(none)"), ", bias ",
              bias.defined() ? bias.desc() : std::string("(none)"));
  const int64_t n = x.shape()[0], c = x.shape()[1], s = c > 0 && n > 0 ? x.numel() / (n * c) : 0;
  const Shape cs{c};
  BatchNormOutput out;
  out.y = AnyTensor::empty(x.shape(), x.dtype(), x.device(), "batch_norm");
  out.mean = AnyTensor::empty(cs, x.dtype(), x.device(), "batch_norm");
  out.var = AnyTensor::empty(cs, x.dtype(), x.device(), "batch_norm");
  AnyTensor invstd = AnyTensor::empty(cs, x.dtype(), x.device(), "batch_norm");
  auto run = [&](auto tag) {
    using T = decltype(tag);
    auto ptr = [](const AnyTensor& t) { return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr; };
    cpu::batch_norm_forward<T>(ptr(x), ptr(weight), ptr(bias), n, c, s, eps, ptr(out.y), ptr(out.mean), ptr(out.var),
                               ptr(invstd));
  };
  if (x.dtype() == DType::Float32)
    run(float{});
  else
    run(double{});
  if (autograd::any_requires_grad({x, weight, bias})) {
    const bool gx = x.requires_grad(), gw = weight.defined() && weight.requires_grad(),
               gb = bias.defined() && bias.requires_grad();
    AnyTensor sx = x.detach(), sw = weight.defined() ? weight.detach() : AnyTensor(), smean = out.mean;
    autograd::record("batch_norm", {x, weight, bias}, {out.y},
                     [sx, sw, smean, invstd, gx, gw, gb, n, c, s](const std::vector<AnyTensor>& g) {
                       const AnyTensor& gy = g[0];
                       AnyTensor dx, dw, db;
                       if (gx) dx = AnyTensor::empty(sx.shape(), sx.dtype(), sx.device());
                       if (gw) dw = AnyTensor::empty(Shape{c}, sx.dtype(), sx.device());
                       if (gb) db = AnyTensor::empty(Shape{c}, sx.dtype(), sx.device());
                       auto run_bwd = [&](auto tag) {
                         using T = decltype(tag);
                         auto ptr = [](const AnyTensor& t) {
                           return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
                         };
                         cpu::batch_norm_backward<T>(ptr(sx), ptr(gy), ptr(sw), ptr(smean), ptr(invstd), n, c, s,
                                                     ptr(dx), ptr(dw), ptr(db));
                       };
                       if (sx.dtype() == DType::Float32)
                         run_bwd(float{});
                       else
                         run_bwd(double{});
                       return std::vector<AnyTensor>{dx, dw, db};
                     });
  }
  return out;
}

}  // namespace ember::op
