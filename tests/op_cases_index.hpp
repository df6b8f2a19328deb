#pragma once
// The registry's indexing ops (ops/index.hpp): index_select, gather and embedding. Their index
// tensors are made at each call, on the input's device.
#include <limits>
#include <vector>

#include "op_case.hpp"

namespace ember::testing {

namespace index_cases {

using namespace case_names;

inline AnyTensor ids64(const std::vector<int64_t>& v, const Shape& s, const AnyTensor& like) {
  return Tensor<int64_t>::from_vector(v, s, like.device());
}
inline AnyTensor ids32(const std::vector<int32_t>& v, const Shape& s, const AnyTensor& like) {
  return Tensor<int32_t>::from_vector(v, s, like.device());
}

}  // namespace index_cases

inline std::vector<OpSpec> index_ops() {
  using namespace index_cases;
  auto idx = [](const std::vector<int64_t>& v) { return I64::from_vector(v); };
  auto x32 = [] { return F::from_vector({0, 1, 2, 3, 4, 5}, {3, 2}); };  // the bad calls' input
  auto x34 = [] { return AnyTensor::zeros({3, 4}, DType::Float32); };
  std::vector<OpSpec> ops;
  ops.push_back(
      {.name = "index_select",
       .family = "index",
       .cases = {{.variant = "[7, 4] dim 0 by {6, 0, 6, 2}",
                  .inputs = {{{7, 4}, -2, 2}},
                  .fn = [](V x) { return op::index_select(x[0], 0, ids64({6, 0, 6, 2}, {4}, x[0])); }},
                 // repeated indices: their gradients accumulate
                 {.variant = "[3, 4, 2] dim 0 by {2, 0, 2, 2, 1}",
                  .inputs = {{{3, 4, 2}}},
                  .fn = [](V x) { return op::index_select(x[0], 0, ids64({2, 0, 2, 2, 1}, {5}, x[0])); }},
                 {.variant = "[3, 4, 2] dim 1 by {3, 3, 0}",
                  .inputs = {{{3, 4, 2}}},
                  .fn = [](V x) { return op::index_select(x[0], 1, ids64({3, 3, 0}, {3}, x[0])); }},
                 {.variant = "[3, 4, 2] dim -1 by int32 {1, 1, 1, 0}",
                  .inputs = {{{3, 4, 2}}},
                  .fn = [](V x) { return op::index_select(x[0], -1, ids32({1, 1, 1, 0}, {4}, x[0])); }},
                 {.variant = "[4] dim 0 by {3, 3, 0}",
                  .inputs = {{{4}}},
                  .fn = [](V x) { return op::index_select(x[0], 0, ids64({3, 3, 0}, {3}, x[0])); }},
                 // a 0-d index selects one entry and keeps the dimension with size 1
                 {.variant = "[2, 3] dim 1 by a 0-d index",
                  .inputs = {{{2, 3}}},
                  .fn = [](V x) { return op::index_select(x[0], 1, ids64({1}, {}, x[0])); }}},
       .bad = {bad<IndexError>("index_select index 3 of size 3", [=] { index_select(x32(), 0, idx({0, 3})); },
                               {"index_select", "index 3", "size 3", "[3, 2]"}),
               bad<IndexError>("index_select index -1 along dim 1", [=] { index_select(x32(), 1, idx({-1})); },
                               {"index_select", "index -1", "dimension 1", "size 2"}),
               bad<IndexError>("index_select an index near INT64_MAX",
                               [=] { index_select(x32(), 0, idx({std::numeric_limits<int64_t>::max()})); },
                               {"index_select", "9223372036854775807"}),
               bad<IndexError>("index_select dim 2", [=] { index_select(x32(), 2, idx({0})); },
                               {"index_select", "dimension 2"}),
               bad<IndexError>("index_select dim -3", [=] { index_select(x32(), -3, idx({0})); },
                               {"index_select", "dimension -3"}),
               bad<ShapeError>("index_select a 2-d index", [=] { index_select(x32(), 0, I64::zeros({1, 1})); },
                               {"index_select", "1-D", "int64[1, 1]"}),
               bad<ShapeError>("index_select of a 0-d tensor", [=] { index_select(F::scalar(1), 0, idx({0})); },
                               {"index_select", "at least one dimension"}),
               bad<IndexError>("index_select from an empty dimension",
                               [=] { index_select(F::zeros({0, 2}), 0, idx({0})); },
                               {"index_select", "index 0", "size 0"}),
               bad<DTypeError>("index_select uint8 indices",
                               [=] { index_select(x32(), 0, Tensor<uint8_t>::zeros({1})); }, {"index_select", "uint8"}),
               bad<IndexError>("index_select [3, 4] by {0, 3}",
                               [=] { op::index_select(x34(), 0, I64::from_vector({0, 3}, {2})); },
                               {"index_select", "index 3 is out of range"}),
               bad<IndexError>("index_select [3, 4] by {1, 3}",
                               [=] { op::index_select(x34(), 0, I64::from_vector({1, 3}, {2})); },
                               {"index 3 is out of range"}),
               bad<IndexError>("index_select [3, 4] dim 1 by {-1}",
                               [=] { op::index_select(x34(), 1, I64::from_vector({-1}, {1})); },
                               {"index_select", "index -1"}),
               bad<DTypeError>("index_select [3, 4] by float32 indices",
                               [=] { op::index_select(x34(), 0, AnyTensor::zeros({2}, DType::Float32)); },
                               {"index_select", "float32"}),
               bad<ShapeError>("index_select [3, 4] by a [1, 2] index",
                               [=] { op::index_select(x34(), 0, I64::from_vector({0, 1}, {1, 2})); },
                               {"index_select", "[1, 2]"}),
               bad<IndexError>("index_select [3, 4] dim 2",
                               [=] { op::index_select(x34(), 2, I64::from_vector({0}, {1})); },
                               {"index_select", "dimension 2"}),
               // near 2^63 (they round to 2^63 in a double): still out of range, and the message says so
               bad<IndexError>("index_select [3, 4] by {0, INT64_MAX}",
                               [=] {
                                 op::index_select(x34(), 0,
                                                  I64::from_vector({0, std::numeric_limits<int64_t>::max()}, {2}));
                               },
                               {"index_select: index 9223372036854775807 is out of range for dimension 0 of size 3"}),
               bad<IndexError>("index_select [3, 4] by {INT64_MAX - 100}",
                               [=] {
                                 op::index_select(x34(), 0,
                                                  I64::from_vector({std::numeric_limits<int64_t>::max() - 100}, {1}));
                               },
                               {"index_select", "9223372036854775707"})}});
  ops.push_back(
      {.name = "gather",
       .family = "index",
       .cases = {{.variant = "[3, 5] dim 1 by [3, 3]",
                  .inputs = {{{3, 5}, -2, 2}},
                  .fn = [](V x) { return op::gather(x[0], 1, ids64({4, 0, 1, 1, 2, 2, 3, 3, 0}, {3, 3}, x[0])); }},
                 // dim 0: an index [5, 4] with more rows than x, repeating
                 {.variant = "[3, 4] dim 0 by [5, 4]",
                  .inputs = {{{3, 4}}},
                  .fn =
                      [](V x) {
                        return op::gather(x[0], 0,
                                          ids64({0, 1, 2, 0, 2, 2, 2, 2, 1, 0, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1}, {5, 4},
                                                x[0]));
                      }},
                 {.variant = "[3, 4] dim 1 by [3, 2]",
                  .inputs = {{{3, 4}}},
                  .fn = [](V x) { return op::gather(x[0], 1, ids64({3, 3, 0, 1, 2, 2}, {3, 2}, x[0])); }},
                 {.variant = "[2, 3, 2] dim -1 by int32 [2, 3, 2]",
                  .inputs = {{{2, 3, 2}}},
                  .fn =
                      [](V x) {
                        return op::gather(x[0], -1, ids32({1, 1, 0, 0, 1, 0, 1, 1, 1, 0, 0, 0}, {2, 3, 2}, x[0]));
                      }},
                 {.variant = "[2, 3, 2] dim 1 by [2, 2, 2]",
                  .inputs = {{{2, 3, 2}}},
                  .fn = [](V x) { return op::gather(x[0], 1, ids64({2, 0, 1, 1, 0, 0, 2, 2}, {2, 2, 2}, x[0])); }}},
       .bad = {bad<IndexError>("gather index -1", [=] { gather(x32(), 1, I64::full({3, 1}, -1.0)); },
                               {"gather", "index -1"}),
               bad<IndexError>("gather dim 2", [=] { gather(x32(), 2, I64::zeros({3, 1})); },
                               {"gather", "dimension 2"}),
               bad<ShapeError>("gather index of another rank", [=] { gather(x32(), 1, I64::zeros({3})); },
                               {"gather", "int64[3]", "rank", "[3, 2]"}),
               bad<ShapeError>("gather index differing outside dim", [=] { gather(x32(), 1, I64::zeros({2, 1})); },
                               {"gather", "dimension 0", "[2, 1]"}),
               bad<ShapeError>("gather from a 0-d tensor", [] { gather(F::scalar(1), 0, I64::scalar(0)); },
                               {"gather", "rank"}),
               bad<DTypeError>("gather float indices", [=] { gather(x32(), 1, F::zeros({3, 1})); },
                               {"gather", "float32"}),
               bad<IndexError>("gather [3, 4] dim 1 index 4",
                               [=] { op::gather(x34(), 1, I64::from_vector({0, 4, 0}, {3, 1})); },
                               {"gather", "index 4"}),
               bad<ShapeError>("gather [3, 4] by [2, 1]: dimension 0 differs",
                               [=] { op::gather(x34(), 1, I64::from_vector({0, 1}, {2, 1})); },
                               {"gather", "dimension 0"}),
               bad<ShapeError>("gather [3, 4] by [3]: the rank differs",
                               [=] { op::gather(x34(), 1, I64::from_vector({0, 1, 2}, {3})); },
                               {"gather", "rank"}),
               bad<IndexError>("gather [3, 4] dim 0 by int32 -2",
                               [=] { op::gather(x34(), 0, Tensor<int32_t>::from_vector({0, 0, 0, -2}, {1, 4})); },
                               {"gather", "index -2"}),
               bad_on_device<DeviceError>("gather cuda:0 index",
                                          [=] { gather(F::ones({2, 3}), 1, I64::zeros({2, 1}, Device::cuda(0))); },
                                          {"gather", "cuda:0"})}});
  ops.push_back({.name = "embedding",
                 .family = "index",
                 .cases = {{.variant = "[5, 3] by [2, 3] ids with repeated rows",
                            .inputs = {{{5, 3}}},
                            .fn = [](V w) { return op::embedding(w[0], ids64({4, 0, 4, 1, 4, 0}, {2, 3}, w[0])); }},
                           {.variant = "[3, 4] by int32 {2, 2, 2}",
                            .inputs = {{{3, 4}}},
                            .fn = [](V w) { return op::embedding(w[0], ids32({2, 2, 2}, {3}, w[0])); }}},
                 .bad = {bad<IndexError>("embedding index 3 of 3 rows", [=] { embedding(x32(), idx({1, 3})); },
                                         {"embedding", "index 3", "size 3"}),
                         bad<IndexError>("embedding index -1 (int32)",
                                         [=] { embedding(x32(), Tensor<int32_t>::from_vector({-1})); },
                                         {"embedding", "index -1"}),
                         bad<ShapeError>("embedding with a 1-d weight", [=] { embedding(F::ones({3}), idx({0})); },
                                         {"embedding", "weight", "[3]"}),
                         bad<ShapeError>("embedding with a 3-d weight",
                                         [=] { embedding(F::ones({3, 2, 2}), idx({0})); },
                                         {"embedding", "[3, 2, 2]"}),
                         bad<DTypeError>("embedding with float ids", [=] { embedding(x32(), F::zeros({2})); },
                                         {"embedding", "float32"}),
                         bad<ValueError>("embedding with undefined ids", [=] { op::embedding(x32(), AnyTensor()); },
                                         {"embedding", "indices", "undefined"}),
                         bad_on_device<DeviceError>("embedding cuda:0 ids",
                                                    [] {
                                                      embedding(F::ones({2, 3}), I64::zeros({1}, Device::cuda(0)));
                                                    },
                                                    {"embedding", "cuda:0"})}});
  return ops;
}

}  // namespace ember::testing
