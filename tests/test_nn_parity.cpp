// CPU vs CUDA parity for every layer (forward, input and parameter gradients) and every optimizer
// step. Runs when a GPU is present; otherwise the GPU cases print "SKIPPED: no GPU", and the
// harness itself is exercised against the pretend device (CPU kernels posing as cuda:0).
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <memory>

#include "gpu_skip.hpp"
#include "pretend_gpu.hpp"
#include <ember/ember.hpp>

using namespace ember;

namespace {

using Factory = std::function<std::shared_ptr<nn::Module>()>;

struct LayerCase {
  std::string name;
  Factory make;
  Shape input;
  bool train = true;
  double tol = 1e-4;  // relative to the reference's magnitude (fp32, GEMM-based layers)
};

void check_close(const AnyTensor& ref, const AnyTensor& got, double tol, const std::string& what) {
  INFO(what << ": " << ref.desc() << " vs " << got.desc());
  REQUIRE(ref.shape() == got.shape());
  auto a = ref.to_double_vector(), b = got.to_double_vector();
  double scale = 1e-6, worst = 0;
  for (double v : a) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  INFO("worst error " << worst << " (scale " << scale << ")");
  CHECK(worst <= tol * scale);
}

// Builds the layer twice from the same seed (identical parameters), runs one on the CPU and one
// on cuda:0 with the same input, dropout stream and upstream gradient, and compares everything.
void run_layer(const LayerCase& c) {
  manual_seed(7);
  auto cpu_m = c.make();
  manual_seed(7);
  auto gpu_m = c.make();
  gpu_m->to(Device::cuda(0));
  cpu_m->train(c.train);
  gpu_m->train(c.train);
  Generator g(11);
  auto x = Tensor<float>::randn(c.input, Device::cpu(), 0.0, 1.0, g).set_requires_grad();
  auto xg = x.detach().to(Device::cuda(0)).set_requires_grad();
  default_generator().set_state(99, 0);
  AnyTensor y = cpu_m->forward_any(x);
  default_generator().set_state(99, 0);
  AnyTensor yg = gpu_m->forward_any(xg);
  check_close(y, yg, c.tol, c.name + " forward");
  auto gy = Tensor<float>::randn(y.shape(), Device::cpu(), 0.0, 1.0, g);
  y.backward(gy);
  yg.backward(gy.to(Device::cuda(0)));
  check_close(x.grad(), xg.grad(), c.tol * 4, c.name + " input gradient");
  auto pc = cpu_m->named_parameters(), pg = gpu_m->named_parameters();
  REQUIRE(pc.size() == pg.size());
  for (size_t i = 0; i < pc.size(); ++i) {
    REQUIRE(pg[i].second.device() == Device::cuda(0));
    check_close(pc[i].second.grad(), pg[i].second.grad(), c.tol * 4, c.name + " grad of " + pc[i].first);
  }
  auto bc = cpu_m->named_buffers(), bg = gpu_m->named_buffers();
  for (size_t i = 0; i < bc.size(); ++i)
    if (is_floating(bc[i].second.dtype())) check_close(bc[i].second, bg[i].second, c.tol, c.name + " " + bc[i].first);
}

template <class M, class... A>
Factory make(A... args) {
  return [=]() -> std::shared_ptr<nn::Module> { return std::make_shared<M>(args...); };
}

std::vector<LayerCase> layer_cases() {
  return {
      {"Linear", make<nn::Linear>(int64_t{24}, int64_t{16}), {8, 24}},
      {"Conv2d groups 2 stride 2", make<nn::Conv2d>(int64_t{4}, int64_t{6}, int64_t{3},
                                                    nn::Conv2dOptions{.stride = {2, 2}, .padding = {1, 1}, .groups = 2}),
       {2, 4, 9, 9}},
      // cuDNN rejects empty tensors: the backend must give the CPU's zeros itself.
      {"Conv2d empty batch", make<nn::Conv2d>(int64_t{4}, int64_t{6}, int64_t{3}, nn::Conv2dOptions{.padding = {1, 1}}),
       {0, 4, 5, 5}},
      {"MaxPool2d", make<nn::MaxPool2d>(int64_t{2}), {2, 3, 8, 8}},
      {"AvgPool2d", make<nn::AvgPool2d>(int64_t{3}, int64_t{2}, int64_t{1}), {2, 3, 9, 9}},
      {"AdaptiveAvgPool2d", make<nn::AdaptiveAvgPool2d>(int64_t{3}), {2, 3, 8, 7}},
      {"BatchNorm1d train", make<nn::BatchNorm1d>(int64_t{6}), {10, 6}},
      {"BatchNorm2d train", make<nn::BatchNorm2d>(int64_t{3}), {4, 3, 5, 5}},
      {"BatchNorm2d eval", make<nn::BatchNorm2d>(int64_t{3}), {4, 3, 5, 5}, false},
      {"LayerNorm", make<nn::LayerNorm>(int64_t{32}), {4, 5, 32}},
      {"Dropout", make<nn::Dropout>(0.3), {16, 16}},
      {"ReLU", make<nn::ReLU>(), {7, 9}},
      {"GELU", make<nn::GELU>(std::string("none")), {7, 9}},
      {"GELU tanh", make<nn::GELU>(std::string("tanh")), {7, 9}},
      {"SiLU", make<nn::SiLU>(), {7, 9}},
      {"Tanh", make<nn::Tanh>(), {7, 9}},
      {"Sigmoid", make<nn::Sigmoid>(), {7, 9}},
      {"Softmax", make<nn::Softmax>(1), {7, 9}},
      {"Flatten", make<nn::Flatten>(), {2, 3, 4, 5}},
      {"MultiheadAttention", make<nn::MultiheadAttention>(int64_t{32}, int64_t{4}), {2, 10, 32}},
      {"TransformerBlock", make<nn::TransformerBlock>(int64_t{32}, int64_t{4}), {2, 10, 32}},
  };
}

// Three optimizer steps on the same parameters and gradients on both devices.
template <class Opt, class Options>
void run_optimizer(const std::string& name, const Options& options) {
  Generator g(5);
  auto p_cpu = Tensor<float>::randn({64}, Device::cpu(), 0.0, 1.0, g).set_requires_grad();
  auto p_gpu = p_cpu.detach().to(Device::cuda(0)).set_requires_grad();
  Opt oc({p_cpu}, options), og({p_gpu}, options);
  for (int s = 0; s < 3; ++s) {
    auto grad = Tensor<float>::randn({64}, Device::cpu(), 0.0, 1.0, g);
    p_cpu.set_grad(grad.clone());
    p_gpu.set_grad(grad.to(Device::cuda(0)));
    oc.step();
    og.step();
  }
  check_close(p_cpu, p_gpu, 1e-5, name + " after 3 steps");
}

void run_all_optimizers() {
  run_optimizer<optim::SGD>("SGD nesterov", optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true});
  run_optimizer<optim::Adam>("Adam amsgrad", optim::AdamOptions{.lr = 0.01, .weight_decay = 0.01, .amsgrad = true});
  run_optimizer<optim::AdamW>("AdamW", optim::AdamOptions{.lr = 0.01});
  run_optimizer<optim::RMSprop>("RMSprop centered momentum",
                                optim::RMSpropOptions{.lr = 0.01, .momentum = 0.9, .centered = true});
}

}  // namespace

TEST_CASE("layer parity CPU vs CUDA (float32): forward, input and parameter gradients", "[parity][gpu][nn]") {
  EMBER_REQUIRE_GPU();
  for (const LayerCase& c : layer_cases()) {
    SECTION(c.name) { run_layer(c); }
  }
}

TEST_CASE("optimizer step parity CPU vs CUDA", "[parity][gpu][optim]") {
  EMBER_REQUIRE_GPU();
  run_all_optimizers();
}

TEST_CASE("layer and optimizer parity harness runs end to end against a pretend device when there is no GPU",
          "[parity][nn]") {
  testing::PretendGpu pretend;
  if (!pretend.active) return;  // with a GPU the real tests above run
  for (const LayerCase& c : layer_cases()) {
    SECTION(c.name) { run_layer(c); }
  }
  SECTION("optimizers") { run_all_optimizers(); }
}
