// Batch normalisation's fused op (ops/batch_norm.hpp) and its kernel-table entries
// (Backend::runs_batch_norm, batch_norm_forward, batch_norm_backward; the CPU's in
// backend/cpu/batch_norm.hpp): the op against the composition nn::BatchNorm uses elsewhere, in
// fp32 and fp64, its finite-difference gradients, the same bits at 1 and 2 threads, and the error
// paths: what the op refuses, the CPU entries' dtypes, and a backend without the kernel (whose
// entries raise by default and where nn::BatchNorm keeps the composition).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <ember/backend/cpu/cpu_backend.hpp>
#include <ember/ember.hpp>
#include <ember/ops/batch_norm.hpp>

#include "gradcheck.hpp"
#include "pretend_gpu.hpp"
#include "test_util.hpp"

using namespace ember;
using ember::testing::ThreadsGuard;
using Catch::Contains;

namespace {

// BatchNorm2d's former composition (mean, subtract, square, mean, rsqrt, multiply, add), as the
// reference of the fused op.
template <class T>
Tensor<T> batch_norm_composed(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& b, double eps) {
  std::vector<int> dims{0};
  for (int i = 2; i < x.dim(); ++i) dims.push_back(i);
  std::vector<int64_t> cs(static_cast<size_t>(x.dim()), 1);
  cs[1] = x.shape()[1];
  Tensor<T> mu = mean(x, dims, true);
  Tensor<T> d = x - mu;
  Tensor<T> var = mean(square(d), dims, true);
  Tensor<T> y = d * reciprocal(sqrt(var + eps));
  if (w.defined()) y = y * w.reshape(Shape(cs)) + b.reshape(Shape(cs));
  return y;
}

template <class T>
std::vector<std::vector<double>> bn_run(bool fused, const Tensor<double>& x0, const Tensor<double>& w0,
                                        const Tensor<double>& b0, const Tensor<double>& gy0) {
  auto x = x0.to<T>().detach().set_requires_grad();
  Tensor<T> w, b;
  if (w0.defined()) {
    w = w0.to<T>().detach().set_requires_grad();
    b = b0.to<T>().detach().set_requires_grad();
  }
  Tensor<T> y = fused ? Tensor<T>(op::batch_norm_train(x, w, b, 1e-5).y) : batch_norm_composed(x, w, b, 1e-5);
  y.backward(gy0.to<T>());
  std::vector<std::vector<double>> r{y.template to<double>().to_vector(), x.grad().template to<double>().to_vector()};
  if (w.defined()) {
    r.push_back(w.grad().template to<double>().to_vector());
    r.push_back(b.grad().template to<double>().to_vector());
  }
  return r;
}

}  // namespace

TEST_CASE("fused CPU batch norm equals the composition: values and gradients, fp32 and fp64", "[batch_norm]") {
  for (bool affine : {true, false}) {
    for (const Shape& s : {Shape{4, 3, 5, 6}, Shape{7, 5}, Shape{2, 4, 9}}) {
      SECTION(std::string(affine ? "affine " : "no affine ") + s.str()) {
        auto x = Tensor<double>::randn(s) * 3.0 + 1.5;
        auto gy = Tensor<double>::randn(s);
        Tensor<double> w, b;
        if (affine) {
          w = Tensor<double>::randn({s[1]});
          b = Tensor<double>::randn({s[1]});
        }
        auto ref = bn_run<double>(false, x, w, b, gy);
        auto f64 = bn_run<double>(true, x, w, b, gy);
        auto f32 = bn_run<float>(true, x, w, b, gy);
        REQUIRE(ref.size() == f64.size());
        for (size_t k = 0; k < ref.size(); ++k)
          for (size_t i = 0; i < ref[k].size(); ++i) {
            CHECK(f64[k][i] == Approx(ref[k][i]).margin(1e-10));
            CHECK(f32[k][i] == Approx(ref[k][i]).margin(2e-5 * (k >= 2 ? static_cast<double>(s.numel()) : 1.0)));
          }
      }
    }
  }
}

TEST_CASE("fused CPU batch norm: finite-difference gradients in double", "[batch_norm][grad]") {
  for (uint64_t seed : {1, 2}) {
    CHECK_GRADIENTS([](const std::vector<AnyTensor>& in) { return op::batch_norm_train(in[0], in[1], in[2], 1e-5).y; },
                    testing::random_inputs({{3, 4, 3, 5}, {4}, {4}}, seed));
    CHECK_GRADIENTS([](const std::vector<AnyTensor>& in) { return op::batch_norm_train(in[0], {}, {}, 1e-3).y; },
                    testing::random_inputs(std::vector<Shape>{Shape{6, 3}}, seed));
  }
}

TEST_CASE("nn::BatchNorm2d on the CPU: fused in training (running stats as before), same bits at 1 and 2 threads",
          "[batch_norm][threads]") {
  ThreadsGuard guard;
  // 64 x 32 x 28 x 28, the CNN's first batch norm: more channels and planes than one chunk.
  auto x = Tensor<float>::randn({64, 32, 28, 28}) * 2.0f + 0.5f;
  auto gy = Tensor<float>::randn({64, 32, 28, 28});
  std::vector<std::vector<float>> runs[2];
  for (int t : {1, 2}) {
    set_num_threads(t);
    manual_seed(3);
    nn::BatchNorm2d bn(32);
    {
      NoGradGuard no_grad;
      bn.weight.copy_(Tensor<float>::randn({32}));
    }
    auto xr = x.detach().set_requires_grad();
    auto y = bn(xr);
    y.backward(gy);
    runs[t - 1] = {y.to_vector(), xr.grad().to_vector(), Tensor<float>(bn.weight.grad()).to_vector(),
                   Tensor<float>(bn.bias.grad()).to_vector(), Tensor<float>(bn.running_mean).to_vector(),
                   Tensor<float>(bn.running_var).to_vector()};
  }
  for (size_t k = 0; k < runs[0].size(); ++k) CHECK(runs[0][k] == runs[1][k]);
  // Running statistics: momentum 0.1 from (0, 1), with the unbiased batch variance.
  auto xd = x.to<double>();
  auto mu = mean(xd, {0, 2, 3}).to_vector();
  auto var = mean(square(xd - mean(xd, {0, 2, 3}, true)), {0, 2, 3}).to_vector();
  const double m = 64.0 * 28 * 28;
  for (size_t c = 0; c < 32; ++c) {
    CHECK(runs[0][4][c] == Approx(0.1 * mu[c]).margin(1e-6));
    CHECK(runs[0][5][c] == Approx(0.9 + 0.1 * var[c] * m / (m - 1)).epsilon(1e-5));
  }
}

TEST_CASE("fused CPU batch norm refuses what it does not take, naming the op and tensors", "[batch_norm][errors]") {
  auto h = Tensor<half>::ones({2, 3, 4});
  CHECK_FALSE(op::batch_norm_fused_applies(h, {}, {}));
  CHECK_THROWS_AS(op::batch_norm_train(h, {}, {}, 1e-5), ValueError);
  CHECK_THROWS_WITH(op::batch_norm_train(h, {}, {}, 1e-5), Contains("batch_norm") && Contains("float16"));
  auto x = Tensor<float>::ones({2, 3, 4});
  auto w64 = Tensor<double>::ones({3});
  CHECK_FALSE(op::batch_norm_fused_applies(x, w64, {}));
  CHECK_THROWS_WITH(op::batch_norm_train(x, w64, {}, 1e-5), Contains("weight") && Contains("float64"));
  auto wrong = Tensor<float>::ones({4});
  CHECK_FALSE(op::batch_norm_fused_applies(x, wrong, {}));
  CHECK(op::batch_norm_fused_applies(x, Tensor<float>::ones({3}), Tensor<float>::zeros({3})));
  // nn::BatchNorm1d with fp16 input keeps the composition (no error) and computes in fp32 inside.
  nn::BatchNorm1d bn(3);
  auto y = bn(Tensor<float>::randn({4, 3}).to<half>());
  CHECK(y.dtype() == DType::Float16);
}

// ---------------------------------------------------------------- the kernel-table entries

namespace {

// A backend without the fused batch norm, standing in for cuda:0 with the CPU's other kernels (so
// the composition runs on it). Its three batch-norm entries are the table's defaults, which a
// backend that does not override them (CUDA) gets.
class NoFusedBatchNormBackend : public cpu::CpuBackend {
 public:
  Device device() const override { return Device::cuda(0); }
  bool runs_batch_norm(const BatchNormArgs& a) const override { return Backend::runs_batch_norm(a); }
  void batch_norm_forward(const BatchNormArgs& a, const void* x, const void* w, const void* b, void* y, void* mean,
                          void* var, void* invstd) override {
    Backend::batch_norm_forward(a, x, w, b, y, mean, var, invstd);
  }
  void batch_norm_backward(const BatchNormArgs& a, const void* x, const void* w, const void* mean, const void* invstd,
                           const void* gy, void* gx, void* gw, void* gb) override {
    Backend::batch_norm_backward(a, x, w, mean, invstd, gy, gx, gw, gb);
  }
};

// cuda:0 served by NoFusedBatchNormBackend for a scope, on a machine without a GPU. With one, cuda:0
// stays the CUDA backend, which has no fused batch norm either.
using NoFusedBatchNormDevice = testing::StandIn<NoFusedBatchNormBackend>;

}  // namespace

TEST_CASE("batch norm table entries by default: the backend says no, the entries raise naming entry, dtype, device",
          "[batch_norm][errors]") {
  NoFusedBatchNormBackend be;
  const BatchNormArgs a{DType::Float32, 2, 3, 4, 1e-5};
  CHECK_FALSE(be.runs_batch_norm(a));
  std::vector<float> x(24, 1.0f), y(24, 7.0f), stats(3, 7.0f), gx(24, 7.0f);
  auto forward = [&] {
    be.batch_norm_forward(a, x.data(), nullptr, nullptr, y.data(), stats.data(), stats.data(), stats.data());
  };
  auto backward = [&] {
    be.batch_norm_backward(a, x.data(), nullptr, stats.data(), stats.data(), x.data(), gx.data(), nullptr, nullptr);
  };
  CHECK_THROWS_AS(forward(), DeviceError);
  CHECK_THAT(testing::message_of(forward),
             Contains("batch_norm_forward") && Contains("cuda:0") && Contains("float32") && Contains("[2, 3, 4]"));
  CHECK_THROWS_AS(backward(), DeviceError);
  CHECK_THAT(testing::message_of(backward),
             Contains("batch_norm_backward") && Contains("cuda:0") && Contains("float32"));
  // Nothing was written.
  CHECK(y == std::vector<float>(24, 7.0f));
  CHECK(gx == std::vector<float>(24, 7.0f));
  // The CPU runs the same problem.
  CHECK(backend_for(Device::cpu()).runs_batch_norm(a));
}

TEST_CASE("CPU batch norm table entries take float32 and float64 only, other dtypes raise naming entry and dtype",
          "[batch_norm][errors]") {
  Backend& be = backend_for(Device::cpu());
  for (DType t : {DType::Float32, DType::Float64}) CHECK(be.runs_batch_norm(BatchNormArgs{t, 2, 3, 4, 1e-5}));
  for (DType t : {DType::Float16, DType::BFloat16, DType::Int64, DType::Int32, DType::UInt8}) {
    const BatchNormArgs a{t, 2, 3, 4, 1e-5};
    CHECK_FALSE(be.runs_batch_norm(a));
    // The op asks first; called anyway, the entries refuse before touching memory.
    auto forward = [&] { be.batch_norm_forward(a, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr); };
    auto backward = [&] {
      be.batch_norm_backward(a, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
    };
    CHECK_THROWS_AS(forward(), DTypeError);
    CHECK_THAT(testing::message_of(forward),
               Contains("batch_norm_forward") && Contains(dtype_name(t)) && Contains("cpu"));
    CHECK_THROWS_AS(backward(), DTypeError);
    CHECK_THAT(testing::message_of(backward), Contains("batch_norm_backward") && Contains(dtype_name(t)));
  }
  // Through the op: a ValueError naming the op, the dtype and the device.
  auto bf = Tensor<bfloat16>::ones({2, 3, 4});
  CHECK_FALSE(op::batch_norm_fused_applies(bf, {}, {}));
  CHECK_THROWS_AS(op::batch_norm_train(bf, {}, {}, 1e-5), ValueError);
  CHECK_THAT(testing::message_of([&] { op::batch_norm_train(bf, {}, {}, 1e-5); }),
             Contains("batch_norm") && Contains("bfloat16") && Contains("cpu"));
}

TEST_CASE("a backend without the fused batch norm: the op refuses, nn::BatchNorm2d keeps the composition there",
          "[batch_norm][errors]") {
  NoFusedBatchNormDevice device;
  const Device dev = Device::cuda(0);
  manual_seed(5);
  auto x = Tensor<float>::randn({4, 3, 5, 6}) * 2.0f + 0.5f;
  auto gy = Tensor<float>::randn({4, 3, 5, 6});
  auto w = Tensor<float>::randn({3});
  auto b = Tensor<float>::randn({3});
  CHECK(op::batch_norm_fused_applies(x, w, b));
  CHECK_FALSE(op::batch_norm_fused_applies(x.to(dev), w.to(dev), b.to(dev)));
  auto refused = [&] { op::batch_norm_train(x.to(dev), w.to(dev), b.to(dev), 1e-5); };
  CHECK_THROWS_AS(refused(), ValueError);
  CHECK_THAT(testing::message_of(refused),
             Contains("batch_norm") && Contains("cuda:0") && Contains("float32") && Contains("composition"));

  // The same layer on the CPU (the fused op) and on the device (the composition): the same
  // function within fp32 rounding, the same running statistics.
  std::vector<std::vector<float>> runs[2];
  std::string grad_fn[2];
  for (int k : {0, 1}) {
    const Device d = k == 0 ? Device::cpu() : dev;
    nn::BatchNorm2d bn(3);
    {
      NoGradGuard no_grad;
      bn.weight.copy_(w);
      bn.bias.copy_(b);
    }
    bn.to(d);
    auto xr = x.to(d).detach().set_requires_grad();
    auto y = bn(xr);
    grad_fn[k] = y.grad_fn_name();
    y.backward(gy.to(d));
    auto host = [](const AnyTensor& t) { return Tensor<float>(t.to(Device::cpu())).to_vector(); };
    runs[k] = {host(y), host(xr.grad()), host(bn.weight.grad()), host(bn.bias.grad()), host(bn.running_mean),
               host(bn.running_var)};
  }
  CHECK(grad_fn[0] == "batch_norm");
  CHECK(grad_fn[1] != "batch_norm");
  const double m = 4.0 * 5 * 6;  // elements per channel
  for (size_t k = 0; k < runs[0].size(); ++k) {
    REQUIRE(runs[1][k].size() == runs[0][k].size());
    const double tol = k == 2 || k == 3 ? 2e-5 * m : 2e-5;
    for (size_t i = 0; i < runs[0][k].size(); ++i) CHECK(runs[1][k][i] == Approx(runs[0][k][i]).margin(tol));
  }
}
