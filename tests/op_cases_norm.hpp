#pragma once
// The registry's normalisations (ops/norm.hpp: layer_norm and rms_norm, one fused kernel;
// ops/batch_norm.hpp: the fused training batch norm). Their CPU-versus-CUDA parity, with the
// shapes that reach every kernel variant and per-dtype tolerances, is in test_norm.cpp and
// test_batch_norm.cpp, so their cases here are not in the generic parity check.
#include <cmath>
#include <vector>

#include "op_case.hpp"

namespace ember::testing {

inline std::vector<OpSpec> norm_ops() {
  using namespace case_names;
  namespace fn = nn::functional;
  const auto x23 = [] { return F::ones({2, 3}); };
  const auto x46 = [] { return F::randn({4, 6}); };
  std::vector<OpSpec> ops;
  ops.push_back(
      {.name = "layer_norm",
       .family = "norm",
       .cases = {{.variant = "[4, 6] with weight and bias",
                  .inputs = {{{4, 6}}, {{6}}, {{6}}},
                  .fn = [](V v) { return op::layer_norm(v[0], 6, v[1], v[2], 1e-5); },
                  .parity = false},
                 {.variant = "[4, 6] without weight and bias",
                  .inputs = {{{4, 6}}},
                  .fn = [](V v) { return op::layer_norm(v[0], 6, {}, {}, 1e-5); },
                  .parity = false}},
       .bad = {
           bad<ShapeError>("layer_norm over 4 of [2, 3]", [=] { op::layer_norm(x23(), 4); },
                           {"layer_norm", "[2, 3]", "4"}),
           bad<ShapeError>("layer_norm over 0 elements", [=] { op::layer_norm(x23(), 0); }, {"layer_norm", "[2, 3]"}),
           bad<ShapeError>("layer_norm of a 0-d tensor", [] { op::layer_norm(F::scalar(1), 1); },
                           {"layer_norm", "float32[]"}),
           bad<ShapeError>("layer_norm weight of 2 elements", [=] { op::layer_norm(x23(), 3, F::ones({2})); },
                           {"layer_norm", "weight", "[2]", "3 elements"}),
           bad<ShapeError>("layer_norm bias of 4 elements",
                           [=] { op::layer_norm(x23(), 3, F::ones({3}), F::ones({4})); },
                           {"layer_norm", "bias", "[4]"}),
           bad<DTypeError>("layer_norm float64 weight", [=] { op::layer_norm(x23(), 3, D::ones({3})); },
                           {"layer_norm", "weight", "float64"}),
           bad<ValueError>("layer_norm eps -1", [=] { op::layer_norm(x23(), 3, {}, {}, -1.0); },
                           {"layer_norm", "eps", "-1"}),
           bad<ShapeError>("layer_norm of [4, 6] with a weight of 5 elements",
                           [=] { op::layer_norm(x46(), 6, F::ones({5})); }, {"layer_norm", "weight", "6 elements"}),
           bad<ShapeError>("layer_norm of [4, 6] over 5", [=] { op::layer_norm(x46(), 5); }, {"layer_norm", "[4, 6]"}),
           bad<DTypeError>("layer_norm of float32 [4, 6] with a float64 weight",
                           [=] { op::layer_norm(x46(), 6, D::ones({6})); }, {"layer_norm", "dtype", "float32"}),
           bad<ValueError>("layer_norm of [4, 6] with eps -1", [=] { op::layer_norm(x46(), 6, {}, {}, -1.0); },
                           {"layer_norm", "eps"}),
           bad<ShapeError>("functional layer_norm shape [2] of [2, 3]", [=] { fn::layer_norm(x23(), {2}); },
                           {"layer_norm", "[2, 3]", "normalized_shape [2]"}),
           bad<ShapeError>("functional layer_norm shape [-1]", [=] { fn::layer_norm(x23(), {-1}); },
                           {"layer_norm", "[2, 3]", "[-1]"}),
           bad<ValueError>("functional layer_norm empty shape", [=] { fn::layer_norm(x23(), {}); },
                           {"layer_norm", "at least one dimension"}),
           bad_on_device<DeviceError>("layer_norm cuda:0 weight",
                                      [=] { op::layer_norm(x23(), 3, F::ones({3}, Device::cuda(0))); },
                                      {"layer_norm", "weight", "cuda:0", "input's device cpu"})}});
  ops.push_back(
      {.name = "rms_norm",
       .family = "norm",
       .cases = {{.variant = "[4, 6] with weight",
                  .inputs = {{{4, 6}}, {{6}}},
                  .fn = [](V v) { return op::rms_norm(v[0], 6, v[1], 1e-5); },
                  .parity = false},
                 {.variant = "[3, 2, 5] over the last 10, no weight",
                  .inputs = {{{3, 2, 5}}},
                  .fn = [](V v) { return op::rms_norm(v[0], 10, {}, 1e-6); },
                  .parity = false}},
       .bad = {bad<ValueError>("rms_norm eps NaN", [=] { op::rms_norm(x23(), 3, {}, std::nan("")); },
                               {"rms_norm", "eps"}),
               bad<DTypeError>("rms_norm of int64", [] { op::rms_norm(I64::ones({2, 3}), 3); }, {"rms_norm", "int64"}),
               bad<DTypeError>("rms_norm of int32", [] { op::rms_norm(Tensor<int32_t>::zeros({2, 3}), 3); },
                               {"rms_norm", "int32"}),
               bad<ShapeError>("functional rms_norm shape [2, 3, 1]", [=] { fn::rms_norm(x23(), {2, 3, 1}); },
                               {"rms_norm", "[2, 3, 1]"}),
               bad<ShapeError>("functional rms_norm shape [0]", [=] { fn::rms_norm(x23(), {0}); }, {"rms_norm", "[0]"}),
               bad<ShapeError>("functional rms_norm shape [7] of [4, 6]", [=] { fn::rms_norm(x46(), {7}); },
                               {"rms_norm", "normalized_shape"})}});
  ops.push_back(
      {.name = "batch_norm",
       .family = "norm",
       .bad = {bad<ValueError>("batch_norm fused op on an int64 input",
                               [] { op::batch_norm_train(I64::ones({2, 3}), AnyTensor(), AnyTensor(), 1e-5); },
                               {"batch_norm", "int64[2, 3]"}),
               bad<ValueError>("batch_norm fused op weight [2] for 3 channels",
                               [=] { op::batch_norm_train(x23(), F::ones({2}), AnyTensor(), 1e-5); },
                               {"batch_norm", "weight float32[2]"}),
               bad<ValueError>("batch_norm fused op on a 1-d input",
                               [] { op::batch_norm_train(F::ones({3}), AnyTensor(), AnyTensor(), 1e-5); },
                               {"batch_norm", "[N, C, ...]", "float32[3]"}),
               bad<ValueError>("batch_norm fused op on float16",
                               [=] { op::batch_norm_train(x23().to<half>(), AnyTensor(), AnyTensor(), 1e-5); },
                               {"batch_norm", "cpu", "float16[2, 3]"}),
               bad_on_device<ValueError>("batch_norm fused op with a cuda:0 weight",
                                         [=] {
                                           op::batch_norm_train(x23(), F::ones({3}, Device::cuda(0)), AnyTensor(),
                                                                1e-5);
                                         },
                                         {"batch_norm", "weight float32[3] on cuda:0"})}});
  return ops;
}

}  // namespace ember::testing
