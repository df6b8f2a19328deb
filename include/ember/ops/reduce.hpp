#pragma once
// Reductions over given dimensions with keepdim: sum, mean, max, min (forward and backward),
// argmax, argmin (no gradient), var and std (with a correction, composed). The dimensions are a
// list ({} or none: all of them) or one plain integer: sum(x, {0, 2}), argmax(x, 1).
#include <algorithm>
#include <concepts>
#include <initializer_list>
#include <utility>
#include <vector>

#include "ember/ops/detail/common.hpp"
#include "ember/ops/elementwise.hpp"

namespace ember::op {

// The dimensions a reduction runs over: a list (`{}` or nothing for all of them, `{1}`, `{0, 2}`,
// a std::vector<int>) or one dimension as a plain integer, so that argmax(x, 1) reads as in
// PyTorch. bool is not a dimension.
class ReduceDims {
 public:
  ReduceDims() = default;
  ReduceDims(std::initializer_list<int> dims) : dims_(dims) {}
  ReduceDims(std::vector<int> dims) : dims_(std::move(dims)) {}
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  ReduceDims(I dim) : dims_{static_cast<int>(dim)} {}
  const std::vector<int>& list() const { return dims_; }

 private:
  std::vector<int> dims_;
};

namespace detail {
inline const char* reduce_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Mean: return "mean";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::ArgMax: return "argmax";
    case ReduceOp::ArgMin: return "argmin";
  }
  return "reduce";
}

// Normalised, sorted, de-duplicated dims; all dims when `dims` is empty.
inline std::vector<int> reduce_dims(const char* op, const AnyTensor& x, const std::vector<int>& dims) {
  std::vector<int> out;
  if (dims.empty()) {
    for (int i = 0; i < x.dim(); ++i) out.push_back(i);
  } else {
    for (int d : dims) {
      // A 0-d tensor takes dimension 0 or -1, as in PyTorch; the message says rank 0, not 1.
      EMBER_CHECK(x.dim() > 0 || d == 0 || d == -1, IndexError, op, ": dimension ", d,
                  " out of range for a tensor of rank 0 (", x.desc(), " takes dimension 0 or -1)");
      out.push_back(normalize_dim(d, std::max(x.dim(), 1), op));
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (x.dim() == 0) out.clear();
  return out;
}

inline Shape reduced_shape(const Shape& s, const std::vector<int>& dims, bool keepdim) {
  std::vector<int64_t> out;
  for (int i = 0; i < s.dim(); ++i) {
    bool r = std::find(dims.begin(), dims.end(), i) != dims.end();
    if (!r) out.push_back(s[i]);
    else if (keepdim) out.push_back(1);
  }
  return Shape(out);
}

// Reduces over dims (innermost first, each kept as size 1), then reshapes to the result shape.
// The result is always a new tensor: with nothing to reduce (a 0-d input), a copy, never a view.
inline AnyTensor reduce_raw(ReduceOp op, const AnyTensor& x, const std::vector<int>& dims, bool keepdim) {
  AnyTensor cur = dims.empty() ? x.detach().clone() : x;
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) cur = reduce_dim_raw(op, cur, *it);
  return cur.detach().reshape(reduced_shape(x.shape(), dims, keepdim));
}
}  // namespace detail

inline AnyTensor reduce(ReduceOp op, const AnyTensor& x, const ReduceDims& dims = {}, bool keepdim = false) {
  const char* name = detail::reduce_name(op);
  detail::OpScope op_scope(name, x);
  detail::check_defined(name, x);
  std::vector<int> rd = detail::reduce_dims(name, x, dims.list());
  // Sums over nothing are 0 and means NaN (0/0), as in PyTorch; extrema of nothing do not exist.
  if (op != ReduceOp::Sum && op != ReduceOp::Mean) {
    for (int d : rd)
      EMBER_CHECK(x.shape()[d] > 0, ShapeError, name, ": cannot reduce over the empty dimension ", d, " of ",
                  x.desc());
    if (x.dim() == 0) EMBER_CHECK(x.numel() > 0, ShapeError, name, ": empty tensor ", x.desc());
  }
  if (op == ReduceOp::Mean) detail::check_floating(name, x);
  if (op == ReduceOp::ArgMax || op == ReduceOp::ArgMin) {
    if (x.dim() == 0) return AnyTensor::zeros(Shape{}, DType::Int64, x.device());  // the only index
    EMBER_CHECK(rd.size() <= 1 || static_cast<int>(rd.size()) == x.dim(), ShapeError, name,
                ": reduces over one dimension or all of them, got ", rd.size(), " of ", x.desc());
    if (rd.size() > 1) {  // over everything: the flat index
      AnyTensor flat = x.detach().reshape(Shape{x.numel()});
      AnyTensor r = detail::reduce_raw(op, flat, {0}, false);
      return keepdim ? r.reshape(detail::reduced_shape(x.shape(), rd, true)) : r;
    }
    return detail::reduce_raw(op, x, rd, keepdim);
  }
  AnyTensor y = detail::reduce_raw(op, x, rd, keepdim);
  if (autograd::any_requires_grad({x})) {
    Shape xs = x.shape();
    Shape keep_shape = detail::reduced_shape(xs, rd, true);
    int64_t count = 1;
    for (int d : rd) count *= xs[d];
    AnyTensor sx = (op == ReduceOp::Max || op == ReduceOp::Min) ? x.detach() : AnyTensor();
    AnyTensor sy = sx.defined() ? y.detach() : AnyTensor();
    autograd::record(name, {x}, {y}, [op, xs, keep_shape, count, sx, sy](const std::vector<AnyTensor>& g) {
      AnyTensor gk = g[0].reshape(keep_shape);
      AnyTensor gx = detail::expand_raw(gk, xs);
      if (op == ReduceOp::Mean) {
        gx = detail::unary_raw(UnaryOp::MulScalar, gx, 1.0 / static_cast<double>(count), 0);
      } else if (op == ReduceOp::Max || op == ReduceOp::Min) {
        // Gradient to every position equal to the extremum, split evenly between ties.
        AnyTensor yk = sy.reshape(keep_shape);
        AnyTensor mask = AnyTensor::empty(xs, DType::UInt8, sx.device());
        StridedArgs st = detail::strided_args(xs, &xs, &keep_shape);
        sx.backend().compare(CompareOp::Eq, sx.dtype(), sx.data_ptr(), yk.data_ptr(),
                             static_cast<uint8_t*>(mask.data_ptr()), st);
        AnyTensor fm = mask.to(sx.dtype());
        // A NaN extremum equals nothing: there the gradient goes to the NaN inputs (x != x), as
        // torch's evenly_distribute_backward does; a group without NaN is unchanged (all 0).
        {
          AnyTensor y_nan = AnyTensor::empty(keep_shape, DType::UInt8, sx.device());
          AnyTensor x_nan = AnyTensor::empty(xs, DType::UInt8, sx.device());
          StridedArgs sk = detail::strided_args(keep_shape, &keep_shape, &keep_shape);
          StridedArgs sxx = detail::strided_args(xs, &xs, &xs);
          sx.backend().compare(CompareOp::Ne, sx.dtype(), yk.data_ptr(), yk.data_ptr(),
                               static_cast<uint8_t*>(y_nan.data_ptr()), sk);
          sx.backend().compare(CompareOp::Ne, sx.dtype(), sx.data_ptr(), sx.data_ptr(),
                               static_cast<uint8_t*>(x_nan.data_ptr()), sxx);
          AnyTensor both = detail::binary_raw(BinaryOp::Mul, x_nan.to(sx.dtype()),
                                              detail::expand_raw(y_nan.to(sx.dtype()), xs), xs);
          fm = detail::binary_raw(BinaryOp::Add, fm, both, xs);
        }
        // Tie counts per reduced group: sum the mask over the reduced dimensions, kept.
        std::vector<int> dims_k;
        for (int i = 0; i < xs.dim(); ++i)
          if (keep_shape[i] == 1 && xs[i] != 1) dims_k.push_back(i);
        AnyTensor cnt = detail::reduce_raw(ReduceOp::Sum, fm, dims_k, true).reshape(keep_shape);
        AnyTensor w = detail::binary_raw(BinaryOp::Div, fm, detail::expand_raw(cnt, xs), xs);
        gx = detail::binary_raw(BinaryOp::Mul, gx, w, xs);
      }
      return std::vector<AnyTensor>{gx};
    });
  }
  return y;
}

inline AnyTensor sum(const AnyTensor& x, const ReduceDims& dims = {}, bool keepdim = false) {
  return reduce(ReduceOp::Sum, x, dims, keepdim);
}
inline AnyTensor mean(const AnyTensor& x, const ReduceDims& dims = {}, bool keepdim = false) {
  return reduce(ReduceOp::Mean, x, dims, keepdim);
}
inline AnyTensor max(const AnyTensor& x, const ReduceDims& dims = {}, bool keepdim = false) {
  return reduce(ReduceOp::Max, x, dims, keepdim);
}
inline AnyTensor min(const AnyTensor& x, const ReduceDims& dims = {}, bool keepdim = false) {
  return reduce(ReduceOp::Min, x, dims, keepdim);
}
inline AnyTensor argmax(const AnyTensor& x, const ReduceDims& dims = {}, bool keepdim = false) {
  return reduce(ReduceOp::ArgMax, x, dims, keepdim);
}
inline AnyTensor argmin(const AnyTensor& x, const ReduceDims& dims = {}, bool keepdim = false) {
  return reduce(ReduceOp::ArgMin, x, dims, keepdim);
}

// Variance over dims, as torch.var(x, dim, correction=1, keepdim): sum((x - mean)^2) divided by
// max(0, N - correction), N the number of elements reduced; correction 1 is Bessel's (the sample
// variance), 0 the population variance. N - correction <= 0 gives inf or nan, as in PyTorch.
// Composed from differentiable ops: the gradient is 2 (x - mean) / (N - correction).
inline AnyTensor var(const AnyTensor& x, const ReduceDims& dims = {}, double correction = 1.0,
                     bool keepdim = false) {
  detail::check_defined("var", x);
  detail::check_floating("var", x);
  EMBER_CHECK(correction >= 0.0, ValueError, "var: correction must be non-negative, got ", correction);
  const std::vector<int> rd = detail::reduce_dims("var", x, dims.list());
  int64_t n = 1;
  for (int d : rd) n *= x.shape()[d];
  if (x.dim() == 0) n = 1;
  AnyTensor centred = sub(x, mean(x, rd, true));
  AnyTensor ss = x.dim() == 0 ? square(centred) : sum(square(centred), rd, keepdim);
  const double dof = std::max(0.0, static_cast<double>(n) - correction);
  return mul(ss, 1.0 / dof);
}
// Standard deviation: sqrt(var(x, dims, correction, keepdim)), as torch.std.
inline AnyTensor std(const AnyTensor& x, const ReduceDims& dims = {}, double correction = 1.0,
                     bool keepdim = false) {
  detail::check_defined("std", x);
  detail::check_floating("std", x);
  detail::reduce_dims("std", x, dims.list());  // a bad dimension is named as std's, not var's
  return sqrt(var(x, dims, correction, keepdim));
}

}  // namespace ember::op

namespace ember {

template <Element T> Tensor<T> sum(const Tensor<T>& x, const op::ReduceDims& dims = {}, bool keepdim = false) {
  return Tensor<T>(op::sum(x, dims, keepdim));
}
template <Element T> Tensor<T> mean(const Tensor<T>& x, const op::ReduceDims& dims = {}, bool keepdim = false) {
  return Tensor<T>(op::mean(x, dims, keepdim));
}
template <Element T> Tensor<T> max(const Tensor<T>& x, const op::ReduceDims& dims = {}, bool keepdim = false) {
  return Tensor<T>(op::max(x, dims, keepdim));
}
template <Element T> Tensor<T> min(const Tensor<T>& x, const op::ReduceDims& dims = {}, bool keepdim = false) {
  return Tensor<T>(op::min(x, dims, keepdim));
}
template <Element T> Tensor<int64_t> argmax(const Tensor<T>& x, const op::ReduceDims& dims = {}, bool keepdim = false) {
  return Tensor<int64_t>(op::argmax(x, dims, keepdim));
}
template <Element T> Tensor<int64_t> argmin(const Tensor<T>& x, const op::ReduceDims& dims = {}, bool keepdim = false) {
  return Tensor<int64_t>(op::argmin(x, dims, keepdim));
}
template <Element T>
Tensor<T> var(const Tensor<T>& x, const op::ReduceDims& dims = {}, double correction = 1.0, bool keepdim = false) {
  return Tensor<T>(op::var(x, dims, correction, keepdim));
}
template <Element T>
Tensor<T> std(const Tensor<T>& x, const op::ReduceDims& dims = {}, double correction = 1.0, bool keepdim = false) {
  return Tensor<T>(op::std(x, dims, correction, keepdim));
}

}  // namespace ember
