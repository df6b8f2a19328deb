#pragma once
// Gradient clipping, as torch.nn.utils.clip_grad_norm_ and clip_grad_value_. Parameters without a
// gradient are skipped. Gradients are changed in place (every handle to them sees it).
//
// clip_grad_norm_(params, max_norm, norm_type = 2, error_if_nonfinite = false):
//   total = norm_type-norm of the vector of the per-gradient norms (= the norm of all gradients
//   concatenated); clip_coef = max_norm / (total + 1e-6), clamped to at most 1; every gradient is
//   multiplied by clip_coef (torch's formula: a no-op unless total + 1e-6 > max_norm; a NaN total
//   turns the gradients to NaN and an infinite one to 0 * inf = NaN, as in torch, unless
//   error_if_nonfinite asks for a ValueError). norm_type is a positive number or infinity
//   (max |g|). Returns the total norm. Norms and the coefficient are computed in float32 (float64
//   when the gradients are float64), as torch computes them in the gradients' dtype; one host
//   synchronisation per call, for the returned value.
// clip_grad_value_(params, clip_value): clamps every gradient element into [-clip_value, clip_value].
//
// Deviations from torch, for honest errors: a negative or NaN max_norm / clip_value and a
// norm_type that is not positive (torch also accepts 0 and -inf) are ValueErrors.
#include <cmath>
#include <limits>
#include <vector>

#include "ember/optim/optimizer.hpp"

namespace ember::optim {

inline double clip_grad_norm_(const std::vector<AnyTensor>& params, double max_norm, double norm_type = 2.0,
                              bool error_if_nonfinite = false) {
  EMBER_CHECK(max_norm >= 0.0, ValueError, "clip_grad_norm_: max_norm must be >= 0, got ", max_norm);
  const bool inf_norm = std::isinf(norm_type) && norm_type > 0;
  EMBER_CHECK(inf_norm || (norm_type > 0.0 && std::isfinite(norm_type)), ValueError,
              "clip_grad_norm_: norm_type must be a positive number or infinity, got ", norm_type);
  std::vector<AnyTensor> grads;
  for (const AnyTensor& p : params) {
    AnyTensor g = p.defined() ? p.grad() : AnyTensor();
    if (g.defined()) grads.push_back(g);
  }
  if (grads.empty()) return 0.0;

  NoGradGuard no_grad;
  DType cd = DType::Float64;
  for (const AnyTensor& g : grads)
    if (g.dtype() != DType::Float64) cd = DType::Float32;
  const Device dev = grads[0].device();
  // The norm of a vector of values, as a one-element tensor [1].
  auto norm_of = [&](const AnyTensor& x) {
    AnyTensor r;
    if (inf_norm) {
      r = op::max(op::abs(x));
    } else if (norm_type == 2.0) {
      r = op::sqrt(op::sum(op::square(x)));
    } else if (norm_type == 1.0) {
      r = op::sum(op::abs(x));
    } else {
      r = op::pow(op::sum(op::pow(op::abs(x), norm_type)), 1.0 / norm_type);
    }
    return r.reshape(Shape{1});
  };
  std::vector<AnyTensor> norms;
  norms.reserve(grads.size());
  for (const AnyTensor& g : grads) {
    AnyTensor x = g.detach().to(cd);
    if (x.numel() == 0) {
      norms.push_back(AnyTensor::zeros(Shape{1}, cd, dev));
      continue;
    }
    norms.push_back(norm_of(x.reshape(Shape{x.numel()})).to(dev));
  }
  const double total = norm_of(op::concat(norms, 0)).item_double();
  if (error_if_nonfinite && !std::isfinite(total))
    throw ValueError(::ember::detail::str_cat(
        "clip_grad_norm_: the total norm of order ", norm_type,
        " of the gradients is non-finite (", total, "), so it cannot be clipped. To scale the gradients by the "
        "non-finite norm anyway, pass error_if_nonfinite=false"));
  // torch: clip_coef = max_norm / (total + 1e-6) in the norm's dtype, computed as
  // reciprocal(total + 1e-6) * max_norm; clamped to <= 1.
  double coef;
  if (cd == DType::Float32) {
    const float t = static_cast<float>(total) + static_cast<float>(1e-6);
    coef = static_cast<double>((1.0f / t) * static_cast<float>(max_norm));
  } else {
    coef = (1.0 / (total + 1e-6)) * max_norm;
  }
  if (!(coef >= 1.0)) {  // scaling by the clamped 1.0 is a no-op; NaN scales, as in torch
    for (AnyTensor& g : grads) g.copy_(op::mul(g.detach(), coef));
  }
  return total;
}

inline void clip_grad_value_(const std::vector<AnyTensor>& params, double clip_value) {
  EMBER_CHECK(clip_value >= 0.0, ValueError, "clip_grad_value_: clip_value must be >= 0, got ", clip_value);
  NoGradGuard no_grad;
  for (const AnyTensor& p : params) {
    AnyTensor g = p.defined() ? p.grad() : AnyTensor();
    if (g.defined() && g.numel() > 0) g.copy_(op::clamp(g.detach(), -clip_value, clip_value));
  }
}

}  // namespace ember::optim
