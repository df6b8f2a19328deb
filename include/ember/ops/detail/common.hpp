#pragma once
// Checks and shape helpers shared by the op families: argument validation with messages that name
// the op, shapes, dtypes and devices, NumPy broadcasting, and the two broadcasting adjoints (expand
// a gradient up, sum a gradient down).
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <vector>

#include "ember/core/tensor.hpp"
#include "ember/core/trace.hpp"

namespace ember::op::detail {

// The profiler's hook into every op: each public op opens one of these first, with its name (a
// string literal) and inputs. With no profiler listening it costs one load and one predictable
// branch; the inputs are read only when one listens.
class OpScope : trace::ListenerScope {
 public:
  template <class... Ts>
  explicit OpScope(const char* name, const Ts&... inputs) {
    if (listener_) [[unlikely]] begin(name, {&inputs...});
  }
  ~OpScope() {
    if (listener_) [[unlikely]] listener_->op_end(name_);
  }

 private:
  [[gnu::noinline]] void begin(const char* name, std::initializer_list<const AnyTensor*> inputs) {
    name_ = name;
    trace::OpInput in[trace::kMaxOpInputs];
    int n = 0;
    for (const AnyTensor* t : inputs) {
      if (n == trace::kMaxOpInputs) break;
      if (!t->defined()) continue;
      in[n++] = trace::OpInput{t->dtype(), t->device(), t->shape()};
    }
    listener_->op_begin(name, in, n);
  }
  const char* name_ = nullptr;
};
// An op over a list of tensors (concat): the first kMaxOpInputs are recorded.
class OpScopeList : trace::ListenerScope {
 public:
  OpScopeList(const char* name, const std::vector<AnyTensor>& inputs) {
    if (listener_) [[unlikely]] begin(name, inputs);
  }
  ~OpScopeList() {
    if (listener_) [[unlikely]] listener_->op_end(name_);
  }

 private:
  [[gnu::noinline]] void begin(const char* name, const std::vector<AnyTensor>& inputs) {
    name_ = name;
    trace::OpInput in[trace::kMaxOpInputs];
    int n = 0;
    for (const AnyTensor& t : inputs) {
      if (n == trace::kMaxOpInputs) break;
      if (t.defined()) in[n++] = trace::OpInput{t.dtype(), t.device(), t.shape()};
    }
    listener_->op_begin(name, in, n);
  }
  const char* name_ = nullptr;
};

inline void check_defined(const char* op, const AnyTensor& t, const char* what = "input") {
  EMBER_CHECK(t.defined(), ValueError, op, ": ", what, " is an undefined tensor");
}

inline void check_same_device(const char* op, const AnyTensor& a, const AnyTensor& b) {
  EMBER_CHECK(a.device() == b.device(), DeviceError, op, ": tensors on different devices: ", a.desc(), " and ",
              b.desc(), "; move one with .to(device)");
}

inline void check_same_dtype(const char* op, const AnyTensor& a, const AnyTensor& b) {
  EMBER_CHECK(a.dtype() == b.dtype(), DTypeError, op, ": dtypes differ: ", a.desc(), " and ", b.desc(),
              "; cast one with .to<T>()");
}

// The two operands of a binary op: both defined (`a_what` and `b_what` name them in the message),
// on one device, of one dtype.
inline void check_operands(const char* op, const AnyTensor& a, const AnyTensor& b, const char* a_what = "first input",
                           const char* b_what = "second input") {
  check_defined(op, a, a_what);
  check_defined(op, b, b_what);
  check_same_device(op, a, b);
  check_same_dtype(op, a, b);
}

inline void check_floating(const char* op, const AnyTensor& a) {
  EMBER_CHECK(is_floating(a.dtype()), DTypeError, op, ": needs a floating-point tensor, got ", a.desc());
}

inline void check_index_dtype(const char* op, const AnyTensor& idx) {
  EMBER_CHECK(idx.dtype() == DType::Int64 || idx.dtype() == DType::Int32, DTypeError, op,
              ": indices must be int64 or int32, got ", idx.desc());
}

inline void check_nonempty(const char* op, const AnyTensor& a) {
  EMBER_CHECK(a.numel() > 0, ShapeError, op, ": empty tensor ", a.desc(), " has no elements to reduce");
}

inline Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b, const char* an = "",
                              const char* bn = "") {
  const int n = std::max(a.dim(), b.dim());
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    int ia = a.dim() - n + i, ib = b.dim() - n + i;
    int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    EMBER_CHECK(da == db || da == 1 || db == 1, ShapeError, op, ": shapes ", a.str(), an, " and ", b.str(), bn,
                " cannot be broadcast together (dimension ", i, ": ", da, " vs ", db, ")");
    out[static_cast<size_t>(i)] = da == 1 ? db : da;
  }
  Shape r(out);
  r.checked_numel(op);  // [2^32, 1] with [1, 2^32]: a ShapeError naming the op, not a wrapped count
  return r;
}

// Strides for reading a tensor of shape `in` as if broadcast to shape `out`.
inline void broadcast_strides(const Shape& in, const Shape& out, int64_t* strides) {
  auto s = in.strides();
  const int off = out.dim() - in.dim();
  for (int i = 0; i < out.dim(); ++i) {
    int j = i - off;
    strides[i] = (j < 0 || in[j] == 1) ? 0 : s[static_cast<size_t>(j)];
  }
}

inline StridedArgs strided_args(const Shape& out, const Shape* a, const Shape* b = nullptr, const Shape* c = nullptr) {
  StridedArgs s;
  s.ndim = out.dim();
  for (int i = 0; i < out.dim(); ++i) s.shape[i] = out[i];
  if (a) broadcast_strides(*a, out, s.stride_a);
  if (b) broadcast_strides(*b, out, s.stride_b);
  if (c) broadcast_strides(*c, out, s.stride_c);
  return s;
}

// x expanded (materialised) to `shape`, which x broadcasts to. Not recorded.
inline AnyTensor expand_raw(const AnyTensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  AnyTensor out = AnyTensor::empty(shape, x.dtype(), x.device());
  Shape xs = x.shape();
  if (out.numel() > 0) out.backend().strided_copy(x.dtype(), x.data_ptr(), out.data_ptr(), strided_args(shape, &xs));
  return out;
}

// Views a tensor of shape s as [outer, s[d], inner] around dimension d (the kernels' layout for
// reductions, indexing and block copies along d).
inline void outer_inner(const Shape& s, int d, int64_t& outer, int64_t& inner) {
  outer = 1;
  inner = 1;
  for (int i = 0; i < d; ++i) outer *= s[i];
  for (int i = d + 1; i < s.dim(); ++i) inner *= s[i];
}

// Sum of x over dimension d (kept as size 1). Not recorded.
inline AnyTensor reduce_dim_raw(ReduceOp op, const AnyTensor& x, int d) {
  const Shape& s = x.shape();
  int64_t outer, inner;
  outer_inner(s, d, outer, inner);
  Shape os = s;
  os[d] = 1;
  const bool arg = op == ReduceOp::ArgMax || op == ReduceOp::ArgMin;
  AnyTensor out = AnyTensor::empty(os, arg ? DType::Int64 : x.dtype(), x.device());
  if (s[d] == 0) {  // sum over nothing is zero, a mean 0/0 = NaN (max/min of nothing were rejected by the caller)
    if (out.numel() > 0)
      out.backend().fill(out.dtype(), out.data_ptr(), out.numel(), op == ReduceOp::Mean ? std::nan("") : 0.0);
    return out;
  }
  if (out.numel() > 0) x.backend().reduce(op, x.dtype(), x.data_ptr(), out.data_ptr(), outer, s[d], inner);
  return out;
}

// The adjoint of broadcasting: sums g (of a broadcast shape) down to `shape`. Not recorded.
inline AnyTensor sum_to_raw(const AnyTensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  AnyTensor cur = g;
  const int off = g.dim() - shape.dim();
  for (int i = g.dim() - 1; i >= 0; --i) {
    int j = i - off;
    if ((j < 0 || shape[j] == 1) && cur.shape()[i] != 1) cur = reduce_dim_raw(ReduceOp::Sum, cur, i);
  }
  return cur.reshape(shape);
}

}  // namespace ember::op::detail
