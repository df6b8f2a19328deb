#pragma once
// Matrix multiply: matmul(a, b, trans_a, trans_b) for vectors, matrices and batches (BLAS on the
// CPU, cuBLAS on CUDA). A batch of matrices times one matrix broadcasts the matrix; [..., m, k]
// times [k, n] folds the leading dimensions into m so it is one GEMM. linear(x, w, b) is
// torch.nn.functional.linear, x W^T + b, with the bias added inside the GEMM.
#include <vector>

#include "ember/ops/detail/common.hpp"

namespace ember::op {

namespace detail {
// The sizes of C = op(A) op(B) for A, B of rank 2 or 3 (a rank-2 operand is shared by every batch
// entry): A is [ar, ac] (per batch entry), B [br, bc], C [m, n] with inner dimension k.
struct GemmDims {
  int64_t ar, ac, br, bc, m, k, n, batch;
  bool batched;  // either operand has a batch dimension
  GemmDims(const Shape& as, const Shape& bs, bool ta, bool tb)
      : ar(as[as.dim() - 2]),
        ac(as[as.dim() - 1]),
        br(bs[bs.dim() - 2]),
        bc(bs[bs.dim() - 1]),
        m(ta ? ac : ar),
        k(ta ? ar : ac),
        n(tb ? br : bc),
        batch(std::max(as.dim() == 3 ? as[0] : 1, bs.dim() == 3 ? bs[0] : 1)),
        batched(as.dim() == 3 || bs.dim() == 3) {}
  Shape out_shape() const { return batched ? Shape{batch, m, n} : Shape{m, n}; }
};

// C = op(A) op(B) + beta C into c, already of the product's shape, for A, B of rank 2 or 3 with a
// non-zero inner dimension.
inline void gemm_into(const AnyTensor& a, const AnyTensor& b, bool ta, bool tb, AnyTensor& c, double beta) {
  const GemmDims d(a.shape(), b.shape(), ta, tb);
  c.backend().gemm(GemmArgs{.dtype = a.dtype(),
                            .trans_a = ta,
                            .trans_b = tb,
                            .m = d.m,
                            .n = d.n,
                            .k = d.k,
                            .a = a.data_ptr(),
                            .lda = d.ac,
                            .stride_a = a.dim() == 3 ? d.ar * d.ac : 0,
                            .b = b.data_ptr(),
                            .ldb = d.bc,
                            .stride_b = b.dim() == 3 ? d.br * d.bc : 0,
                            .c = c.data_ptr(),
                            .ldc = d.n,
                            .stride_c = d.m * d.n,
                            .batch = d.batch,
                            .beta = beta});
}

// C = op(A) op(B) for A, B of rank 2 or 3.
inline AnyTensor mm_raw(const AnyTensor& a, const AnyTensor& b, bool ta, bool tb) {
  const GemmDims d(a.shape(), b.shape(), ta, tb);
  AnyTensor c = AnyTensor::empty(d.out_shape(), a.dtype(), a.device(), "matmul");
  if (c.numel() == 0) return c;
  if (d.k == 0) {
    c.backend().fill(c.dtype(), c.data_ptr(), c.numel(), 0.0);
    return c;
  }
  gemm_into(a, b, ta, tb, c, 0.0);
  return c;
}

inline AnyTensor mm(const AnyTensor& a, const AnyTensor& b, bool ta, bool tb) {
  AnyTensor c = mm_raw(a, b, ta, tb);
  if (autograd::any_requires_grad({a, b})) {
    const bool ga = a.requires_grad(), gb = b.requires_grad();
    AnyTensor sa = a.detach(), sb = b.detach();
    autograd::record("matmul", {a, b}, {c}, [sa, sb, ta, tb, ga, gb](const std::vector<AnyTensor>& g) {
      const AnyTensor& gc = g[0];
      AnyTensor da, db;
      if (ga) {
        da = ta ? mm_raw(sb, gc, tb, true) : mm_raw(gc, sb, false, !tb);
        if (da.dim() != sa.dim()) da = reduce_dim_raw(ReduceOp::Sum, da, 0).reshape(sa.shape());
      }
      if (gb) {
        db = tb ? mm_raw(gc, sa, true, ta) : mm_raw(sa, gc, !ta, false);
        if (db.dim() != sb.dim()) db = reduce_dim_raw(ReduceOp::Sum, db, 0).reshape(sb.shape());
      }
      return std::vector<AnyTensor>{da, db};
    });
  }
  return c;
}
}  // namespace detail

inline AnyTensor matmul(const AnyTensor& a, const AnyTensor& b, bool trans_a = false, bool trans_b = false) {
  detail::OpScope op_scope("matmul", a, b);
  detail::check_operands("matmul", a, b);
  detail::check_floating("matmul", a);
  EMBER_CHECK(a.dim() >= 1 && b.dim() >= 1, ShapeError, "matmul: scalars cannot be multiplied: ", a.desc(), " and ",
              b.desc());
  // Vectors: a row vector on the left, a column vector on the right, squeezed afterwards.
  if (a.dim() == 1 || b.dim() == 1) {
    // Checked here, so that the message shows the caller's shapes, not the [1, k] and [k, 1] views.
    const Shape& as = a.shape();
    const Shape& bs = b.shape();
    const int64_t ka = a.dim() == 1 ? as[0] : (trans_a ? as[as.dim() - 2] : as[as.dim() - 1]);
    const int64_t kb = b.dim() == 1 ? bs[0] : (trans_b ? bs[bs.dim() - 1] : bs[bs.dim() - 2]);
    EMBER_CHECK(ka == kb, ShapeError, "matmul: inner dimensions differ: ", a.desc(),
                (trans_a && a.dim() > 1 ? " (transposed)" : ""), " times ", b.desc(),
                (trans_b && b.dim() > 1 ? " (transposed)" : ""), " (", ka, " vs ", kb, ")");
    AnyTensor a2 = a.dim() == 1 ? a.reshape(Shape{1, a.shape()[0]}) : a;
    AnyTensor b2 = b.dim() == 1 ? b.reshape(Shape{b.shape()[0], 1}) : b;
    AnyTensor r = matmul(a2, b2, a.dim() == 1 ? false : trans_a, b.dim() == 1 ? false : trans_b);
    std::vector<int64_t> s = r.shape().vec();
    if (b.dim() == 1) s.erase(s.end() - 1);
    if (a.dim() == 1) s.erase(s.end() - (b.dim() == 1 ? 1 : 2));
    return r.reshape(Shape(s));
  }
  const Shape& as = a.shape();
  const Shape& bs = b.shape();
  const int64_t k_a = trans_a ? as[as.dim() - 2] : as[as.dim() - 1];
  const int64_t k_b = trans_b ? bs[bs.dim() - 1] : bs[bs.dim() - 2];
  EMBER_CHECK(k_a == k_b, ShapeError, "matmul: inner dimensions differ: ", a.desc(), (trans_a ? " (transposed)" : ""),
              " times ", b.desc(), (trans_b ? " (transposed)" : ""), " (", k_a, " vs ", k_b, ")");
  // [..., m, k] x [k, n]: one GEMM over the folded leading dimensions.
  if (a.dim() > 2 && b.dim() == 2 && !trans_a) {
    std::vector<int64_t> out = as.vec();
    out.back() = trans_b ? bs[0] : bs[1];
    int64_t rows = 1;  // the folded leading dimensions (not numel / k, which divides by 0 when k is 0)
    for (int i = 0; i < as.dim() - 1; ++i) rows *= as[i];
    AnyTensor r = detail::mm(a.reshape(Shape{rows, k_a}), b, false, trans_b);
    return r.reshape(Shape(out));
  }
  // Batched: equal batch dimensions, or one operand a single matrix.
  std::vector<int64_t> a_batch(as.begin(), as.end() - 2), b_batch(bs.begin(), bs.end() - 2);
  EMBER_CHECK(a_batch.empty() || b_batch.empty() || a_batch == b_batch, ShapeError,
              "matmul: batch dimensions differ: ", a.desc(), " and ", b.desc());
  std::vector<int64_t> batch = a_batch.empty() ? b_batch : a_batch;
  int64_t nb = 1;
  for (int64_t d : batch) nb *= d;
  AnyTensor a3 = a_batch.empty() ? a : a.reshape(Shape{nb, as[as.dim() - 2], as[as.dim() - 1]});
  AnyTensor b3 = b_batch.empty() ? b : b.reshape(Shape{nb, bs[bs.dim() - 2], bs[bs.dim() - 1]});
  AnyTensor r = detail::mm(a3, b3, trans_a, trans_b);
  if (batch.empty()) return r;
  std::vector<int64_t> out = batch;
  out.push_back(r.shape()[1]);
  out.push_back(r.shape()[2]);
  return r.reshape(Shape(out));
}


namespace detail {
// The checks of linear and linear_act: x [..., in], w [out, in], b [out] or undefined.
inline void check_linear_args(const char* name, const AnyTensor& x, const AnyTensor& w, const AnyTensor& b) {
  check_operands(name, x, w, "input", "weight");
  check_floating(name, x);
  EMBER_CHECK(x.dim() >= 1, ShapeError, name, ": the input must have at least one dimension, got ", x.desc());
  EMBER_CHECK(w.dim() == 2, ShapeError, name, ": the weight must be [out_features, in_features], got ", w.desc());
  const int64_t in = w.shape()[1], out = w.shape()[0];
  EMBER_CHECK(x.shape()[x.dim() - 1] == in, ShapeError, name, ": input ", x.desc(), " must end in ", in,
              " features to match weight ", w.desc());
  if (b.defined()) {
    check_same_device(name, x, b);
    check_same_dtype(name, x, b);
    EMBER_CHECK(b.dim() == 1 && b.shape()[0] == out, ShapeError, name, ": the bias must be [", out,
                "] to match weight ", w.desc(), ", got ", b.desc());
  }
}

// The shapes of linear and linear_act for x [..., in] and w [out, in]: x folds into x2 [rows, in]
// (rows is the product of x's leading dimensions, not numel / in, which divides by 0 when in is
// 0), the GEMM gives y2 [rows, out], and y is y2 as [..., out].
struct LinearShapes {
  int64_t in, out, rows = 1;
  Shape x2, y2, y;
  LinearShapes(const AnyTensor& x, const AnyTensor& w) : in(w.shape()[1]), out(w.shape()[0]) {
    for (int i = 0; i < x.dim() - 1; ++i) rows *= x.shape()[i];
    std::vector<int64_t> y_dims = x.shape().vec();
    y_dims.back() = out;
    x2 = Shape{rows, in};
    y2 = Shape{rows, out};
    y = Shape(y_dims);
  }
};

// The gradients of y = x W^T + b from gy [rows, out] (x saved as [rows, in]): gx = gy W (in x's
// shape), gW = gy^T x, gb = the column sums of gy; each only where asked for.
inline std::vector<AnyTensor> linear_backward(const AnyTensor& gy, const AnyTensor& x2, const AnyTensor& w, bool gx,
                                              bool gw, bool gb, const Shape& x_shape) {
  AnyTensor dx, dw, db;
  if (gx) dx = mm_raw(gy, w, false, false).reshape(x_shape);
  if (gw) dw = mm_raw(gy, x2, true, false);
  if (gb) db = reduce_dim_raw(ReduceOp::Sum, gy, 0).reshape(Shape{w.shape()[0]});
  return {dx, dw, db};
}

inline const char* linear_act_name(LinearActivation a) {
  switch (a) {
    case LinearActivation::None: return "linear";
    case LinearActivation::Relu: return "linear_relu";
    case LinearActivation::Gelu: return "linear_gelu";
    case LinearActivation::GeluTanh: return "linear_gelu_tanh";
  }
  return "linear_act";
}
}  // namespace detail

// linear(x, w, b) = x W^T + b for x [..., in], w [out, in], b [out] (or undefined: no bias), as
// torch.nn.functional.linear. The leading dimensions of x fold into one GEMM, and the bias goes
// into it as torch's addmm does: C is filled with the broadcast bias and the GEMM adds x W^T to it
// (beta = 1), so the output is written once instead of a GEMM pass and a broadcast-add pass.
// Against matmul then `+ b` the last bits differ: the bias is added first and the BLAS adds its
// K-blocks to it. Backward: gx = gy W, gW = gy^T x, gb = the column sums of gy.
inline AnyTensor linear(const AnyTensor& x, const AnyTensor& w, const AnyTensor& b = AnyTensor()) {
  detail::OpScope op_scope("linear", x, w, b);
  detail::check_linear_args("linear", x, w, b);
  const detail::LinearShapes s(x, w);
  AnyTensor x2 = x.reshape(s.x2);
  AnyTensor y2;
  if (b.defined()) {
    y2 = detail::expand_raw(b, s.y2);  // always a new buffer: [rows, out] is never b's shape [out]
  } else {
    y2 = AnyTensor::empty(s.y2, x.dtype(), x.device(), "linear");
  }
  if (y2.numel() > 0) {
    if (s.in == 0) {
      if (!b.defined()) y2.backend().fill(y2.dtype(), y2.data_ptr(), y2.numel(), 0.0);
    } else {
      detail::gemm_into(x2, w, false, true, y2, b.defined() ? 1.0 : 0.0);
    }
  }
  AnyTensor y = y2.reshape(s.y);
  if (autograd::any_requires_grad({x, w, b})) {
    const bool gx = x.requires_grad(), gw = w.requires_grad(), gb = b.defined() && b.requires_grad();
    AnyTensor sx = x2.detach(), sw = w.detach();
    const Shape x_shape = x.shape(), y2_shape = s.y2;
    autograd::record("linear", {x, w, b}, {y},
                     [sx, sw, gx, gw, gb, x_shape, y2_shape](const std::vector<AnyTensor>& g) {
                       return detail::linear_backward(g[0].reshape(y2_shape), sx, sw, gx, gw, gb, x_shape);
                     });
  }
  return y;
}

// linear_act(x, w, b, act) = act(x W^T + b): a Linear layer and its activation as one op (one
// kernel-table call, one autograd node). The values are linear(x, w, b) followed by relu / gelu /
// gelu(tanh_approximation) exactly on the CPU (the same kernels in the same order, so the same
// bits). On CUDA the bias and the activation run in the GEMM's epilogue (cuBLASLt): z is not
// written, read back and written again, so the last bits differ from the composite by the
// epilogue's rounding (fp32: its own GELU; fp16/bf16: the activation of the unrounded sum).
// Memory: ReLU keeps only y for its backward (y > 0 exactly where z > 0), GELU keeps z as the
// composite does. Backward: gz = gy * act'(z), then as linear.
inline AnyTensor linear_act(const AnyTensor& x, const AnyTensor& w, const AnyTensor& b, LinearActivation act) {
  const char* name = detail::linear_act_name(act);
  detail::OpScope op_scope(name, x, w, b);
  detail::check_linear_args(name, x, w, b);
  if (act == LinearActivation::None) return linear(x, w, b);
  const detail::LinearShapes s(x, w);
  AnyTensor x2 = x.reshape(s.x2);
  const bool keep_z = linear_act_needs_z(act);
  AnyTensor y2 = AnyTensor::empty(s.y2, x.dtype(), x.device(), name);
  AnyTensor z2 = keep_z ? AnyTensor::empty(s.y2, x.dtype(), x.device(), name) : AnyTensor();
  if (y2.numel() > 0) {
    LinearActArgs a;
    a.dtype = x.dtype();
    a.rows = s.rows;
    a.in = s.in;
    a.out = s.out;
    a.act = act;
    y2.backend().linear_act_forward(a, x2.data_ptr(), w.data_ptr(), b.defined() ? b.data_ptr() : nullptr,
                                    keep_z ? z2.data_ptr() : nullptr, y2.data_ptr());
  }
  AnyTensor y = y2.reshape(s.y);
  if (autograd::any_requires_grad({x, w, b})) {
    const bool gx = x.requires_grad(), gw = w.requires_grad(), gb = b.defined() && b.requires_grad();
    AnyTensor sx = x2.detach(), sw = w.detach();
    // The activation's derivative reads z (GELU) or y (ReLU, standing in for z).
    AnyTensor saved = keep_z ? z2 : y2.detach();
    const UnaryOp uop = act == LinearActivation::Relu ? UnaryOp::Relu
                        : act == LinearActivation::Gelu ? UnaryOp::Gelu
                                                        : UnaryOp::GeluTanh;
    const Shape x_shape = x.shape(), y2_shape = s.y2;
    autograd::record(name, {x, w, b}, {y},
                     [sx, sw, saved, uop, gx, gw, gb, x_shape, y2_shape](const std::vector<AnyTensor>& g) {
                       const AnyTensor gy = g[0].reshape(y2_shape);
                       AnyTensor gz = AnyTensor::empty(gy.shape(), gy.dtype(), gy.device());
                       if (gz.numel() > 0)
                         gz.backend().unary_backward(uop, gz.dtype(), saved.data_ptr(), nullptr, gy.data_ptr(),
                                                     gz.data_ptr(), gz.numel(), 0.0, 0.0);
                       return detail::linear_backward(gz, sx, sw, gx, gw, gb, x_shape);
                     });
  }
  return y;
}

}  // namespace ember::op

namespace ember {
template <Element T>
Tensor<T> matmul(const Tensor<T>& a, const Tensor<T>& b, bool trans_a = false, bool trans_b = false) {
  return Tensor<T>(op::matmul(a, b, trans_a, trans_b));
}
// x W^T + b (torch.nn.functional.linear); b may be an undefined tensor (no bias).
template <Element T>
Tensor<T> linear(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& b = Tensor<T>()) {
  return Tensor<T>(op::linear(x, w, b));
}
// act(x W^T + b) as one op (op::linear_act); b may be undefined.
template <Element T>
Tensor<T> linear_act(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& b, LinearActivation act) {
  return Tensor<T>(op::linear_act(x, w, b, act));
}
}  // namespace ember
