// Anomaly detection (autograd::detect_anomaly): forward outputs and backward gradients
// checked for non-finite values, the error naming the op, the module path and, in backward, the
// forward op that created the node; off by default.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <memory>
#include <thread>

#include <ember/ember.hpp>

using namespace ember;
using Catch::Contains;

namespace {
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// A module that takes the log of its input: log of a negative number is NaN in forward; the
// derivative 1/x at 0 is inf in backward.
class LogLayer : public nn::ModuleBase<LogLayer> {
 public:
  std::string type_name() const override { return "LogLayer"; }
  template <class T>
  Tensor<T> forward(const Tensor<T>& x) {
    return log(x);
  }
};

class Net : public nn::ModuleBase<Net> {
 public:
  Net() {
    fc = register_module("fc", std::make_shared<nn::Linear>(3, 3));
    act = register_module("act", std::make_shared<LogLayer>());
  }
  std::string type_name() const override { return "Net"; }
  template <class T>
  Tensor<T> forward(const Tensor<T>& x) {
    return (*act)(x * (*fc)(x));
  }
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<LogLayer> act;
};
}  // namespace

TEST_CASE("anomaly: off by default, NaN flows silently", "[anomaly]") {
  CHECK_FALSE(autograd::is_anomaly_enabled());
  auto x = Tensor<double>::from_vector({-1.0, 2.0}, Shape{2}).set_requires_grad(true);
  auto y = sum(log(x));
  CHECK(std::isnan(y.item()));
  y.backward();
  CHECK(x.grad().to_vector() == std::vector<double>{-1.0, 0.5});
}

TEST_CASE("anomaly: a NaN output in forward names the op", "[anomaly]") {
  auto x = Tensor<double>::from_vector({-1.0, 2.0}, Shape{2}).set_requires_grad(true);
  autograd::detect_anomaly guard;
  CHECK(autograd::is_anomaly_enabled());
  CHECK_THROWS_AS(log(x), AutogradError);
  CHECK_THROWS_WITH(log(x), Contains("detect_anomaly: op 'log' returned nan values in its 0th output") &&
                                Contains("float64[2] on cpu") && Contains("in forward"));
  // Infinities pass in forward by default (masks, log(0)) ...
  auto z = Tensor<double>::from_vector({0.0, 1.0}, Shape{2}).set_requires_grad(true);
  CHECK(log(z).to_vector()[0] == -std::numeric_limits<double>::infinity());
  // ... and are rejected when asked.
  autograd::detect_anomaly strict(true);
  CHECK_THROWS_WITH(log(z), Contains("op 'log' returned inf values"));
}

TEST_CASE("anomaly: nn::recompute's node checks its outputs, also when no argument requires grad", "[anomaly]") {
  // The function runs under NoGradGuard in forward (its ops record nothing), so the check is the
  // one autograd::record makes for the recompute node itself.
  auto w = Tensor<double>::from_vector({1.0, 1.0}, Shape{2}).set_requires_grad(true);
  auto fn = [w](const Tensor<double>& t) { return log(t * w); };
  autograd::detect_anomaly guard;
  for (bool input_requires_grad : {true, false}) {
    INFO("input requires grad: " << input_requires_grad);
    auto x = Tensor<double>::from_vector({-1.0, 2.0}, Shape{2}).set_requires_grad(input_requires_grad);
    CHECK_THROWS_WITH(nn::recompute(fn, x), Contains("op 'RecomputeBackward' returned nan values"));
    auto positive = Tensor<double>::from_vector({1.0, 2.0}, Shape{2}).set_requires_grad(input_requires_grad);
    CHECK(nn::recompute(fn, positive).grad_fn_name() == "RecomputeBackward");
  }
}

TEST_CASE("anomaly: the forward error names the module path", "[anomaly]") {
  Net net;
  net.to(DType::Float64);
  auto x = Tensor<double>::from_vector({-1.0, 2.0, 3.0}, Shape{1, 3});
  {
    NoGradGuard ng;  // make fc(x) all ones so that x * fc(x) = x, whose log is NaN at -1
    for (auto& p : net.fc->parameters()) p.copy_(AnyTensor::zeros(p.shape(), p.dtype()));
    net.fc->parameters()[1].copy_(AnyTensor::full(Shape{3}, 1.0, DType::Float64));
  }
  autograd::detect_anomaly guard;
  CHECK_THROWS_WITH(net(x), Contains("op 'log'") && Contains("in module 'act' (LogLayer)"));
  // Through Sequential (forward_any) the path is dotted.
  nn::Sequential seq;
  seq.push_back(std::make_shared<LogLayer>());
  CHECK_THROWS_WITH(seq.forward_any(x.detach().set_requires_grad(true)),
                    Contains("op 'log'") && Contains("in module '0' (LogLayer)"));
}

TEST_CASE("anomaly: a non-finite gradient in backward names the node and where forward made it", "[anomaly]") {
  // sqrt(0) = 0 is fine in forward; its derivative 0.5 / sqrt(0) is inf in backward.
  auto x = Tensor<double>::from_vector({0.0, 4.0}, Shape{2}).set_requires_grad(true);
  autograd::detect_anomaly guard;
  auto y = sum(sqrt(x) * 2.0);
  CHECK_THROWS_AS(y.backward(), AutogradError);
  auto y2 = sum(sqrt(x) * 2.0);
  CHECK_THROWS_WITH(y2.backward(), Contains("detect_anomaly: the backward of 'sqrt' returned inf values in its 0th "
                                            "output") &&
                                       Contains("float64[2] on cpu") && Contains("created in forward by op 'sqrt'"));
  // In a module: the module path of the op that made the node.
  Net net;
  net.to(DType::Float64);
  {
    NoGradGuard ng;
    for (auto& p : net.fc->parameters()) p.copy_(AnyTensor::zeros(p.shape(), p.dtype()));
  }
  // x * fc(x) = 0 everywhere: log(0) = -inf passes forward, 1/0 = inf in backward (log's node).
  auto in = Tensor<double>::from_vector({1.0, 2.0, 3.0}, Shape{1, 3});
  auto out = net(in);
  CHECK_THROWS_WITH(sum(out).backward(), Contains("the backward of 'log' returned inf") &&
                                             Contains("created in forward by op 'log' in module 'act' (LogLayer)"));
}

TEST_CASE("anomaly: the guard nests and restores, and a finite training step is unchanged", "[anomaly]") {
  {
    autograd::detect_anomaly a;
    {
      autograd::detect_anomaly b;
      CHECK(autograd::is_anomaly_enabled());
    }
    CHECK(autograd::is_anomaly_enabled());
  }
  CHECK_FALSE(autograd::is_anomaly_enabled());
  // Same gradients with and without the guard.
  auto run = [](bool anomaly) {
    nn::Linear lin(3, 2);
    lin.to(DType::Float64);
    {
      NoGradGuard ng;
      lin.parameters()[0].copy_(Tensor<double>::from_vector({0.1, 0.2, 0.3, -0.1, 0.4, 0.5}, Shape{2, 3}));
      lin.parameters()[1].copy_(Tensor<double>::from_vector({0.1, -0.2}, Shape{2}));
    }
    auto x = Tensor<double>::from_vector({1.0, 2.0, 0.5}, Shape{1, 3});
    std::unique_ptr<autograd::detect_anomaly> g;
    if (anomaly) g = std::make_unique<autograd::detect_anomaly>();
    auto loss = sum(relu(lin(x)));
    loss.backward();
    return lin.parameters()[0].grad().to_double_vector();
  };
  const std::vector<double> with = run(true), without = run(false);
  CHECK(with == without);
  CHECK(with == std::vector<double>{1.0, 2.0, 0.5, 1.0, 2.0, 0.5});  // both units active
  // Another thread is not affected by this thread's guard.
  autograd::detect_anomaly guard;
  bool other = true;
  std::thread t([&] { other = autograd::is_anomaly_enabled(); });
  t.join();
  CHECK_FALSE(other);
  (void)kNan;
}
