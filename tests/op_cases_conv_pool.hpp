#pragma once
// The registry's convolution and pooling ops (ops/conv.hpp, ops/pool.hpp).
#include <array>
#include <string>
#include <vector>

#include "op_case.hpp"

namespace ember::testing {

namespace conv_pool_cases {

using namespace case_names;

// conv2d of x [n, cin, h, w] by a [cout, cin / groups, kh, kw] weight, and a bias if asked.
inline OpCase conv_case(const std::string& what, int64_t n, int64_t cin, int64_t h, int64_t w, int64_t cout, int64_t kh,
                        int64_t kw, op::Conv2dOptions o, bool bias) {
  std::vector<Input> in = {{{n, cin, h, w}}, {{cout, cin / o.groups, kh, kw}}};
  if (bias) in.push_back({{cout}});
  return {.variant = what,
          .inputs = in,
          .fn = [o](V x) { return op::conv2d(x[0], x[1], x.size() > 2 ? x[2] : AnyTensor(), o); },
          .tolerance = Tolerance::Gemm};
}

}  // namespace conv_pool_cases

inline std::vector<OpSpec> conv_pool_ops() {
  using namespace conv_pool_cases;
  const auto x = [] { return F::ones({1, 2, 5, 5}); };
  const auto w = [] { return F::ones({4, 2, 3, 3}); };
  const auto x22 = [] { return F::ones({1, 1, 2, 2}); };  // too small for a 3x3 window
  const auto conv = [](const F& in, const F& wt, const F& b, op::Conv2dOptions o) { conv2d(in, wt, b, o); };
  auto stride = [](int64_t a, int64_t b) {
    op::Conv2dOptions o;
    o.stride = {a, b};
    return o;
  };
  auto padding = [](int64_t a, int64_t b) {
    op::Conv2dOptions o;
    o.padding = {a, b};
    return o;
  };
  auto dilation = [](int64_t a, int64_t b) {
    op::Conv2dOptions o;
    o.dilation = {a, b};
    return o;
  };
  auto groups = [](int64_t g) {
    op::Conv2dOptions o;
    o.groups = g;
    return o;
  };
  auto pool = [](std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride, std::array<int64_t, 2> padding) {
    op::Pool2dOptions o;
    o.kernel = kernel;
    o.stride = stride;
    o.padding = padding;
    return o;
  };
  std::vector<OpSpec> ops;
  ops.push_back(
      {.name = "conv2d",
       .family = "conv_pool",
       .cases = {{.variant = "3x3 pad 1 + bias, [2, 3, 9, 8]",
                  .inputs = {{{2, 3, 9, 8}}, {{5, 3, 3, 3}}, {{5}}},
                  .fn = [](V x) { return op::conv2d(x[0], x[1], x[2], {{1, 1}, {1, 1}, {1, 1}, 1}); },
                  .tolerance = Tolerance::Gemm},
                 {.variant = "stride 2 dilation 2 groups 2, [2, 4, 11, 10]",
                  .inputs = {{{2, 4, 11, 10}}, {{6, 2, 3, 3}}},
                  .fn = [](V x) { return op::conv2d(x[0], x[1], AnyTensor(), {{2, 2}, {1, 2}, {2, 2}, 2}); },
                  .tolerance = Tolerance::Gemm},
                 conv_case("3x3 no padding", 2, 3, 5, 6, 4, 3, 3, {}, true),
                 conv_case("3x3 padding 1", 1, 2, 4, 4, 3, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, true),
                 conv_case("stride 2 padding 1", 2, 2, 7, 6, 3, 3, 3, {{2, 2}, {1, 1}, {1, 1}, 1}, false),
                 conv_case("dilation 2", 1, 2, 7, 7, 2, 3, 3, {{1, 1}, {2, 2}, {2, 2}, 1}, true),
                 conv_case("groups 2, 1x3 kernel", 2, 4, 4, 5, 6, 1, 3, {{1, 2}, {0, 1}, {1, 1}, 2}, true),
                 conv_case("depthwise", 1, 3, 5, 5, 3, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 3}, true)},
       .bad =
           {bad<ShapeError>("conv2d 3-d input", [=] { conv(F::ones({2, 5, 5}), w(), F(), {}); },
                            {"conv2d", "[N, C, H, W]", "[2, 5, 5]"}),
            bad<ShapeError>("conv2d 0-d input", [=] { conv(F::scalar(1), w(), F(), {}); }, {"conv2d", "float32[]"}),
            bad<ShapeError>("conv2d 3-d weight", [=] { conv(x(), F::ones({4, 2, 3}), F(), {}); },
                            {"conv2d", "weight", "[4, 2, 3]"}),
            bad<ShapeError>("conv2d input channels 3 against weight 2",
                            [=] { conv(F::ones({1, 3, 5, 5}), w(), F(), {}); },
                            {"conv2d", "[1, 3, 5, 5]", "[4, 2, 3, 3]", "groups=1"}),
            bad<ShapeError>("conv2d groups 3 do not divide", [=] { conv(x(), w(), F(), groups(3)); },
                            {"conv2d", "groups=3"}),
            bad<ValueError>("conv2d groups 0", [=] { conv(x(), w(), F(), groups(0)); }, {"conv2d", "groups 0"}),
            bad<ValueError>("conv2d negative stride", [=] { conv(x(), w(), F(), stride(-1, 1)); },
                            {"conv2d", "stride -1x1"}),
            bad<ValueError>("conv2d negative padding", [=] { conv(x(), w(), F(), padding(0, -2)); },
                            {"conv2d", "padding 0x-2"}),
            bad<ValueError>("conv2d dilation 0", [=] { conv(x(), w(), F(), dilation(0, 1)); },
                            {"conv2d", "dilation 0x1"}),
            bad<ShapeError>("conv2d bias [3]", [=] { conv(x(), w(), F::ones({3}), {}); },
                            {"conv2d", "bias", "[3]", "[4]"}),
            bad<ShapeError>("conv2d bias [1, 4]", [=] { conv(x(), w(), F::ones({1, 4}), {}); },
                            {"conv2d", "bias", "[1, 4]"}),
            bad<ShapeError>("conv2d empty kernel", [=] { conv(x(), F::ones({4, 2, 0, 3}), F(), {}); },
                            {"conv2d", "kernel", "empty", "[4, 2, 0, 3]"}),
            bad<ShapeError>("conv2d empty image", [=] { conv(F::ones({1, 2, 0, 5}), w(), F(), {}); },
                            {"conv2d", "too small", "[1, 2, 0, 5]"}),
            bad<DTypeError>("conv2d int64", [] { conv2d(I64::ones({1, 2, 5, 5}), I64::ones({4, 2, 3, 3})); },
                            {"conv2d", "int64"}),
            bad<DTypeError>("conv2d float64 bias", [=] { op::conv2d(x(), w(), D::ones({4})); }, {"conv2d", "float64"}),
            bad<ValueError>("conv2d undefined weight", [=] { op::conv2d(x(), AnyTensor()); },
                            {"conv2d", "weight", "undefined"}),
            bad<ShapeError>("conv2d weight [4, 2, 3, 3] for 3 input channels",
                            [] { conv2d(F::ones({1, 3, 5, 5}), F::ones({4, 2, 3, 3})); },
                            {"conv2d", "[4, 2, 3, 3]"}),
            bad<ShapeError>("conv2d 7x7 kernel on a 5x5 image",
                            [] { conv2d(F::ones({1, 3, 5, 5}), F::ones({4, 3, 7, 7})); },
                            {"conv2d", "too small"}),
            bad<ShapeError>("conv2d bias [3] for 4 outputs",
                            [] { conv2d(F::ones({1, 3, 5, 5}), F::ones({4, 3, 3, 3}), F::ones({3})); },
                            {"conv2d", "[3]"}),
            // windows that do not fit the input
            bad<ShapeError>("conv2d 3x3 stride 2 on 2x2",
                            [=] { conv(x22(), F::ones({1, 1, 3, 3}), F(), stride(2, 2)); },
                            {"conv2d", "[1, 1, 2, 2]", "3x3"}),
            bad<ShapeError>("conv2d 0x0 kernel", [=] { conv2d(x22(), F::ones({1, 1, 0, 0})); },
                            {"conv2d", "0x0"}),
            bad<ShapeError>("conv2d 1x0 kernel", [=] { conv2d(x22(), F::ones({1, 1, 1, 0})); },
                            {"conv2d"}),
            bad<ShapeError>("conv2d 3x3 dilated 2 (spans 5) on 4x4",
                            [=] {
                              op::Conv2dOptions o = dilation(2, 2);
                              o.stride = {2, 2};
                              conv(F::ones({1, 1, 4, 4}), F::ones({1, 1, 3, 3}), F(), o);
                            },
                            {"conv2d"}),
            bad_on_device<DeviceError>("conv2d cuda:0 weight",
                                       [] { conv2d(F::ones({1, 2, 5, 5}), F::ones({4, 2, 3, 3}, Device::cuda(0))); },
                                       {"conv2d", "cuda:0"}),
            bad_on_device<DeviceError>(
                "conv2d cuda:0 bias",
                [] {
                  conv2d(F::ones({1, 2, 5, 5}), F::ones({4, 2, 3, 3}), F::ones({4}, Device::cuda(0)));
                },
                {"conv2d", "[4] on cuda:0"})}});
  ops.push_back({.name = "max_pool2d",
                 .family = "conv_pool",
                 .cases = {{.variant = "3x3 stride 2 padding 1 ceil_mode, [2, 3, 9, 10]",
                            .inputs = {{{2, 3, 9, 10}, -2, 2}},
                            .fn = [](V x) { return op::max_pool2d(x[0], {{3, 3}, {2, 2}, {1, 1}, true}); }},
                           // random values have no ties
                           {.variant = "3x2 stride 2x1 padding 1 ceil_mode, [2, 2, 5, 6]",
                            .inputs = {{{2, 2, 5, 6}}},
                            .fn = [](V x) { return op::max_pool2d(x[0], {{3, 2}, {2, 1}, {1, 1}, true}); }}},
                 .bad = {bad<ShapeError>("max_pool2d 3-d input", [] { max_pool2d(F::ones({2, 4, 4})); },
                                         {"max_pool2d", "[2, 4, 4]"}),
                         bad<ValueError>("max_pool2d kernel 0x2",
                                         [=] { max_pool2d(x(), pool({0, 2}, {0, 0}, {0, 0})); },
                                         {"max_pool2d", "kernel", "0x2"}),
                         bad<ValueError>("max_pool2d negative stride",
                                         [=] { max_pool2d(x(), pool({2, 2}, {-1, -1}, {0, 0})); },
                                         {"max_pool2d", "stride", "-1x-1"}),
                         bad<ValueError>("max_pool2d negative padding",
                                         [=] { max_pool2d(x(), pool({2, 2}, {0, 0}, {-1, 0})); },
                                         {"max_pool2d", "padding -1x0"}),
                         bad<DTypeError>("max_pool2d int64", [] { max_pool2d(I64::ones({1, 1, 4, 4})); },
                                         {"max_pool2d", "int64"}),
                         // windows that do not fit the input (ceil_mode as PyTorch)
                         bad<ShapeError>("max_pool2d 3x3 on 2x2",
                                         [=] { max_pool2d(x22(), pool({3, 3}, {0, 0}, {0, 0})); },
                                         {"max_pool2d", "[1, 1, 2, 2]", "3x3"}),
                         bad<ShapeError>("max_pool2d 3x3 stride 1 on 2x2",
                                         [=] { max_pool2d(x22(), pool({3, 3}, {1, 1}, {0, 0})); },
                                         {"max_pool2d"})}});
  ops.push_back({.name = "avg_pool2d",
                 .family = "conv_pool",
                 .cases = {{.variant = "3x3 stride 2 padding 1 padding not counted, [2, 3, 9, 10]",
                            .inputs = {{{2, 3, 9, 10}, -2, 2}},
                            .fn = [](V x) { return op::avg_pool2d(x[0], {{3, 3}, {2, 2}, {1, 1}, false, false}); }},
                           {.variant = "3x3 stride 2 padding 1 ceil_mode, padding not counted, [2, 1, 5, 6]",
                            .inputs = {{{2, 1, 5, 6}}},
                            .fn = [](V x) { return op::avg_pool2d(x[0], {{3, 3}, {2, 2}, {1, 1}, true, false}); }}},
                 .bad = {bad<ShapeError>("avg_pool2d 5-d input", [] { avg_pool2d(F::ones({1, 1, 1, 4, 4})); },
                                         {"avg_pool2d", "[1, 1, 1, 4, 4]"}),
                         bad<ValueError>("avg_pool2d negative stride",
                                         [=] { avg_pool2d(x(), pool({2, 2}, {-1, -1}, {0, 0})); },
                                         {"avg_pool2d", "stride"}),
                         bad<ValueError>("avg_pool2d padding over half the kernel",
                                         [=] { avg_pool2d(x(), pool({2, 2}, {0, 0}, {2, 0})); },
                                         {"avg_pool2d", "padding 2x0", "half"}),
                         bad<ShapeError>("avg_pool2d 3x3 on 2x2",
                                         [=] { avg_pool2d(x22(), pool({3, 3}, {0, 0}, {0, 0})); },
                                         {"avg_pool2d"})}});
  ops.push_back({.name = "adaptive_avg_pool2d",
                 .family = "conv_pool",
                 .cases = {{.variant = "[2, 3, 9, 10] to 4x3",
                            .inputs = {{{2, 3, 9, 10}, -2, 2}},
                            .fn = [](V x) { return op::adaptive_avg_pool2d(x[0], {4, 3}); }},
                           {.variant = "[1, 2, 5, 7] to 3x4",
                            .inputs = {{{1, 2, 5, 7}}},
                            .fn = [](V x) { return op::adaptive_avg_pool2d(x[0], {3, 4}); }}},
                 .bad = {bad<ValueError>("adaptive_avg_pool2d output 0x2", [=] { adaptive_avg_pool2d(x(), {0, 2}); },
                                         {"adaptive_avg_pool2d", "output size", "0x2"}),
                         bad<ShapeError>("adaptive_avg_pool2d 2-d input",
                                         [] { adaptive_avg_pool2d(F::ones({4, 4}), {2, 2}); },
                                         {"adaptive_avg_pool2d", "[4, 4]"}),
                         bad<ShapeError>("adaptive_avg_pool2d empty image",
                                         [] { adaptive_avg_pool2d(F::ones({1, 1, 0, 4}), {2, 2}); },
                                         {"adaptive_avg_pool2d", "[1, 1, 0, 4]"})}});
  return ops;
}

}  // namespace ember::testing
