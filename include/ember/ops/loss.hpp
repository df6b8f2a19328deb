#pragma once
// Class-index losses with PyTorch's formula, checks and numerics (torch.nn.functional's
// cross_entropy and nll_loss):
//
//   op::cross_entropy(input, target, weight, ignore_index, label_smoothing, reduction)
//       logits [N, C, d1, ...] or [C]; one fused kernel per direction
//       (Backend::cross_entropy_forward/backward): the row's log-sum-exp and the picked and
//       smoothed terms, without the [M, C] log-probabilities
//   op::nll_loss(input, target, weight, ignore_index, reduction)
//       log-probabilities [N, C, d1, ...] or [C], composed from differentiable ops
//
// target holds class indices [N, d1, ...] (or 0-d), int64 or int32; weight is an optional [C]
// floating class weight. Per element (M = the target's element count, eps = label_smoothing):
//   loss_i = (1 - eps) * (-w[y_i] logp[i, y_i]) + (eps / C) * (-sum_c w[c] logp[i, c]),
//   0 where y_i == ignore_index; "mean" divides the sum by sum_i w[y_i] over non-ignored i.
// An index outside [0, C) that is not ignore_index is an IndexError naming the op (one small read
// of the targets' min and max to the host). A mean over targets that are all ignored is 0/0 = NaN
// as in PyTorch, with zero gradients (see weighted_mean).
//
// Precision: the loss is computed in the input's compute type -- fp32 for float16/bfloat16 inputs
// (cast up first, recorded, so gradients flow back to the input's type), the input's type
// otherwise -- and returned in it. The mixed-precision path relies on this.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ember/ops/compare.hpp"
#include "ember/ops/elementwise.hpp"
#include "ember/ops/index.hpp"
#include "ember/ops/reduce.hpp"
#include "ember/ops/shape.hpp"
#include "ember/ops/softmax.hpp"

namespace ember::op {

// How a loss reduces its per-element values (PyTorch's reduction="none" / "mean" / "sum").
enum class Reduction : uint8_t { None, Mean, Sum };

namespace detail {

// The type a loss computes in: fp32 for float16/bfloat16, the input's type otherwise.
inline DType loss_compute_dtype(DType t) { return is_low_precision(t) ? DType::Float32 : t; }

// An optional floating tensor (class weights, pos_weight) on the input's device, as the compute type.
inline AnyTensor optional_weight(const char* op, const char* what, const AnyTensor& w, const AnyTensor& input,
                                 DType cdt) {
  if (!w.defined()) return w;
  EMBER_CHECK(is_floating(w.dtype()), DTypeError, op, ": ", what, " must be floating point, got ", w.desc());
  check_same_device(op, input, w);
  return w.to(cdt);
}

// A class-index loss's problem, after the checks both losses share: input [C] or [N, C, ...] with
// C classes, a class-index target of the input's shape without the class dimension (tshape, M
// elements), and the class weight [C] as the compute type cdt (undefined when not given).
struct ClassProblem {
  Shape tshape;
  bool batched = false;
  int64_t C = 0, M = 0;
  AnyTensor weight;
};
inline ClassProblem class_problem(const char* op, const AnyTensor& input, const AnyTensor& target,
                                  const AnyTensor& weight_in, DType cdt) {
  check_defined(op, target, "target");
  check_same_device(op, input, target);
  EMBER_CHECK(target.dtype() == DType::Int64 || target.dtype() == DType::Int32, DTypeError, op,
              ": target must hold class indices as int64 (or int32), got ", target.desc());
  EMBER_CHECK(input.dim() >= 1, ShapeError, op, ": input must be [C] or [N, C, ...], got ", input.desc());
  ClassProblem p;
  p.batched = input.dim() >= 2;
  p.C = input.shape()[p.batched ? 1 : 0];
  EMBER_CHECK(p.C > 0, ShapeError, op, ": input ", input.desc(), " has no classes");
  std::vector<int64_t> ts = input.shape().vec();
  ts.erase(ts.begin() + (p.batched ? 1 : 0));
  p.tshape = Shape(ts);
  EMBER_CHECK(target.shape() == p.tshape, ShapeError, op, ": target ", target.desc(), " does not match input ",
              input.desc(), " (expected target shape ", p.tshape.str(), ")");
  p.M = p.tshape.numel();
  p.weight = optional_weight(op, "weight", weight_in, input, cdt);
  if (p.weight.defined())
    EMBER_CHECK(p.weight.shape() == Shape{p.C}, ShapeError, op, ": weight ", weight_in.desc(), " must be [", p.C,
                "] (one per class) for input ", input.desc());
  return p;
}

// The target as int64 [M] (index), which of its elements are not ignored (valid), and index with
// the ignored ones replaced by class 0 (safe). The others are checked to lie in [0, C), with one
// host read (one device sync) of safe's min and max.
struct ClassTargets {
  AnyTensor index, valid, safe;
};
inline ClassTargets class_targets(const char* op, const AnyTensor& target, const AnyTensor& input,
                                  const ClassProblem& p, int64_t ignore_index) {
  const Device dev = target.device();
  ClassTargets t;
  t.index = target.detach().to(DType::Int64).reshape(Shape{p.M});
  t.valid = ne(t.index, AnyTensor::full(Shape{}, static_cast<double>(ignore_index), DType::Int64, dev));
  t.safe = where(t.valid, t.index, AnyTensor::zeros(Shape{}, DType::Int64, dev));
  if (p.M > 0) {
    auto mm = concat({min(t.safe).reshape(Shape{1}), max(t.safe).reshape(Shape{1})}).to_double_vector();
    const int64_t lo = static_cast<int64_t>(mm[0]), hi = static_cast<int64_t>(mm[1]);
    EMBER_CHECK(lo >= 0 && hi < p.C, IndexError, op, ": target ", lo < 0 ? lo : hi, " is out of bounds for ", p.C,
                " classes (input ", input.desc(), ", ignore_index ", ignore_index, ")");
  }
  return t;
}

// x [C], [N, C] or [N, C, d1, ...] as [M, C]: the class dimension moved last (M = the target's
// element count).
inline AnyTensor classes_last(const AnyTensor& x, bool batched, int64_t M, int64_t C) {
  AnyTensor lp = x;
  if (!batched) {
    lp = lp.reshape(Shape{1, C});
  } else if (x.dim() > 2) {
    std::vector<int> perm{0};
    for (int i = 2; i < x.dim(); ++i) perm.push_back(i);
    perm.push_back(1);
    lp = permute(x, perm);
  }
  return lp.reshape(Shape{M, C});
}

// sum(loss) / sum(weights), the weights being each element's target weight (0 where ignored).
// With every target ignored the total is 0: the loss is 0/0 = NaN as in PyTorch, but so would be
// every gradient (d/dloss of loss/0), where PyTorch's are 0, and a padding-only micro-batch would
// poison the parameters. So divide by the total where it is non-zero (by 1 elsewhere: the loss
// terms are all 0 there) and add a constant NaN (no gradient) where it is zero. No host read: it
// stays on the device.
inline AnyTensor weighted_mean(const AnyTensor& loss, const AnyTensor& weights) {
  const DType cdt = loss.dtype();
  const Device dev = loss.device();
  AnyTensor total = sum(weights);
  AnyTensor zero = AnyTensor::zeros(Shape{}, cdt, dev);
  AnyTensor is_zero = eq(total, zero);
  AnyTensor safe_total = where(is_zero, AnyTensor::full(Shape{}, 1.0, cdt, dev), total);
  AnyTensor mean = div(sum(loss), safe_total);
  AnyTensor nan_if_empty = where(is_zero.detach(), AnyTensor::full(Shape{}, std::nan(""), cdt, dev), zero);
  return add(mean, nan_if_empty);
}

inline AnyTensor reduce_loss(const AnyTensor& loss, const AnyTensor& weights, const Shape& tshape, Reduction red) {
  switch (red) {
    case Reduction::None: return loss.reshape(tshape);
    case Reduction::Sum: return sum(loss);
    case Reduction::Mean: return weighted_mean(loss, weights);
  }
  return loss;
}

// The negative log-likelihood of the log-probabilities `logp` (the compute type, input's layout),
// composed from differentiable ops: what nll_loss computes, and cross_entropy where the class
// weights need a gradient. `input` is the caller's tensor, for messages.
inline AnyTensor nll_composite(const char* op, const AnyTensor& logp, const AnyTensor& input, const AnyTensor& target,
                               const AnyTensor& weight_in, int64_t ignore_index, double eps, Reduction red) {
  const DType cdt = logp.dtype();
  const ClassProblem p = class_problem(op, input, target, weight_in, cdt);
  const ClassTargets t = class_targets(op, target, input, p, ignore_index);
  AnyTensor lp = classes_last(logp, p.batched, p.M, p.C);  // [M, C]
  AnyTensor validf = t.valid.to(cdt);
  AnyTensor picked = gather(lp, 1, t.safe.reshape(Shape{p.M, 1})).reshape(Shape{p.M});
  AnyTensor wi = p.weight.defined() ? mul(index_select(p.weight, 0, t.safe), validf) : validf;
  AnyTensor loss = neg(mul(picked, wi));
  if (eps > 0.0) {
    AnyTensor weighted = p.weight.defined() ? mul(lp, p.weight) : lp;
    AnyTensor smooth = mul(neg(sum(weighted, {1})), validf);
    loss = add(mul(loss, 1.0 - eps), mul(smooth, eps / static_cast<double>(p.C)));
  }
  return reduce_loss(loss, wi, p.tshape, red);
}

// Cross-entropy of logits `x` (the compute type, input's layout) in one fused kernel per
// direction. Same checks, formula, mean's divisor and all-ignored NaN as nll_composite. The class
// weights get no gradient here (cross_entropy takes nll_composite when they require one).
inline AnyTensor cross_entropy_fused(const AnyTensor& x, const AnyTensor& input, const AnyTensor& target,
                                     const AnyTensor& weight_in, int64_t ignore_index, double eps, Reduction red) {
  const char* op = "cross_entropy";
  const DType cdt = x.dtype();
  const Device dev = x.device();
  const ClassProblem p = class_problem(op, input, target, weight_in, cdt);
  const AnyTensor weight = p.weight.defined() ? p.weight.detach() : p.weight;
  const int64_t M = p.M;
  const AnyTensor tgt = class_targets(op, target, input, p, ignore_index).index;
  AnyTensor lp = classes_last(x, p.batched, M, p.C);  // [M, C]
  AnyTensor loss = AnyTensor::empty(Shape{M}, cdt, dev);
  AnyTensor wt = AnyTensor::empty(Shape{M}, cdt, dev);
  AnyTensor lse = AnyTensor::empty(Shape{M}, cdt == DType::Float64 ? DType::Float64 : DType::Float32, dev);
  const CrossEntropyArgs a{cdt, M, p.C, ignore_index, eps};
  auto ptr = [](const AnyTensor& t) -> const void* { return t.defined() ? t.data_ptr() : nullptr; };
  if (M > 0)
    lp.backend().cross_entropy_forward(a, lp.data_ptr(), static_cast<const int64_t*>(tgt.data_ptr()), ptr(weight),
                                       loss.data_ptr(), lse.data_ptr(), wt.data_ptr());
  if (autograd::any_requires_grad({lp})) {
    AnyTensor sx = lp.detach();
    autograd::record(op, {lp}, {loss}, [sx, tgt, weight, lse, a](const std::vector<AnyTensor>& g) {
      AnyTensor gx = AnyTensor::empty(sx.shape(), sx.dtype(), sx.device());
      if (a.rows > 0)
        sx.backend().cross_entropy_backward(a, sx.data_ptr(), static_cast<const int64_t*>(tgt.data_ptr()),
                                            weight.defined() ? weight.data_ptr() : nullptr, lse.data_ptr(),
                                            g[0].data_ptr(), gx.data_ptr());
      return std::vector<AnyTensor>{gx};
    });
  }
  return reduce_loss(loss, wt, p.tshape, red);
}

}  // namespace detail

// Cross entropy of logits [N, C, d1, ...] (or [C]) against class indices [N, d1, ...] (or 0-d):
// log_softmax over the class dimension (stable: the row maximum is subtracted) then the weighted,
// label-smoothed NLL of torch.nn.functional.cross_entropy, in the fused kernel unless the class
// weights require a gradient (then log_softmax and nll_loss's composition). label_smoothing in
// [0, 1]. Returns the compute type (float32 for float16/bfloat16 logits).
inline AnyTensor cross_entropy(const AnyTensor& input, const AnyTensor& target, const AnyTensor& weight = {},
                               int64_t ignore_index = -100, double label_smoothing = 0.0,
                               Reduction reduction = Reduction::Mean) {
  const char* name = "cross_entropy";
  detail::OpScope op_scope(name, input, target, weight);
  EMBER_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, ValueError, name,
              ": label_smoothing must be in [0, 1], got ", label_smoothing);
  detail::check_defined(name, input);
  detail::check_floating(name, input);
  EMBER_CHECK(input.dim() >= 1, ShapeError, name, ": input must be [C] or [N, C, ...], got ", input.desc());
  AnyTensor x = input.to(detail::loss_compute_dtype(input.dtype()));
  if (!(weight.defined() && weight.requires_grad()))
    return detail::cross_entropy_fused(x, input, target, weight, ignore_index, label_smoothing, reduction);
  AnyTensor lp = log_softmax(x, input.dim() >= 2 ? 1 : 0);
  return detail::nll_composite(name, lp, input, target, weight, ignore_index, label_smoothing, reduction);
}

// Negative log-likelihood: input holds log-probabilities [N, C, d1, ...] (or [C]), target class
// indices [N, d1, ...] (or 0-d). Returns the compute type.
inline AnyTensor nll_loss(const AnyTensor& input, const AnyTensor& target, const AnyTensor& weight = {},
                          int64_t ignore_index = -100, Reduction reduction = Reduction::Mean) {
  const char* name = "nll_loss";
  detail::OpScope op_scope(name, input, target, weight);
  detail::check_defined(name, input);
  detail::check_floating(name, input);
  AnyTensor lp = input.to(detail::loss_compute_dtype(input.dtype()));
  return detail::nll_composite(name, lp, input, target, weight, ignore_index, 0.0, reduction);
}

}  // namespace ember::op

namespace ember {
template <Element T, Element I>
  requires std::is_floating_point_v<compute_t<T>>
Tensor<compute_t<T>> cross_entropy(const Tensor<T>& input, const Tensor<I>& target, const AnyTensor& weight = {},
                                   int64_t ignore_index = -100, double label_smoothing = 0.0,
                                   op::Reduction reduction = op::Reduction::Mean) {
  return Tensor<compute_t<T>>(op::cross_entropy(input, target, weight, ignore_index, label_smoothing, reduction));
}
template <Element T, Element I>
  requires std::is_floating_point_v<compute_t<T>>
Tensor<compute_t<T>> nll_loss(const Tensor<T>& input, const Tensor<I>& target, const AnyTensor& weight = {},
                              int64_t ignore_index = -100, op::Reduction reduction = op::Reduction::Mean) {
  return Tensor<compute_t<T>>(op::nll_loss(input, target, weight, ignore_index, reduction));
}
}  // namespace ember
