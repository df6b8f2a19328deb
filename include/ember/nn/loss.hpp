#pragma once
// Loss functions with PyTorch's semantics, defaults and numerics, composed from ember's
// differentiable ops (so they run on every device and their gradients come from autograd).
//
//   functional:  mse_loss, l1_loss, smooth_l1_loss, cross_entropy, nll_loss,
//                binary_cross_entropy_with_logits          (namespace ember::nn::functional)
//   modules:     MSELoss, L1Loss, SmoothL1Loss, CrossEntropyLoss, NLLLoss, BCEWithLogitsLoss
//
// Precision: a loss computes in the input's compute type -- fp32 for float16/bfloat16 inputs
// (they are cast up first), the input type otherwise -- and returns that type. So
// `cross_entropy(Tensor<half>, ...)` returns a `Tensor<float>`; the mixed-precision path relies on
// this (DESIGN.md decision 5).
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
enum class Reduction { None, Mean, Sum };

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

// A floating target of the input's shape, as the compute type. The target may have the input's
// dtype or the compute dtype (an fp32 target for fp16 logits).
inline AnyTensor float_target(const char* op, const AnyTensor& input, const AnyTensor& target, DType cdt) {
  op::detail::check_defined(op, target, "target");
  op::detail::check_same_device(op, input, target);
  EMBER_CHECK(target.dtype() == input.dtype() || target.dtype() == cdt, DTypeError, op, ": target ", target.desc(),
              " must have the input's dtype (", dtype_name(input.dtype()), ")",
              cdt != input.dtype() ? ember::detail::str_cat(" or ", dtype_name(cdt)) : std::string());
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
  op::detail::check_defined(op, target, "target");
  op::detail::check_same_device(op, input, target);
  EMBER_CHECK(target.dtype() == input.dtype() || target.dtype() == cdt, DTypeError, op, ": target ", target.desc(),
              " must have the input's dtype (", dtype_name(input.dtype()), ")",
              cdt != input.dtype() ? ember::detail::str_cat(" or ", dtype_name(cdt)) : std::string());
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

// An optional floating tensor (class weights, pos_weight) on the input's device, as the compute type.
inline AnyTensor optional_weight(const char* op, const char* what, const AnyTensor& w, const AnyTensor& input,
                                 DType cdt) {
  if (!w.defined()) return w;
  EMBER_CHECK(is_floating(w.dtype()), DTypeError, op, ": ", what, " must be floating point, got ", w.desc());
  op::detail::check_same_device(op, input, w);
  return w.to(cdt);
}

// Negative log-likelihood of class indices, shared by nll_loss and cross_entropy (which passes
// log_softmax of its logits). `logp` is [N, C, d1, ...] or [C] in the compute type; `input` is the
// caller's tensor (for messages). Implements PyTorch's formula exactly:
//   loss_i = (1 - eps) * (-w[y_i] logp[i, y_i]) + (eps / C) * (-sum_c w[c] logp[i, c]),
//   0 where y_i == ignore_index; "mean" divides the sum by sum_i w[y_i] over non-ignored i.
// x [C], [N, C] or [N, C, d1, ...] as [M, C]: the class dimension moved last (M = the target's
// element count), as nll_loss and the fused cross_entropy take it.
inline AnyTensor classes_last(const AnyTensor& x, bool batched, int64_t M, int64_t C) {
  AnyTensor lp = x;
  if (!batched) {
    lp = lp.reshape(Shape{1, C});
  } else if (x.dim() > 2) {
    std::vector<int> perm{0};
    for (int i = 2; i < x.dim(); ++i) perm.push_back(i);
    perm.push_back(1);
    lp = op::permute(x, perm);
  }
  return lp.reshape(Shape{M, C});
}

inline AnyTensor nll_core(const char* op, const AnyTensor& logp, const AnyTensor& input, const AnyTensor& target,
                          const AnyTensor& weight_in, int64_t ignore_index, double eps, Reduction red) {
  op::detail::check_defined(op, target, "target");
  op::detail::check_same_device(op, input, target);
  EMBER_CHECK(target.dtype() == DType::Int64 || target.dtype() == DType::Int32, DTypeError, op,
              ": target must hold class indices as int64 (or int32), got ", target.desc());
  EMBER_CHECK(input.dim() >= 1, ShapeError, op, ": input must be [C] or [N, C, ...], got ", input.desc());
  const bool batched = input.dim() >= 2;
  const int64_t C = input.shape()[batched ? 1 : 0];
  EMBER_CHECK(C > 0, ShapeError, op, ": input ", input.desc(), " has no classes");
  // Expected target shape: the input's shape without the class dimension.
  std::vector<int64_t> ts = input.shape().vec();
  ts.erase(ts.begin() + (batched ? 1 : 0));
  const Shape tshape(ts);
  EMBER_CHECK(target.shape() == tshape, ShapeError, op, ": target ", target.desc(), " does not match input ",
              input.desc(), " (expected target shape ", tshape.str(), ")");
  AnyTensor weight = optional_weight(op, "weight", weight_in, input, logp.dtype());
  if (weight.defined())
    EMBER_CHECK(weight.shape() == Shape{C}, ShapeError, op, ": weight ", weight_in.desc(), " must be [", C,
                "] (one per class) for input ", input.desc());
  const DType cdt = logp.dtype();
  const Device dev = logp.device();
  const int64_t M = tshape.numel();

  AnyTensor lp = classes_last(logp, batched, M, C);  // [M, C]

  // Valid (non-ignored) targets, and indices with the ignored ones replaced by 0 (a valid class).
  AnyTensor tgt = target.detach().to(DType::Int64).reshape(Shape{M});
  AnyTensor valid = op::ne(tgt, AnyTensor::full(Shape{}, static_cast<double>(ignore_index), DType::Int64, dev));
  AnyTensor safe = op::where(valid, tgt, AnyTensor::zeros(Shape{}, DType::Int64, dev));
  if (M > 0) {
    // min and max in one host read (one device sync).
    auto mm = op::concat({op::min(safe).reshape(Shape{1}), op::max(safe).reshape(Shape{1})}).to_double_vector();
    const int64_t lo = static_cast<int64_t>(mm[0]), hi = static_cast<int64_t>(mm[1]);
    EMBER_CHECK(lo >= 0 && hi < C, IndexError, op, ": target ", lo < 0 ? lo : hi, " is out of bounds for ", C,
                " classes (input ", input.desc(), ", ignore_index ", ignore_index, ")");
  }
  AnyTensor validf = valid.to(cdt);
  AnyTensor picked = op::gather(lp, 1, safe.reshape(Shape{M, 1})).reshape(Shape{M});
  AnyTensor wi = weight.defined() ? op::mul(op::index_select(weight, 0, safe), validf) : validf;
  AnyTensor loss = op::neg(op::mul(picked, wi));
  if (eps > 0.0) {
    AnyTensor weighted = weight.defined() ? op::mul(lp, weight) : lp;
    AnyTensor smooth = op::mul(op::neg(op::sum(weighted, {1})), validf);
    loss = op::add(op::mul(loss, 1.0 - eps), op::mul(smooth, eps / static_cast<double>(C)));
  }
  switch (red) {
    case Reduction::None: return loss.reshape(tshape);
    case Reduction::Sum: return op::sum(loss);
    case Reduction::Mean: {
      // sum / total weight. With every target ignored the total is 0: the loss is 0/0 = NaN as in
      // PyTorch, but so would be every gradient (d/dloss of loss/0), where PyTorch's are 0, and a
      // padding-only micro-batch would poison the parameters. So divide by the total where it is
      // non-zero (by 1 elsewhere: the loss terms are all 0 there) and add a constant NaN (no
      // gradient) where it is zero. No host read: it stays on the device.
      AnyTensor total = op::sum(wi);
      AnyTensor zero = AnyTensor::zeros(Shape{}, cdt, dev);
      AnyTensor is_zero = op::eq(total, zero);
      AnyTensor safe_total = op::where(is_zero, AnyTensor::full(Shape{}, 1.0, cdt, dev), total);
      AnyTensor mean = op::div(op::sum(loss), safe_total);
      AnyTensor nan_if_empty = op::where(is_zero.detach(), AnyTensor::full(Shape{}, std::nan(""), cdt, dev), zero);
      return op::add(mean, nan_if_empty);
    }
  }
  return loss;
}
// Cross-entropy of logits `x` (compute type, [N, C, d1, ...] or [C]) in one fused kernel per
// direction (Backend::cross_entropy_forward/backward): the log-sum-exp and the picked and smoothed
// terms per row, without the [M, C] log-probabilities of nll_core. Same checks, formula, mean's
// divisor and all-ignored NaN as nll_core. The class weights get no gradient here (the caller uses
// nll_core when they require one).
inline AnyTensor cross_entropy_fused(const AnyTensor& x, const AnyTensor& input, const AnyTensor& target,
                                     const AnyTensor& weight_in, int64_t ignore_index, double eps, Reduction red) {
  const char* op = "cross_entropy";
  op::detail::check_defined(op, target, "target");
  op::detail::check_same_device(op, input, target);
  EMBER_CHECK(target.dtype() == DType::Int64 || target.dtype() == DType::Int32, DTypeError, op,
              ": target must hold class indices as int64 (or int32), got ", target.desc());
  const bool batched = input.dim() >= 2;
  const int64_t C = input.shape()[batched ? 1 : 0];
  EMBER_CHECK(C > 0, ShapeError, op, ": input ", input.desc(), " has no classes");
  std::vector<int64_t> ts = input.shape().vec();
  ts.erase(ts.begin() + (batched ? 1 : 0));
  const Shape tshape(ts);
  EMBER_CHECK(target.shape() == tshape, ShapeError, op, ": target ", target.desc(), " does not match input ",
              input.desc(), " (expected target shape ", tshape.str(), ")");
  const DType cdt = x.dtype();
  const Device dev = x.device();
  AnyTensor weight = optional_weight(op, "weight", weight_in, input, cdt);
  if (weight.defined()) {
    EMBER_CHECK(weight.shape() == Shape{C}, ShapeError, op, ": weight ", weight_in.desc(), " must be [", C,
                "] (one per class) for input ", input.desc());
    weight = weight.detach();
  }
  const int64_t M = tshape.numel();
  AnyTensor lp = classes_last(x, batched, M, C);  // [M, C]
  AnyTensor tgt = target.detach().to(DType::Int64).reshape(Shape{M});
  if (M > 0) {  // bounds of the non-ignored targets, in one host read
    AnyTensor valid = op::ne(tgt, AnyTensor::full(Shape{}, static_cast<double>(ignore_index), DType::Int64, dev));
    AnyTensor safe = op::where(valid, tgt, AnyTensor::zeros(Shape{}, DType::Int64, dev));
    auto mm = op::concat({op::min(safe).reshape(Shape{1}), op::max(safe).reshape(Shape{1})}).to_double_vector();
    const int64_t lo = static_cast<int64_t>(mm[0]), hi = static_cast<int64_t>(mm[1]);
    EMBER_CHECK(lo >= 0 && hi < C, IndexError, op, ": target ", lo < 0 ? lo : hi, " is out of bounds for ", C,
                " classes (input ", input.desc(), ", ignore_index ", ignore_index, ")");
  }
  AnyTensor loss = AnyTensor::empty(Shape{M}, cdt, dev);
  AnyTensor wt = AnyTensor::empty(Shape{M}, cdt, dev);
  AnyTensor lse = AnyTensor::empty(Shape{M}, cdt == DType::Float64 ? DType::Float64 : DType::Float32, dev);
  const CrossEntropyArgs a{cdt, M, C, ignore_index, eps};
  auto ptr = [](const AnyTensor& t) -> const void* { return t.defined() ? t.data_ptr() : nullptr; };
  if (M > 0)
    lp.backend().cross_entropy_forward(a, lp.data_ptr(), static_cast<const int64_t*>(tgt.data_ptr()), ptr(weight),
                                       loss.data_ptr(), lse.data_ptr(), wt.data_ptr());
  if (autograd::any_requires_grad({lp})) {
    AnyTensor sx = lp.detach();
    autograd::record("cross_entropy", {lp}, {loss}, [sx, tgt, weight, lse, a](const std::vector<AnyTensor>& g) {
      AnyTensor gx = AnyTensor::empty(sx.shape(), sx.dtype(), sx.device());
      if (a.rows > 0)
        sx.backend().cross_entropy_backward(a, sx.data_ptr(), static_cast<const int64_t*>(tgt.data_ptr()),
                                            weight.defined() ? weight.data_ptr() : nullptr, lse.data_ptr(),
                                            g[0].data_ptr(), gx.data_ptr());
      return std::vector<AnyTensor>{gx};
    });
  }
  switch (red) {
    case Reduction::None: return loss.reshape(tshape);
    case Reduction::Sum: return op::sum(loss);
    case Reduction::Mean: {  // as nll_core: sum / total weight, NaN (no gradient) when every target is ignored
      AnyTensor total = op::sum(wt);
      AnyTensor zero = AnyTensor::zeros(Shape{}, cdt, dev);
      AnyTensor is_zero = op::eq(total, zero);
      AnyTensor safe_total = op::where(is_zero, AnyTensor::full(Shape{}, 1.0, cdt, dev), total);
      AnyTensor mean = op::div(op::sum(loss), safe_total);
      AnyTensor nan_if_empty = op::where(is_zero, AnyTensor::full(Shape{}, std::nan(""), cdt, dev), zero);
      return op::add(mean, nan_if_empty);
    }
  }
  return loss;
}
}  // namespace detail

namespace functional {

// mean/sum/none of (input - target)^2. A target of another shape is broadcast (with a warning,
// once), as in PyTorch.
template <Element T>
  requires std::is_floating_point_v<compute_t<T>>
Tensor<compute_t<T>> mse_loss(const Tensor<T>& input, const AnyTensor& target, const std::string& reduction = "mean") {
  auto red = detail::parse_reduction("mse_loss", reduction);
  op::detail::check_defined("mse_loss", input);
  AnyTensor x = detail::to_compute(input);
  AnyTensor t = detail::broadcast_target("mse_loss", 0, input, target, x.dtype());
  return Tensor<compute_t<T>>(detail::apply_reduction(op::square(op::sub(x, t)), red));
}

// mean/sum/none of |input - target|.
template <Element T>
  requires std::is_floating_point_v<compute_t<T>>
Tensor<compute_t<T>> l1_loss(const Tensor<T>& input, const AnyTensor& target, const std::string& reduction = "mean") {
  auto red = detail::parse_reduction("l1_loss", reduction);
  op::detail::check_defined("l1_loss", input);
  AnyTensor x = detail::to_compute(input);
  AnyTensor t = detail::broadcast_target("l1_loss", 1, input, target, x.dtype());
  return Tensor<compute_t<T>>(detail::apply_reduction(op::abs(op::sub(x, t)), red));
}

// 0.5 d^2 / beta where |d| < beta, |d| - 0.5 beta elsewhere (d = input - target); beta = 0 is L1.
template <Element T>
  requires std::is_floating_point_v<compute_t<T>>
Tensor<compute_t<T>> smooth_l1_loss(const Tensor<T>& input, const AnyTensor& target,
                                    const std::string& reduction = "mean", double beta = 1.0) {
  auto red = detail::parse_reduction("smooth_l1_loss", reduction);
  EMBER_CHECK(beta >= 0.0, ValueError, "smooth_l1_loss: beta must be non-negative, got ", beta);
  op::detail::check_defined("smooth_l1_loss", input);
  AnyTensor x = detail::to_compute(input);
  AnyTensor t = detail::broadcast_target("smooth_l1_loss", 2, input, target, x.dtype());
  AnyTensor d = op::sub(x, t);
  AnyTensor ad = op::abs(d);
  AnyTensor l;
  if (beta == 0.0) {
    l = ad;
  } else {
    AnyTensor quad = op::mul(op::square(d), 0.5 / beta);
    AnyTensor lin = op::sub(ad, 0.5 * beta);
    l = op::where(op::compare(CompareOp::Lt, ad, beta), quad, lin);
  }
  return Tensor<compute_t<T>>(detail::apply_reduction(l, red));
}

// Negative log-likelihood: input holds log-probabilities [N, C, d1, ...] (or [C]), target class
// indices [N, d1, ...] (or a 0-d tensor).
template <Element T>
  requires std::is_floating_point_v<compute_t<T>>
Tensor<compute_t<T>> nll_loss(const Tensor<T>& input, const AnyTensor& target, const NLLLossOptions& opt = {}) {
  auto red = detail::parse_reduction("nll_loss", opt.reduction);
  op::detail::check_defined("nll_loss", input);
  AnyTensor lp = detail::to_compute(input);
  return Tensor<compute_t<T>>(detail::nll_core("nll_loss", lp, input, target, opt.weight, opt.ignore_index, 0.0, red));
}

// Cross entropy of logits [N, C, d1, ...] (or [C]) against class indices [N, d1, ...] (or 0-d):
// log_softmax over the class dimension (stable: the row maximum is subtracted) then the
// weighted, label-smoothed NLL of PyTorch's torch.nn.functional.cross_entropy.
template <Element T>
  requires std::is_floating_point_v<compute_t<T>>
Tensor<compute_t<T>> cross_entropy(const Tensor<T>& input, const AnyTensor& target,
                                   const CrossEntropyOptions& opt = {}) {
  auto red = detail::parse_reduction("cross_entropy", opt.reduction);
  EMBER_CHECK(opt.label_smoothing >= 0.0 && opt.label_smoothing <= 1.0, ValueError,
              "cross_entropy: label_smoothing must be in [0, 1], got ", opt.label_smoothing);
  op::detail::check_defined("cross_entropy", input);
  EMBER_CHECK(input.dim() >= 1, ShapeError, "cross_entropy: input must be [C] or [N, C, ...], got ", input.desc());
  AnyTensor x = detail::to_compute(input);
  // The fused kernel, unless the class weights themselves need a gradient.
  if (!(opt.weight.defined() && opt.weight.requires_grad()))
    return Tensor<compute_t<T>>(detail::cross_entropy_fused(x, input, target, opt.weight, opt.ignore_index,
                                                            opt.label_smoothing, red));
  AnyTensor lp = op::log_softmax(x, input.dim() >= 2 ? 1 : 0);
  return Tensor<compute_t<T>>(detail::nll_core("cross_entropy", lp, input, target, opt.weight, opt.ignore_index,
                                               opt.label_smoothing, red));
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
  AnyTensor w = detail::optional_weight(name, "weight", opt.weight, input, cdt);
  AnyTensor pw = detail::optional_weight(name, "pos_weight", opt.pos_weight, input, cdt);
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
// A loss module with a reduction string, checked at construction.
class LossBase : public Module {
 public:
  LossBase(const char* name, std::string reduction) : name_(name), reduction_(std::move(reduction)) {
    parse_reduction(name, reduction_);
  }
  std::string type_name() const override { return name_; }
  const std::string& reduction() const { return reduction_; }

 protected:
  std::string name_;
  std::string reduction_;
};
}  // namespace detail

#define EMBER_ELEMENTWISE_LOSS(Class, fn)                                                   \
  class Class : public detail::LossBase {                                                  \
   public:                                                                                 \
    explicit Class(std::string reduction = "mean") : LossBase(#Class, std::move(reduction)) {} \
    template <Element T>                                                                   \
    Tensor<compute_t<T>> forward(const Tensor<T>& input, const AnyTensor& target) {        \
      return functional::fn(input, target, reduction_);                                    \
    }                                                                                      \
    template <Element T>                                                                   \
    Tensor<compute_t<T>> operator()(const Tensor<T>& input, const AnyTensor& target) {     \
      return forward(input, target);                                                       \
    }                                                                                      \
  };
EMBER_ELEMENTWISE_LOSS(MSELoss, mse_loss)
EMBER_ELEMENTWISE_LOSS(L1Loss, l1_loss)
#undef EMBER_ELEMENTWISE_LOSS

class SmoothL1Loss : public detail::LossBase {
 public:
  explicit SmoothL1Loss(std::string reduction = "mean", double beta = 1.0)
      : LossBase("SmoothL1Loss", std::move(reduction)), beta_(beta) {
    EMBER_CHECK(beta >= 0.0, ValueError, "SmoothL1Loss: beta must be non-negative, got ", beta);
  }
  template <Element T>
  Tensor<compute_t<T>> forward(const Tensor<T>& input, const AnyTensor& target) {
    return functional::smooth_l1_loss(input, target, reduction_, beta_);
  }
  template <Element T>
  Tensor<compute_t<T>> operator()(const Tensor<T>& input, const AnyTensor& target) {
    return forward(input, target);
  }
  double beta() const { return beta_; }

 private:
  double beta_;
};

// The class weight, when given, is a buffer named "weight" (as in PyTorch), so it moves with
// to(device) / to(dtype) and appears in the state dict.
class CrossEntropyLoss : public detail::LossBase {
 public:
  explicit CrossEntropyLoss(CrossEntropyOptions opt = {})
      : LossBase("CrossEntropyLoss", opt.reduction), opt_(std::move(opt)) {
    EMBER_CHECK(opt_.label_smoothing >= 0.0 && opt_.label_smoothing <= 1.0, ValueError,
                "CrossEntropyLoss: label_smoothing must be in [0, 1], got ", opt_.label_smoothing);
    if (opt_.weight.defined()) opt_.weight = register_buffer("weight", opt_.weight);
  }
  template <Element T>
  Tensor<compute_t<T>> forward(const Tensor<T>& input, const AnyTensor& target) {
    return functional::cross_entropy(input, target, opt_);
  }
  template <Element T>
  Tensor<compute_t<T>> operator()(const Tensor<T>& input, const AnyTensor& target) {
    return forward(input, target);
  }
  const CrossEntropyOptions& options() const { return opt_; }

 private:
  CrossEntropyOptions opt_;
};

class NLLLoss : public detail::LossBase {
 public:
  explicit NLLLoss(NLLLossOptions opt = {}) : LossBase("NLLLoss", opt.reduction), opt_(std::move(opt)) {
    if (opt_.weight.defined()) opt_.weight = register_buffer("weight", opt_.weight);
  }
  template <Element T>
  Tensor<compute_t<T>> forward(const Tensor<T>& input, const AnyTensor& target) {
    return functional::nll_loss(input, target, opt_);
  }
  template <Element T>
  Tensor<compute_t<T>> operator()(const Tensor<T>& input, const AnyTensor& target) {
    return forward(input, target);
  }

 private:
  NLLLossOptions opt_;
};

// Buffers "weight" and "pos_weight" when given, as in PyTorch.
class BCEWithLogitsLoss : public detail::LossBase {
 public:
  explicit BCEWithLogitsLoss(BCEWithLogitsOptions opt = {})
      : LossBase("BCEWithLogitsLoss", opt.reduction), opt_(std::move(opt)) {
    if (opt_.weight.defined()) opt_.weight = register_buffer("weight", opt_.weight);
    if (opt_.pos_weight.defined()) opt_.pos_weight = register_buffer("pos_weight", opt_.pos_weight);
  }
  template <Element T>
  Tensor<compute_t<T>> forward(const Tensor<T>& input, const AnyTensor& target) {
    return functional::binary_cross_entropy_with_logits(input, target, opt_);
  }
  template <Element T>
  Tensor<compute_t<T>> operator()(const Tensor<T>& input, const AnyTensor& target) {
    return forward(input, target);
  }

 private:
  BCEWithLogitsOptions opt_;
};

}  // namespace ember::nn
