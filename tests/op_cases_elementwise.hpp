#pragma once
// The registry's elementwise ops (ops/elementwise.hpp) and comparisons / where (ops/compare.hpp).
#include <cmath>
#include <string>
#include <vector>

#include "op_case.hpp"

namespace ember::testing {

namespace elementwise_cases {

using namespace case_names;
using Prepare = std::function<void(std::vector<AnyTensor>&)>;

// fn(a, b) on every broadcast pair, a in [alo, ahi), b in [blo, bhi).
inline std::vector<OpCase> binary_cases(const std::string& what, const OpFn& fn, double alo, double ahi, double blo,
                                        double bhi, Prepare prepare = {}) {
  static const std::pair<Shape, Shape> pairs[] = {
      {Shape{3, 1, 4}, Shape{2, 4}},       {Shape{}, Shape{2, 3}},     {Shape{2, 3}, Shape{}},
      {Shape{2, 3}, Shape{2, 3}},          {Shape{4, 1}, Shape{1, 5}}, {Shape{2, 1, 3}, Shape{2, 4, 1}},
      {Shape{2, 1, 3, 1, 2}, Shape{4, 1}},
  };
  std::vector<OpCase> v;
  for (const auto& [sa, sb] : pairs)
    v.push_back({.variant = what + " " + sa.str() + " with " + sb.str(),
                 .inputs = {{sa, alo, ahi}, {sb, blo, bhi}},
                 .fn = fn,
                 .prepare = prepare});
  return v;
}

// fn(x) on [2, 3, 4] and on a 0-d tensor, x in [lo, hi), kept 0.05 away from the kinks.
inline std::vector<OpCase> unary_cases(const std::string& what, const OpFn& fn, double lo, double hi,
                                       std::vector<double> kinks = {}, bool parity = true) {
  std::vector<OpCase> v;
  for (const Shape& s : {Shape{2, 3, 4}, Shape{}})
    v.push_back({.variant = what + " on " + s.str(),
                 .inputs = {{s, lo, hi}},
                 .fn = fn,
                 .parity = parity,
                 .prepare = kinks.empty() ? Prepare() : away_from(kinks)});
  return v;
}

// The case op_parity has always run for a unary op: [7, 9] in [lo, hi).
inline OpCase unary_parity_case(const OpFn& fn, double lo = -2, double hi = 2, std::vector<double> kinks = {}) {
  return {.variant = "[7, 9]",
          .inputs = {{{7, 9}, lo, hi}},
          .fn = fn,
          .prepare = kinks.empty() ? Prepare() : away_from(kinks)};
}

// maximum and minimum are not differentiable at ties: a on even multiples of 0.02, b on odd ones.
inline void pull_ties_apart(std::vector<AnyTensor>& x) {
  for (size_t k = 0; k < 2; ++k) {
    double* p = static_cast<double*>(x[k].data_ptr());
    for (int64_t i = 0; i < x[k].numel(); ++i) p[i] = std::round(p[i] / 0.04) * 0.04 + (k == 1 ? 0.02 : 0.0);
  }
}

// A unary op on {NaN, +inf, -inf} in float32, float64 and float16.
inline NanCheck unary_nan(UnaryOp u, std::vector<double> want, double a = 0, double b = 0) {
  return {.what = std::string(op::detail::unary_name(u)) + " of NaN, +inf, -inf",
          .values = {{kNan, kInf, -kInf}},
          .shapes = {Shape{3}},
          .fn = [u, a, b](V x) { return op::unary(u, x[0], a, b); },
          .want = std::move(want),
          .dtypes = {DType::Float32, DType::Float64, DType::Float16}};
}

// A smooth activation in float32: NaN in, NaN out; +inf in, +inf out.
inline NanCheck activation_nan(UnaryOp u) {
  return {.what = std::string(op::detail::unary_name(u)) + " of NaN and +inf",
          .values = {{kNan, kInf}},
          .shapes = {Shape{2}},
          .fn = [u](V x) { return op::unary(u, x[0]); },
          .want = {kNan, kInf},
          .dtypes = {DType::Float32}};
}

// A binary op with NaN on either side, float64.
inline NanCheck binary_nan(const char* what, OpFn fn, std::vector<double> want,
                           std::vector<std::vector<double>> want_grads = {}) {
  return {.what = what,
          .values = {{kNan, 1.0, 2.0, 1.0, 0.0}, {1.0, kNan, 2.0, 0.0, 0.0}},
          .shapes = {Shape{5}, Shape{5}},
          .fn = std::move(fn),
          .want = std::move(want),
          .want_grads = std::move(want_grads)};
}

}  // namespace elementwise_cases

inline std::vector<OpSpec> elementwise_ops() {
  using namespace elementwise_cases;
  using T = Tensor<double>;  // the typed operators' cases: float64 only, so not in the parity check
  std::vector<OpSpec> ops;
  auto typed = [](const std::string& what, std::function<T(const T&)> f) {
    return unary_cases(
        what, [f](V x) -> AnyTensor { return f(T(x[0])); }, -2, 2, {0.0}, false);
  };
  auto typed_binary = [](const std::string& what, std::function<T(const T&, const T&)> f) {
    return std::vector<OpCase>{{.variant = what + " [3, 1, 4] with [2, 4]",
                                .inputs = {{{3, 1, 4}}, {{2, 4}, 0.5, 1.5}},
                                .fn = [f](V x) -> AnyTensor { return f(T(x[0]), T(x[1])); },
                                .parity = false}};
  };
  // A constant operand [2, 4] in [0.5, 1.5): the other input alone requires grad.
  auto c24 = [](const AnyTensor& like) { return constant({2, 4}, 5, 0.5, 1.5, like); };

  // ---------------------------------------------------------------- binary ops
  ops.push_back({.name = "add",
                 .family = "elementwise",
                 .cases = join(std::vector<OpCase>{{.variant = "broadcast [4, 1, 5] + [3, 5]",
                                                    .inputs = {{{4, 1, 5}, -2, 2}, {{3, 5}, -2, 2}},
                                                    .fn = [](V x) { return op::add(x[0], x[1]); }}},
                               binary_cases(
                                   "a + b", [](V x) { return op::add(x[0], x[1]); }, -1, 1, -1, 1),
                               typed_binary("operator +", [](const T& a, const T& b) { return a + b; })),
                 .bad = {bad<ShapeError>("add empty [0, 3] + [2, 3]", [] { F::zeros({0, 3}) + F::ones({2, 3}); },
                                         {"add", "[0, 3]"}),
                         bad<ShapeError>("add [2, 3] + [4]", [] { op::add(F::zeros({2, 3}), F::zeros({4})); },
                                         {"add", "[2, 3]", "[4]"}),
                         bad<ValueError>("add with an undefined second input",
                                         [] { op::add(F::ones({2, 3}), AnyTensor()); },
                                         {"add", "second input", "undefined"})},
                 .nan = {binary_nan("a + b with NaN on either side", [](V x) { return op::add(x[0], x[1]); },
                                    {kNan, kNan, 4.0, 1.0, 0.0})}});
  ops.push_back({.name = "sub",
                 .family = "elementwise",
                 .cases = join(std::vector<OpCase>{{.variant = "[6, 7] - [6, 7]",
                                                    .inputs = {{{6, 7}, -2, 2}, {{6, 7}, -2, 2}},
                                                    .fn = [](V x) { return op::sub(x[0], x[1]); }}},
                               binary_cases(
                                   "a - b", [](V x) { return op::sub(x[0], x[1]); }, -1, 1, -1, 1),
                               typed_binary("operator -", [](const T& a, const T& b) { return a - b; })),
                 .bad = {bad<ShapeError>("sub [2, 3] - [3, 2]", [] { sub(F::ones({2, 3}), F::ones({3, 2})); },
                                         {"sub", "[2, 3]", "[3, 2]", "dimension"}),
                         bad_on_device<DeviceError>("sub cpu - cuda:0",
                                                    [] { sub(F::ones({2, 3}), F::ones({2, 3}, Device::cuda(0))); },
                                                    {"sub", "on cpu", "on cuda:0"})}});
  ops.push_back({.name = "mul",
                 .family = "elementwise",
                 .cases = join(std::vector<OpCase>{{.variant = "broadcast [2, 3, 4] * [4]",
                                                    .inputs = {{{2, 3, 4}, -2, 2}, {{4}, -2, 2}},
                                                    .fn = [](V x) { return op::mul(x[0], x[1]); }}},
                               binary_cases(
                                   "a * b", [](V x) { return op::mul(x[0], x[1]); }, -1, 1, -1, 1),
                               typed_binary("operator *", [](const T& a, const T& b) { return a * b; })),
                 .bad = {bad<ShapeError>("mul [2, 3] * [3, 2]", [] { mul(F::ones({2, 3}), F::ones({3, 2})); },
                                         {"mul", "[2, 3]", "[3, 2]"}),
                         bad<DTypeError>("mul float32 * float64", [] { op::mul(F::ones({2, 3}), D::ones({2, 3})); },
                                         {"mul", "float32", "float64"})}});
  ops.push_back({.name = "div",
                 .family = "elementwise",
                 .cases = join(std::vector<OpCase>{{.variant = "[5, 5] / [5, 5] in [0.5, 2)",
                                                    .inputs = {{{5, 5}, 0.5, 2}, {{5, 5}, 0.5, 2}},
                                                    .fn = [](V x) { return op::div(x[0], x[1]); }},
                                                   {.variant = "constant [2, 4] / x [3, 1, 4]",
                                                    .inputs = {{{3, 1, 4}, 0.5, 1.5}},
                                                    .fn = [=](V x) { return op::div(c24(x[0]), x[0]); }}},
                               binary_cases(
                                   "a / b, b in [0.5, 2)", [](V x) { return op::div(x[0], x[1]); }, -1, 1, 0.5, 2),
                               binary_cases(
                                   "a / b, b in [-2, -0.5)", [](V x) { return op::div(x[0], x[1]); }, -1, 1, -2, -0.5),
                               typed_binary("operator /", [](const T& a, const T& b) { return a / b; })),
                 .bad = {bad<ShapeError>("div [2, 3] / [2]", [] { div(F::ones({2, 3}), F::ones({2})); },
                                         {"div", "[2, 3]", "[2]", "3 vs 2"}),
                         bad<ValueError>("integer division of 0-d by 0-d zero",
                                         [] { op::div(I64::scalar(3), I64::scalar(0)); }, {"div", "division by zero"}),
                         bad<ValueError>("int32 [3] / int32 [3] holding a zero",
                                         [] {
                                           Tensor<int32_t>::from_vector({7, -7, 4}, Shape{3}) /
                                               Tensor<int32_t>::from_vector({2, 2, 0}, Shape{3});
                                         },
                                         {"div", "integer division by zero", "int32[3]"}),
                         bad<ValueError>("int64 [2] / int64 zeros [1]",
                                         [] { I64::from_vector({1, 2}, Shape{2}) / I64::zeros({1}); },
                                         {"integer division by zero", "int64"}),
                         bad<ValueError>("int64 [2] / 0.0", [] { I64::from_vector({1, 2}, Shape{2}) / 0.0; },
                                         {"div", "integer division by zero"})},
                 .nan = {binary_nan("a / b with NaN, x / 0 and 0 / 0", [](V x) { return op::div(x[0], x[1]); },
                                    {kNan, kNan, 1.0, kInf, kNan}),
                         {.what = "float32 1 / 0 is inf",
                          .values = {{1.0}, {0.0}},
                          .shapes = {Shape{1}, Shape{1}},
                          .fn = [](V x) { return op::div(x[0], x[1]); },
                          .want = {kInf},
                          .dtypes = {DType::Float32}},
                         {.what = "float32 1 / 0.0 (a scalar) is inf",
                          .values = {{1.0}},
                          .shapes = {Shape{1}},
                          .fn = [](V x) { return op::div(x[0], 0.0); },
                          .want = {kInf},
                          .dtypes = {DType::Float32}}}});
  std::vector<OpCase> pow_cases =
      join(std::vector<OpCase>{{.variant = "[9] ^ [9] in [0.5, 2)",
                                .inputs = {{{9}, 0.5, 2}, {{9}, 0.5, 2}},
                                .fn = [](V x) { return op::pow(x[0], x[1]); }},
                               {.variant = "x [3, 1, 4] ^ constant [2, 4]",
                                .inputs = {{{3, 1, 4}, 0.5, 1.5}},
                                .fn = [=](V x) { return op::pow(x[0], c24(x[0])); }},
                               {.variant = "constant [2, 4] ^ x [3, 1, 4]",
                                .inputs = {{{3, 1, 4}, 0.5, 1.5}},
                                .fn = [=](V x) { return op::pow(c24(x[0]), x[0]); }},
                               {.variant = "x ^ 2.5 on [7, 9] in [0.1, 3)",
                                .inputs = {{{7, 9}, 0.1, 3}},
                                .fn = [](V x) { return op::pow(x[0], 2.5); }}},
           binary_cases(
               "a ^ b, positive base", [](V x) { return op::pow(x[0], x[1]); }, 0.5, 2, -1.5, 2.5));
  for (double e : {2.0, 3.0, 0.5, -1.5, 1.0, 0.0})
    pow_cases = join(pow_cases, unary_cases(
                                    "x ^ " + num(e) + " in [0.3, 2)", [e](V x) { return op::pow(x[0], e); }, 0.3, 2));
  for (double e : {2.0, 3.0})  // integer exponents on negative bases
    pow_cases = join(pow_cases, unary_cases(
                                    "x ^ " + num(e) + " in [-2, 2)", [e](V x) { return op::pow(x[0], e); }, -2, 2));
  ops.push_back({.name = "pow",
                 .family = "elementwise",
                 .cases = pow_cases,
                 .bad = {bad<ShapeError>("pow [2, 3] ^ [4, 1, 2]", [] { pow(F::ones({2, 3}), F::ones({4, 1, 2})); },
                                         {"pow", "[4, 1, 2]"})},
                 .nan = {binary_nan("a ^ b with NaN (C's pow: pow(1, NaN) = 1)",
                                    [](V x) { return op::pow(x[0], x[1]); }, {kNan, 1.0, 4.0, 1.0, 1.0}),
                         unary_nan(UnaryOp::Pow, {kNan, kInf, kInf}, 2.0)}});
  ops.push_back(
      {.name = "maximum",
       .family = "elementwise",
       .cases = join(std::vector<OpCase>{{.variant = "[3, 4] with [3, 4]",
                                          .inputs = {{{3, 4}, -2, 2}, {{3, 4}, -2, 2}},
                                          .fn = [](V x) { return op::maximum(x[0], x[1]); },
                                          .prepare = pull_ties_apart}},
                     binary_cases(
                         "no ties", [](V x) { return op::maximum(x[0], x[1]); }, -1, 1, -1, 1, pull_ties_apart)),
       .bad = {bad<ShapeError>("maximum [2, 3] [2, 2]", [] { maximum(F::ones({2, 3}), F::ones({2, 2})); },
                               {"maximum", "[2, 2]"}),
               bad_on_device<DeviceError>("maximum cpu cuda:0",
                                          [] { maximum(F::ones({2, 3}), F::ones({2, 3}, Device::cuda(0))); },
                                          {"maximum", "cuda:0"})},
       .nan = {binary_nan("maximum with NaN on either side: both get the whole gradient, ties split it",
                          [](V x) { return op::maximum(x[0], x[1]); }, {kNan, kNan, 2.0, 1.0, 0.0},
                          {{1.0, 1.0, 0.5, 1.0, 0.5}, {1.0, 1.0, 0.5, 0.0, 0.5}})}});
  ops.push_back(
      {.name = "minimum",
       .family = "elementwise",
       .cases = join(std::vector<OpCase>{{.variant = "[3, 4] with [4]",
                                          .inputs = {{{3, 4}, -2, 2}, {{4}, -2, 2}},
                                          .fn = [](V x) { return op::minimum(x[0], x[1]); },
                                          .prepare = pull_ties_apart}},
                     binary_cases(
                         "no ties", [](V x) { return op::minimum(x[0], x[1]); }, -1, 1, -1, 1, pull_ties_apart)),
       .bad = {bad<ShapeError>("minimum [0] [2]", [] { minimum(F::zeros({0}), F::ones({2})); },
                               {"minimum", "[0]", "0 vs 2"})},
       .nan = {binary_nan("minimum with NaN on either side: both get the whole gradient, ties split it",
                          [](V x) { return op::minimum(x[0], x[1]); }, {kNan, kNan, 2.0, 0.0, 0.0},
                          {{1.0, 1.0, 0.5, 0.0, 0.5}, {1.0, 1.0, 0.5, 1.0, 0.5}})}});

  // ---------------------------------------------------------------- unary ops
  auto unary = [](UnaryOp u) { return [u](V x) { return op::unary(u, x[0]); }; };
  // A unary op's cases: [7, 9] in [plo, phi) (the parity check's since it began), then [2, 3, 4]
  // and 0-d in [lo, hi); values kept off the kinks.
  auto unary_op = [](const char* name, const OpFn& parity_fn, double plo, double phi, const std::string& what,
                     const OpFn& fn, double lo, double hi, std::vector<double> kinks = {}) {
    return OpSpec{.name = name,
                  .family = "elementwise",
                  .cases = join(std::vector<OpCase>{unary_parity_case(parity_fn, plo, phi, kinks)},
                                unary_cases(what, fn, lo, hi, kinks))};
  };
  OpSpec neg = unary_op(
      "neg", unary(UnaryOp::Neg), -2, 2, "neg", [](V x) { return op::neg(x[0]); }, -1, 1);
  neg.cases = join(neg.cases, typed("operator - (unary)", [](const T& x) { return -x; }));
  neg.nan = {unary_nan(UnaryOp::Neg, {kNan, -kInf, kInf})};
  OpSpec exp = unary_op(
      "exp", unary(UnaryOp::Exp), -2, 2, "exp", [](V x) { return op::exp(x[0]); }, -2, 2);
  exp.bad = {bad<ValueError>("exp of an undefined tensor", [] { op::exp(AnyTensor()); }, {"exp", "undefined"})};
  exp.nan = {unary_nan(UnaryOp::Exp, {kNan, kInf, 0.0})};
  OpSpec log = unary_op(
      "log", [](V x) { return op::log(x[0]); }, 0.1, 3, "log, positive inputs", [](V x) { return op::log(x[0]); }, 0.2,
      3);
  log.bad = {bad<DTypeError>("log of int64", [] { op::log(I64::ones({2})); }, {"log", "int64"})};
  log.nan = {unary_nan(UnaryOp::Log, {kNan, kInf, kNan}),
             {.what = "log(0) is -inf",
              .values = {{0.0}},
              .shapes = {Shape{1}},
              .fn = unary(UnaryOp::Log),
              .want = {-kInf},
              .dtypes = {DType::Float32}}};
  OpSpec sqrt = unary_op(
      "sqrt", [](V x) { return op::sqrt(x[0]); }, 0.1, 3, "sqrt, positive inputs", [](V x) { return op::sqrt(x[0]); },
      0.2, 3);
  sqrt.nan = {unary_nan(UnaryOp::Sqrt, {kNan, kInf, kNan})};
  OpSpec abs =
      unary_op("abs", unary(UnaryOp::Abs), -2, 2, "abs away from 0", [](V x) { return op::abs(x[0]); }, -1, 1, {0.0});
  abs.nan = {unary_nan(UnaryOp::Abs, {kNan, kInf, kInf})};
  OpSpec relu = unary_op("relu", unary(UnaryOp::Relu), -2, 2, "relu away from 0", [](V x) { return op::relu(x[0]); },
                         -1, 1, {0.0});
  relu.nan = {{.what = "relu of NaN, infinities and numbers (the float fast path, double, half)",
               .values = {{kNan, kInf, -kInf, -1.0, 0.0, 2.0}},
               .shapes = {Shape{6}},
               .fn = unary(UnaryOp::Relu),
               .want = {kNan, kInf, 0.0, 0.0, 0.0, 2.0},
               .dtypes = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}},
              // PyTorch's threshold_backward zeroes the gradient where x <= 0 only: at NaN it passes.
              {.what = "relu's gradient passes NaN's through",
               .values = {{kNan, kInf, -kInf, -1.0, 0.0, 2.0}},
               .shapes = {Shape{6}},
               .fn = [](V x) { return op::relu(x[0]); },
               .want = {kNan, kInf, 0.0, 0.0, 0.0, 2.0},
               .want_grads = {{1.0, 1.0, 0.0, 0.0, 0.0, 1.0}}},
              // It used to give a finite loss, and NaN weights after a step.
              {.what = "a NaN input reaches a Linear layer's output through relu",
               .values = {{1.0, kNan, 0.0, 0.0, 0.0, 0.0}},
               .shapes = {Shape{1, 6}},
               .fn = [](V x) { return AnyTensor(nn::Linear(6, 1)(Tensor<float>(op::relu(x[0])))); },
               .want = {kNan},
               .dtypes = {DType::Float32}}};
  OpSpec gelu = unary_op(
      "gelu", unary(UnaryOp::Gelu), -2, 2, "gelu exact (erf)", [](V x) { return op::gelu(x[0]); }, -3, 3);
  gelu.nan = {activation_nan(UnaryOp::Gelu)};
  OpSpec gelu_tanh = unary_op(
      "gelu_tanh", unary(UnaryOp::GeluTanh), -2, 2, "gelu, tanh approximation",
      [](V x) { return op::gelu(x[0], true); }, -3, 3);
  gelu_tanh.nan = {activation_nan(UnaryOp::GeluTanh)};
  OpSpec silu = unary_op(
      "silu", unary(UnaryOp::Silu), -2, 2, "silu", [](V x) { return op::silu(x[0]); }, -4, 4);
  silu.nan = {activation_nan(UnaryOp::Silu)};
  OpSpec tanh = unary_op(
      "tanh", unary(UnaryOp::Tanh), -2, 2, "tanh", [](V x) { return op::tanh(x[0]); }, -2, 2);
  tanh.nan = {unary_nan(UnaryOp::Tanh, {kNan, 1.0, -1.0})};
  OpSpec sigmoid = unary_op(
      "sigmoid", unary(UnaryOp::Sigmoid), -2, 2, "sigmoid", [](V x) { return op::sigmoid(x[0]); }, -4, 4);
  sigmoid.bad = {
      bad<DTypeError>("sigmoid of uint8", [] { op::sigmoid(Tensor<uint8_t>::ones({2})); }, {"sigmoid", "uint8"})};
  sigmoid.nan = {unary_nan(UnaryOp::Sigmoid, {kNan, 1.0, 0.0})};
  OpSpec square = unary_op(
      "square", unary(UnaryOp::Square), -2, 2, "square", [](V x) { return op::square(x[0]); }, -2, 2);
  square.nan = {unary_nan(UnaryOp::Square, {kNan, kInf, kInf})};
  OpSpec reciprocal = unary_op(
      "reciprocal", [](V x) { return op::reciprocal(x[0]); }, 0.5, 3, "reciprocal away from 0",
      [](V x) { return op::reciprocal(x[0]); }, -2, 2, {0.0});
  reciprocal.nan = {unary_nan(UnaryOp::Reciprocal, {kNan, 0.0, 0.0}),
                    {.what = "reciprocal(0) is inf",
                     .values = {{0.0}},
                     .shapes = {Shape{1}},
                     .fn = unary(UnaryOp::Reciprocal),
                     .want = {kInf},
                     .dtypes = {DType::Float32}}};
  for (OpSpec* u :
       {&neg, &exp, &log, &sqrt, &abs, &relu, &gelu, &gelu_tanh, &silu, &tanh, &sigmoid, &square, &reciprocal})
    ops.push_back(*u);
  ops.push_back(
      {.name = "sign",
       .family = "elementwise",
       .cases = unary_cases("sign (gradient 0) away from 0", [](V x) { return op::sign(x[0]); }, -1, 1, {0.0}),
       // torch.sign(nan) is 0 (pytorch/pytorch#41245)
       .nan = {unary_nan(UnaryOp::Sign, {0.0, 1.0, -1.0})}});
  ops.push_back({.name = "clamp",
                 .family = "elementwise",
                 .cases = join(std::vector<OpCase>{unary_parity_case([](V x) { return op::clamp(x[0], -0.5, 0.7); }, -2,
                                                                     2, {-0.5, 0.7})},
                               unary_cases("clamp to [-0.5, 0.5] away from the bounds",
                                           [](V x) { return op::clamp(x[0], -0.5, 0.5); }, -1, 1, {-0.5, 0.5})),
                 .bad = {bad<ValueError>("clamp with min > max on an empty tensor",
                                         [] { clamp(F::zeros({0}), 2.0, 1.0); }, {"clamp", "min 2", "max 1"})},
                 .nan = {unary_nan(UnaryOp::Clamp, {kNan, 1.0, -1.0}, -1.0, 1.0)}});
  ops.push_back({.name = "fake_quantize",
                 .family = "elementwise",
                 // NaN stays, infinities clamp to the range
                 .nan = {unary_nan(UnaryOp::FakeQuantize, {kNan, 63.5, -64.0}, 0.5, 127.0)}});

  // ---------------------------------------------------------------- tensor-scalar ops
  ops.push_back({.name = "add_scalar",
                 .family = "elementwise",
                 .cases = join(typed("x + 3.0", [](const T& x) { return x + 3.0; }),
                               typed("3.0 + x", [](const T& x) { return 3.0 + x; }),
                               typed("x - 1.5", [](const T& x) { return x - 1.5; })),
                 .nan = {unary_nan(UnaryOp::AddScalar, {kNan, kInf, -kInf}, 1.0)}});
  ops.push_back({.name = "mul_scalar",
                 .family = "elementwise",
                 .cases = join(typed("x * 2.0", [](const T& x) { return x * 2.0; }),
                               typed("2.0 * x", [](const T& x) { return 2.0 * x; }),
                               typed("x / 4.0", [](const T& x) { return x / 4.0; })),
                 .nan = {unary_nan(UnaryOp::MulScalar, {kNan, -kInf, kInf}, -2.0)}});
  ops.push_back({.name = "rsub_scalar",
                 .family = "elementwise",
                 .cases = typed("1.0 - x", [](const T& x) { return 1.0 - x; }),
                 .nan = {unary_nan(UnaryOp::RSubScalar, {kNan, -kInf, kInf}, 1.0)}});
  ops.push_back(
      {.name = "rdiv_scalar",
       .family = "elementwise",
       .cases = join(std::vector<OpCase>{{.variant = "(3 x + 7) rdiv 2 on [5, 3]",
                                          .inputs = {{{5, 3}, -2, 2}},
                                          .fn = [](V x) { return op::rdiv(op::add(op::mul(x[0], 3.0), 7.0), 2.0); }}},
                     typed("2.0 / x", [](const T& x) { return 2.0 / x; })),
       .nan = {unary_nan(UnaryOp::RDivScalar, {kNan, 0.0, 0.0}, 1.0)}});

  // ---------------------------------------------------------------- comparisons and where
  auto positive = [](const Shape& s, uint64_t seed, const AnyTensor& like) {
    return op::compare(CompareOp::Gt, constant(s, seed, -1, 1, like), 0.0);
  };
  ops.push_back({.name = "where",
                 .family = "elementwise",
                 .cases = {{.variant = "where(a > b, a, b) on [3, 4]",
                            .inputs = {{{3, 4}, -2, 2}, {{3, 4}, -2, 2}},
                            .fn = [](V x) { return op::where(op::gt(x[0], x[1]), x[0], x[1]); },
                            .prepare = pull_ties_apart},
                           {.variant = "condition [3, 1, 4], a [2, 4], b []",
                            .inputs = {{{2, 4}}, {{}}},
                            .fn = [=](V x) { return op::where(positive({3, 1, 4}, 11, x[0]), x[0], x[1]); }},
                           {.variant = "condition [2, 1], a [3], b [2, 3]",
                            .inputs = {{{3}}, {{2, 3}}},
                            .fn = [=](V x) { return op::where(positive({2, 1}, 12, x[0]), x[0], x[1]); }}},
                 .bad = {bad<ShapeError>("where condition [4] against [2, 3]",
                                         [] { where(Tensor<uint8_t>::ones({4}), F::ones({2, 3}), F::ones({2, 3})); },
                                         {"where", "[4]", "[2, 3]"}),
                         bad_on_device<DeviceError>("where cpu condition, cuda:0 values",
                                                    [] {
                                                      const F xg = F::ones({2, 3}, Device::cuda(0));
                                                      where(Tensor<uint8_t>::ones({2, 3}), xg, xg);
                                                    },
                                                    {"where", "uint8[2, 3] on cpu", "cuda:0"})}});
  ops.push_back({.name = "le",
                 .family = "elementwise",
                 .cases = {{.variant = "[3, 4] <= [4]",
                            .inputs = {{{3, 4}, -2, 2}, {{4}, -2, 2}},
                            .fn = [](V x) { return op::le(x[0], x[1]); },
                            .differentiable = false}}});
  ops.push_back({.name = "eq",
                 .family = "elementwise",
                 .bad = {bad<ShapeError>("eq [2, 3] [3]", [] { eq(F::ones({2, 3}), F::ones({2})); },
                                         {"eq", "[2, 3]", "[2]"})}});
  ops.push_back({.name = "lt",
                 .family = "elementwise",
                 .bad = {bad_on_device<DeviceError>("lt cpu cuda:0",
                                                    [] { lt(F::ones({2, 3}), F::ones({2, 3}, Device::cuda(0))); },
                                                    {"lt", "cuda:0"})}});
  return ops;
}

}  // namespace ember::testing
