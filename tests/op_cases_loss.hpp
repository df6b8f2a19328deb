#pragma once
// The registry's losses (ops/loss.hpp: cross_entropy and nll_loss; nn/loss.hpp's functional
// mse_loss, l1_loss, smooth_l1_loss and binary_cross_entropy_with_logits). cross_entropy's
// CPU-versus-CUDA parity, with its fused kernel's shapes and tolerances, is in test_nn_loss.cpp.
#include <string>
#include <vector>

#include "op_case.hpp"

namespace ember::testing {

namespace loss_cases {

using namespace case_names;

// Logits [2, 3] = 0.1 .. 0.6, the losses' NaN checks' input.
inline NanCheck all_ignored(const std::string& what, OpFn fn) {
  return {.what = what,
          .values = {{0.1, 0.2, 0.3, 0.4, 0.5, 0.6}},
          .shapes = {Shape{2, 3}},
          .fn = std::move(fn),
          .want = {kNan},
          .want_grads = {std::vector<double>(6, 0.0)}};
}

}  // namespace loss_cases

inline std::vector<OpSpec> loss_ops() {
  using namespace loss_cases;
  namespace fnl = nn::functional;
  const auto logits = [] { return F::zeros({2, 3}); };
  const auto t = [] { return I64::from_vector({0, 2}); };
  const auto idx = [](const std::vector<int64_t>& v) { return I64::from_vector(v); };
  const auto x34 = [] { return F::randn({3, 4}); };
  const Device gpu = Device::cuda(0);
  std::vector<OpSpec> ops;
  ops.push_back(
      {.name = "cross_entropy",
       .family = "loss",
       .cases =
           {{.variant = "[6, 4], class weights, label smoothing 0.1, an ignored target",
             .inputs = {{{6, 4}, -3, 3}},
             .fn =
                 [](V v) {
                   const AnyTensor w = D::from_vector({0.5, 1.0, 2.0, 1.5}, {4}).to(v[0].dtype()).to(v[0].device());
                   return op::cross_entropy(v[0], I64::from_vector({0, 2, -100, 1, 3, 2}, {6}, v[0].device()), w, -100,
                                            0.1);
                 },
             .parity = false},
            {.variant = "[2, 3, 2, 2] (4-d), reduction none",
             .inputs = {{{2, 3, 2, 2}, -3, 3}},
             .fn =
                 [](V v) {
                   return op::cross_entropy(v[0], I64::from_vector({0, 1, 2, 1, 0, 2, 2, 2}, {2, 2, 2}, v[0].device()),
                                            {}, -100, 0.0, op::Reduction::None);
                 },
             .parity = false}},
       .bad = {bad<IndexError>("cross_entropy target 3 of 3 classes",
                               [=] { fnl::cross_entropy(logits(), idx({0, 3})); },
                               {"cross_entropy", "target 3", "3 classes", "[2, 3]"}),
               bad<IndexError>("cross_entropy target -1 (ignore_index -100)",
                               [=] { fnl::cross_entropy(logits(), idx({-1, 0})); },
                               {"cross_entropy", "target -1", "ignore_index -100"}),
               bad<IndexError>("cross_entropy int32 target 7",
                               [=] { fnl::cross_entropy(logits(), Tensor<int32_t>::from_vector({7, 0})); },
                               {"cross_entropy", "target 7"}),
               bad<IndexError>("cross_entropy 1-d input, 0-d target 5",
                               [] { fnl::cross_entropy(F::zeros({3}), I64::scalar(5)); },
                               {"cross_entropy", "target 5"}),
               bad<DTypeError>("cross_entropy float target", [=] { fnl::cross_entropy(logits(), F::zeros({2})); },
                               {"cross_entropy", "class indices", "float32[2]"}),
               bad<ShapeError>("cross_entropy target [3] for [2, 3]",
                               [=] { fnl::cross_entropy(logits(), idx({0, 1, 2})); },
                               {"cross_entropy", "int64[3]", "[2, 3]", "expected target shape [2]"}),
               bad<ShapeError>("cross_entropy target [2, 1] for [2, 3]",
                               [=] { fnl::cross_entropy(logits(), I64::zeros({2, 1})); },
                               {"cross_entropy", "[2, 1]"}),
               bad<ShapeError>("cross_entropy 0-d input", [] { fnl::cross_entropy(F::scalar(0), I64::scalar(0)); },
                               {"cross_entropy", "[C] or [N, C, ...]"}),
               bad<ShapeError>("cross_entropy no classes", [=] { fnl::cross_entropy(F::zeros({2, 0}), idx({0, 0})); },
                               {"cross_entropy", "no classes"}),
               bad<ShapeError>("cross_entropy weight [2] for 3 classes",
                               [=] { fnl::cross_entropy(logits(), t(), {.weight = F::ones({2})}); },
                               {"cross_entropy", "weight", "[2]", "[3]"}),
               bad<DTypeError>("cross_entropy int64 weight",
                               [=] { fnl::cross_entropy(logits(), t(), {.weight = I64::ones({3})}); },
                               {"cross_entropy", "weight", "int64"}),
               bad<ValueError>("cross_entropy label_smoothing 1.5",
                               [=] { fnl::cross_entropy(logits(), t(), {.label_smoothing = 1.5}); },
                               {"cross_entropy", "label_smoothing", "1.5"}),
               bad<ValueError>("cross_entropy reduction 'avg'",
                               [=] { fnl::cross_entropy(logits(), t(), {.reduction = "avg"}); },
                               {"cross_entropy", "'avg'"}),
               bad<DTypeError>("op::cross_entropy of int64 logits", [=] { op::cross_entropy(I64::zeros({2, 3}), t()); },
                               {"cross_entropy", "floating", "int64[2, 3]"}),
               bad<ValueError>("op::cross_entropy label_smoothing -0.5",
                               [=] { op::cross_entropy(logits(), t(), {}, -100, -0.5); },
                               {"cross_entropy", "label_smoothing", "-0.5"}),
               bad<IndexError>("cross_entropy [3, 4] target 4 of 4 classes",
                               [=] { fnl::cross_entropy(x34(), I64::from_vector({0, 4, 1}, {3})); },
                               {"cross_entropy", "target 4 is out of bounds for 4 classes"}),
               bad<IndexError>("cross_entropy [3, 4] target -1",
                               [=] { fnl::cross_entropy(x34(), I64::from_vector({0, -1, 1}, {3})); },
                               {"cross_entropy", "target -1"}),
               bad<ShapeError>("cross_entropy [3, 4] target [4]", [=] { fnl::cross_entropy(x34(), I64::zeros({4})); },
                               {"cross_entropy", "[4]"}),
               bad<DTypeError>("cross_entropy [3, 4] float32 target", [=] { fnl::cross_entropy(x34(), F::zeros({3})); },
                               {"cross_entropy", "float32[3]"}),
               bad<ShapeError>("cross_entropy [3, 4] weight [3]",
                               [=] { fnl::cross_entropy(x34(), I64::zeros({3}), {.weight = F::ones({3})}); },
                               {"cross_entropy", "weight", "[3]"}),
               bad_on_device<DeviceError>("cross_entropy cuda:0 target",
                                          [=] { fnl::cross_entropy(F::ones({2, 3}), I64::zeros({2}, gpu)); },
                                          {"cross_entropy", "cuda:0"}),
               bad_on_device<DeviceError>(
                   "cross_entropy cuda:0 class weight",
                   [=] {
                     fnl::cross_entropy(F::ones({2, 3}), I64::zeros({2}), {.weight = F::ones({3}, gpu)});
                   },
                   {"cross_entropy", "cuda:0"})},
       // PyTorch: the loss is 0/0 = NaN, the gradients 0 (a padding-only micro-batch must not
       // poison the parameters).
       .nan = {all_ignored("mean cross_entropy with every target ignored: NaN, zero gradients",
                           [](V x) {
                             return AnyTensor(fnl::cross_entropy(D(x[0]), I64::from_vector({-100, -100}, Shape{2})));
                           }),
               all_ignored("... with label smoothing 0.1 and class weights", [](V x) {
                 nn::CrossEntropyOptions o;
                 o.label_smoothing = 0.1;
                 o.weight = D::from_vector({1.0, 2.0, 3.0}, Shape{3});
                 return AnyTensor(fnl::cross_entropy(D(x[0]), I64::from_vector({-100, -100}, Shape{2}), o));
               })}});
  ops.push_back(
      {.name = "nll_loss",
       .family = "loss",
       .bad = {bad<IndexError>("nll_loss target 3", [=] { fnl::nll_loss(logits(), idx({3, 0})); },
                               {"nll_loss", "target 3"}),
               bad<IndexError>("nll_loss target -2 with ignore_index 1",
                               [=] { fnl::nll_loss(logits(), idx({1, -2}), {.ignore_index = 1}); },
                               {"nll_loss", "target -2", "ignore_index 1"}),
               bad<ShapeError>("nll_loss [2, 3, 4] with target [2, 3]",
                               [] { fnl::nll_loss(F::zeros({2, 3, 4}), I64::zeros({2, 3})); },
                               {"nll_loss", "[2, 3, 4]", "expected target shape [2, 4]"}),
               bad<DTypeError>("nll_loss uint8 target", [=] { fnl::nll_loss(logits(), Tensor<uint8_t>::zeros({2})); },
                               {"nll_loss", "uint8"}),
               bad<ShapeError>("nll_loss 0-d input", [] { fnl::nll_loss(F::scalar(0), I64::scalar(0)); },
                               {"nll_loss", "[C]"}),
               bad<ValueError>("op::nll_loss of an undefined input", [=] { op::nll_loss(AnyTensor(), t()); },
                               {"nll_loss", "input", "undefined"}),
               bad<DTypeError>("op::nll_loss of a uint8 input",
                               [=] { op::nll_loss(Tensor<uint8_t>::zeros({2, 3}), t()); },
                               {"nll_loss", "uint8[2, 3]"}),
               bad<ShapeError>("op::nll_loss weight [2] for 3 classes",
                               [=] { op::nll_loss(logits(), t(), F::ones({2})); },
                               {"nll_loss", "weight", "[2]", "[3]"}),
               bad_on_device<DeviceError>("op::nll_loss cuda:0 target",
                                          [=] { op::nll_loss(F::ones({2, 3}), I64::zeros({2}, gpu)); },
                                          {"nll_loss", "int64[2] on cuda:0"}),
               bad_on_device<DeviceError>("op::nll_loss cuda:0 class weight",
                                          [=] { op::nll_loss(F::ones({2, 3}), I64::zeros({2}), F::ones({3}, gpu)); },
                                          {"nll_loss", "float32[3] on cuda:0"})},
       .nan = {all_ignored(
                   "mean nll_loss with every target ignored (ignore_index 3): NaN, zero gradients",
                   [](V x) {
                     return AnyTensor(fnl::nll_loss(D(x[0]), I64::from_vector({3, 3}, Shape{2}), {.ignore_index = 3}));
                   }),
               {.what = "mean nll_loss with one valid target: the usual mean",
                .values = {{0.1, 0.2, 0.3, 0.4, 0.5, 0.6}},
                .shapes = {Shape{2, 3}},
                .fn = [](V x) { return AnyTensor(fnl::nll_loss(D(x[0]), I64::from_vector({-100, 2}, Shape{2}))); },
                .want = {-0.6},
                .want_grads = {{0, 0, 0, 0, 0, -1}},
                .rtol = 1e-12}}});
  ops.push_back({.name = "mse_loss",
                 .family = "loss",
                 .bad = {bad<ShapeError>("mse_loss [2, 3] against [4]", [=] { fnl::mse_loss(logits(), F::zeros({4})); },
                                         {"mse_loss", "[2, 3] (input)", "[4] (target)"}),
                         bad<DTypeError>("mse_loss int64 target", [=] { fnl::mse_loss(logits(), I64::zeros({2, 3})); },
                                         {"mse_loss", "int64"}),
                         bad<ValueError>("mse_loss reduction 'max'", [=] { fnl::mse_loss(logits(), logits(), "max"); },
                                         {"mse_loss", "'max'"}),
                         bad_on_device<DeviceError>("mse_loss cuda:0 target",
                                                    [] {
                                                      fnl::mse_loss(F::ones({2, 3}), F::ones({2, 3}, Device::cuda(0)));
                                                    },
                                                    {"mse_loss", "cuda:0"})}});
  ops.push_back({.name = "l1_loss",
                 .family = "loss",
                 .bad = {bad<ValueError>("l1_loss undefined target", [=] { fnl::l1_loss(logits(), AnyTensor()); },
                                         {"l1_loss", "target"})}});
  ops.push_back(
      {.name = "smooth_l1_loss",
       .family = "loss",
       .bad = {bad<ValueError>("smooth_l1_loss beta -1", [=] { fnl::smooth_l1_loss(logits(), logits(), "mean", -1.0); },
                               {"smooth_l1_loss", "beta", "-1"})}});
  ops.push_back({.name = "binary_cross_entropy_with_logits",
                 .family = "loss",
                 .bad = {bad<ShapeError>("bce target of another shape",
                                         [=] { fnl::binary_cross_entropy_with_logits(logits(), F::zeros({3})); },
                                         {"binary_cross_entropy_with_logits", "[3]", "[2, 3]"}),
                         bad<ShapeError>("bce pos_weight [2] for [2, 3]",
                                         [=] {
                                           fnl::binary_cross_entropy_with_logits(logits(), logits(),
                                                                                 {.pos_weight = F::ones({2})});
                                         },
                                         {"binary_cross_entropy_with_logits", "pos_weight", "[2]"}),
                         bad<DTypeError>("bce int64 target",
                                         [=] { fnl::binary_cross_entropy_with_logits(logits(), I64::zeros({2, 3})); },
                                         {"binary_cross_entropy_with_logits", "int64"})}});
  return ops;
}

}  // namespace ember::testing
