// Convolution and pooling: forward values against direct loops, torch's output-size rules, the
// inputs PyTorch accepts (empty batches, no channels, windows that fit only with padding or
// ceil_mode), the modules, and the max-pooling CPU kernel against torch's rule. Each op's gradient
// check, CPU/CUDA parity and bad inputs come from the registry (tests/op_cases.hpp).
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

#include "gradcheck.hpp"

using namespace ember;
using Catch::Contains;

namespace {
// Direct definition of conv2d (cross-correlation), in double.
std::vector<double> conv_reference(const std::vector<double>& x, const std::vector<double>& w,
                                   const std::vector<double>& b, int64_t n, int64_t cin, int64_t h, int64_t wd,
                                   int64_t cout, int64_t kh, int64_t kw, const op::Conv2dOptions& o, int64_t& oh,
                                   int64_t& ow) {
  oh = (h + 2 * o.padding[0] - o.dilation[0] * (kh - 1) - 1) / o.stride[0] + 1;
  ow = (wd + 2 * o.padding[1] - o.dilation[1] * (kw - 1) - 1) / o.stride[1] + 1;
  const int64_t cin_g = cin / o.groups, cout_g = cout / o.groups;
  std::vector<double> y(static_cast<size_t>(n * cout * oh * ow));
  for (int64_t in = 0; in < n; ++in)
    for (int64_t co = 0; co < cout; ++co)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          double s = b.empty() ? 0.0 : b[static_cast<size_t>(co)];
          const int64_t g = co / cout_g;
          for (int64_t ci = 0; ci < cin_g; ++ci)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                int64_t iy = oy * o.stride[0] - o.padding[0] + i * o.dilation[0];
                int64_t ix = ox * o.stride[1] - o.padding[1] + j * o.dilation[1];
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                s += x[static_cast<size_t>(((in * cin + g * cin_g + ci) * h + iy) * wd + ix)] *
                     w[static_cast<size_t>(((co * cin_g + ci) * kh + i) * kw + j)];
              }
          y[static_cast<size_t>(((in * cout + co) * oh + oy) * ow + ox)] = s;
        }
  return y;
}

struct ConvCase {
  const char* name;
  int64_t n, cin, h, w, cout, kh, kw;
  op::Conv2dOptions o;
  bool bias;
};

std::vector<ConvCase> conv_cases() {
  return {
      {"3x3 no padding", 2, 3, 5, 6, 4, 3, 3, {}, true},
      {"3x3 padding 1", 1, 2, 4, 4, 3, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, true},
      {"stride 2 padding 1", 2, 2, 7, 6, 3, 3, 3, {{2, 2}, {1, 1}, {1, 1}, 1}, false},
      {"dilation 2", 1, 2, 7, 7, 2, 3, 3, {{1, 1}, {2, 2}, {2, 2}, 1}, true},
      {"groups 2, 1x3 kernel", 2, 4, 4, 5, 6, 1, 3, {{1, 2}, {0, 1}, {1, 1}, 2}, true},
      {"depthwise", 1, 3, 5, 5, 3, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 3}, true},
  };
}
}  // namespace

TEST_CASE("conv2d forward equals the direct definition (float64 and float32)", "[conv]") {
  for (const ConvCase& c : conv_cases()) {
    SECTION(c.name) {
      auto x = Tensor<double>::randn({c.n, c.cin, c.h, c.w});
      auto w = Tensor<double>::randn({c.cout, c.cin / c.o.groups, c.kh, c.kw});
      auto b = c.bias ? Tensor<double>::randn({c.cout}) : Tensor<double>();
      int64_t oh, ow;
      auto ref = conv_reference(x.to_vector(), w.to_vector(), c.bias ? b.to_vector() : std::vector<double>{}, c.n,
                                c.cin, c.h, c.w, c.cout, c.kh, c.kw, c.o, oh, ow);
      auto y = conv2d(x, w, b, c.o);
      REQUIRE(y.shape() == Shape{c.n, c.cout, oh, ow});
      auto yv = y.to_vector();
      for (size_t i = 0; i < ref.size(); ++i) CHECK(yv[i] == Approx(ref[i]).margin(1e-12));
      auto yf = conv2d(x.to<float>(), w.to<float>(), c.bias ? b.to<float>() : Tensor<float>(), c.o).to_vector();
      for (size_t i = 0; i < ref.size(); ++i) CHECK(yf[i] == Approx(ref[i]).margin(1e-4));
    }
  }
}

TEST_CASE("conv2d in half and bfloat16 matches float32 within the dtype tolerance", "[conv][lowp]") {
  auto x = Tensor<float>::randn({2, 3, 6, 6});
  auto w = Tensor<float>::randn({4, 3, 3, 3}, Device::cpu(), 0.0, 0.2);
  auto ref = conv2d(x, w, Tensor<float>(), {{1, 1}, {1, 1}, {1, 1}, 1}).to_vector();
  auto yh = conv2d(x.to<half>(), w.to<half>(), Tensor<half>(), {{1, 1}, {1, 1}, {1, 1}, 1}).to<float>().to_vector();
  auto yb = conv2d(x.to<bfloat16>(), w.to<bfloat16>(), Tensor<bfloat16>(), {{1, 1}, {1, 1}, {1, 1}, 1})
                .to<float>()
                .to_vector();
  for (size_t i = 0; i < ref.size(); ++i) {
    CHECK(yh[i] == Approx(ref[i]).margin(1e-2));
    CHECK(yb[i] == Approx(ref[i]).margin(5e-2));
  }
}

TEST_CASE("conv2d and pooling accept empty batches, no channels, and windows that fit with padding", "[conv][pool]") {
  using F = Tensor<float>;
  const F w = F::ones({4, 2, 3, 3});
  // An empty batch (and no channels for pooling) gives an empty output of the right shape.
  CHECK(conv2d(F::zeros({0, 2, 5, 5}), w).shape() == Shape{0, 4, 3, 3});
  CHECK(conv2d(F::zeros({0, 2, 5, 5}), w, F::ones({4})).shape() == Shape{0, 4, 3, 3});
  CHECK(max_pool2d(F::zeros({0, 3, 4, 4})).shape() == Shape{0, 3, 2, 2});
  CHECK(avg_pool2d(F::zeros({2, 0, 4, 4})).shape() == Shape{2, 0, 2, 2});
  CHECK(adaptive_avg_pool2d(F::zeros({0, 3, 4, 4}), {1, 1}).shape() == Shape{0, 3, 1, 1});
  // No input channels: every output is the bias (PyTorch's conv2d gives zeros plus bias).
  auto c0 = conv2d(F::zeros({1, 0, 5, 5}), F::zeros({4, 0, 3, 3}), F::from_vector({1, 2, 3, 4}, {4}));
  REQUIRE(c0.shape() == Shape{1, 4, 3, 3});
  CHECK(c0.to_vector()[0] == 1.0f);
  CHECK(c0.to_vector()[35] == 4.0f);
  // Stride 0 means "the kernel size", as torch's default.
  op::Pool2dOptions dflt;
  dflt.stride = {0, 0};
  CHECK(max_pool2d(F::ones({1, 1, 4, 4}), dflt).shape() == Shape{1, 1, 2, 2});
  // A 3x3 window on 2x2 fits the padded input (the unpadded one raises: the registry's bad inputs).
  const F x = F::ones({1, 1, 2, 2});
  op::Conv2dOptions pad;
  pad.padding = {1, 1};
  pad.stride = {2, 2};
  CHECK(conv2d(x, F::ones({1, 1, 3, 3}), F(), pad).shape() == Shape{1, 1, 1, 1});
  // torch.nn.functional.max_pool2d(ones(1,1,2,2), 3, stride=2, ceil_mode=True) is [1, 1, 1, 1].
  op::Pool2dOptions ceil;
  ceil.kernel = {3, 3};
  ceil.stride = {2, 2};
  ceil.ceil_mode = true;
  CHECK(max_pool2d(x, ceil).shape() == Shape{1, 1, 1, 1});
  // With padding the window fits: kernel 3, padding 1 on 2x2 gives 1x1 (stride 3).
  op::Pool2dOptions padded;
  padded.kernel = {3, 3};
  padded.padding = {1, 1};
  CHECK(max_pool2d(x, padded).shape() == Shape{1, 1, 1, 1});
}

TEST_CASE("nn::Conv2d: torch's parameter shapes and default init bounds, module gradients", "[conv][nn]") {
  nn::Conv2d conv(4, 6, {3, 2}, {.padding = {1, 0}, .groups = 2});
  CHECK(conv.weight.shape() == Shape{6, 2, 3, 2});
  CHECK(conv.bias.shape() == Shape{6});
  const double bound = 1.0 / std::sqrt(2.0 * 3 * 2);  // kaiming_uniform(a=sqrt(5)) = 1/sqrt(fan_in)
  for (double v : conv.weight.to_double_vector()) CHECK(std::fabs(v) <= bound);
  for (double v : conv.bias.to_double_vector()) CHECK(std::fabs(v) <= bound);
  auto y = conv(Tensor<float>::randn({2, 4, 5, 5}));
  CHECK(y.shape() == Shape{2, 6, 5, 4});
  conv.to(DType::Float64);
  CHECK_MODULE_GRADIENTS([&](const std::vector<AnyTensor>& in) { return conv.forward_any(in[0]); },
                         testing::random_inputs({{1, 4, 4, 3}}, 5), conv);
}

TEST_CASE("max_pool2d: values, first-maximum gradient routing, ceil_mode and padding", "[pool]") {
  auto x = Tensor<double>::from_vector({1, 5, 2, 0,  //
                                        3, 4, 9, 9,  //
                                        7, 0, 1, 2,  //
                                        8, 6, 3, 4},
                                       {1, 1, 4, 4})
               .set_requires_grad();
  auto y = max_pool2d(x, {{2, 2}});
  CHECK(y.to_vector() == std::vector<double>{5, 9, 8, 4});
  sum(y * Tensor<double>::from_vector({1, 2, 3, 4}, {1, 1, 2, 2})).backward();
  // The tie 9, 9 sends the gradient to the first (row-major) maximum only, as torch does.
  CHECK(x.grad().to_vector() == std::vector<double>{0, 1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 3, 0, 0, 4});
  // 5x5 with kernel 2 stride 2: 2x2 normally, 3x3 with ceil_mode; padding 1 gives 3x3.
  auto z = Tensor<float>::randn({1, 2, 5, 5});
  CHECK(max_pool2d(z, {{2, 2}}).shape() == Shape{1, 2, 2, 2});
  CHECK(max_pool2d(z, {{2, 2}, {2, 2}, {0, 0}, true}).shape() == Shape{1, 2, 3, 3});
  CHECK(max_pool2d(z, {{3, 3}, {2, 2}, {1, 1}}).shape() == Shape{1, 2, 3, 3});
  CHECK_THROWS_WITH(max_pool2d(z, {{2, 2}, {1, 1}, {2, 2}}), Contains("max_pool2d") && Contains("half the kernel"));
}

TEST_CASE("avg_pool2d and adaptive_avg_pool2d: values (count_include_pad)", "[pool]") {
  auto x = Tensor<double>::arange(16).reshape({1, 1, 4, 4});
  CHECK(avg_pool2d(x, {{2, 2}}).to_vector() == std::vector<double>{2.5, 4.5, 10.5, 12.5});
  // Padding 1, kernel 3, stride 2 on 4x4: the corner window holds 4 real values (0, 1, 4, 5).
  auto with_pad = avg_pool2d(x, {{3, 3}, {2, 2}, {1, 1}, false, true}).to_vector();
  auto without = avg_pool2d(x, {{3, 3}, {2, 2}, {1, 1}, false, false}).to_vector();
  CHECK(with_pad[0] == Approx((0 + 1 + 4 + 5) / 9.0));
  CHECK(without[0] == Approx((0 + 1 + 4 + 5) / 4.0));
  // Adaptive 4 -> 3: windows [0,2), [1,3), [2,4) in each direction.
  auto a = adaptive_avg_pool2d(x, {3, 3}).to_vector();
  CHECK(a[0] == Approx((0 + 1 + 4 + 5) / 4.0));
  CHECK(a[4] == Approx((5 + 6 + 9 + 10) / 4.0));
  CHECK(adaptive_avg_pool2d(x, {1, 1}).item() == Approx(7.5));
}

TEST_CASE("pooling modules", "[pool][nn]") {
  auto x = Tensor<float>::randn({2, 3, 8, 8});
  CHECK(nn::MaxPool2d(2)(x).shape() == Shape{2, 3, 4, 4});
  CHECK(nn::AvgPool2d(2)(x).shape() == Shape{2, 3, 4, 4});
  CHECK(nn::AdaptiveAvgPool2d(1)(x).shape() == Shape{2, 3, 1, 1});
  CHECK(nn::MaxPool2d(2)(x).to_vector() == max_pool2d(x, {{2, 2}}).to_vector());
}
