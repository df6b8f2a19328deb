#pragma once
// The registry's reductions (ops/reduce.hpp: sum, mean, max, min, argmax, argmin, var, std) and
// softmax / log_softmax (ops/softmax.hpp).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "op_case.hpp"
#include "test_util.hpp"

namespace ember::testing {

namespace reduce_cases {

using namespace case_names;
using Reduce = AnyTensor (*)(const AnyTensor&, const std::vector<int>&, bool);

// max and min are not differentiable at ties: values pairwise at least 0.04 apart (a permutation
// of 0.05 k, from the ranks of the random values in [0, 1), plus less than 0.01 of them).
inline void spread_apart(std::vector<AnyTensor>& xs) {
  for (AnyTensor& x : xs) {
    double* p = static_cast<double*>(x.data_ptr());
    std::vector<size_t> order(static_cast<size_t>(x.numel()));
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] < p[b]; });
    std::vector<double> out(order.size());
    for (size_t k = 0; k < order.size(); ++k) out[order[k]] = 0.05 * static_cast<double>(k) - 0.5 + 0.009 * p[order[k]];
    std::copy(out.begin(), out.end(), p);
  }
}

// A reduction over every dim set, keepdim false and true, on [2, 3, 4]; then a 1-D tensor over
// dim 0 and a 0-d tensor over everything. Values pairwise apart for max and min.
inline std::vector<OpCase> dim_set_cases(Reduce r, bool ties_matter) {
  using Prepare = std::function<void(std::vector<AnyTensor>&)>;
  const Prepare apart = spread_apart;
  std::vector<OpCase> v;
  for (const std::vector<int>& dims :
       std::vector<std::vector<int>>{{0}, {1}, {-1}, {0, 2}, {1, 2}, {2, 0}, {0, 1, 2}, {}})
    for (bool keepdim : {false, true})
      v.push_back({.variant = "[2, 3, 4] dims " + list_str(dims) + (keepdim ? " keepdim" : ""),
                   .inputs = {{{2, 3, 4}, ties_matter ? 0.0 : -1.0, 1.0}},
                   .fn = [r, dims, keepdim](V x) { return r(x[0], dims, keepdim); },
                   .prepare = ties_matter ? apart : Prepare()});
  v.push_back({.variant = "[5] dim 0",
               .inputs = {{{5}, 0, 1}},
               .fn = [r](V x) { return r(x[0], {0}, false); },
               .prepare = apart});
  v.push_back({.variant = "0-d", .inputs = {{{}}}, .fn = [r](V x) { return r(x[0], {}, false); }});
  return v;
}

inline AnyTensor sum_of(const AnyTensor& x, const std::vector<int>& d, bool k) { return op::sum(x, d, k); }
inline AnyTensor mean_of(const AnyTensor& x, const std::vector<int>& d, bool k) { return op::mean(x, d, k); }
inline AnyTensor max_of(const AnyTensor& x, const std::vector<int>& d, bool k) { return op::max(x, d, k); }
inline AnyTensor min_of(const AnyTensor& x, const std::vector<int>& d, bool k) { return op::min(x, d, k); }

// [1, NaN, 3, 4] as [2, 2], reduced by fn.
inline NanCheck with_nan(const std::string& what, OpFn fn, std::vector<double> want,
                         std::vector<std::vector<double>> want_grads = {}) {
  return {.what = what,
          .values = {{1.0, kNan, 3.0, 4.0}},
          .shapes = {Shape{2, 2}},
          .fn = std::move(fn),
          .want = std::move(want),
          .want_grads = std::move(want_grads)};
}

inline NanCheck of_infinities(const std::string& what, OpFn fn, std::vector<double> want) {
  return {.what = what, .values = {{kInf, -kInf}}, .shapes = {Shape{2}}, .fn = std::move(fn), .want = std::move(want)};
}

// Rows with NaN, +inf, only -inf, and -inf beside two equal logits.
inline NanCheck softmax_rows(const std::string& what, OpFn fn, std::vector<double> last_row, double rtol) {
  std::vector<double> want(9, kNan);
  want.insert(want.end(), last_row.begin(), last_row.end());
  return {.what = what,
          .values = {{kNan, 1.0, 2.0, kInf, 1.0, 2.0, -kInf, -kInf, -kInf, -kInf, 0.0, 0.0}},
          .shapes = {Shape{4, 3}},
          .fn = std::move(fn),
          .want = std::move(want),
          .rtol = rtol};
}

}  // namespace reduce_cases

inline std::vector<OpSpec> reduce_ops() {
  using namespace reduce_cases;
  std::vector<OpSpec> ops;
  ops.push_back(
      {.name = "sum",
       .family = "reduce",
       .cases = join(std::vector<OpCase>{{.variant = "[4, 5, 6] dims {0,2}",
                                          .inputs = {{{4, 5, 6}, -2, 2}},
                                          .fn = [](V x) { return op::sum(x[0], {0, 2}); }},
                                         {.variant = "[33, 17] all",
                                          .inputs = {{{33, 17}, -2, 2}},
                                          .fn = [](V x) { return op::sum(x[0]); }}},
                     dim_set_cases(sum_of, false)),
       .bad = {bad<IndexError>("sum dim -3 of rank 2", [] { sum(F::ones({2, 3}), {-3}); },
                               {"sum", "dimension -3", "rank 2"}),
               bad<IndexError>("sum of a 0-d tensor over dim 1", [] { sum(F::scalar(1), {1}); },
                               {"sum", "dimension 1", "rank 0"}),
               bad<ValueError>("sum of an undefined tensor", [] { op::sum(AnyTensor()); }, {"sum", "undefined"})},
       .nan = {with_nan("sum of [1, NaN, 3, 4]", [](V x) { return op::sum(x[0]); }, {kNan}),
               with_nan("sum of [[1, NaN], [3, 4]] over dim 1", [](V x) { return op::sum(x[0], {1}); }, {kNan, 7.0}),
               of_infinities("sum of +inf and -inf", [](V x) { return op::sum(x[0]); }, {kNan})}});
  ops.push_back({.name = "mean",
                 .family = "reduce",
                 .cases = join(std::vector<OpCase>{{.variant = "[4, 5, 6] dim 1 keepdim",
                                                    .inputs = {{{4, 5, 6}, -2, 2}},
                                                    .fn = [](V x) { return op::mean(x[0], {1}, true); }}},
                               dim_set_cases(mean_of, false)),
                 .bad = {bad<IndexError>("mean dim 2 of rank 2", [] { mean(F::ones({2, 3}), {2}); },
                                         {"mean", "dimension 2", "rank 2"}),
                         bad<DTypeError>("mean of int64", [] { mean(I64::ones({3})); }, {"mean", "int64"})},
                 .nan = {with_nan("mean of [1, NaN, 3, 4]", [](V x) { return op::mean(x[0]); }, {kNan})}});
  ops.push_back(
      {.name = "max",
       .family = "reduce",
       .cases = join(std::vector<OpCase>{{.variant = "[4, 50] dim 1",
                                          .inputs = {{{4, 50}, -2, 2}},
                                          .fn = [](V x) { return op::max(x[0], {1}); }}},
                     dim_set_cases(max_of, true)),
       .bad = {bad<IndexError>("max dims {0, 5}", [] { max(F::ones({2, 3}), {0, 5}); }, {"max", "dimension 5"}),
               bad<ShapeError>("max over the empty dimension", [] { max(F::zeros({3, 0}), {1}); },
                               {"max", "empty dimension 1", "[3, 0]"})},
       // torch's evenly_distribute_backward: when the max is NaN the gradient goes to the NaN(s).
       .nan = {with_nan("max of [1, NaN, 3, 4]: NaN, its gradient to the NaN", [](V x) { return op::max(x[0]); },
                        {kNan}, {{0.0, 1.0, 0.0, 0.0}}),
               with_nan("max of [[1, NaN], [3, 4]] over dim 1", [](V x) { return op::max(x[0], {1}); }, {kNan, 4.0}),
               of_infinities("max of +inf and -inf", [](V x) { return op::max(x[0]); }, {kInf})}});
  ops.push_back({.name = "min",
                 .family = "reduce",
                 .cases = join(std::vector<OpCase>{{.variant = "[4, 50] all",
                                                    .inputs = {{{4, 50}, -2, 2}},
                                                    .fn = [](V x) { return op::min(x[0]); }}},
                               dim_set_cases(min_of, true)),
                 .bad = {bad<IndexError>("min dim -3", [] { min(F::ones({2, 3}), {-3}); }, {"min", "dimension -3"})},
                 .nan = {with_nan("min of [1, NaN, 3, 4]", [](V x) { return op::min(x[0]); }, {kNan}),
                         {.what = "min of [NaN, 1, NaN]: the gradient split between the NaNs",
                          .values = {{kNan, 1.0, kNan}},
                          .shapes = {Shape{3}},
                          .fn = [](V x) { return op::min(x[0]); },
                          .want = {kNan},
                          .want_grads = {{0.5, 0.0, 0.5}}}}});
  ops.push_back(
      {.name = "argmax",
       .family = "reduce",
       .cases = {forward_only("[6, 40] dim 1", {6, 40}, [](V x) { return op::argmax(x[0], {1}); })},
       .bad = {bad<IndexError>("argmax dim 2", [] { argmax(F::ones({2, 3}), {2}); }, {"argmax", "dimension 2"}),
               bad<ShapeError>("argmax over 2 of 3 dimensions", [] { argmax(F::ones({2, 3, 4}), {0, 1}); },
                               {"argmax", "one dimension or all", "[2, 3, 4]"})},
       .nan = {with_nan("argmax of [1, NaN, 3, 4] is the NaN's index", [](V x) { return op::argmax(x[0]); }, {1.0})}});
  ops.push_back(
      {.name = "argmin",
       .family = "reduce",
       .cases = {forward_only("[6, 40] dim 0", {6, 40}, [](V x) { return op::argmin(x[0], {0}); })},
       .bad = {bad<IndexError>("argmin dim -5", [] { argmin(F::ones({2, 3}), {-5}); }, {"argmin", "dimension -5"}),
               bad<ShapeError>("argmin of an empty tensor", [] { argmin(F::zeros({0})); }, {"argmin", "[0]"})}});
  std::vector<OpCase> var_cases, std_cases;
  for (double c : {0.0, 1.0}) {
    var_cases.push_back({.variant = "[3, 4] dim 1 keepdim, correction " + num(c), .inputs = {{{3, 4}}}, .fn = [c](V x) {
                           return op::var(x[0], {1}, c, true);
                         }});
    std_cases.push_back({.variant = "[3, 4] dim 0, correction " + num(c), .inputs = {{{3, 4}}}, .fn = [c](V x) {
                           return op::std(x[0], {0}, c);
                         }});
    std_cases.push_back({.variant = "[2, 3, 2] all, correction " + num(c), .inputs = {{{2, 3, 2}}}, .fn = [c](V x) {
                           return op::std(x[0], {}, c);
                         }});
  }
  ops.push_back({.name = "var",
                 .family = "reduce",
                 .cases = var_cases,
                 .bad = {bad<IndexError>("var dim 3", [] { var(F::ones({2, 3}), {3}); }, {"var", "dimension 3"}),
                         bad<DTypeError>("var of int64", [] { op::var(I64::ones({3})); }, {"var", "int64"}),
                         bad<ValueError>("var with a negative correction", [] { var(F::ones({2, 3}), {}, -1.0); },
                                         {"var", "correction", "-1"})}});
  ops.push_back({.name = "std",
                 .family = "reduce",
                 .cases = std_cases,
                 .bad = {bad<IndexError>("std dim -4", [] { op::std(F::ones({2, 3}), {-4}); },
                                         {"std", "dimension -4"})}});

  // ---------------------------------------------------------------- softmax
  for (bool log : {false, true}) {
    const std::string name = log ? "log_softmax" : "softmax";
    auto f = [log](const AnyTensor& x, int dim) { return log ? op::log_softmax(x, dim) : op::softmax(x, dim); };
    std::vector<OpCase> cases;
    if (log)
      cases.push_back(
          {.variant = "[37, 5] dim 0", .inputs = {{{37, 5}, -2, 2}}, .fn = [f](V x) { return f(x[0], 0); }});
    else
      cases.push_back(
          {.variant = "[5, 37] dim 1", .inputs = {{{5, 37}, -2, 2}}, .fn = [f](V x) { return f(x[0], 1); }});
    for (int dim : {-1, 2, 1, 0})
      cases.push_back({.variant = "[2, 3, 4] dim " + std::to_string(dim),
                       .inputs = {{{2, 3, 4}, -2, 2}},
                       .fn = [f, dim](V x) { return f(x[0], dim); }});
    cases.push_back({.variant = "[6] default dim", .inputs = {{{6}, -2, 2}}, .fn = [log](V x) {
                       return log ? op::log_softmax(x[0]) : op::softmax(x[0]);
                     }});
    if (log)  // the cross-entropy composition: -sum(log_softmax(a) * softmax(b), 1)
      cases.push_back(
          {.variant = "-sum(log_softmax(a, 1) * softmax(b, 1), 1) on [3, 5]",
           .inputs = {{{3, 5}, -3, 3}, {{3, 5}, -3, 3}},
           .fn = [](V x) { return op::neg(op::sum(op::mul(op::log_softmax(x[0], 1), op::softmax(x[1], 1)), {1})); }});
    OpSpec s{.name = name, .family = "reduce", .cases = cases};
    if (log) {
      s.bad = {bad<IndexError>("log_softmax dim -3", [] { log_softmax(F::ones({2, 3}), -3); },
                               {"log_softmax", "dimension -3"}),
               bad<IndexError>("log_softmax of a 0-d tensor over dim -2", [] { log_softmax(F::scalar(1), -2); },
                               {"log_softmax", "dimension -2"}),
               bad<DTypeError>("log_softmax of int64", [] { log_softmax(I64::ones({3})); }, {"log_softmax", "int64"})};
      s.nan = {softmax_rows(
          "log_softmax of rows with NaN and infinities", [](V x) { return op::log_softmax(x[0]); },
          {-kInf, std::log(0.5), std::log(0.5)}, 1e-12)};
    } else {
      s.bad = {bad<IndexError>("softmax dim 2", [] { softmax(F::ones({2, 3}), 2); },
                               {"softmax", "dimension 2", "rank 2"}),
               bad<IndexError>("softmax of a 0-d tensor over dim 1", [] { softmax(F::scalar(1), 1); },
                               {"softmax", "dimension 1"})};
      s.nan = {softmax_rows(
          "softmax of rows with NaN and infinities", [](V x) { return op::softmax(x[0]); }, {0.0, 0.5, 0.5}, 0.0)};
    }
    ops.push_back(s);
  }
  return ops;
}

}  // namespace ember::testing
