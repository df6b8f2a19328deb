#pragma once
// Loss functions with PyTorch's semantics, defaults and numerics, built on ember's differentiable
// ops (so they run on every device and their gradients come from autograd).
//
//   functional:  mse_loss, l1_loss, smooth_l1_loss, cross_entropy, nll_loss,
//                binary_cross_entropy_with_logits          (namespace ember::nn::functional)
//   modules:     MSELoss, L1Loss, SmoothL1Loss, CrossEntropyLoss, NLLLoss, BCEWithLogitsLoss
//
// cross_entropy and nll_loss are the ops op::cross_entropy and op::nll_loss (ops/loss.hpp: the
// checks, the fused kernel, the formula) with PyTorch's options struct and reduction string.
//
// Precision: a loss computes in the input's compute type -- fp32 for float16/bfloat16 inputs
// (they are cast up first), the input type otherwise -- and returns that type. So
// `cross_entropy(Tensor<half>, ...)` returns a `Tensor<float>`; the mixed-precision path relies on
// this.
//
// Reductions are "mean" (default), "sum" or "none". Class-index losses take int64 (or int32)
// targets; an index outside [0, C) that is not ignore_index raises an IndexError naming the op
// (one small read of the targets' min and max to the host). A mean over targets that are all
// ignored is 0/0 = nan, as in PyTorch.
#include <atomic>
#include <cmath>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "ember/nn/module.hpp"
#include "ember/ops/loss.hpp"

namespace ember::nn {

// ---- options (C++20 designated initialisers: {.weight = w, .label_smoothing = 0.1}) ----
struct CrossEntropyOptions {
  AnyTensor weight;              // per-class weight [C] (optional)
  int64_t ignore_index = -100;   // targets equal to this contribute nothing (loss and mean's divisor)
  double label_smoothing = 0.0;  // in [0, 1]
  std::string reduction = "mean";
};
struct NLLLossOptions {
  AnyTensor weight;  // [C] (optional)
  int64_t ignore_index = -100;
  std::string reduction = "mean";
};
struct BCEWithLogitsOptions {
  AnyTensor weight;      // broadcast to the input (optional)
  AnyTensor pos_weight;  // weight of the positive term, broadcast to the input, usually [C] (optional)
  std::string reduction = "mean";
};

namespace detail {
using Reduction = op::Reduction;

inline Reduction parse_reduction(const char* op, const std::string& r) {
  if (r == "mean") return Reduction::Mean;
  if (r == "sum") return Reduction::Sum;
  if (r == "none") return Reduction::None;
  throw ValueError(ember::detail::str_cat(op, ": reduction must be 'mean', 'sum' or 'none', got '", r, "'"));
}

inline AnyTensor apply_reduction(const AnyTensor& l, Reduction r) {
  switch (r) {
    case Reduction::None: return l;
    case Reduction::Sum: return op::sum(l);
    case Reduction::Mean: return op::mean(l);
  }
  return l;
}

// The input cast to its compute type (recorded, so gradients flow back to the input's type).
template <Element T>
AnyTensor to_compute(const Tensor<T>& x) {
  return x.to(dtype_of<compute_t<T>>);
}

// The checks every floating target passes: defined, on the input's device, and of the input's
// dtype or the compute dtype (an fp32 target for fp16 logits).
inline void check_float_target(const char* op, const AnyTensor& input, const AnyTensor& target, DType cdt) {
  op::detail::check_defined(op, target, "target");
  op::detail::check_same_device(op, input, target);
  EMBER_CHECK(target.dtype() == input.dtype() || target.dtype() == cdt, DTypeError, op, ": target ", target.desc(),
              " must have the input's dtype (", dtype_name(input.dtype()), ")",
              cdt != input.dtype() ? ember::detail::str_cat(" or ", dtype_name(cdt)) : std::string());
}

// A floating target of the input's shape, as the compute type.
inline AnyTensor float_target(const char* op, const AnyTensor& input, const AnyTensor& target, DType cdt) {
  check_float_target(op, input, target, cdt);
  EMBER_CHECK(target.shape() == input.shape(), ShapeError, op, ": target ", target.desc(), " and input ", input.desc(),
              " must have the same shape");
  return target.to(cdt);
}

// Elementwise regression losses broadcast a target of another shape, as PyTorch does, and warn
// once per loss (to stderr, PyTorch's text): such a target is usually a mistake ([N] against
// [N, 1] gives an [N, N] loss). Shapes that do not broadcast are a ShapeError.
inline std::atomic<bool>& broadcast_warned(int which) {
  static std::atomic<bool> flags[3];
  return flags[which];
}
inline AnyTensor broadcast_target(const char* op, int which, const AnyTensor& input, const AnyTensor& target,
                                  DType cdt) {
  check_float_target(op, input, target, cdt);
  if (!(target.shape() == input.shape())) {
    op::detail::broadcast_shapes(op, input.shape(), target.shape(), " (input)", " (target)");
    if (!broadcast_warned(which).exchange(true))
      std::cerr << "ember warning: " << op << ": Using a target size (" << target.shape().str()
                << ") that is different to the input size (" << input.shape().str()
                << "). This will likely lead to incorrect results due to broadcasting. Please ensure they have the "
                   "same size.\n";
  }
  return target.to(cdt);
}

// An elementwise regression loss: `of_difference(input - target)` in the compute type, with the
// target broadcast (broadcast_target's `which` keys its warning), then reduced.
template <Element T, class OfDifference>
Tensor<compute_t<T>> elementwise_loss(const char* op, int which, const Tensor<T>& input, const AnyTensor& target,
                                      Reduction red, OfDifference of_difference) {
  op::detail::check_defined(op, input);
  AnyTensor x = to_compute(input);
  AnyTensor t = broadcast_target(op, which, input, target, x.dtype());
  return Tensor<compute_t<T>>(apply_reduction(of_difference(op::sub(x, t)), red));
}

}  // namespace detail

namespace functional {

// mean/sum/none of (input - target)^2. A target of another shape is broadcast (with a warning,
// once), as in PyTorch.
template <Element T>
  requires std::is_floating_point_v<compute_t<T>>
Tensor<compute_t<T>> mse_loss(const Tensor<T>& input, const AnyTensor& target, const std::string& reduction = "mean") {
  auto red = detail::parse_reduction("mse_loss", reduction);
  return detail::elementwise_loss("mse_loss", 0, input, target, red, [](const AnyTensor& d) { return op::square(d); });
}

// mean/sum/none of |input - target|.
template <Element T>
  requires std::is_floating_point_v<compute_t<T>>
Tensor<compute_t<T>> l1_loss(const Tensor<T>& input, const AnyTensor& target, const std::string& reduction = "mean") {
  auto red = detail::parse_reduction("l1_loss", reduction);
  return detail::elementwise_loss("l1_loss", 1, input, target, red, [](const AnyTensor& d) { return op::abs(d); });
}

// 0.5 d^2 / beta where |d| < beta, |d| - 0.5 beta elsewhere (d = input - target); beta = 0 is L1.
template <Element T>
  requires std::is_floating_point_v<compute_t<T>>
Tensor<compute_t<T>> smooth_l1_loss(const Tensor<T>& input, const AnyTensor& target,
                                    const std::string& reduction = "mean", double beta = 1.0) {
  auto red = detail::parse_reduction("smooth_l1_loss", reduction);
  EMBER_CHECK(beta >= 0.0, ValueError, "smooth_l1_loss: beta must be non-negative, got ", beta);
  return detail::elementwise_loss("smooth_l1_loss", 2, input, target, red, [beta](const AnyTensor& d) {
    AnyTensor ad = op::abs(d);
    if (beta == 0.0) return ad;
    AnyTensor quad = op::mul(op::square(d), 0.5 / beta);
    AnyTensor lin = op::sub(ad, 0.5 * beta);
    return op::where(op::compare(CompareOp::Lt, ad, beta), quad, lin);
  });
}

// Negative log-likelihood: input holds log-probabilities [N, C, d1, ...] (or [C]), target class
// indices [N, d1, ...] (or a 0-d tensor).
template <Element T>
  requires std::is_floating_point_v<compute_t<T>>
Tensor<compute_t<T>> nll_loss(const Tensor<T>& input, const AnyTensor& target, const NLLLossOptions& opt = {}) {
  auto red = detail::parse_reduction("nll_loss", opt.reduction);
  return Tensor<compute_t<T>>(op::nll_loss(input, target, opt.weight, opt.ignore_index, red));
}

// Cross entropy of logits [N, C, d1, ...] (or [C]) against class indices [N, d1, ...] (or 0-d):
// log_softmax over the class dimension (stable: the row maximum is subtracted) then the
// weighted, label-smoothed NLL of PyTorch's torch.nn.functional.cross_entropy.
template <Element T>
  requires std::is_floating_point_v<compute_t<T>>
Tensor<compute_t<T>> cross_entropy(const Tensor<T>& input, const AnyTensor& target,
                                   const CrossEntropyOptions& opt = {}) {
  auto red = detail::parse_reduction("cross_entropy", opt.reduction);
  return Tensor<compute_t<T>>(
      op::cross_entropy(input, target, opt.weight, opt.ignore_index, opt.label_smoothing, red));
}

// Binary cross entropy on logits, in the stable form (no sigmoid, no log of a probability):
//   l = (1 - y) x + lw * (log(1 + exp(-|x|)) + max(-x, 0)),  lw = 1 + (pos_weight - 1) y,
// which for pos_weight = 1 is max(x, 0) - x y + log(1 + exp(-|x|)); then times weight.
template <Element T>
  requires std::is_floating_point_v<compute_t<T>>
Tensor<compute_t<T>> binary_cross_entropy_with_logits(const Tensor<T>& input, const AnyTensor& target,
                                                      const BCEWithLogitsOptions& opt = {}) {
  const char* name = "binary_cross_entropy_with_logits";
  auto red = detail::parse_reduction(name, opt.reduction);
  op::detail::check_defined(name, input);
  AnyTensor x = detail::to_compute(input);
  const DType cdt = x.dtype();
  AnyTensor y = detail::float_target(name, input, target, cdt);
  AnyTensor w = op::detail::optional_weight(name, "weight", opt.weight, input, cdt);
  AnyTensor pw = op::detail::optional_weight(name, "pos_weight", opt.pos_weight, input, cdt);
  for (const AnyTensor* t : {&w, &pw})
    if (t->defined()) {
      const char* what = t == &w ? " (weight)" : " (pos_weight)";
      Shape b = op::detail::broadcast_shapes(name, t->shape(), input.shape(), what, " (input)");
      EMBER_CHECK(b == input.shape(), ShapeError, name, ":", what, " ", t->desc(), " does not broadcast to the input ",
                  input.desc());
    }
  AnyTensor zero = AnyTensor::zeros(Shape{}, cdt, x.device());
  // softplus(-x) = log(1 + exp(-|x|)) + max(-x, 0), finite for any x.
  AnyTensor sp = op::add(op::log(op::add(op::exp(op::neg(op::abs(x))), 1.0)), op::maximum(op::neg(x), zero));
  AnyTensor l = op::mul(op::rsub(y, 1.0), x);
  if (pw.defined()) {
    AnyTensor lw = op::add(op::mul(op::sub(pw, 1.0), y), 1.0);
    l = op::add(l, op::mul(lw, sp));
  } else {
    l = op::add(l, sp);
  }
  if (w.defined()) l = op::mul(l, w);
  return Tensor<compute_t<T>>(detail::apply_reduction(l, red));
}

}  // namespace functional

// ---- modules (two inputs, so they derive from Module, not ModuleBase) ----

namespace detail {
// A loss module with a reduction string, checked at construction. Its operator() is
// Derived::forward(input, target).
template <class Derived>
class LossBase : public Module {
 public:
  LossBase(const char* name, std::string reduction) : name_(name), reduction_(std::move(reduction)) {
    parse_reduction(name, reduction_);
  }
  std::string type_name() const override { return name_; }
  const std::string& reduction() const { return reduction_; }
  template <Element T>
  Tensor<compute_t<T>> operator()(const Tensor<T>& input, const AnyTensor& target) {
    return static_cast<Derived&>(*this).forward(input, target);
  }

 protected:
  std::string name_;
  std::string reduction_;
};

// A loss module configured by an options struct. The class weight, when given, is a buffer
// named "weight" (as in PyTorch), so it moves with to(device) / to(dtype) and appears in the
// state dict.
template <class Derived, class Options>
class OptionsLossBase : public LossBase<Derived> {
 public:
  OptionsLossBase(const char* name, Options opt) : LossBase<Derived>(name, opt.reduction), opt_(std::move(opt)) {
    if (opt_.weight.defined()) opt_.weight = this->register_buffer("weight", opt_.weight);
  }
  const Options& options() const { return opt_; }

 protected:
  Options opt_;
};
}  // namespace detail

#define EMBER_ELEMENTWISE_LOSS(Class, fn)                                                   \
  class Class : public detail::LossBase<Class> {                                           \
   public:                                                                                 \
    explicit Class(std::string reduction = "mean") : LossBase(#Class, std::move(reduction)) {} \
    template <Element T>                                                                   \
    Tensor<compute_t<T>> forward(const Tensor<T>& input, const AnyTensor& target) {        \
      return functional::fn(input, target, reduction_);                                    \
    }                                                                                      \
  };
EMBER_ELEMENTWISE_LOSS(MSELoss, mse_loss)
EMBER_ELEMENTWISE_LOSS(L1Loss, l1_loss)
#undef EMBER_ELEMENTWISE_LOSS

class SmoothL1Loss : public detail::LossBase<SmoothL1Loss> {
 public:
  explicit SmoothL1Loss(std::string reduction = "mean", double beta = 1.0)
      : LossBase("SmoothL1Loss", std::move(reduction)), beta_(beta) {
    EMBER_CHECK(beta >= 0.0, ValueError, "SmoothL1Loss: beta must be non-negative, got ", beta);
  }
  template <Element T>
  Tensor<compute_t<T>> forward(const Tensor<T>& input, const AnyTensor& target) {
    return functional::smooth_l1_loss(input, target, reduction_, beta_);
  }
  double beta() const { return beta_; }

 private:
  double beta_;
};

class CrossEntropyLoss : public detail::OptionsLossBase<CrossEntropyLoss, CrossEntropyOptions> {
 public:
  explicit CrossEntropyLoss(CrossEntropyOptions opt = {}) : OptionsLossBase("CrossEntropyLoss", std::move(opt)) {
    EMBER_CHECK(opt_.label_smoothing >= 0.0 && opt_.label_smoothing <= 1.0, ValueError,
                "CrossEntropyLoss: label_smoothing must be in [0, 1], got ", opt_.label_smoothing);
  }
  template <Element T>
  Tensor<compute_t<T>> forward(const Tensor<T>& input, const AnyTensor& target) {
    return functional::cross_entropy(input, target, opt_);
  }
};

class NLLLoss : public detail::OptionsLossBase<NLLLoss, NLLLossOptions> {
 public:
  explicit NLLLoss(NLLLossOptions opt = {}) : OptionsLossBase("NLLLoss", std::move(opt)) {}
  template <Element T>
  Tensor<compute_t<T>> forward(const Tensor<T>& input, const AnyTensor& target) {
    return functional::nll_loss(input, target, opt_);
  }
};

// "pos_weight", when given, is a buffer too, as in PyTorch.
class BCEWithLogitsLoss : public detail::OptionsLossBase<BCEWithLogitsLoss, BCEWithLogitsOptions> {
 public:
  explicit BCEWithLogitsLoss(BCEWithLogitsOptions opt = {}) : OptionsLossBase("BCEWithLogitsLoss", std::move(opt)) {
    if (opt_.pos_weight.defined()) opt_.pos_weight = register_buffer("pos_weight", opt_.pos_weight);
  }
  template <Element T>
  Tensor<compute_t<T>> forward(const Tensor<T>& input, const AnyTensor& target) {
    return functional::binary_cross_entropy_with_logits(input, target, opt_);
  }
};

}  // namespace ember::nn
