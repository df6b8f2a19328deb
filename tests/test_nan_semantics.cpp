// NaN and infinity semantics against PyTorch's (CPU, eager; the expected values written out by
// hand). Every op's are declared in the registry of op cases (tests/op_cases.hpp); this harness
// runs them: one test per op, "nan <dtypes>: <op>", each check in each of its dtypes, the
// output's values and, where declared, the inputs' gradients after backward of sum(output).
// Below, the same for what is not an op: the random factories' bad ranges and clip_grad_norm_.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

#include <ember/ember.hpp>

#include "op_cases.hpp"

using namespace ember;
using namespace ember::testing;
using Catch::Contains;

namespace {

// NaN-aware closeness of two value lists: NaN equals NaN; other values within rtol (0: equal,
// infinities included; the sign of a zero is ignored).
void check_same(const std::vector<double>& got, const std::vector<double>& want, double rtol = 0.0) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << " want " << want[i]);
    if (std::isnan(want[i]))
      CHECK(std::isnan(got[i]));
    else
      CHECK((got[i] == want[i] || std::fabs(got[i] - want[i]) <= rtol * std::fabs(want[i])));
  }
}

void check_nan(const NanCheck& n, DType t) {
  INFO(n.what << ", " << dtype_name(t));
  std::vector<AnyTensor> xs;
  for (size_t k = 0; k < n.values.size(); ++k) {
    AnyTensor x = Tensor<double>::from_vector(n.values[k], n.shapes[k]).to(t);
    if (!n.want_grads.empty()) x.set_requires_grad(true);
    xs.push_back(x);
  }
  AnyTensor y = n.fn(xs);
  check_same(y.to_double_vector(), n.want, n.rtol);
  if (n.want_grads.empty()) return;
  op::sum(y).backward();
  for (size_t k = 0; k < xs.size(); ++k) {
    INFO("the gradient of input " << k);
    REQUIRE(xs[k].grad().defined());
    check_same(xs[k].grad().to_double_vector(), n.want_grads[k], n.rtol);
  }
}

// Every dtype an op's checks run in, in the order they first appear.
std::vector<DType> dtypes_of(const OpSpec& op) {
  std::vector<DType> ts;
  for (const NanCheck& n : op.nan)
    for (DType t : n.dtypes)
      if (std::find(ts.begin(), ts.end(), t) == ts.end()) ts.push_back(t);
  return ts;
}

const bool registered = [] {
  for (const OpSpec& op : op_registry()) {
    if (op.nan.empty()) continue;
    register_test_case("nan " + dtype_list(dtypes_of(op)) + ": " + op.name, "[nan][" + op.family + "]", [&op] {
      for (const NanCheck& n : op.nan)
        for (DType t : n.dtypes) check_nan(n, t);
    });
  }
  return true;
}();

}  // namespace

TEST_CASE("nan: rand with lo > hi and randn with std < 0 raise", "[nan][errors]") {
  CHECK_THROWS_AS(Tensor<float>::rand({2}, Device::cpu(), 1.0, 0.0), ValueError);
  CHECK_THROWS_WITH(Tensor<float>::rand({2}, Device::cpu(), 1.0, 0.0),
                    Contains("rand") && Contains("lo 1") && Contains("hi 0"));
  CHECK_THROWS_WITH(Tensor<float>::rand({2}, Device::cpu(), kNan, 1.0), Contains("rand"));
  CHECK_THROWS_AS(Tensor<double>::randn({2}, Device::cpu(), 0.0, -1.0), ValueError);
  CHECK_THROWS_WITH(Tensor<double>::randn({2}, Device::cpu(), 0.0, -1.0), Contains("randn") && Contains("std -1"));
  // The edge cases PyTorch accepts: lo == hi gives lo; std == 0 gives the mean.
  CHECK(Tensor<double>::rand({3}, Device::cpu(), 2.0, 2.0).to_vector() == std::vector<double>(3, 2.0));
  CHECK(Tensor<double>::randn({3}, Device::cpu(), 5.0, 0.0).to_vector() == std::vector<double>(3, 5.0));
}

TEST_CASE("nan: clip_grad_norm_ with a NaN or infinite gradient scales by NaN/0 as torch", "[nan]") {
  // torch (error_if_nonfinite=False): clip_coef = max_norm / (nan + 1e-6) = nan, clamped to 1
  // stays nan, so every gradient becomes nan; with an inf norm the coefficient is 0 (inf * 0 = nan).
  auto p = Tensor<double>::zeros({2}).set_requires_grad(true);
  p.set_grad(Tensor<double>::from_vector({kNan, 1.0}, Shape{2}));
  CHECK(std::isnan(optim::clip_grad_norm_({p}, 1.0)));
  check_same(p.grad().to_double_vector(), {kNan, kNan});
  p.set_grad(Tensor<double>::from_vector({kInf, 1.0}, Shape{2}));
  CHECK(optim::clip_grad_norm_({p}, 1.0) == kInf);
  check_same(p.grad().to_double_vector(), {kNan, 0.0});
  p.set_grad(Tensor<double>::from_vector({kNan, 1.0}, Shape{2}));
  CHECK_THROWS_AS(optim::clip_grad_norm_({p}, 1.0, 2.0, true), ValueError);
}
