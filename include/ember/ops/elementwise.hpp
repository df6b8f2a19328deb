#pragma once
// Elementwise ops with NumPy broadcasting, forward and backward: add, sub, mul, div, pow,
// maximum, minimum; neg, exp, log, sqrt, abs, clamp, relu, gelu (exact and tanh), silu, tanh,
// sigmoid, square, reciprocal, sign, fake_quantize; scalar forms; C++ operators on Tensor<T>.
#include "ember/ops/detail/common.hpp"

namespace ember::op {

namespace detail {
inline const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg: return "neg";
    case UnaryOp::Exp: return "exp";
    case UnaryOp::Log: return "log";
    case UnaryOp::Sqrt: return "sqrt";
    case UnaryOp::Abs: return "abs";
    case UnaryOp::Relu: return "relu";
    case UnaryOp::Gelu: return "gelu";
    case UnaryOp::GeluTanh: return "gelu_tanh";
    case UnaryOp::Silu: return "silu";
    case UnaryOp::Tanh: return "tanh";
    case UnaryOp::Sigmoid: return "sigmoid";
    case UnaryOp::Pow: return "pow";
    case UnaryOp::Clamp: return "clamp";
    case UnaryOp::AddScalar: return "add_scalar";
    case UnaryOp::MulScalar: return "mul_scalar";
    case UnaryOp::RSubScalar: return "rsub_scalar";
    case UnaryOp::RDivScalar: return "rdiv_scalar";
    case UnaryOp::Square: return "square";
    case UnaryOp::Reciprocal: return "reciprocal";
    case UnaryOp::Sign: return "sign";
    case UnaryOp::FakeQuantize: return "fake_quantize";
  }
  return "unary";
}

// Ops whose derivative needs y = op(x) rather than x.
inline bool backward_uses_output(UnaryOp op) {
  return op == UnaryOp::Exp || op == UnaryOp::Sqrt || op == UnaryOp::Tanh || op == UnaryOp::Sigmoid ||
         op == UnaryOp::Reciprocal;
}
// Ops defined on integer tensors too.
inline bool integer_ok(UnaryOp op) {
  return op == UnaryOp::Neg || op == UnaryOp::Abs || op == UnaryOp::Relu || op == UnaryOp::Clamp ||
         op == UnaryOp::AddScalar || op == UnaryOp::MulScalar || op == UnaryOp::RSubScalar ||
         op == UnaryOp::Square || op == UnaryOp::Sign;
}

inline AnyTensor unary_raw(UnaryOp op, const AnyTensor& x, double a, double b) {
  AnyTensor out = AnyTensor::empty(x.shape(), x.dtype(), x.device());
  if (x.numel() > 0) x.backend().unary(op, x.dtype(), x.data_ptr(), out.data_ptr(), x.numel(), a, b);
  return out;
}

// Integer division by zero has no value (the double quotient converted back is undefined
// behaviour: INT_MIN on x86): PyTorch raises, so does ember. One small read of the divisor's
// zero flag to the host, for integer divisions only.
inline void check_no_integer_zero_divisor(const char* name, const AnyTensor& a, const AnyTensor& b) {
  if (is_floating(b.dtype()) || b.numel() == 0) return;
  AnyTensor zero = AnyTensor::zeros(Shape{}, b.dtype(), b.device());
  AnyTensor is_zero = AnyTensor::empty(b.shape(), DType::UInt8, b.device());
  Shape bs = b.shape(), zs{};
  b.backend().compare(CompareOp::Eq, b.dtype(), b.data_ptr(), zero.data_ptr(), static_cast<uint8_t*>(is_zero.data_ptr()),
                      strided_args(bs, &bs, &zs));
  const bool any = reduce_dim_raw(ReduceOp::Max, is_zero.reshape(Shape{b.numel()}), 0).item_double() != 0.0;
  EMBER_CHECK(!any, ValueError, name, ": integer division by zero (", a.desc(), " divided by ", b.desc(),
              "), as in PyTorch; divide floating-point tensors for inf/nan");
}

inline AnyTensor binary_raw(BinaryOp op, const AnyTensor& a, const AnyTensor& b, const Shape& out_shape) {
  AnyTensor out = AnyTensor::empty(out_shape, a.dtype(), a.device());
  Shape as = a.shape(), bs = b.shape();
  if (out.numel() > 0)
    a.backend().binary(op, a.dtype(), a.data_ptr(), b.data_ptr(), out.data_ptr(), strided_args(out_shape, &as, &bs));
  return out;
}
}  // namespace detail

// y = op(x; a, b), recorded with its derivative from math::unary_derivative.
inline AnyTensor unary(UnaryOp op, const AnyTensor& x, double a = 0.0, double b = 0.0) {
  const char* name = detail::unary_name(op);
  detail::OpScope op_scope(name, x);
  detail::check_defined(name, x);
  EMBER_CHECK(is_floating(x.dtype()) || detail::integer_ok(op), DTypeError, name,
              ": needs a floating-point tensor, got ", x.desc());
  AnyTensor y = detail::unary_raw(op, x, a, b);
  if (autograd::any_requires_grad({x})) {
    const bool use_y = detail::backward_uses_output(op);
    AnyTensor saved = use_y ? y.detach() : x.detach();
    autograd::record(name, {x}, {y}, [op, saved, use_y, a, b](const std::vector<AnyTensor>& g) {
      const AnyTensor& gy = g[0];
      AnyTensor gx = AnyTensor::empty(gy.shape(), gy.dtype(), gy.device());
      if (gx.numel() > 0)
        gx.backend().unary_backward(op, gx.dtype(), use_y ? nullptr : saved.data_ptr(),
                                    use_y ? saved.data_ptr() : nullptr, gy.data_ptr(), gx.data_ptr(), gx.numel(), a, b);
      return std::vector<AnyTensor>{gx};
    });
  }
  return y;
}

inline AnyTensor neg(const AnyTensor& x) { return unary(UnaryOp::Neg, x); }
inline AnyTensor exp(const AnyTensor& x) { return unary(UnaryOp::Exp, x); }
inline AnyTensor log(const AnyTensor& x) { return unary(UnaryOp::Log, x); }
inline AnyTensor sqrt(const AnyTensor& x) { return unary(UnaryOp::Sqrt, x); }
inline AnyTensor abs(const AnyTensor& x) { return unary(UnaryOp::Abs, x); }
inline AnyTensor relu(const AnyTensor& x) { return unary(UnaryOp::Relu, x); }
// GELU; `tanh_approximation` selects PyTorch's approximate='tanh'.
inline AnyTensor gelu(const AnyTensor& x, bool tanh_approximation = false) {
  return unary(tanh_approximation ? UnaryOp::GeluTanh : UnaryOp::Gelu, x);
}
inline AnyTensor silu(const AnyTensor& x) { return unary(UnaryOp::Silu, x); }
inline AnyTensor tanh(const AnyTensor& x) { return unary(UnaryOp::Tanh, x); }
inline AnyTensor sigmoid(const AnyTensor& x) { return unary(UnaryOp::Sigmoid, x); }
inline AnyTensor square(const AnyTensor& x) { return unary(UnaryOp::Square, x); }
inline AnyTensor reciprocal(const AnyTensor& x) { return unary(UnaryOp::Reciprocal, x); }
inline AnyTensor sign(const AnyTensor& x) { return unary(UnaryOp::Sign, x); }
inline AnyTensor pow(const AnyTensor& x, double exponent) { return unary(UnaryOp::Pow, x, exponent); }
// x quantized to signed integers of step `scale` in [-qmax - 1, qmax] (int8: 127) and dequantized,
// differentiable with the straight-through estimator (gradient 1 inside the range, 0 where
// clamped): quantization-aware training's fake quantization, per tensor.
inline AnyTensor fake_quantize(const AnyTensor& x, double scale, double qmax = 127.0) {
  EMBER_CHECK(std::isfinite(scale) && scale > 0.0, ValueError, "fake_quantize: scale must be positive and finite, got ",
              scale, " for ", x.desc());
  EMBER_CHECK(qmax >= 1.0 && qmax == std::floor(qmax), ValueError, "fake_quantize: qmax must be a whole number >= 1, got ",
              qmax, " for ", x.desc());
  EMBER_CHECK(is_floating(x.dtype()), DTypeError, "fake_quantize: a floating-point input expected, got ", x.desc());
  return unary(UnaryOp::FakeQuantize, x, scale, qmax);
}
inline AnyTensor clamp(const AnyTensor& x, double lo, double hi) {
  EMBER_CHECK(lo <= hi, ValueError, "clamp: min ", lo, " is greater than max ", hi, " for ", x.desc());
  return unary(UnaryOp::Clamp, x, lo, hi);
}
inline AnyTensor add(const AnyTensor& x, double s) { return unary(UnaryOp::AddScalar, x, s); }
inline AnyTensor mul(const AnyTensor& x, double s) { return unary(UnaryOp::MulScalar, x, s); }
inline AnyTensor sub(const AnyTensor& x, double s) { return unary(UnaryOp::AddScalar, x, -s); }
inline AnyTensor binary(BinaryOp op, const AnyTensor& a, const AnyTensor& b);
// Floating x: x * (1/s). Integer x by a whole s: an integer division (x * (1/49) truncates 49 to 0;
// a zero divisor raises); by a fractional s: x * (1/s), truncated.
inline AnyTensor div(const AnyTensor& x, double s) {
  if (!is_floating(x.dtype()) && x.defined() && s == static_cast<double>(static_cast<int64_t>(s)))
    return binary(BinaryOp::Div, x, AnyTensor::full(Shape{}, s, x.dtype(), x.device()));
  return unary(UnaryOp::MulScalar, x, 1.0 / s);
}
inline AnyTensor rsub(const AnyTensor& x, double s) { return unary(UnaryOp::RSubScalar, x, s); }
inline AnyTensor rdiv(const AnyTensor& x, double s) { return unary(UnaryOp::RDivScalar, x, s); }

namespace detail {
inline const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: return "add";
    case BinaryOp::Sub: return "sub";
    case BinaryOp::Mul: return "mul";
    case BinaryOp::Div: return "div";
    case BinaryOp::Pow: return "pow";
    case BinaryOp::Maximum: return "maximum";
    case BinaryOp::Minimum: return "minimum";
  }
  return "binary";
}
}  // namespace detail

// out = a op b with broadcasting; gradients are summed back down to each input's shape.
inline AnyTensor binary(BinaryOp op, const AnyTensor& a, const AnyTensor& b) {
  const char* name = detail::binary_name(op);
  detail::OpScope op_scope(name, a, b);
  detail::check_operands(name, a, b);
  Shape out_shape = detail::broadcast_shapes(name, a.shape(), b.shape());
  if (op == BinaryOp::Div) detail::check_no_integer_zero_divisor(name, a, b);
  AnyTensor out = detail::binary_raw(op, a, b, out_shape);
  if (autograd::any_requires_grad({a, b})) {
    EMBER_CHECK(is_floating(a.dtype()), DTypeError, name, ": gradients need floating-point tensors, got ", a.desc());
    const bool ga = a.requires_grad(), gb = b.requires_grad();
    AnyTensor sa = a.detach(), sb = b.detach();
    AnyTensor so = (op == BinaryOp::Pow) ? out.detach() : AnyTensor();
    autograd::record(name, {a, b}, {out}, [op, sa, sb, so, ga, gb](const std::vector<AnyTensor>& g) {
      const AnyTensor& gy = g[0];
      const Shape& os = gy.shape();
      AnyTensor da, db;
      switch (op) {
        case BinaryOp::Add:
          if (ga) da = gy;
          if (gb) db = gy;
          break;
        case BinaryOp::Sub:
          if (ga) da = gy;
          if (gb) db = detail::unary_raw(UnaryOp::Neg, gy, 0, 0);
          break;
        case BinaryOp::Mul:
          if (ga) da = detail::binary_raw(BinaryOp::Mul, gy, sb, os);
          if (gb) db = detail::binary_raw(BinaryOp::Mul, gy, sa, os);
          break;
        case BinaryOp::Div: {
          AnyTensor q = detail::binary_raw(BinaryOp::Div, gy, sb, os);  // gy / b
          if (ga) da = q;
          if (gb) {  // -gy * a / b^2 = -(gy / b) * (a / b)
            AnyTensor ab = detail::binary_raw(BinaryOp::Div, sa, sb, os);
            db = detail::unary_raw(UnaryOp::Neg, detail::binary_raw(BinaryOp::Mul, q, ab, os), 0, 0);
          }
          break;
        }
        case BinaryOp::Pow: {
          if (ga) {  // b * a^(b-1) = b * out / a, computed directly to stay finite at a == 0
            AnyTensor bm1 = detail::unary_raw(UnaryOp::AddScalar, sb, -1.0, 0);
            AnyTensor p = detail::binary_raw(BinaryOp::Pow, sa, bm1, os);
            da = detail::binary_raw(BinaryOp::Mul, detail::binary_raw(BinaryOp::Mul, gy, sb, os), p, os);
          }
          if (gb) {  // out * log(a), with log(a) taken as 0 where a == 0 (0^b is flat in b there), not -inf
            AnyTensor la = detail::unary_raw(UnaryOp::Log, sa, 0, 0);
            if (sa.numel() > 0) {
              AnyTensor zero = AnyTensor::zeros(Shape{}, sa.dtype(), sa.device());
              AnyTensor a_is_zero = AnyTensor::empty(sa.shape(), DType::UInt8, sa.device());
              AnyTensor la0 = AnyTensor::empty(sa.shape(), sa.dtype(), sa.device());
              Shape as = sa.shape(), zs{};
              gy.backend().compare(CompareOp::Eq, sa.dtype(), sa.data_ptr(), zero.data_ptr(),
                                   static_cast<uint8_t*>(a_is_zero.data_ptr()), detail::strided_args(as, &as, &zs));
              gy.backend().where(sa.dtype(), static_cast<const uint8_t*>(a_is_zero.data_ptr()), zero.data_ptr(),
                                 la.data_ptr(), la0.data_ptr(), detail::strided_args(as, &zs, &as, &as));
              la = la0;
            }
            db = detail::binary_raw(BinaryOp::Mul, detail::binary_raw(BinaryOp::Mul, gy, so, os), la, os);
          }
          break;
        }
        case BinaryOp::Maximum:
        case BinaryOp::Minimum: {
          // The gradient goes to the selected input; ties split it evenly, as in PyTorch, whose
          // formula (for maximum) is where(a == b, g/2, g) masked to 0 where a < b for a, and where
          // a > b for b: at a NaN every comparison is false, so both inputs get the whole gradient.
          // Weights: wa = 1 - [a loses] - [a == b]/2, wb = 1 - [b loses] - [a == b]/2.
          AnyTensor mask_a_loses = AnyTensor::empty(os, DType::UInt8, gy.device());
          AnyTensor mask_b_loses = AnyTensor::empty(os, DType::UInt8, gy.device());
          AnyTensor mask_eq = AnyTensor::empty(os, DType::UInt8, gy.device());
          Shape as = sa.shape(), bs = sb.shape();
          StridedArgs st = detail::strided_args(os, &as, &bs);
          const bool is_max = op == BinaryOp::Maximum;
          gy.backend().compare(is_max ? CompareOp::Lt : CompareOp::Gt, sa.dtype(), sa.data_ptr(), sb.data_ptr(),
                               static_cast<uint8_t*>(mask_a_loses.data_ptr()), st);
          gy.backend().compare(is_max ? CompareOp::Gt : CompareOp::Lt, sa.dtype(), sa.data_ptr(), sb.data_ptr(),
                               static_cast<uint8_t*>(mask_b_loses.data_ptr()), st);
          gy.backend().compare(CompareOp::Eq, sa.dtype(), sa.data_ptr(), sb.data_ptr(),
                               static_cast<uint8_t*>(mask_eq.data_ptr()), st);
          AnyTensor half_eq = detail::unary_raw(UnaryOp::MulScalar, mask_eq.to(gy.dtype()), 0.5, 0);
          auto weight = [&](const AnyTensor& loses) {  // 1 - loses - eq/2: 1, 0.5 or 0
            AnyTensor l = detail::binary_raw(BinaryOp::Add, loses.to(gy.dtype()), half_eq, os);
            return detail::unary_raw(UnaryOp::RSubScalar, l, 1.0, 0);
          };
          if (ga) da = detail::binary_raw(BinaryOp::Mul, gy, weight(mask_a_loses), os);
          if (gb) db = detail::binary_raw(BinaryOp::Mul, gy, weight(mask_b_loses), os);
          break;
        }
      }
      if (da.defined()) da = detail::sum_to_raw(da, sa.shape());
      if (db.defined()) db = detail::sum_to_raw(db, sb.shape());
      return std::vector<AnyTensor>{da, db};
    });
  }
  return out;
}

inline AnyTensor add(const AnyTensor& a, const AnyTensor& b) { return binary(BinaryOp::Add, a, b); }
inline AnyTensor sub(const AnyTensor& a, const AnyTensor& b) { return binary(BinaryOp::Sub, a, b); }
inline AnyTensor mul(const AnyTensor& a, const AnyTensor& b) { return binary(BinaryOp::Mul, a, b); }
inline AnyTensor div(const AnyTensor& a, const AnyTensor& b) { return binary(BinaryOp::Div, a, b); }
inline AnyTensor pow(const AnyTensor& a, const AnyTensor& b) { return binary(BinaryOp::Pow, a, b); }
inline AnyTensor maximum(const AnyTensor& a, const AnyTensor& b) { return binary(BinaryOp::Maximum, a, b); }
inline AnyTensor minimum(const AnyTensor& a, const AnyTensor& b) { return binary(BinaryOp::Minimum, a, b); }

}  // namespace ember::op

namespace ember {

// Typed forms: same names in namespace ember, Tensor<T> in, Tensor<T> out.
#define EMBER_TYPED_UNARY(name)                                                    \
  template <Element T>                                                             \
  Tensor<T> name(const Tensor<T>& x) {                                             \
    return Tensor<T>(op::name(x));                                                 \
  }
EMBER_TYPED_UNARY(neg)
EMBER_TYPED_UNARY(exp)
EMBER_TYPED_UNARY(log)
EMBER_TYPED_UNARY(sqrt)
EMBER_TYPED_UNARY(abs)
EMBER_TYPED_UNARY(relu)
EMBER_TYPED_UNARY(silu)
EMBER_TYPED_UNARY(tanh)
EMBER_TYPED_UNARY(sigmoid)
EMBER_TYPED_UNARY(square)
EMBER_TYPED_UNARY(reciprocal)
EMBER_TYPED_UNARY(sign)
#undef EMBER_TYPED_UNARY

template <Element T> Tensor<T> gelu(const Tensor<T>& x, bool tanh_approximation = false) {
  return Tensor<T>(op::gelu(x, tanh_approximation));
}
template <Element T> Tensor<T> pow(const Tensor<T>& x, double exponent) { return Tensor<T>(op::pow(x, exponent)); }
template <Element T> Tensor<T> clamp(const Tensor<T>& x, double lo, double hi) { return Tensor<T>(op::clamp(x, lo, hi)); }
template <Element T> Tensor<T> fake_quantize(const Tensor<T>& x, double scale, double qmax = 127.0) {
  return Tensor<T>(op::fake_quantize(x, scale, qmax));
}

#define EMBER_TYPED_BINARY(name)                                                   \
  template <Element T>                                                             \
  Tensor<T> name(const Tensor<T>& a, const Tensor<T>& b) {                         \
    return Tensor<T>(op::name(a, b));                                              \
  }
EMBER_TYPED_BINARY(add)
EMBER_TYPED_BINARY(sub)
EMBER_TYPED_BINARY(mul)
EMBER_TYPED_BINARY(div)
EMBER_TYPED_BINARY(pow)
EMBER_TYPED_BINARY(maximum)
EMBER_TYPED_BINARY(minimum)
#undef EMBER_TYPED_BINARY

template <Element T> Tensor<T> operator+(const Tensor<T>& a, const Tensor<T>& b) { return Tensor<T>(op::add(a, b)); }
template <Element T> Tensor<T> operator-(const Tensor<T>& a, const Tensor<T>& b) { return Tensor<T>(op::sub(a, b)); }
template <Element T> Tensor<T> operator*(const Tensor<T>& a, const Tensor<T>& b) { return Tensor<T>(op::mul(a, b)); }
template <Element T> Tensor<T> operator/(const Tensor<T>& a, const Tensor<T>& b) { return Tensor<T>(op::div(a, b)); }
template <Element T> Tensor<T> operator-(const Tensor<T>& x) { return Tensor<T>(op::neg(x)); }
template <Element T> Tensor<T> operator+(const Tensor<T>& x, double s) { return Tensor<T>(op::add(x, s)); }
template <Element T> Tensor<T> operator+(double s, const Tensor<T>& x) { return Tensor<T>(op::add(x, s)); }
template <Element T> Tensor<T> operator-(const Tensor<T>& x, double s) { return Tensor<T>(op::sub(x, s)); }
template <Element T> Tensor<T> operator-(double s, const Tensor<T>& x) { return Tensor<T>(op::rsub(x, s)); }
template <Element T> Tensor<T> operator*(const Tensor<T>& x, double s) { return Tensor<T>(op::mul(x, s)); }
template <Element T> Tensor<T> operator*(double s, const Tensor<T>& x) { return Tensor<T>(op::mul(x, s)); }
template <Element T> Tensor<T> operator/(const Tensor<T>& x, double s) { return Tensor<T>(op::div(x, s)); }
template <Element T> Tensor<T> operator/(double s, const Tensor<T>& x) { return Tensor<T>(op::rdiv(x, s)); }

}  // namespace ember
