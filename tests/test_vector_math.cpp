// The CPU's vector math (backend/cpu/vector_math.hpp and its lanes): fast_expf against exp, the
// softmax row kernels (exp_sub_sum, row_max), tanh and tanh-GELU with their gradients, and every
// lane width this processor runs (4, 8 AVX2, 16 AVX-512F) giving the same bits, tails included.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <ember/backend/cpu/reduce.hpp>
#include <ember/ember.hpp>

#include "test_util.hpp"

using namespace ember;
using namespace ember::testing;

TEST_CASE("fast_expf: within 2 ulp of exp over the float range, 0, inf and NaN at the edges",
          "[vector_math][softmax]") {
  double worst = 0;
  for (double x = -87.0; x < 88.5; x += 0.00731) {
    const float f = static_cast<float>(x);
    const double ref = std::exp(static_cast<double>(f));
    const double got = cpu::detail::fast_expf(f);
    worst = std::max(worst, std::abs(got - ref) / ref);
  }
  REQUIRE(worst < 2.5e-7);  // 2 ulp of float is 2.4e-7 relative at worst
  REQUIRE(cpu::detail::fast_expf(0.0f) == 1.0f);
  REQUIRE(cpu::detail::fast_expf(-std::numeric_limits<float>::infinity()) == 0.0f);
  REQUIRE(cpu::detail::fast_expf(-100.0f) == 0.0f);
  REQUIRE(std::isinf(cpu::detail::fast_expf(100.0f)));
  REQUIRE(std::isinf(cpu::detail::fast_expf(std::numeric_limits<float>::infinity())));
  REQUIRE(std::isnan(cpu::detail::fast_expf(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("exp_sub_sum and row_max: the vector lanes give fast_expf's bits and the max ignoring NaN",
          "[vector_math][softmax]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t n : {0, 1, 3, 4, 7, 8, 9, 16, 33, 1000}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = static_cast<float>((i * 37) % 211) * 0.9f - 95.0f;
    const float edge[] = {nan, inf, -inf, 88.7f, -87.3f, 88.8f, -87.4f, 0.0f, -0.0f};
    for (size_t i = 0; i < x.size() && i < 9; ++i) x[i * 3 % x.size()] = edge[i];
    for (float sub : {0.0f, 0.5f, -3.0f}) {
      std::vector<float> y(x.size()), in = x;
      const float sum = cpu::detail::exp_sub_sum(in.data(), y.data(), n, sub);
      double ref_sum = 0;
      bool any_nan = false;
      for (size_t i = 0; i < x.size(); ++i) {
        const float r = cpu::detail::fast_expf(x[i] - sub);
        INFO("n " << n << " i " << i << " x " << x[i] << " sub " << sub);
        if (std::isnan(r)) {
          REQUIRE(std::isnan(y[i]));
          any_nan = true;
        } else {
          REQUIRE(y[i] == r);  // bitwise
        }
        ref_sum += r;
      }
      if (any_nan) {
        REQUIRE(std::isnan(sum));
      } else if (std::isinf(ref_sum)) {
        REQUIRE(sum == ref_sum);
      } else {
        REQUIRE(std::abs(sum - ref_sum) <= 1e-5 * std::abs(ref_sum) + 1e-30);
      }
      // in place (softmax and attention call it so)
      const float sum2 = cpu::detail::exp_sub_sum(in.data(), in.data(), n, sub);
      for (size_t i = 0; i < x.size(); ++i) REQUIRE((in[i] == y[i] || (std::isnan(in[i]) && std::isnan(y[i]))));
      REQUIRE((sum2 == sum || (std::isnan(sum2) && std::isnan(sum))));
    }
    float ref_max = -inf;
    for (float v : x) ref_max = v > ref_max ? v : ref_max;
    REQUIRE(cpu::detail::row_max(x.data(), n) == ref_max);
  }
  std::vector<float> only_nan(5, nan);
  REQUIRE(cpu::detail::row_max(only_nan.data(), 5) == -inf);
}

TEST_CASE("vector math: every lane width this processor runs (4, 8 AVX2, 16 AVX-512F) gives the same bits",
          "[vector_math][softmax]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x, gy;
  for (double v = -95.0; v < 95.0; v += 0.0173) x.push_back(static_cast<float>(v));
  for (float e : {nan, inf, -inf, 0.0f, -0.0f, 1e-30f, -1e-30f, 0.625f, -0.625f, 9.5f, 88.7f, -87.4f}) x.push_back(e);
  for (size_t i = 0; i < x.size(); ++i) gy.push_back(i % 5 == 0 ? -1.25f : 0.5f + static_cast<float>(i % 7));
  auto same = [](float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0; };
  std::vector<int> widths;
  for (int w : {4, 8, 16})
    if (cpu::detail::runs_lanes(w)) widths.push_back(w);
  REQUIRE(cpu::detail::runs_lanes(cpu::detail::lanes()));
  if (!cpu::detail::runs_lanes(16)) WARN("SKIPPED: the 16-lane (AVX-512F) copy: this processor or compiler lacks it");
  if (!cpu::detail::runs_lanes(8)) WARN("SKIPPED: the 8-lane (AVX2) copy: this processor lacks it");
  // every length up to 40 (all tails of 4, 8 and 16 lanes) and the whole array
  std::vector<int64_t> lengths;
  for (int64_t n = 0; n <= 40; ++n) lengths.push_back(n);
  lengths.push_back(static_cast<int64_t>(x.size()));
  for (int w : widths) {
    INFO("lanes " << w);
    for (int64_t n : lengths) {
      INFO("n " << n);
      const float* xs = x.data() + (n == static_cast<int64_t>(x.size()) ? 0 : 3);
      std::vector<float> y(static_cast<size_t>(n)), ref(static_cast<size_t>(n));
      const float sum = cpu::detail::exp_sub_sum_at(w, xs, y.data(), n, 0.75f);
      const float ref_sum = cpu::detail::exp_sub_sum_at(4, xs, ref.data(), n, 0.75f);
      for (int64_t i = 0; i < n; ++i) REQUIRE(same(y[static_cast<size_t>(i)], cpu::detail::fast_expf(xs[i] - 0.75f)));
      if (std::isfinite(ref_sum)) REQUIRE(std::abs(sum - ref_sum) <= 1e-5f * std::abs(ref_sum));
      float m = -inf;
      for (int64_t i = 0; i < n; ++i) m = xs[i] > m ? xs[i] : m;
      REQUIRE(cpu::detail::row_max_at(w, xs, n) == m);
      auto check_map = [&](auto op_tag, bool with_gy) {
        constexpr auto kOp = decltype(op_tag)::value;
        cpu::detail::map_f32_at<kOp>(w, xs, with_gy ? gy.data() : nullptr, y.data(), n);
        cpu::detail::map_f32_at<kOp>(4, xs, with_gy ? gy.data() : nullptr, ref.data(), n);
        for (int64_t i = 0; i < n; ++i) {
          INFO("op " << static_cast<int>(kOp) << " x " << xs[i]);
          REQUIRE(same(y[static_cast<size_t>(i)], ref[static_cast<size_t>(i)]));
        }
      };
      using Op = cpu::detail::LaneOp;
      check_map(std::integral_constant<Op, Op::Tanh>{}, false);
      check_map(std::integral_constant<Op, Op::GeluTanh>{}, false);
      check_map(std::integral_constant<Op, Op::GeluTanhGrad>{}, true);
      check_map(std::integral_constant<Op, Op::Relu>{}, false);
      check_map(std::integral_constant<Op, Op::ReluGrad>{}, true);
    }
  }
  // a width the processor does not run means the widest it does
  std::vector<float> a(x.size()), b(x.size());
  cpu::detail::map_f32_at<cpu::detail::LaneOp::GeluTanh>(3, x.data(), nullptr, a.data(),
                                                         static_cast<int64_t>(x.size()));
  cpu::detail::gelu_tanh_f32(x.data(), b.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) REQUIRE(same(a[i], b[i]));
}

TEST_CASE("vector tanh and tanh-GELU (fp32): accuracy, edges, tails, the ops and their gradients",
          "[vector_math][softmax]") {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x;
  for (double v = -12.0; v < 12.0; v += 0.00731) x.push_back(static_cast<float>(v));
  for (float e : {0.0f, -0.0f, 1e-30f, -1e-30f, 0.625f, 0.62499994f, -0.625f, 9.5f, -9.5f, inf, -inf}) x.push_back(e);
  std::vector<float> y(x.size()), g(x.size()), d(x.size()), ones(x.size(), 1.0f);
  cpu::detail::tanh_f32(x.data(), y.data(), static_cast<int64_t>(x.size()));
  cpu::detail::gelu_tanh_f32(x.data(), g.data(), static_cast<int64_t>(x.size()));
  cpu::detail::gelu_tanh_backward_f32(x.data(), ones.data(), d.data(), static_cast<int64_t>(x.size()));
  double worst_tanh = 0, worst_gelu = 0, worst_grad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i], t = std::tanh(v);
    worst_tanh = std::max(worst_tanh, t == 0 ? std::abs(y[i]) : std::abs(y[i] - t) / std::abs(t));
    if (!std::isfinite(v)) continue;
    const double in = 0.7978845608028654 * (v + 0.044715 * v * v * v), ti = std::tanh(in);
    worst_gelu = std::max(worst_gelu, std::abs(g[i] - 0.5 * v * (1 + ti)) / (1.0 + std::abs(v)));
    const double dg = 0.5 * (1 + ti) + 0.5 * v * (1 - ti * ti) * 0.7978845608028654 * (1 + 3 * 0.044715 * v * v);
    worst_grad = std::max(worst_grad, std::abs(d[i] - dg) / (1.0 + std::abs(v)));
  }
  REQUIRE(worst_tanh < 3e-7);
  REQUIRE(worst_gelu < 1e-6);  // float rounding of the formula (libm's tanhf gives the same error: 4.3e-7)
  REQUIRE(worst_grad < 1e-6);
  REQUIRE(std::signbit(y[x.size() - 10]));  // tanh(-0) = -0
  REQUIRE(y[x.size() - 2] == 1.0f);
  REQUIRE(y[x.size() - 1] == -1.0f);
  float nan_in = std::numeric_limits<float>::quiet_NaN(), nan_out = 0;
  cpu::detail::tanh_f32(&nan_in, &nan_out, 1);
  REQUIRE(std::isnan(nan_out));
  // ReLU and its gradient on the lanes: math::unary's and unary_derivative's formulas exactly
  {
    std::vector<float> rx = x, gyv(x.size());
    rx.push_back(std::numeric_limits<float>::quiet_NaN());
    gyv.resize(rx.size());
    for (size_t i = 0; i < gyv.size(); ++i) gyv[i] = (i % 3 == 0) ? -1.5f : 0.25f;
    gyv[7] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> ry(rx.size()), rg(rx.size());
    const auto n = static_cast<int64_t>(rx.size());
    cpu::detail::relu_f32(rx.data(), ry.data(), n);
    cpu::detail::relu_backward_f32(rx.data(), gyv.data(), rg.data(), n);
    auto same = [](float a, float b) {
      return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
    };
    for (size_t i = 0; i < rx.size(); ++i) {
      INFO("x " << rx[i] << " gy " << gyv[i]);
      REQUIRE(same(ry[i], math::unary<float>(UnaryOp::Relu, rx[i], 0.0f, 0.0f)));
      REQUIRE(same(rg[i], gyv[i] * math::unary_derivative<float>(UnaryOp::Relu, rx[i], 0.0f, 0.0f, 0.0f)));
    }
  }
  // a tail (n % lanes) is computed by the same lanes: any prefix gives the same bits
  for (int64_t n = 1; n <= 17; ++n) {
    std::vector<float> z(static_cast<size_t>(n));
    cpu::detail::tanh_f32(x.data() + 5, z.data(), n);
    for (int64_t i = 0; i < n; ++i) REQUIRE(z[static_cast<size_t>(i)] == y[static_cast<size_t>(5 + i)]);
  }
  // the ops use them, at every thread count, forward and backward
  ThreadsGuard guard;
  auto xt =
      Tensor<float>::from_vector(std::vector<float>(x.begin(), x.end() - 2), {static_cast<int64_t>(x.size() - 2)});
  std::vector<double> first_g, first_d;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    auto xv = Tensor<float>(xt.detach().clone()).set_requires_grad();
    auto out = gelu(xv, true);
    sum(out).backward();
    auto gv = out.to_double_vector(), dv = xv.grad().to_double_vector();
    for (size_t i = 0; i + 2 < x.size(); ++i) {
      REQUIRE(gv[i] == static_cast<double>(g[i]));
      REQUIRE(dv[i] == static_cast<double>(d[i]));
    }
    REQUIRE(AnyTensor(op::tanh(xt)).to_double_vector()[3] == static_cast<double>(y[3]));
  }
}
