// NaN and infinity propagation of every op, against PyTorch's semantics (issue 14, "wrong or
// silent results"), and the inputs PyTorch rejects that ember used to accept: integer division by
// zero, rand with lo > hi, randn with std < 0, convolution and pooling windows that do not fit.
// The expected values are PyTorch's (CPU, eager), written out by hand.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include <ember/ember.hpp>

#include "test_util.hpp"

using namespace ember;
using Catch::Contains;

namespace {
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// NaN-aware equality of two value lists (NaN equals NaN; the sign of a zero is ignored).
void check_same(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << " want " << want[i]);
    if (std::isnan(want[i])) CHECK(std::isnan(got[i]));
    else CHECK(got[i] == want[i]);
  }
}

template <class T>
std::vector<double> unary_of(UnaryOp op, const std::vector<double>& x, double a = 0, double b = 0) {
  AnyTensor t = Tensor<double>::from_vector(x, Shape{static_cast<int64_t>(x.size())}).to(dtype_of<T>);
  return op::unary(op, t, a, b).to_double_vector();
}
}  // namespace

TEST_CASE("nan: relu propagates NaN (float fast path, double, half) and passes its gradient", "[nan]") {
  const std::vector<double> x{kNan, kInf, -kInf, -1.0, 0.0, 2.0};
  const std::vector<double> want{kNan, kInf, 0.0, 0.0, 0.0, 2.0};
  check_same(unary_of<float>(UnaryOp::Relu, x), want);
  check_same(unary_of<double>(UnaryOp::Relu, x), want);
  check_same(unary_of<half>(UnaryOp::Relu, x), want);
  check_same(unary_of<bfloat16>(UnaryOp::Relu, x), want);
  // PyTorch's threshold_backward zeroes the gradient where x <= 0 only: at NaN it passes through.
  auto t = Tensor<double>::from_vector(x, Shape{6});
  t.set_requires_grad(true);
  sum(relu(t)).backward();
  check_same(t.grad().to_double_vector(), {1.0, 1.0, 0.0, 0.0, 0.0, 1.0});
  // A NaN input reaches the loss (it used to give a finite loss and NaN weights after a step).
  nn::Linear lin(6, 1);
  auto y = lin(relu(Tensor<float>::from_vector({1, kNan, 0, 0, 0, 0}, Shape{1, 6})));
  CHECK(std::isnan(y.item()));
}

TEST_CASE("nan: unary ops on NaN and infinities match PyTorch", "[nan]") {
  const std::vector<double> x{kNan, kInf, -kInf};
  struct Case {
    UnaryOp op;
    std::vector<double> want;
    double a = 0, b = 0;
  };
  const std::vector<Case> cases{
      {UnaryOp::Neg, {kNan, -kInf, kInf}},
      {UnaryOp::Exp, {kNan, kInf, 0.0}},
      {UnaryOp::Log, {kNan, kInf, kNan}},
      {UnaryOp::Sqrt, {kNan, kInf, kNan}},
      {UnaryOp::Abs, {kNan, kInf, kInf}},
      {UnaryOp::Tanh, {kNan, 1.0, -1.0}},
      {UnaryOp::Sigmoid, {kNan, 1.0, 0.0}},
      {UnaryOp::Square, {kNan, kInf, kInf}},
      {UnaryOp::Reciprocal, {kNan, 0.0, 0.0}},
      {UnaryOp::Sign, {0.0, 1.0, -1.0}},  // torch.sign(nan) is 0 (pytorch/pytorch#41245)
      {UnaryOp::Clamp, {kNan, 1.0, -1.0}, -1.0, 1.0},
      {UnaryOp::Pow, {kNan, kInf, kInf}, 2.0},
      {UnaryOp::AddScalar, {kNan, kInf, -kInf}, 1.0},
      {UnaryOp::MulScalar, {kNan, -kInf, kInf}, -2.0},
      {UnaryOp::RSubScalar, {kNan, -kInf, kInf}, 1.0},
      {UnaryOp::RDivScalar, {kNan, 0.0, 0.0}, 1.0},
      {UnaryOp::FakeQuantize, {kNan, 63.5, -64.0}, 0.5, 127.0},  // NaN stays, infinities clamp to the range
  };
  for (const Case& c : cases) {
    INFO("op " << op::detail::unary_name(c.op));
    check_same(unary_of<float>(c.op, x, c.a, c.b), c.want);
    check_same(unary_of<double>(c.op, x, c.a, c.b), c.want);
    check_same(unary_of<half>(c.op, x, c.a, c.b), c.want);
  }
  // NaN in, NaN out; +inf in, +inf out.
  for (UnaryOp op : {UnaryOp::Gelu, UnaryOp::GeluTanh, UnaryOp::Silu}) {
    INFO("op " << op::detail::unary_name(op));
    check_same(unary_of<float>(op, {kNan, kInf}), {kNan, kInf});
  }
  check_same(unary_of<float>(UnaryOp::Log, {0.0}), {-kInf});
  check_same(unary_of<float>(UnaryOp::Reciprocal, {0.0}), {kInf});
}

TEST_CASE("nan: binary ops propagate NaN, and maximum/minimum gradients follow PyTorch at NaN", "[nan]") {
  auto a = Tensor<double>::from_vector({kNan, 1.0, 2.0, 1.0, 0.0}, Shape{5});
  auto b = Tensor<double>::from_vector({1.0, kNan, 2.0, 0.0, 0.0}, Shape{5});
  check_same(maximum(a, b).to_double_vector(), {kNan, kNan, 2.0, 1.0, 0.0});
  check_same(minimum(a, b).to_double_vector(), {kNan, kNan, 2.0, 0.0, 0.0});
  check_same((a + b).to_double_vector(), {kNan, kNan, 4.0, 1.0, 0.0});
  check_same((a / b).to_double_vector(), {kNan, kNan, 1.0, kInf, kNan});
  check_same(pow(a, b).to_double_vector(), {kNan, 1.0, 4.0, 1.0, 1.0});  // C's pow: pow(1, nan) = 1
  // torch: self gets where(a == b, g/2, g) masked to 0 where a < b (maximum); a NaN on either side
  // makes every comparison false, so both inputs get the whole gradient.
  for (bool is_max : {true, false}) {
    INFO((is_max ? "maximum" : "minimum"));
    auto ga = a.detach().clone().set_requires_grad(true);
    auto gb = b.detach().clone().set_requires_grad(true);
    sum(is_max ? maximum(ga, gb) : minimum(ga, gb)).backward();
    check_same(ga.grad().to_double_vector(), {1.0, 1.0, 0.5, is_max ? 1.0 : 0.0, 0.5});
    check_same(gb.grad().to_double_vector(), {1.0, 1.0, 0.5, is_max ? 0.0 : 1.0, 0.5});
  }
}

TEST_CASE("nan: reductions propagate NaN and infinities, and max gradients go to the NaN", "[nan]") {
  auto x = Tensor<double>::from_vector({1.0, kNan, 3.0, 4.0}, Shape{2, 2});
  CHECK(std::isnan(sum(x).item()));
  CHECK(std::isnan(mean(x).item()));
  CHECK(std::isnan(max(x).item()));
  CHECK(std::isnan(min(x).item()));
  CHECK(argmax(x).item() == 1);
  check_same(sum(x, {1}).to_double_vector(), {kNan, 7.0});
  check_same(max(x, {1}).to_double_vector(), {kNan, 4.0});
  auto inf = Tensor<double>::from_vector({kInf, -kInf}, Shape{2});
  CHECK(std::isnan(sum(inf).item()));
  CHECK(max(inf).item() == kInf);
  // torch's evenly_distribute_backward: when the max is NaN the gradient goes to the NaN(s).
  auto g = x.detach().clone().set_requires_grad(true);
  max(g).backward();
  check_same(g.grad().to_double_vector(), {0.0, 1.0, 0.0, 0.0});
  auto g2 = Tensor<double>::from_vector({kNan, 1.0, kNan}, Shape{3});
  g2.set_requires_grad(true);
  min(g2).backward();
  check_same(g2.grad().to_double_vector(), {0.5, 0.0, 0.5});
}

TEST_CASE("nan: softmax and log_softmax rows with NaN and infinities", "[nan]") {
  auto x = Tensor<double>::from_vector({kNan, 1.0, 2.0,  kInf, 1.0, 2.0,  -kInf, -kInf, -kInf,  -kInf, 0.0, 0.0},
                                       Shape{4, 3});
  auto s = softmax(x).to_double_vector();
  auto ls = log_softmax(x).to_double_vector();
  for (int i = 0; i < 9; ++i) {
    INFO("element " << i);
    CHECK(std::isnan(s[static_cast<size_t>(i)]));
    CHECK(std::isnan(ls[static_cast<size_t>(i)]));
  }
  check_same({s[9], s[10], s[11]}, {0.0, 0.5, 0.5});
  check_same({ls[9]}, {-kInf});
  CHECK(ls[10] == Approx(std::log(0.5)));
}

TEST_CASE("nan: mean cross-entropy and NLL with every target ignored: NaN loss, zero gradients", "[nan]") {
  // PyTorch: the loss is 0/0 = NaN, the gradients are 0 (a padding-only micro-batch must not
  // poison the parameters).
  auto logits = Tensor<double>::from_vector({0.1, 0.2, 0.3, 0.4, 0.5, 0.6}, Shape{2, 3});
  auto tgt = Tensor<int64_t>::from_vector({-100, -100}, Shape{2});
  {
    auto x = logits.detach().clone().set_requires_grad(true);
    auto l = nn::functional::cross_entropy(x, tgt);
    CHECK(std::isnan(l.item()));
    l.backward();
    check_same(x.grad().to_double_vector(), std::vector<double>(6, 0.0));
  }
  {
    auto x = logits.detach().clone().set_requires_grad(true);
    nn::CrossEntropyOptions o;
    o.label_smoothing = 0.1;
    o.weight = Tensor<double>::from_vector({1.0, 2.0, 3.0}, Shape{3});
    auto l = nn::functional::cross_entropy(x, tgt, o);
    CHECK(std::isnan(l.item()));
    l.backward();
    check_same(x.grad().to_double_vector(), std::vector<double>(6, 0.0));
  }
  {
    auto x = logits.detach().clone().set_requires_grad(true);
    auto l = nn::functional::nll_loss(x, Tensor<int64_t>::from_vector({3, 3}, Shape{2}), {.ignore_index = 3});
    CHECK(std::isnan(l.item()));
    l.backward();
    check_same(x.grad().to_double_vector(), std::vector<double>(6, 0.0));
  }
  {  // one valid target: the usual mean, unchanged by the fix
    auto x = logits.detach().clone().set_requires_grad(true);
    auto l = nn::functional::nll_loss(x, Tensor<int64_t>::from_vector({-100, 2}, Shape{2}));
    CHECK(l.item() == Approx(-0.6));
    l.backward();
    check_same(x.grad().to_double_vector(), {0, 0, 0, 0, 0, -1});
  }
}

TEST_CASE("nan: integer division by zero raises, as PyTorch does", "[nan][errors]") {
  auto a = Tensor<int32_t>::from_vector({7, -7, 4}, Shape{3});
  auto b = Tensor<int32_t>::from_vector({2, 2, 0}, Shape{3});
  CHECK_THROWS_AS(a / b, ValueError);
  CHECK_THROWS_WITH(a / b, Contains("div") && Contains("integer division by zero") && Contains("int32[3]"));
  auto l = Tensor<int64_t>::from_vector({1, 2}, Shape{2});
  CHECK_THROWS_WITH(l / Tensor<int64_t>::zeros({1}), Contains("integer division by zero") && Contains("int64"));
  CHECK_THROWS_WITH(l / 0.0, Contains("div") && Contains("integer division by zero"));
  // Non-zero divisors still divide (truncating), floats still give inf.
  auto ok = a / Tensor<int32_t>::from_vector({2, 2, 3}, Shape{3});
  CHECK(ok.to_vector() == std::vector<int32_t>{3, -3, 1});
  CHECK((Tensor<float>::ones({1}) / Tensor<float>::zeros({1})).item() == std::numeric_limits<float>::infinity());
  CHECK((Tensor<float>::ones({1}) / 0.0).item() == std::numeric_limits<float>::infinity());
}

TEST_CASE("nan: rand with lo > hi and randn with std < 0 raise", "[nan][errors]") {
  CHECK_THROWS_AS(Tensor<float>::rand({2}, Device::cpu(), 1.0, 0.0), ValueError);
  CHECK_THROWS_WITH(Tensor<float>::rand({2}, Device::cpu(), 1.0, 0.0), Contains("rand") && Contains("lo 1") &&
                                                                          Contains("hi 0"));
  CHECK_THROWS_WITH(Tensor<float>::rand({2}, Device::cpu(), kNan, 1.0), Contains("rand"));
  CHECK_THROWS_AS(Tensor<double>::randn({2}, Device::cpu(), 0.0, -1.0), ValueError);
  CHECK_THROWS_WITH(Tensor<double>::randn({2}, Device::cpu(), 0.0, -1.0), Contains("randn") && Contains("std -1"));
  // The edge cases PyTorch accepts: lo == hi gives lo; std == 0 gives the mean.
  CHECK(Tensor<double>::rand({3}, Device::cpu(), 2.0, 2.0).to_vector() == std::vector<double>(3, 2.0));
  CHECK(Tensor<double>::randn({3}, Device::cpu(), 5.0, 0.0).to_vector() == std::vector<double>(3, 5.0));
}

TEST_CASE("nan: convolution windows that do not fit the input raise", "[nan][errors]") {
  auto x = Tensor<float>::ones({1, 1, 2, 2});
  op::Conv2dOptions s2;
  s2.stride = {2, 2};
  CHECK_THROWS_AS(conv2d(x, Tensor<float>::ones({1, 1, 3, 3}), Tensor<float>(), s2), ShapeError);
  CHECK_THROWS_WITH(conv2d(x, Tensor<float>::ones({1, 1, 3, 3}), Tensor<float>(), s2),
                    Contains("conv2d") && Contains("[1, 1, 2, 2]") && Contains("3x3"));
  CHECK_THROWS_AS(conv2d(x, Tensor<float>::ones({1, 1, 0, 0})), ShapeError);
  CHECK_THROWS_WITH(conv2d(x, Tensor<float>::ones({1, 1, 0, 0})), Contains("conv2d") && Contains("0x0"));
  CHECK_THROWS_AS(conv2d(x, Tensor<float>::ones({1, 1, 1, 0})), ShapeError);
  op::Conv2dOptions dil;  // dilated 3x3 spans 5 > 4
  dil.dilation = {2, 2};
  dil.stride = {2, 2};
  CHECK_THROWS_AS(conv2d(Tensor<float>::ones({1, 1, 4, 4}), Tensor<float>::ones({1, 1, 3, 3}), Tensor<float>(), dil),
                  ShapeError);
  // The padded input fits the window: fine.
  op::Conv2dOptions pad;
  pad.padding = {1, 1};
  pad.stride = {2, 2};
  CHECK(conv2d(x, Tensor<float>::ones({1, 1, 3, 3}), Tensor<float>(), pad).shape() == Shape{1, 1, 1, 1});
  nn::Conv2d layer(1, 1, 3);
  CHECK_THROWS_AS(layer(x), ShapeError);
}

TEST_CASE("nan: pooling windows that do not fit the input raise (ceil_mode as PyTorch)", "[nan][errors]") {
  auto x = Tensor<float>::ones({1, 1, 2, 2});
  op::Pool2dOptions k3;
  k3.kernel = {3, 3};
  CHECK_THROWS_AS(max_pool2d(x, k3), ShapeError);
  CHECK_THROWS_WITH(max_pool2d(x, k3), Contains("max_pool2d") && Contains("[1, 1, 2, 2]") && Contains("3x3"));
  CHECK_THROWS_AS(avg_pool2d(x, k3), ShapeError);
  op::Pool2dOptions k3s1 = k3;
  k3s1.stride = {1, 1};
  CHECK_THROWS_AS(max_pool2d(x, k3s1), ShapeError);
  // torch.nn.functional.max_pool2d(ones(1,1,2,2), 3, stride=2, ceil_mode=True) is [1, 1, 1, 1].
  op::Pool2dOptions ceil = k3;
  ceil.stride = {2, 2};
  ceil.ceil_mode = true;
  CHECK(max_pool2d(x, ceil).shape() == Shape{1, 1, 1, 1});
  // With padding the window fits: kernel 3, padding 1 on 2x2 gives 1x1 (stride 3).
  op::Pool2dOptions padded = k3;
  padded.padding = {1, 1};
  CHECK(max_pool2d(x, padded).shape() == Shape{1, 1, 1, 1});
  nn::MaxPool2d layer(3);
  CHECK_THROWS_AS(layer(x), ShapeError);
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
