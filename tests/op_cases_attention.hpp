#pragma once
// The registry's attention (nn::functional::scaled_dot_product_attention and its kernel-level
// op::fused_attention). Its CPU-versus-CUDA parity, with the block sizes and masks that reach
// every kernel path, is in test_attention.cpp; its typed cases here are float64 only.
#include <limits>
#include <vector>

#include "op_case.hpp"

namespace ember::testing {

inline std::vector<OpSpec> attention_ops() {
  using namespace case_names;
  using nn::functional::AttentionOptions;
  using nn::functional::scaled_dot_product_attention;
  // q [2, 5, 3], k [2, 7, 3], v [2, 7, 4]
  const std::vector<Input> qkv = {{{2, 5, 3}}, {{2, 7, 3}}, {{2, 7, 4}}};
  auto sdpa = [](V x, const AttentionOptions& o) {
    return AnyTensor(scaled_dot_product_attention(D(x[0]), D(x[1]), D(x[2]), o));
  };
  const auto q = [] { return F::zeros({2, 4, 8}); };
  const auto k = [] { return F::zeros({2, 5, 8}); };
  const auto v = [] { return F::zeros({2, 5, 6}); };
  std::vector<OpSpec> ops;
  ops.push_back(
      {.name = "scaled_dot_product_attention",
       .family = "attention",
       .cases = {{.variant = "plain", .inputs = qkv, .fn = [=](V x) { return sdpa(x, {}); }, .parity = false},
                 {.variant = "causal, scale 0.7",
                  .inputs = qkv,
                  .fn = [=](V x) { return sdpa(x, {.is_causal = true, .scale = 0.7}); },
                  .parity = false},
                 {.variant = "a float mask [2, 5, 7]",
                  .inputs = qkv,
                  .fn = [=](V x) { return sdpa(x, {.attn_mask = constant({2, 5, 7}, 3, -1, 1, x[0])}); },
                  .parity = false},
                 {.variant = "causal, the last key padding (a bool mask [7])",
                  .inputs = qkv,
                  .fn =
                      [=](V x) {
                        return sdpa(x, {.attn_mask = Tensor<uint8_t>::from_vector({0, 0, 0, 0, 0, 0, 1}, {7}),
                                        .is_causal = true});
                      },
                  .parity = false}},
       .bad = {
           bad<ShapeError>("sdpa key [2, 5, 7] for query [2, 4, 8]",
                           [=] { scaled_dot_product_attention(q(), F::zeros({2, 5, 7}), v()); },
                           {"scaled_dot_product_attention", "[2, 5, 7]"}),
           bad<ShapeError>("sdpa key batch 3 for 2",
                           [=] { scaled_dot_product_attention(q(), F::zeros({3, 5, 8}), v()); },
                           {"scaled_dot_product_attention", "[3, 5, 8]"}),
           bad<ShapeError>("sdpa value [2, 4, 6] for key [2, 5, 8]",
                           [=] { scaled_dot_product_attention(q(), k(), F::zeros({2, 4, 6})); },
                           {"scaled_dot_product_attention", "[2, 4, 6]"}),
           bad<ShapeError>("sdpa 1-d query", [=] { scaled_dot_product_attention(F::zeros({8}), k(), v()); },
                           {"scaled_dot_product_attention", "[8]"}),
           bad<ShapeError>("sdpa attn_mask [3, 5] that does not broadcast",
                           [=] { scaled_dot_product_attention(q(), k(), v(), {.attn_mask = F::zeros({3, 5})}); },
                           {"attn_mask", "broadcast"}),
           bad<DTypeError>("sdpa int32 attn_mask",
                           [=] {
                             scaled_dot_product_attention(q(), k(), v(), {.attn_mask = Tensor<int32_t>::zeros({4, 5})});
                           },
                           {"scaled_dot_product_attention", "int32"}),
           bad<ValueError>("sdpa dropout_p 1.5",
                           [=] { scaled_dot_product_attention(q(), k(), v(), {.dropout_p = 1.5}); },
                           {"scaled_dot_product_attention", "1.5"}),
           bad<ValueError>("sdpa scale inf",
                           [=] {
                             scaled_dot_product_attention(q(), k(), v(),
                                                          {.scale = std::numeric_limits<double>::infinity()});
                           },
                           {"scaled_dot_product_attention", "scale"}),
           bad<DTypeError>("fused_attention of float16",
                           [=] {
                             op::fused_attention(q().to(DType::Float16), k().to(DType::Float16), v().to(DType::Float16),
                                                 {}, 1, false, 1.0);
                           },
                           {"scaled_dot_product_attention", "float16"}),
           bad<ShapeError>("fused_attention mask [3, 4, 5]",
                           [=] { op::fused_attention(q(), k(), v(), F::zeros({3, 4, 5}), 1, false, 1.0); },
                           {"scaled_dot_product_attention", "[3, 4, 5]"}),
           bad<ValueError>("fused_attention mask group 3 of batch 2",
                           [=] { op::fused_attention(q(), k(), v(), F::zeros({1, 4, 5}), 3, false, 1.0); },
                           {"scaled_dot_product_attention", "3"})}});
  return ops;
}

}  // namespace ember::testing
