#pragma once
// Indexing: index_select (and embedding lookup, its dim-0 case) and gather along a dimension.
// Backwards scatter with accumulation, so repeated indices add up. Indices are int64 (int32 is
// widened) and are checked against the dimension before any kernel runs.
#include "ember/ops/compare.hpp"
#include "ember/ops/detail/common.hpp"

namespace ember::op {

namespace detail {
inline AnyTensor as_int64(const AnyTensor& idx) { return idx.dtype() == DType::Int64 ? idx : idx.detach().to(DType::Int64); }

// Throws IndexError naming the op when any index is outside [0, n). Two small host reads.
// Comparisons, not min/max: the reductions carry int64 values in a double, where an index near
// 2^63 becomes 2^63 and wraps to a negative int64 on the way back; a comparison cannot wrap.
inline void check_index_range(const char* op, const AnyTensor& idx, int64_t n, const AnyTensor& x, int dim) {
  if (idx.numel() == 0) return;
  AnyTensor flat = idx.detach().reshape(Shape{idx.numel()});
  const bool too_low = reduce_dim_raw(ReduceOp::Max, op::compare(CompareOp::Lt, flat, 0.0), 0).item_double() != 0;
  const bool too_high =
      reduce_dim_raw(ReduceOp::Max, op::compare(CompareOp::Ge, flat, static_cast<double>(n)), 0).item_double() != 0;
  if (!too_low && !too_high) return;
  // The error path: find the first offending index exactly, on the host.
  AnyTensor host = flat.to(DType::Int64).to(Device::cpu());
  const auto* v = static_cast<const int64_t*>(host.data_ptr());
  int64_t bad = 0;
  for (int64_t i = 0; i < host.numel(); ++i)
    if (v[i] < 0 || v[i] >= n) {
      bad = v[i];
      break;
    }
  throw IndexError(::ember::detail::str_cat(op, ": index ", bad, " is out of range for dimension ", dim, " of size ", n,
                                            " of ", x.desc()));
}

// x and an index tensor: both defined, the index int64 or int32, on x's device.
inline void check_index_operands(const char* op, const AnyTensor& x, const AnyTensor& index) {
  check_defined(op, x);
  check_defined(op, index, "index");
  check_index_dtype(op, index);
  check_same_device(op, x, index);
}
}  // namespace detail

inline AnyTensor index_select(const AnyTensor& x, int dim, const AnyTensor& index) {
  detail::OpScope op_scope("index_select", x, index);
  detail::check_index_operands("index_select", x, index);
  EMBER_CHECK(index.dim() <= 1, ShapeError, "index_select: index must be 1-D, got ", index.desc());
  EMBER_CHECK(x.dim() >= 1, ShapeError, "index_select: needs at least one dimension, got ", x.desc());
  int d = normalize_dim(dim, x.dim(), "index_select");
  AnyTensor idx = detail::as_int64(index);
  const int64_t n = x.shape()[d];
  detail::check_index_range("index_select", idx, n, x, d);
  int64_t outer, inner;
  detail::outer_inner(x.shape(), d, outer, inner);
  Shape os = x.shape();
  os[d] = idx.numel();
  AnyTensor out = AnyTensor::empty(os, x.dtype(), x.device());
  if (out.numel() > 0)
    x.backend().index_select(x.dtype(), x.data_ptr(), static_cast<const int64_t*>(idx.data_ptr()), out.data_ptr(), outer,
                             n, idx.numel(), inner);
  if (autograd::any_requires_grad({x})) {
    Shape xs = x.shape();
    AnyTensor sidx = idx.detach();
    autograd::record("index_select", {x}, {out}, [xs, sidx, outer, n, inner](const std::vector<AnyTensor>& g) {
      AnyTensor gx = AnyTensor::zeros(xs, g[0].dtype(), g[0].device());
      if (g[0].numel() > 0)
        gx.backend().index_add(gx.dtype(), g[0].data_ptr(), static_cast<const int64_t*>(sidx.data_ptr()),
                               gx.data_ptr(), outer, n, sidx.numel(), inner);
      return std::vector<AnyTensor>{gx};
    });
  }
  return out;
}

// Rows of `weight` [num_embeddings, dim] picked by `indices` of any shape: result indices.shape + [dim].
inline AnyTensor embedding(const AnyTensor& weight, const AnyTensor& indices) {
  detail::OpScope op_scope("embedding", weight, indices);
  detail::check_defined("embedding", weight, "weight");
  detail::check_defined("embedding", indices, "indices");
  EMBER_CHECK(weight.dim() == 2, ShapeError, "embedding: weight must be [num_embeddings, dim], got ", weight.desc());
  detail::check_index_dtype("embedding", indices);
  detail::check_same_device("embedding", weight, indices);
  detail::check_index_range("embedding", indices, weight.shape()[0], weight, 0);
  AnyTensor flat = indices.reshape(Shape{indices.numel()});
  AnyTensor rows = index_select(weight, 0, flat);
  std::vector<int64_t> s = indices.shape().vec();
  s.push_back(weight.shape()[1]);
  return rows.reshape(Shape(s));
}

// torch.gather: out[..., j, ...] = x[..., index[..., j, ...], ...] along `dim`; index has x's rank
// and x's sizes in every other dimension.
inline AnyTensor gather(const AnyTensor& x, int dim, const AnyTensor& index) {
  detail::OpScope op_scope("gather", x, index);
  detail::check_index_operands("gather", x, index);
  EMBER_CHECK(x.dim() >= 1 && index.dim() == x.dim(), ShapeError, "gather: index ", index.desc(),
              " must have the rank of ", x.desc());
  int d = normalize_dim(dim, x.dim(), "gather");
  for (int i = 0; i < x.dim(); ++i)
    EMBER_CHECK(i == d || index.shape()[i] == x.shape()[i], ShapeError, "gather: index ", index.desc(),
                " differs from ", x.desc(), " in dimension ", i, " (only dimension ", d, " may differ)");
  AnyTensor idx = detail::as_int64(index);
  const int64_t n = x.shape()[d];
  detail::check_index_range("gather", idx, n, x, d);
  int64_t outer, inner;
  detail::outer_inner(x.shape(), d, outer, inner);
  const int64_t idx_n = idx.shape()[d];
  AnyTensor out = AnyTensor::empty(idx.shape(), x.dtype(), x.device());
  if (out.numel() > 0)
    x.backend().gather(x.dtype(), x.data_ptr(), static_cast<const int64_t*>(idx.data_ptr()), out.data_ptr(), outer, n,
                       idx_n, inner);
  if (autograd::any_requires_grad({x})) {
    Shape xs = x.shape();
    AnyTensor sidx = idx.detach();
    autograd::record("gather", {x}, {out}, [xs, sidx, outer, n, idx_n, inner](const std::vector<AnyTensor>& g) {
      AnyTensor gx = AnyTensor::zeros(xs, g[0].dtype(), g[0].device());
      if (g[0].numel() > 0)
        gx.backend().scatter_add(gx.dtype(), g[0].data_ptr(), static_cast<const int64_t*>(sidx.data_ptr()),
                                 gx.data_ptr(), outer, n, idx_n, inner);
      return std::vector<AnyTensor>{gx};
    });
  }
  return out;
}

}  // namespace ember::op

namespace ember {
template <Element T, Element I>
Tensor<T> index_select(const Tensor<T>& x, int dim, const Tensor<I>& index) {
  return Tensor<T>(op::index_select(x, dim, index));
}
template <Element T, Element I>
Tensor<T> embedding(const Tensor<T>& weight, const Tensor<I>& indices) {
  return Tensor<T>(op::embedding(weight, indices));
}
template <Element T, Element I>
Tensor<T> gather(const Tensor<T>& x, int dim, const Tensor<I>& index) {
  return Tensor<T>(op::gather(x, dim, index));
}
}  // namespace ember
