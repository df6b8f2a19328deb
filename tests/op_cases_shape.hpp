#pragma once
// The registry's shape ops (ops/shape.hpp and the Tensor methods): permute, transpose, expand,
// unsqueeze, squeeze, flatten, reshape, concat, split, chunk, slice, select, clone and to(dtype).
#include <algorithm>
#include <string>
#include <vector>

#include "op_case.hpp"
#include "test_util.hpp"

namespace ember::testing {

namespace shape_cases {

using namespace case_names;
using View = std::function<AnyTensor(const AnyTensor&)>;

// A view of square(x) times fixed weights viewed the same way: a gradient that depends on
// position, so a view that scrambled the layout would fail.
inline OpCase through_view(const std::string& what, View view) {
  return {.variant = what + " of [2, 3, 4]", .inputs = {{{2, 3, 4}}}, .fn = [view](V x) {
            AnyTensor w = constant({2, 3, 4}, 50, -1, 1, x[0]);
            return op::mul(view(op::square(x[0])), w.reshape(view(w).shape()));
          }};
}

// The outputs of a multi-output op times fixed different weights, summed: a scalar that depends
// on every output but the `unused` ones.
inline AnyTensor weighted_sum(const std::vector<AnyTensor>& outs, std::vector<size_t> unused = {}) {
  AnyTensor total;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (std::find(unused.begin(), unused.end(), i) != unused.end()) continue;
    AnyTensor term = op::sum(op::mul(outs[i], constant(outs[i].shape(), 100 + i, 0.5, 2.0, outs[i])));
    total = total.defined() ? op::add(total, term) : term;
  }
  return total;
}

inline OpCase pieces(const std::string& what, const Shape& s, std::function<std::vector<AnyTensor>(const AnyTensor&)> f,
                     std::vector<size_t> unused = {}) {
  return {.variant = what + " of " + s.str(), .inputs = {{s}}, .fn = [f, unused](V x) {
            return weighted_sum(f(x[0]), unused);
          }};
}

inline OpCase of53(const std::string& what, OpFn fn, bool parity = true) {
  return {.variant = what + " of [5, 3]", .inputs = {{{5, 3}}}, .fn = std::move(fn), .parity = parity};
}

}  // namespace shape_cases

inline std::vector<OpSpec> shape_ops() {
  using namespace shape_cases;
  const auto x23 = [] { return F::ones({2, 3}); };
  const auto s0 = [] { return F::scalar(1); };
  std::vector<OpSpec> ops;

  std::vector<OpCase> perm = {{.variant = "[2, 3, 4, 5] by {3,1,0,2}",
                               .inputs = {{{2, 3, 4, 5}, -2, 2}},
                               .fn = [](V x) { return op::permute(x[0], {3, 1, 0, 2}); }},
                              {.variant = "[2, 3, 2, 4] by {3,1,0,2}", .inputs = {{{2, 3, 2, 4}}}, .fn = [](V x) {
                                 return op::permute(x[0], {3, 1, 0, 2});
                               }}};
  for (const std::vector<int>& p :
       std::vector<std::vector<int>>{{2, 0, 1}, {1, 0, 2}, {0, 2, 1}, {0, 1, 2}, {-1, 0, 1}})
    perm.push_back({.variant = "[2, 3, 4] by " + list_str(p), .inputs = {{{2, 3, 4}}}, .fn = [p](V x) {
                      return op::permute(x[0], p);
                    }});
  ops.push_back({.name = "permute",
                 .family = "shape",
                 .cases = perm,
                 .bad = {bad<IndexError>("permute [0, 2]", [=] { permute(x23(), {0, 2}); }, {"permute", "dimension 2"}),
                         bad<ShapeError>("permute [0, 0]", [=] { permute(x23(), {0, 0}); }, {"permute", "repeated"}),
                         bad<ShapeError>("permute [1, 0, 2] of rank 2", [=] { permute(x23(), {1, 0, 2}); },
                                         {"permute", "3 dimensions"})}});
  ops.push_back(
      {.name = "transpose",
       .family = "shape",
       .cases = {{.variant = "[6, 7]", .inputs = {{{6, 7}, -2, 2}}, .fn = [](V x) { return op::transpose(x[0]); }},
                 {.variant = "[2, 3, 4] default (-2, -1)",
                  .inputs = {{{2, 3, 4}}},
                  .fn = [](V x) { return op::transpose(x[0]); }},
                 {.variant = "[2, 3, 4] (0, 2)",
                  .inputs = {{{2, 3, 4}}},
                  .fn = [](V x) { return op::transpose(x[0], 0, 2); }},
                 {.variant = "[3, 5] (1, 0)",
                  .inputs = {{{3, 5}}},
                  .fn = [](V x) { return op::transpose(x[0], 1, 0); }}},
       .bad = {bad<IndexError>("transpose -3", [=] { transpose(x23(), -3, 0); }, {"transpose", "dimension -3"}),
               bad<ShapeError>("transpose of a 1-d tensor", [] { transpose(F::ones({3})); }, {"transpose", "[3]"})}});
  std::vector<OpCase> ex = {{.variant = "[3, 1] to [2, 3, 4], in [-2, 2)", .inputs = {{{3, 1}, -2, 2}}, .fn = [](V x) {
                               return op::expand(x[0], Shape{2, 3, 4});
                             }}};
  for (const auto& [from, to] : std::vector<std::pair<Shape, Shape>>{
           {{3, 1}, {2, 3, 4}}, {{}, {2, 3}}, {{4}, {3, 4}}, {{1, 4}, {1, 4}}, {{2, 1, 1}, {2, 3, 2}}})
    ex.push_back({.variant = from.str() + " to " + to.str(), .inputs = {{from}}, .fn = [to](V x) {
                    return op::expand(x[0], to);
                  }});
  ops.push_back(
      {.name = "expand",
       .family = "shape",
       .cases = ex,
       .bad = {bad<ShapeError>("expand [2, 3] to [3]", [=] { expand(x23(), Shape{3}); }, {"expand", "[2, 3]", "[3]"}),
               bad<ShapeError>("expand [2, 3] to [2, 1]", [=] { expand(x23(), Shape{2, 1}); }, {"expand", "[2, 1]"}),
               bad<ShapeError>("expand [2] to [0]", [] { expand(F::ones({2}), Shape{0}); },
                               {"expand", "[2]", "[0]"})}});
  ops.push_back(
      {.name = "unsqueeze",
       .family = "shape",
       .cases = {through_view("unsqueeze 0", [](const AnyTensor& x) { return op::unsqueeze(x, 0); }),
                 through_view("unsqueeze -1", [](const AnyTensor& x) { return op::unsqueeze(x, -1); }),
                 through_view("unsqueeze 2", [](const AnyTensor& x) { return op::unsqueeze(x, 2); })},
       .bad = {bad<IndexError>("unsqueeze 3 of rank 2", [=] { unsqueeze(x23(), 3); }, {"unsqueeze", "dimension 3"}),
               bad<IndexError>("unsqueeze -4 of rank 2", [=] { unsqueeze(x23(), -4); },
                               {"unsqueeze", "dimension -4"})}});
  ops.push_back(
      {.name = "squeeze",
       .family = "shape",
       .cases = {through_view("squeeze 1 of unsqueeze 1",
                              [](const AnyTensor& x) { return op::squeeze(op::unsqueeze(x, 1), 1); })},
       .bad = {bad<IndexError>("squeeze 2 of rank 2", [=] { squeeze(x23(), 2); }, {"squeeze", "dimension 2"}),
               bad<IndexError>("squeeze 1 of a 0-d tensor", [=] { squeeze(s0(), 1); }, {"squeeze", "dimension 1"})}});
  ops.push_back(
      {.name = "flatten",
       .family = "shape",
       .cases = {through_view("flatten", [](const AnyTensor& x) { return op::flatten(x); }),
                 through_view("flatten 1..2", [](const AnyTensor& x) { return op::flatten(x, 1, 2); }),
                 through_view("flatten 0..1", [](const AnyTensor& x) { return op::flatten(x, 0, 1); })},
       .bad = {bad<IndexError>("flatten start 2 of rank 2", [=] { flatten(x23(), 2); }, {"flatten", "dimension 2"}),
               bad<ShapeError>("flatten start after end", [] { flatten(F::ones({2, 3, 4}), 2, 1); },
                               {"flatten", "start 2 after end 1"})}});
  ops.push_back(
      {.name = "reshape",
       .family = "shape",
       .cases = {through_view("reshape {4, -1}",
                              [](const AnyTensor& x) {
                                return x.reshape({4, -1});
                              }),
                 through_view("reshape {24}", [](const AnyTensor& x) { return x.reshape({24}); })},
       .bad = {bad<ShapeError>("reshape [2, 3] to [4, -1]", [=] { x23().reshape({4, -1}); }, {"reshape", "[2, 3]"}),
               bad<ShapeError>("reshape with two -1", [=] { x23().reshape({-1, -1}); },
                               {"reshape", "more than one -1"}),
               bad<ShapeError>("reshape with -2", [=] { x23().reshape({-2, 3}); },
                               {"reshape", "negative dimension -2"}),
               bad<ShapeError>("reshape an empty tensor with -1 and 0", [] { F::zeros({0}).reshape({0, -1}); },
                               {"reshape", "cannot infer -1", "[0]"}),
               bad<ShapeError>("reshape whose known sizes overflow int64",
                               [] { F::zeros({0}).reshape({int64_t{1} << 32, int64_t{1} << 32, 4, -1}); },
                               {"reshape", "overflows"}),
               bad<ShapeError>("reshape 0-d to [2]", [=] { s0().reshape({2}); }, {"reshape", "float32[]", "[2]"})}});
  ops.push_back({.name = "concat",
                 .family = "shape",
                 .cases = {{.variant = "[2, 3] and [2, 5] along 1",
                            .inputs = {{{2, 3}, -2, 2}, {{2, 5}, -2, 2}},
                            .fn = [](V x) { return op::concat({x[0], x[1]}, 1); }},
                           {.variant = "3 inputs along 0",
                            .inputs = {{{1, 3, 2}}, {{2, 3, 2}}, {{3, 3, 2}}},
                            .fn = [](V x) { return op::concat(x, 0); }},
                           {.variant = "3 inputs along 1",
                            .inputs = {{{2, 1, 2}}, {{2, 3, 2}}, {{2, 2, 2}}},
                            .fn = [](V x) { return op::concat(x, 1); }},
                           {.variant = "3 inputs along -1",
                            .inputs = {{{2, 3, 1}}, {{2, 3, 4}}, {{2, 3, 2}}},
                            .fn = [](V x) { return op::concat(x, -1); }},
                           // the same tensor twice: both gradients add up in it
                           {.variant = "{a, b, a} along 1",
                            .inputs = {{{2, 2}}, {{2, 3}}},
                            .fn = [](V x) { return op::concat({x[0], x[1], x[0]}, 1); }}},
                 .bad = {bad<ValueError>("concat of nothing", [] { op::concat({}); }, {"concat", "no tensors"}),
                         bad<IndexError>("concat dim 2", [=] { concat(std::vector<F>{x23(), x23()}, 2); },
                                         {"concat", "dimension 2"}),
                         bad<IndexError>("concat of 0-d tensors", [=] { concat(std::vector<F>{s0(), s0()}); },
                                         {"concat", "rank 0"}),
                         bad<ShapeError>("concat ranks 2 and 1", [=] { concat(std::vector<F>{x23(), F::ones({3})}); },
                                         {"concat", "tensor 1", "[3]", "[2, 3]"}),
                         bad<DTypeError>("concat float32 and float64", [=] { op::concat({x23(), D::ones({2, 3})}); },
                                         {"concat", "float32", "float64"}),
                         bad<ValueError>("concat with an undefined tensor", [=] { op::concat({x23(), AnyTensor()}); },
                                         {"concat", "undefined"}),
                         bad_on_device<DeviceError>("concat cpu and cuda:0",
                                                    [=] {
                                                      concat(std::vector<F>{x23(), F::ones({2, 3}, Device::cuda(0))});
                                                    },
                                                    {"concat", "cuda:0"})}});
  ops.push_back({.name = "split",
                 .family = "shape",
                 .cases = {{.variant = "[4, 6] by {2, 4} along 1, the second piece",
                            .inputs = {{{4, 6}, -2, 2}},
                            .fn = [](V x) { return op::split(x[0], {2, 4}, 1)[1]; }},
                           pieces("{1, 3, 2} along 0", {6, 3},
                                  [](const AnyTensor& x) {
                                    return op::split(x, {1, 3, 2}, 0);
                                  }),
                           pieces("{2, 2} along 1", {3, 4, 2},
                                  [](const AnyTensor& x) {
                                    return op::split(x, {2, 2}, 1);
                                  }),
                           pieces("{1, 1, 3} along -1", {2, 3, 5},
                                  [](const AnyTensor& x) {
                                    return op::split(x, {1, 1, 3}, -1);
                                  }),
                           pieces("{1, 2, 1} along 0, pieces 0 and 2 unused", {4, 2},
                                  [](const AnyTensor& x) {
                                    return op::split(x, {1, 2, 1}, 0);
                                  },
                                  {0, 2})},
                 .bad = {bad<IndexError>("split dim 2", [=] { split(x23(), {1, 1}, 2); }, {"split", "dimension 2"}),
                         bad<ShapeError>("split negative size", [=] { split(x23(), {3, -1}, 0); },
                                         {"split", "negative size -1"}),
                         bad<ShapeError>("split sizes {} of a non-empty dimension", [=] { split(x23(), {}, 0); },
                                         {"split", "add up to 0"}),
                         bad<IndexError>("split a 0-d tensor", [=] { split(s0(), {1}); }, {"split", "rank 0"})}});
  ops.push_back({.name = "chunk",
                 .family = "shape",
                 .cases = {pieces("3 chunks along 1", {2, 5}, [](const AnyTensor& x) { return op::chunk(x, 3, 1); }),
                           pieces("2 chunks along 0, chunk 1 unused", {4, 3},
                                  [](const AnyTensor& x) { return op::chunk(x, 2, 0); }, {1})},
                 .bad = {bad<ValueError>("chunk into -1", [=] { chunk(x23(), -1); }, {"chunk", "-1"}),
                         bad<IndexError>("chunk dim -3", [=] { chunk(x23(), 2, -3); }, {"chunk", "dimension -3"}),
                         bad<ValueError>("chunk an undefined tensor", [] { op::chunk(AnyTensor(), 2); },
                                         {"chunk", "undefined"})}});
  ops.push_back(
      {.name = "slice",
       .family = "shape",
       .cases = {of53("slice(1, 4)", [](V x) { return x[0].slice(1, 4); }),
                 of53("slice(0, 5)", [](V x) { return x[0].slice(0, 5); }),
                 of53("slice(1, 4).slice(1, 2)", [](V x) { return x[0].slice(1, 4).slice(1, 2); }),
                 // two slices of one tensor together: gradients of disjoint and overlapping ranges add up
                 of53("slice(0, 2) * slice(3, 5)", [](V x) { return op::mul(x[0].slice(0, 2), x[0].slice(3, 5)); }),
                 of53("slice(0, 3) + slice(1, 4)", [](V x) { return op::add(x[0].slice(0, 3), x[0].slice(1, 4)); }),
                 // a slice of a non-leaf (the slice's offset is applied to a computed tensor)
                 of53("exp((2 x).slice(2, 4))", [](V x) { return op::exp(op::mul(x[0], 2.0).slice(2, 4)); })},
       .bad = {bad<IndexError>("slice end past the dimension", [=] { x23().slice(0, 3); },
                               {"slice", "[0, 3)", "[2, 3]"}),
               bad<IndexError>("slice begin after end", [=] { x23().slice(2, 1); }, {"slice", "[2, 1)"}),
               bad<IndexError>("slice negative begin", [=] { x23().slice(-1, 1); }, {"slice", "[-1, 1)"}),
               bad<ShapeError>("slice a 0-d tensor", [=] { s0().slice(0, 1); }, {"slice", "at least one dimension"})}});
  ops.push_back(
      {.name = "select",
       .family = "shape",
       .cases = {of53("select(2)", [](V x) { return x[0].select(2); }),
                 of53("select(-1)", [](V x) { return x[0].select(-1); }),
                 of53(
                     "typed select(0).clone()", [](V x) -> AnyTensor { return Tensor<double>(x[0]).select(0).clone(); },
                     false)},
       .bad = {bad<IndexError>("select -3 of size 2", [=] { x23().select(-3); }, {"select", "index -3", "[2, 3]"}),
               bad<ShapeError>("select of a 0-d tensor", [=] { s0().select(0); },
                               {"select", "at least one dimension"})}});
  ops.push_back({.name = "clone",
                 .family = "shape",
                 .cases = {of53("clone()", [](V x) { return x[0].clone(); }),
                           of53("clone() * x", [](V x) { return op::mul(x[0].clone(), x[0]); })}});
  ops.push_back(
      {.name = "to(dtype)",
       .family = "shape",
       // to(Float64) of a float64 tensor is the identity; of the others, a cast the gradient goes back through
       .cases = {of53("to(float64)", [](V x) { return x[0].to(DType::Float64); })}});
  return ops;
}

}  // namespace ember::testing
