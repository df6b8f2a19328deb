#pragma once
// The scalar definitions of every elementwise op and its derivative, shared by the CPU and CUDA
// backends so that both compute the same thing. C is the compute type (float for half/bfloat16).
#include <math.h>

#include <cstdint>
#include <type_traits>

#include "ember/core/backend.hpp"
#include "ember/core/macros.hpp"

namespace ember::math {

// Arithmetic type of a kernel: float for the 16-bit floats, double for integers, else T.
template <class T>
using calc_t = std::conditional_t<std::is_integral_v<T>, double, compute_t<T>>;

// calc_t<T> -> T on the host (the CPU kernels, and the CUDA backend's fill values, so that both
// store the same bits).
template <class T>
inline T from_calc(calc_t<T> v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(v);
  } else {
    return T(v);
  }
}

EMBER_HD inline float exp_(float x) { return ::expf(x); }
EMBER_HD inline double exp_(double x) { return ::exp(x); }
EMBER_HD inline float log_(float x) { return ::logf(x); }
EMBER_HD inline double log_(double x) { return ::log(x); }
EMBER_HD inline float sqrt_(float x) { return ::sqrtf(x); }
EMBER_HD inline double sqrt_(double x) { return ::sqrt(x); }
EMBER_HD inline float tanh_(float x) { return ::tanhf(x); }
EMBER_HD inline double tanh_(double x) { return ::tanh(x); }
EMBER_HD inline float erf_(float x) { return ::erff(x); }
EMBER_HD inline double erf_(double x) { return ::erf(x); }
EMBER_HD inline float pow_(float x, float y) { return ::powf(x, y); }
EMBER_HD inline double pow_(double x, double y) { return ::pow(x, y); }
EMBER_HD inline float abs_(float x) { return ::fabsf(x); }
EMBER_HD inline double abs_(double x) { return ::fabs(x); }
EMBER_HD inline float rint_(float x) { return ::rintf(x); }  // half to even, the default rounding mode
EMBER_HD inline double rint_(double x) { return ::rint(x); }
template <class C> EMBER_HD inline bool isnan_(C x) { return x != x; }

// FakeQuantize: x to the nearest step of `scale` (ties to even, as ONNX's QuantizeLinear and
// PyTorch's fake_quantize round), clamped to the signed integer range [-qmax - 1, qmax], back in
// x's type. NaN stays NaN.
template <class C>
EMBER_HD inline C fake_quantize_(C x, C scale, C qmax) {
  if (isnan_(x)) return x;
  C q = rint_(x / scale);
  q = q < -qmax - C(1) ? -qmax - C(1) : (q > qmax ? qmax : q);
  return q * scale;
}

template <class C>
EMBER_HD inline C sigmoid_(C x) {
  // Stable for large |x|: never exponentiates a large positive number.
  if (x >= C(0)) return C(1) / (C(1) + exp_(-x));
  C e = exp_(x);
  return e / (C(1) + e);
}

inline constexpr double kSqrt2OverPi = 0.7978845608028654;
inline constexpr double kInvSqrt2 = 0.7071067811865476;
inline constexpr double kInvSqrt2Pi = 0.3989422804014327;
inline constexpr double kGeluTanhCoef = 0.044715;

template <class C>
EMBER_HD inline C unary(UnaryOp op, C x, C a, C b) {
  switch (op) {
    case UnaryOp::Neg: return -x;
    case UnaryOp::Exp: return exp_(x);
    case UnaryOp::Log: return log_(x);
    case UnaryOp::Sqrt: return sqrt_(x);
    case UnaryOp::Abs: return abs_(x);
    case UnaryOp::Relu: return (x > C(0) || isnan_(x)) ? x : C(0);  // NaN propagates, as torch.relu
    case UnaryOp::Gelu: return C(0.5) * x * (C(1) + erf_(x * C(kInvSqrt2)));
    case UnaryOp::GeluTanh: {
      C inner = C(kSqrt2OverPi) * (x + C(kGeluTanhCoef) * x * x * x);
      return C(0.5) * x * (C(1) + tanh_(inner));
    }
    case UnaryOp::Silu: return x * sigmoid_(x);
    case UnaryOp::Tanh: return tanh_(x);
    case UnaryOp::Sigmoid: return sigmoid_(x);
    case UnaryOp::Pow: return pow_(x, a);
    case UnaryOp::Clamp: return isnan_(x) ? x : (x < a ? a : (x > b ? b : x));
    case UnaryOp::AddScalar: return x + a;
    case UnaryOp::MulScalar: return x * a;
    case UnaryOp::RSubScalar: return a - x;
    case UnaryOp::RDivScalar: return a / x;
    case UnaryOp::Square: return x * x;
    case UnaryOp::Reciprocal: return C(1) / x;
    case UnaryOp::Sign: return x > C(0) ? C(1) : (x < C(0) ? C(-1) : C(0));
    case UnaryOp::FakeQuantize: return fake_quantize_(x, a, b);
  }
  return x;
}

// d op(x) / dx, given x and y = op(x).
template <class C>
EMBER_HD inline C unary_derivative(UnaryOp op, C x, C y, C a, C b) {
  switch (op) {
    case UnaryOp::Neg: return C(-1);
    case UnaryOp::Exp: return y;
    case UnaryOp::Log: return C(1) / x;
    case UnaryOp::Sqrt: return C(0.5) / y;
    case UnaryOp::Abs: return x > C(0) ? C(1) : (x < C(0) ? C(-1) : C(0));
    case UnaryOp::Relu: return x <= C(0) ? C(0) : C(1);  // torch's threshold_backward: passes at NaN
    case UnaryOp::Gelu: {
      C cdf = C(0.5) * (C(1) + erf_(x * C(kInvSqrt2)));
      C pdf = C(kInvSqrt2Pi) * exp_(C(-0.5) * x * x);
      return cdf + x * pdf;
    }
    case UnaryOp::GeluTanh: {
      C inner = C(kSqrt2OverPi) * (x + C(kGeluTanhCoef) * x * x * x);
      C t = tanh_(inner);
      C dinner = C(kSqrt2OverPi) * (C(1) + C(3 * kGeluTanhCoef) * x * x);
      return C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * dinner;
    }
    case UnaryOp::Silu: {
      C s = sigmoid_(x);
      return s * (C(1) + x * (C(1) - s));
    }
    case UnaryOp::Tanh: return C(1) - y * y;
    case UnaryOp::Sigmoid: return y * (C(1) - y);
    case UnaryOp::Pow: return a == C(0) ? C(0) : a * pow_(x, a - C(1));
    case UnaryOp::Clamp: return (x >= a && x <= b) ? C(1) : C(0);
    case UnaryOp::AddScalar: return C(1);
    case UnaryOp::MulScalar: return a;
    case UnaryOp::RSubScalar: return C(-1);
    case UnaryOp::RDivScalar: return -a / (x * x);
    case UnaryOp::Square: return C(2) * x;
    case UnaryOp::Reciprocal: return -y * y;
    case UnaryOp::Sign: return C(0);
    // The straight-through estimator: 1 where x is inside the integer range (PyTorch's
    // fake_quantize gradient), 0 where it was clamped.
    case UnaryOp::FakeQuantize: {
      const C q = rint_(x / a);
      return (q >= -b - C(1) && q <= b) ? C(1) : C(0);
    }
  }
  return C(0);
}

template <class C>
EMBER_HD inline C binary(BinaryOp op, C a, C b) {
  switch (op) {
    case BinaryOp::Add: return a + b;
    case BinaryOp::Sub: return a - b;
    case BinaryOp::Mul: return a * b;
    case BinaryOp::Div: return a / b;
    case BinaryOp::Pow: return pow_(a, b);
    case BinaryOp::Maximum: return (isnan_(a) || a > b) ? a : b;
    case BinaryOp::Minimum: return (isnan_(a) || a < b) ? a : b;
  }
  return a;
}

template <class C>
EMBER_HD inline bool compare(CompareOp op, C a, C b) {
  switch (op) {
    case CompareOp::Eq: return a == b;
    case CompareOp::Ne: return a != b;
    case CompareOp::Lt: return a < b;
    case CompareOp::Le: return a <= b;
    case CompareOp::Gt: return a > b;
    case CompareOp::Ge: return a >= b;
  }
  return false;
}

}  // namespace ember::math
