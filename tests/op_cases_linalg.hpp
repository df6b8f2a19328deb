#pragma once
// The registry's linear algebra (ops/linalg.hpp): matmul, linear (the bias inside the GEMM) and
// linear_act (Linear with its activation fused).
#include <cmath>
#include <string>
#include <vector>

#include "op_case.hpp"

namespace ember::testing {

namespace linalg_cases {

using namespace case_names;

// The stored shape of an operand: batch dims, then [rows, cols] of op(X), transposed back if t.
inline Shape operand(std::vector<int64_t> batch, int64_t rows, int64_t cols, bool t) {
  batch.push_back(t ? cols : rows);
  batch.push_back(t ? rows : cols);
  return Shape(batch);
}

inline OpCase matmul_case(std::string variant, std::vector<Input> inputs, bool ta = false, bool tb = false) {
  return {.variant = std::move(variant),
          .inputs = std::move(inputs),
          .fn = [ta, tb](V x) { return op::matmul(x[0], x[1], ta, tb); },
          .tolerance = Tolerance::Gemm};
}

inline std::string transposes(bool ta, bool tb) { return std::string(ta ? " trans_a" : "") + (tb ? " trans_b" : ""); }

inline const char* act_name(LinearActivation a) {
  switch (a) {
    case LinearActivation::None: return "none";
    case LinearActivation::Relu: return "relu";
    case LinearActivation::Gelu: return "gelu";
    case LinearActivation::GeluTanh: return "gelu tanh";
  }
  return "?";
}

}  // namespace linalg_cases

inline std::vector<OpSpec> linalg_ops() {
  using namespace linalg_cases;
  using A = AnyTensor;
  std::vector<OpSpec> ops;

  std::vector<OpCase> mm = {matmul_case("[17, 33] x [33, 9]", {{{17, 33}}, {{33, 9}}}),
                            matmul_case("[33, 17]^T x [9, 33]^T", {{{33, 17}}, {{9, 33}}}, true, true),
                            matmul_case("batched [3, 8, 16] x [3, 16, 5]", {{{3, 8, 16}}, {{3, 16, 5}}}),
                            matmul_case("batch broadcast [3, 8, 16] x [16, 5]", {{{3, 8, 16}}, {{16, 5}}}),
                            // vectors: 1-D x 2-D, 2-D x 1-D, 1-D x 1-D, 3-D x 1-D, 1-D x 3-D
                            matmul_case("[4] x [4, 3]", {{{4}}, {{4, 3}}}),
                            matmul_case("[4] x [3, 4]^T", {{{4}}, {{3, 4}}}, false, true),
                            matmul_case("[3, 4] x [4]", {{{3, 4}}, {{4}}}),
                            matmul_case("[4, 3]^T x [4]", {{{4, 3}}, {{4}}}, true, false),
                            matmul_case("[5] x [5]", {{{5}}, {{5}}}),
                            matmul_case("[2, 3, 4] x [4]", {{{2, 3, 4}}, {{4}}}),
                            matmul_case("[4] x [2, 4, 3]", {{{4}}, {{2, 4, 3}}}),
                            // one operand constant, and a chain (x W1) W2^T
                            {.variant = "x [2, 5, 4] times a constant [4, 3]",
                             .inputs = {{{2, 5, 4}}},
                             .fn = [](V x) { return op::matmul(x[0], constant({4, 3}, 9, -1, 1, x[0])); },
                             .tolerance = Tolerance::Gemm},
                            {.variant = "a constant [4, 3]^T times x [4, 2]",
                             .inputs = {{{4, 2}}},
                             .fn = [](V x) { return op::matmul(constant({4, 3}, 9, -1, 1, x[0]), x[0], true); },
                             .tolerance = Tolerance::Gemm},
                            {.variant = "(x [3, 4] W1 [4, 5]) W2^T [2, 5]",
                             .inputs = {{{3, 4}}, {{4, 5}}, {{2, 5}}},
                             .fn = [](V x) { return op::matmul(op::matmul(x[0], x[1]), x[2], false, true); },
                             .tolerance = Tolerance::Gemm}};
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      mm.push_back(matmul_case("[3, 4] x [4, 5]" + transposes(ta, tb),
                               {{operand({}, 3, 4, ta)}, {operand({}, 4, 5, tb)}}, ta, tb));
      // 2-D [2, 3] x [3, 4], batched 3-D / 4-D, and the batch broadcast 3-D x 2-D, 2-D x 3-D, 4-D x 2-D, 2-D x 4-D
      for (const auto& [ab, bb] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
               {{}, {}}, {{2}, {2}}, {{2, 3}, {2, 3}}, {{3}, {}}, {{}, {3}}, {{2, 2}, {}}, {{}, {2, 2}}})
        mm.push_back(matmul_case("batch " + Shape(ab).str() + " x " + Shape(bb).str() + transposes(ta, tb),
                                 {{operand(ab, 2, 3, ta)}, {operand(bb, 3, 4, tb)}}, ta, tb));
    }
  ops.push_back({.name = "matmul",
                 .family = "linalg",
                 .cases = mm,
                 .bad = {bad<ShapeError>("matmul 0-d x [2]", [] { matmul(F::scalar(1), F::ones({2})); },
                                         {"matmul", "scalars", "float32[]"}),
                         bad<ShapeError>("matmul [3] . [4]", [] { matmul(F::ones({3}), F::ones({4})); },
                                         {"matmul", "float32[3] on cpu times float32[4]", "3 vs 4"}),
                         bad<ShapeError>("matmul [2, 3] x [2]", [] { matmul(F::ones({2, 3}), F::ones({2})); },
                                         {"matmul", "[2, 3] on cpu times float32[2]", "3 vs 2"}),
                         bad<ShapeError>("matmul [5] x [4, 3]", [] { matmul(F::ones({5}), F::ones({4, 3})); },
                                         {"matmul", "float32[5] on cpu times float32[4, 3]", "5 vs 4"}),
                         bad<ShapeError>("matmul [2, 3] x [2, 3] transposed a",
                                         [] { matmul(F::ones({2, 3}), F::ones({2, 3}), true, true); },
                                         {"matmul", "(transposed)", "2 vs 3"}),
                         bad<ShapeError>("matmul [2, 2, 3] x [2, 4, 2]",
                                         [] { matmul(F::ones({2, 2, 3}), F::ones({2, 4, 2})); },
                                         {"matmul", "inner dimensions", "[2, 2, 3]", "[2, 4, 2]"}),
                         bad<ShapeError>("matmul batch [2, 1] x [3, 2]: no batch broadcasting",
                                         [] { matmul(F::ones({2, 1, 2, 3}), F::ones({3, 2, 3, 4})); },
                                         {"matmul", "batch dimensions"}),
                         bad<ShapeError>("matmul [0, 3] x [0, 3]", [] { matmul(F::zeros({0, 3}), F::zeros({0, 3})); },
                                         {"matmul", "3 vs 0"}),
                         bad<DTypeError>("matmul int64", [] { matmul(I64::ones({2, 2}), I64::ones({2, 2})); },
                                         {"matmul", "int64"}),
                         bad<DTypeError>("matmul float32 x float64",
                                         [] { op::matmul(F::ones({2, 2}), D::ones({2, 2})); },
                                         {"matmul", "float32", "float64"}),
                         bad<ValueError>("matmul with an undefined input",
                                         [] { op::matmul(F::ones({2, 2}), AnyTensor()); },
                                         {"matmul", "second input"}),
                         bad_on_device<DeviceError>("matmul cpu x cuda:0",
                                                    [] { matmul(F::ones({2, 3}), F::ones({3, 2}, Device::cuda(0))); },
                                                    {"matmul", "cuda:0"})}});

  std::vector<OpCase> lin = {{.variant = "bias in the GEMM, [3, 8, 16] with [5, 16] and [5]",
                              .inputs = {{{3, 8, 16}}, {{5, 16}}, {{5}}},
                              .fn = [](V x) { return op::linear(x[0], x[1], x[2]); },
                              .tolerance = Tolerance::Gemm},
                             {.variant = "no bias, [8, 16] with [5, 16]",
                              .inputs = {{{8, 16}}, {{5, 16}}},
                              .fn = [](V x) { return op::linear(x[0], x[1]); },
                              .tolerance = Tolerance::Gemm}};
  for (const auto& [xs, with_bias] : std::vector<std::pair<Shape, bool>>{
           {{4, 6}, true}, {{2, 3, 6}, true}, {{6}, true}, {{4, 6}, false}, {{2, 1, 3, 6}, false}}) {
    if (with_bias)
      lin.push_back({.variant = "x " + xs.str() + " with bias",
                     .inputs = {{xs}, {{5, 6}}, {{5}}},
                     .fn = [](V x) { return op::linear(x[0], x[1], x[2]); },
                     .tolerance = Tolerance::Gemm});
    else
      lin.push_back({.variant = "x " + xs.str() + " without bias",
                     .inputs = {{xs}, {{5, 6}}},
                     .fn = [](V x) { return op::linear(x[0], x[1]); },
                     .tolerance = Tolerance::Gemm});
  }
  auto f32 = [](const Shape& s) { return A::zeros(s, DType::Float32); };
  ops.push_back({.name = "linear",
                 .family = "linalg",
                 .cases = lin,
                 .bad = {bad<ShapeError>("linear x [2, 5] with weight [3, 4]",
                                         [=] { op::linear(f32({2, 5}), f32({3, 4}), f32({3})); },
                                         {"linear", "[2, 5]", "[3, 4]"}),
                         bad<ShapeError>("linear with a 3-d weight",
                                         [=] { op::linear(f32({2, 4}), f32({3, 4, 1}), f32({3})); },
                                         {"linear", "[3, 4, 1]"}),
                         bad<ShapeError>("linear with a 1-d weight", [=] { op::linear(f32({2, 4}), f32({4})); },
                                         {"linear: the weight must be [out_features, in_features]"}),
                         bad<ShapeError>("linear with a bias [4] for 3 outputs",
                                         [=] { op::linear(f32({2, 4}), f32({3, 4}), f32({4})); },
                                         {"linear", "[4]"}),
                         bad<ShapeError>("linear with a bias [1, 3]",
                                         [=] { op::linear(f32({2, 4}), f32({3, 4}), f32({1, 3})); },
                                         {"linear: the bias must be [3]", "[1, 3]"}),
                         bad<ShapeError>("linear of a 0-d input", [=] { op::linear(f32({}), f32({3, 4}), f32({3})); },
                                         {"linear", "float32[]"}),
                         bad<DTypeError>("linear with a float64 bias",
                                         [=] { op::linear(f32({2, 4}), f32({3, 4}), A::zeros({3}, DType::Float64)); },
                                         {"linear", "float64"}),
                         bad<DTypeError>("linear with a float64 weight",
                                         [=] { op::linear(f32({2, 4}), A::zeros({3, 4}, DType::Float64)); },
                                         {"linear", "float64", "float32"}),
                         bad<DTypeError>("linear of int32",
                                         [] {
                                           op::linear(A::zeros({2, 4}, DType::Int32), A::zeros({3, 4}, DType::Int32));
                                         },
                                         {"linear", "int32"}),
                         bad<ValueError>("linear of an undefined input", [=] { op::linear(AnyTensor(), f32({3, 4})); },
                                         {"linear", "undefined"}),
                         bad<ValueError>("linear with an undefined weight",
                                         [=] { op::linear(f32({2, 4}), AnyTensor()); },
                                         {"linear", "undefined"})}});

  // linear_act's parity, with its cuBLASLt epilogues and their tolerances, is in test_linalg.cpp.
  std::vector<OpCase> la;
  for (LinearActivation act : {LinearActivation::Relu, LinearActivation::Gelu, LinearActivation::GeluTanh})
    for (bool with_bias : {true, false}) {
      OpCase c{.variant = std::string(act_name(act)) + (with_bias ? " with bias" : " without bias") + ", x [2, 3, 4]",
               .inputs = {{{2, 3, 4}}, {{5, 4}}, {{5}}},
               .fn = [act, with_bias](V v) { return op::linear_act(v[0], v[1], with_bias ? v[2] : AnyTensor(), act); },
               .tolerance = Tolerance::Gemm,
               .parity = false};
      if (act == LinearActivation::Relu)  // finite differences of 1e-6 must not straddle ReLU's kink
        c.prepare = [with_bias](std::vector<AnyTensor>& in) {
          const AnyTensor z = op::linear(in[0], in[1], with_bias ? in[2] : AnyTensor());
          for (double v : z.to_double_vector()) REQUIRE(std::abs(v) > 1e-4);
        };
      la.push_back(c);
    }
  ops.push_back(
      {.name = "linear_act",
       .family = "linalg",
       .cases = la,
       .bad = {
           bad<ShapeError>("linear_act relu, x [4, 3] with weight [5, 4]",
                           [] {
                             op::linear_act(F::randn({4, 3}), F::randn({5, 4}), AnyTensor(), LinearActivation::Relu);
                           },
                           {"linear_relu", "[4, 3]", "[5, 4]"}),
           bad<ShapeError>(
               "linear_act gelu tanh with a bias [4] for 5 outputs",
               [] {
                 op::linear_act(F::randn({4, 3}), F::randn({5, 3}), F::randn({4}), LinearActivation::GeluTanh);
               },
               {"linear_gelu_tanh", "bias must be [5]"}),
           bad<DTypeError>("linear_act gelu with a float64 weight",
                           [] {
                             op::linear_act(F::randn({4, 3}), D::randn({5, 3}), AnyTensor(), LinearActivation::Gelu);
                           },
                           {"linear_gelu", "float64"}),
           bad<DTypeError>("linear_act relu of int32",
                           [] {
                             op::linear_act(F::randn({4, 3}).to(DType::Int32), F::randn({5, 3}).to(DType::Int32),
                                            AnyTensor(), LinearActivation::Relu);
                           },
                           {"linear_relu", "int32"}),
           bad<ValueError>("linear_act relu of an undefined input",
                           [] { op::linear_act(AnyTensor(), F::randn({5, 3}), AnyTensor(), LinearActivation::Relu); },
                           {"linear_relu", "undefined"}),
           // none: linear's own checks and name
           bad<ShapeError>("linear_act none, x [4, 3] with weight [5, 4]",
                           [] {
                             op::linear_act(F::randn({4, 3}), F::randn({5, 4}), AnyTensor(), LinearActivation::None);
                           },
                           {"linear:"})}});
  return ops;
}

}  // namespace ember::testing
