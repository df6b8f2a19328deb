// LayerNorm and RMSNorm (ops/norm.hpp: one fused kernel; nn::LayerNorm, nn::RMSNorm): values
// against a double reference with and without weight and bias, Welford's statistics at a large
// mean, the modules' gradients, backward independent of the thread count, and CPU-versus-CUDA
// parity of the fused kernels (real GPU, else skipped; the pretend device checks the device
// plumbing in CI). The ops' gradient checks and bad inputs come from the registry
// (tests/op_cases.hpp).
#include <catch2/catch.hpp>

#include <cmath>
#include <utility>
#include <vector>

#include <ember/ember.hpp>

#include "gpu_skip.hpp"
#include "gradcheck.hpp"
#include "pretend_gpu.hpp"
#include "test_util.hpp"

using namespace ember;
using namespace ember::testing;

namespace {

// LayerNorm (rms: RMSNorm) of each row of `cols` values, in double by plain loops.
std::vector<double> ref_norm(const std::vector<double>& x, int64_t cols, const std::vector<double>* w,
                             const std::vector<double>* b, double eps, bool rms) {
  std::vector<double> y(x.size());
  const int64_t rows = static_cast<int64_t>(x.size()) / cols;
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < cols; ++j) m += x[static_cast<size_t>(r * cols + j)];
    m = rms ? 0.0 : m / static_cast<double>(cols);
    for (int64_t j = 0; j < cols; ++j) {
      const double d = x[static_cast<size_t>(r * cols + j)] - m;
      v += d * d;
    }
    v /= static_cast<double>(cols);
    for (int64_t j = 0; j < cols; ++j) {
      double o = (x[static_cast<size_t>(r * cols + j)] - m) / std::sqrt(v + eps);
      if (w) o *= (*w)[static_cast<size_t>(j)];
      if (b) o += (*b)[static_cast<size_t>(j)];
      y[static_cast<size_t>(r * cols + j)] = o;
    }
  }
  return y;
}

}  // namespace

TEST_CASE("layer_norm and rms_norm: values against a double reference, with and without weight and bias", "[norm]") {
  Generator gen(11);
  for (int64_t cols : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{1000}}) {
    auto x = Tensor<double>::randn({9, cols}, Device::cpu(), 3.0, 2.0, gen);
    auto w = Tensor<double>::randn({cols}, Device::cpu(), 1.0, 0.5, gen);
    auto b = Tensor<double>::randn({cols}, Device::cpu(), 0.0, 0.5, gen);
    const auto xv = x.to_double_vector(), wv = w.to_double_vector(), bv = b.to_double_vector();
    for (bool rms : {false, true}) {
      for (int affine = 0; affine < 3; ++affine) {  // none, weight, weight + bias
        AnyTensor wa = affine >= 1 ? AnyTensor(w) : AnyTensor(), ba = affine == 2 && !rms ? AnyTensor(b) : AnyTensor();
        AnyTensor y = rms ? op::rms_norm(x, cols, wa, 1e-5) : op::layer_norm(x, cols, wa, ba, 1e-5);
        auto ref = ref_norm(xv, cols, affine >= 1 ? &wv : nullptr, ba.defined() ? &bv : nullptr, 1e-5, rms);
        INFO("cols " << cols << " rms " << rms << " affine " << affine);
        REQUIRE(max_rel_diff(y.to_double_vector(), ref) < 1e-12);
        // float32: within the composite's tolerance
        AnyTensor xf = x.to(DType::Float32), wf = wa.defined() ? wa.to(DType::Float32) : AnyTensor();
        AnyTensor bf = ba.defined() ? ba.to(DType::Float32) : AnyTensor();
        AnyTensor yf = rms ? op::rms_norm(xf, cols, wf, 1e-5) : op::layer_norm(xf, cols, wf, bf, 1e-5);
        REQUIRE(max_rel_diff(yf.to_double_vector(), ref) < 2e-5);
      }
    }
  }
  SECTION("nn::LayerNorm over two trailing dimensions equals the reference; its output comes from the fused op") {
    nn::LayerNorm ln(std::vector<int64_t>{3, 4});
    {
      NoGradGuard ng;
      ln.weight.copy_(Tensor<float>::randn({3, 4}, Device::cpu(), 1.0, 0.3, gen));
      ln.bias.copy_(Tensor<float>::randn({3, 4}, Device::cpu(), 0.0, 0.3, gen));
    }
    auto x = Tensor<float>::randn({2, 5, 3, 4}, Device::cpu(), 0.0, 1.0, gen).set_requires_grad();
    auto y = ln(x);
    REQUIRE(y.grad_fn_name() == "layer_norm");
    const auto wv = ln.weight.to_double_vector(), bv = ln.bias.to_double_vector();
    REQUIRE(max_rel_diff(y.to_double_vector(), ref_norm(x.to_double_vector(), 12, &wv, &bv, 1e-5, false)) < 2e-6);
  }
  SECTION("nn::RMSNorm: torch's default eps (the dtype's epsilon) and weight") {
    nn::RMSNorm rn(16);
    REQUIRE(rn.eps() < 0);
    auto x = Tensor<float>::randn({4, 16}, Device::cpu(), 0.0, 1.0, gen);
    const auto wv = rn.weight.to_double_vector();
    REQUIRE(max_rel_diff(rn(x).to_double_vector(),
                         ref_norm(x.to_double_vector(), 16, &wv, nullptr, 1.1920928955078125e-07, true)) < 2e-6);
  }
}

TEST_CASE("layer_norm: Welford statistics stay accurate for a large mean in float32", "[norm]") {
  Generator gen(3);
  auto x64 = Tensor<double>::randn({16, 4096}, Device::cpu(), 0.0, 1e-2, gen) + 1e4;
  auto x = Tensor<float>(x64.to(DType::Float32));
  const auto xv = x.to_double_vector();  // the float values, exactly
  REQUIRE(max_rel_diff(op::layer_norm(x, 4096, {}, {}, 1e-5).to_double_vector(),
                       ref_norm(xv, 4096, nullptr, nullptr, 1e-5, false)) < 1e-4);
  // the statistics themselves against the double reference
  AnyTensor y = op::layer_norm(x, 4096, {}, {}, 0.0);
  const auto yv = y.to_double_vector();  // once: converting inside the loop made this test quadratic
  double ss = 0;
  for (size_t j = 0; j < 4096; ++j) ss += yv[j] * yv[j];
  REQUIRE(std::abs(ss / 4096 - 1.0) < 1e-4);
}

TEST_CASE("layer_norm and rms_norm accept an empty batch", "[norm]") {
  using F = Tensor<float>;
  CHECK(op::layer_norm(F::zeros({0, 4}), 4).shape() == Shape{0, 4});
  CHECK(nn::functional::rms_norm(F::zeros({0, 4}), {4}).shape() == Shape{0, 4});
}

TEST_CASE("nn::LayerNorm and nn::RMSNorm gradients (gradcheck, float64), their parameters included", "[norm][grad]") {
  // (the ops' own gradient checks, with and without weight and bias: tests/test_gradcheck.cpp)
  auto in3 = testing::random_inputs({{3, 2, 5}}, 22);
  nn::LayerNorm ln(std::vector<int64_t>{2, 5}, {.dtype = DType::Float64});
  auto ln_mod = [&](const std::vector<AnyTensor>& v) { return AnyTensor(ln(Tensor<double>(v[0]))); };
  CHECK_MODULE_GRADIENTS(ln_mod, in3, ln);
  nn::RMSNorm rn(5, {.dtype = DType::Float64});
  auto rn_mod = [&](const std::vector<AnyTensor>& v) { return AnyTensor(rn(Tensor<double>(v[0]))); };
  CHECK_MODULE_GRADIENTS(rn_mod, in3, rn);
}

TEST_CASE("layer_norm backward does not depend on the thread count (parameter gradients by fixed row blocks)",
          "[norm][threads]") {
  ThreadsGuard guard;
  Generator gen(5);
  auto x0 = Tensor<float>::randn({333, 512}, Device::cpu(), 0.5, 2.0, gen);
  auto gy = Tensor<float>::randn({333, 512}, Device::cpu(), 0.0, 1.0, gen);
  auto run = [&](int threads) {
    set_num_threads(threads);
    nn::LayerNorm ln(512);
    auto x = Tensor<float>(x0.detach().clone()).set_requires_grad();
    auto y = ln(x);
    y.backward(gy);
    return std::vector<std::vector<float>>{to_vec<float>(y), to_vec<float>(x.grad()), to_vec<float>(ln.weight.grad()),
                                           to_vec<float>(ln.bias.grad())};
  };
  const auto one = run(1), two = run(2), four = run(4);
  REQUIRE(one == two);
  REQUIRE(one == four);
  // bias gradient = column sums of gy
  const auto g = gy.to_double_vector();
  for (int64_t j = 0; j < 512; j += 51) {
    double s = 0;
    for (int64_t r = 0; r < 333; ++r) s += g[static_cast<size_t>(r * 512 + j)];
    REQUIRE(std::abs(one[3][static_cast<size_t>(j)] - s) < 1e-4);
  }
}

TEST_CASE("parity: fused layer_norm and rms_norm kernels, CPU versus CUDA", "[norm][cuda][parity]") {
  EMBER_REQUIRE_GPU();
  // 256, 520, 1024 and 40 columns: packed rows (kernels/norm.cuh) at 1 to 8 packs per lane; 33:
  // no whole number of packs; 3000: a block per row.
  const std::pair<int64_t, int64_t> shapes[] = {{7, 33}, {130, 1024}, {5, 3000}, {1, 1}, {64, 256}, {9, 520}, {33, 40}};
  for (DType t : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
    const double tol = t == DType::Float64 ? 1e-10 : t == DType::Float32 ? 2e-5 : t == DType::Float16 ? 4e-3 : 3e-2;
    for (const auto& [rows, cols] : shapes) {
      for (bool rms : {false, true}) {
        Generator gen(static_cast<uint64_t>(rows * 131 + cols));
        AnyTensor x = Tensor<float>::randn({rows, cols}, Device::cpu(), 1.0, 2.0, gen).to(t);
        AnyTensor w = Tensor<float>::randn({cols}, Device::cpu(), 1.0, 0.5, gen).to(t);
        AnyTensor b = rms ? AnyTensor() : Tensor<float>::randn({cols}, Device::cpu(), 0.0, 0.5, gen).to(t);
        AnyTensor gy = Tensor<float>::randn({rows, cols}, Device::cpu(), 0.0, 1.0, gen).to(t);
        auto run = [&](Device d) {
          return output_and_grads_on(d, x, w, b, gy, [&](const AnyTensor& xd, const AnyTensor& wd, const AnyTensor& bd) {
            return rms ? op::rms_norm(xd, cols, wd, 1e-5) : op::layer_norm(xd, cols, wd, bd, 1e-5);
          });
        };
        auto c = run(Device::cpu()), g = run(Device::cuda(0));
        INFO(dtype_name(t) << " " << rows << "x" << cols << " rms " << rms);
        for (size_t k = 0; k < c.size(); ++k) {
          // the parameter gradients sum over rows: scale the tolerance with them
          const double scale = k >= 2 ? std::sqrt(static_cast<double>(rows)) : 1.0;
          REQUIRE(max_rel_diff(g[k], c[k]) < tol * scale);
        }
      }
    }
  }
}

TEST_CASE("fused norms on a device: nn::LayerNorm on cuda:0 (pretend device in CI) equals the CPU", "[norm]") {
  testing::PretendGpu pretend;
  if (!testing::cuda_device_or_skip()) return;
  Generator gen(9);
  auto x = Tensor<float>::randn({6, 40}, Device::cpu(), 0.0, 1.0, gen);
  nn::LayerNorm ln(40);
  auto yc = ln(x).to_double_vector();
  ln.to(Device::cuda(0));
  auto xd = Tensor<float>(x.to(Device::cuda(0))).set_requires_grad();
  auto yd = ln(xd);
  REQUIRE(yd.device() == Device::cuda(0));
  REQUIRE(max_rel_diff(yd.to(Device::cpu()).to_double_vector(), yc) < 2e-5);
  sum(yd).backward();
  REQUIRE(xd.grad().device() == Device::cuda(0));
  REQUIRE(ln.weight.grad().device() == Device::cuda(0));
  // d sum(y) / d bias = rows
  for (double v : ln.bias.grad().to(Device::cpu()).to_double_vector()) REQUIRE(std::abs(v - 6.0) < 1e-5);
}
