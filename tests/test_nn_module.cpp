// nn::Module: registration and dotted names, traversal, modes, device/dtype moves,
// state_dict round trips and strict loading errors; Linear, Sequential, Embedding, activations.
#include <catch2/catch.hpp>

#include "gradcheck.hpp"

using namespace ember;
using Catch::Contains;

namespace {
// A custom module written as a plain struct, as the docs show.
struct TwoLayer : nn::ModuleBase<TwoLayer> {
  std::shared_ptr<nn::Linear> fc1, fc2;
  TwoLayer(int64_t in, int64_t hidden, int64_t out) {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(in, hidden));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(hidden, out));
  }
  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    return (*fc2)(relu((*fc1)(x)));
  }
};

struct WithBuffer : nn::ModuleBase<WithBuffer> {
  AnyTensor scale, count;
  WithBuffer() {
    scale = register_parameter("scale", Tensor<float>::ones({2}));
    count = register_buffer("count", Tensor<int64_t>::zeros({1}));
  }
  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    return x * nn::param_as<T>(scale);
  }
};
}  // namespace

TEST_CASE("module: dotted names, counts and PyTorch's state_dict order", "[nn][module]") {
  nn::Sequential seq;
  seq.push_back(std::make_shared<TwoLayer>(4, 8, 3));
  seq.emplace<nn::ReLU>();
  seq.push_back(std::make_shared<WithBuffer>());
  auto names = seq.named_parameters();
  std::vector<std::string> got;
  for (auto& [n, p] : names) got.push_back(n);
  CHECK(got == std::vector<std::string>{"0.fc1.weight", "0.fc1.bias", "0.fc2.weight", "0.fc2.bias", "2.scale"});
  CHECK(seq.named_buffers().size() == 1);
  CHECK(seq.named_buffers()[0].first == "2.count");
  CHECK(seq.parameter_count() == 4 * 8 + 8 + 8 * 3 + 3 + 2);
  auto sd = seq.state_dict();
  CHECK(sd.size() == 6);
  CHECK(sd.back().first == "2.count");
  for (auto& [n, p] : names) {
    CHECK(p.requires_grad());
    CHECK(p.is_leaf());
  }
}

TEST_CASE("module: registration errors name the module and the name", "[nn][module]") {
  WithBuffer m;
  CHECK_THROWS_WITH(m.register_parameter("scale", Tensor<float>::ones({1})), Contains("already registered"));
  CHECK_THROWS_WITH(m.register_parameter("a.b", Tensor<float>::ones({1})), Contains("no dots"));
  CHECK_THROWS_WITH(m.register_parameter("ints", Tensor<int32_t>::ones({1})), Contains("floating point"));
}

TEST_CASE("module: train and eval propagate to children", "[nn][module]") {
  TwoLayer m(2, 3, 1);
  CHECK(m.is_training());
  m.eval();
  CHECK_FALSE(m.is_training());
  CHECK_FALSE(m.fc1->is_training());
  m.train();
  CHECK(m.fc2->is_training());
}

TEST_CASE("module: state_dict round trip and strict loading", "[nn][module][state]") {
  manual_seed(1);
  TwoLayer a(4, 5, 2);
  manual_seed(2);
  TwoLayer b(4, 5, 2);
  auto x = Tensor<float>::randn({3, 4});
  CHECK(a(x).to_vector() != b(x).to_vector());
  b.load_state_dict(a.state_dict());
  CHECK(a(x).to_vector() == b(x).to_vector());
  // Loading copies values: later changes to a do not reach b.
  {
    NoGradGuard ng;
    a.fc1->weight.copy_(op::mul(a.fc1->weight, 2.0));
  }
  CHECK(a(x).to_vector() != b(x).to_vector());

  auto sd = a.state_dict();
  nn::StateDict missing(sd.begin() + 1, sd.end());
  CHECK_THROWS_WITH(b.load_state_dict(missing), Contains("missing keys: fc1.weight"));
  auto extra = sd;
  extra.emplace_back("fc3.weight", Tensor<float>::ones({1}));
  CHECK_THROWS_WITH(b.load_state_dict(extra), Contains("unexpected keys: fc3.weight"));
  CHECK_NOTHROW(b.load_state_dict(extra, /*strict=*/false));
  auto wrong = sd;
  wrong[0].second = Tensor<float>::ones({5, 3});
  CHECK_THROWS_WITH(b.load_state_dict(wrong, false), Contains("fc1.weight") && Contains("expected [5, 4]"));
}

TEST_CASE("module: to(dtype) moves parameters in place, so held handles follow", "[nn][module]") {
  TwoLayer m(3, 4, 2);
  AnyTensor held = m.fc1->weight;
  m.to(DType::Float64);
  CHECK(held.dtype() == DType::Float64);
  CHECK(m.fc1->weight.dtype() == DType::Float64);
  auto y = m(Tensor<double>::randn({2, 3}));
  CHECK(y.dtype() == DType::Float64);
  CHECK_THROWS_AS(m.to(DType::Int32), DTypeError);
}

TEST_CASE("Linear: default init bounds, forward, and gradients (double)", "[nn][linear]") {
  nn::Linear lin(16, 4);
  auto w = lin.weight.to_double_vector();
  const double bound = 1.0 / std::sqrt(16.0);
  for (double v : w) CHECK(std::fabs(v) <= bound);
  double spread = 0;
  for (double v : w) spread = std::max(spread, std::fabs(v));
  CHECK(spread > bound * 0.5);  // actually spread over the range
  // y = x W^T + b against a hand loop.
  auto x = Tensor<float>::randn({2, 16});
  auto y = lin(x).to_vector();
  auto xv = x.to_vector();
  auto bv = lin.bias.to_double_vector();
  for (int i = 0; i < 2; ++i)
    for (int o = 0; o < 4; ++o) {
      double s = bv[static_cast<size_t>(o)];
      for (int k = 0; k < 16; ++k) s += xv[static_cast<size_t>(i * 16 + k)] * w[static_cast<size_t>(o * 16 + k)];
      CHECK(y[static_cast<size_t>(i * 4 + o)] == Approx(s).margin(1e-5));
    }
  nn::Linear ld(3, 2, {.bias = true, .dtype = DType::Float64});
  for (uint64_t seed : {1, 2, 3}) {
    CHECK_MODULE_GRADIENTS([&](const std::vector<AnyTensor>& in) { return ld.forward_any(in[0]); },
                           testing::random_inputs({{4, 3}}, seed), ld);
    CHECK_MODULE_GRADIENTS([&](const std::vector<AnyTensor>& in) { return ld.forward_any(in[0]); },
                           testing::random_inputs({{2, 5, 3}}, seed), ld);
  }
  CHECK_THROWS_WITH(lin(Tensor<float>::ones({2, 5})), Contains("Linear(16, 4)") && Contains("float32[2, 5]"));
}

TEST_CASE("Linear in double: gradients through the module reach its parameters", "[nn][linear]") {
  nn::Linear lin(3, 2, {.bias = true, .dtype = DType::Float64});
  auto x = Tensor<double>::randn({5, 3});
  auto loss = sum(square(lin(x)));
  loss.backward();
  // d/dW sum((xW^T+b)^2) = 2 (xW^T+b)^T x, checked against a hand loop.
  auto y = lin(x).to_vector();
  auto xv = x.to_vector();
  auto gw = lin.weight.grad().to_double_vector();
  for (int o = 0; o < 2; ++o)
    for (int k = 0; k < 3; ++k) {
      double s = 0;
      for (int i = 0; i < 5; ++i) s += 2 * y[static_cast<size_t>(i * 2 + o)] * xv[static_cast<size_t>(i * 3 + k)];
      CHECK(gw[static_cast<size_t>(o * 3 + k)] == Approx(s).epsilon(1e-12));
    }
}

TEST_CASE("Sequential and activations compute what their ops compute", "[nn][sequential]") {
  nn::Sequential seq(std::make_shared<nn::Linear>(3, 3), std::make_shared<nn::GELU>("tanh"),
                     std::make_shared<nn::Softmax>(1));
  auto x = Tensor<float>::randn({2, 3});
  auto* lin = dynamic_cast<nn::Linear*>(&seq[0]);
  REQUIRE(lin != nullptr);
  auto ref = softmax(gelu((*lin)(x), true), 1);
  CHECK(seq(x).to_vector() == ref.to_vector());
  CHECK(seq.size() == 3);
  CHECK(nn::Flatten()(Tensor<float>::zeros({2, 3, 4})).shape() == Shape{2, 12});
  CHECK_THROWS_AS(nn::GELU("fast"), ValueError);
}

TEST_CASE("Embedding: N(0,1) init, lookup by int64 and int32, accumulating backward", "[nn][embedding]") {
  manual_seed(3);
  nn::Embedding emb(10, 4);
  auto w = emb.weight.to_double_vector();
  double m = 0;
  for (double v : w) m += v;
  CHECK(std::fabs(m / 40) < 0.5);
  auto ids = Tensor<int64_t>::from_vector({1, 3, 1}, {3});
  AnyTensor out = emb(ids);
  CHECK(out.shape() == Shape{3, 4});
  CHECK(out.to_double_vector()[0] == w[4]);
  AnyTensor out32 = emb(Tensor<int32_t>::from_vector({{9, 0}}, {1, 2}));
  CHECK(out32.shape() == Shape{1, 2, 4});
  op::sum(out).backward();
  auto g = emb.weight.grad().to_double_vector();
  CHECK(g[4] == 2.0);   // id 1 twice
  CHECK(g[12] == 1.0);  // id 3 once
  CHECK(g[0] == 0.0);
  CHECK_THROWS_AS(emb.forward_any(Tensor<float>::zeros({2})), DTypeError);
}

namespace {
// Factories that return their model by value, as a user writes them. The registered parameters,
// buffers and children are handles shared with the layers' own members (nothing registered points
// into the module object), so a move carries them along with nothing to re-point.
nn::Sequential make_mlp() {
  nn::Sequential m;
  m.emplace<nn::Linear>(3, 5);
  m.emplace<nn::ReLU>();
  m.emplace<nn::Linear>(5, 2);
  return m;
}
WithBuffer make_with_buffer(bool flag) {
  WithBuffer a, b;
  return flag ? std::move(a) : std::move(b);  // two candidates: a move, not an elided copy
}
}  // namespace

TEST_CASE("module: a model returned by value or moved keeps its registered tensors, names and mode",
          "[nn][module][move]") {
  manual_seed(11);
  const auto x = Tensor<float>::randn({4, 3});

  nn::Sequential model = make_mlp();
  REQUIRE(model.size() == 3);
  std::vector<std::string> names;
  for (const auto& [n, t] : model.state_dict()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  CHECK(model.named_children().at(2).second->module_name() == "2");
  CHECK(&model[2] == model.named_children().at(2).second.get());  // layers() and children agree
  const auto out = model(x).to_vector();

  // Move construction: the same tensors (the same TensorImpl), the source left empty.
  const std::vector<AnyTensor> before = model.parameters();
  model.eval();
  nn::Sequential moved(std::move(model));
  const std::vector<AnyTensor> after = moved.parameters();
  REQUIRE(after.size() == before.size());
  for (size_t i = 0; i < after.size(); ++i) CHECK(after[i].impl() == before[i].impl());
  CHECK(model.parameters().empty());  // NOLINT(bugprone-use-after-move): moved-from is empty
  CHECK(model.named_children().empty());
  CHECK(model.size() == 0);
  CHECK_FALSE(moved.is_training());
  CHECK(moved(x).to_vector() == out);

  // The registered parameters are the ones forward uses: a step on them changes the output.
  moved.train();
  optim::SGD opt(moved.parameters(), {.lr = 0.5});
  sum(square(moved(x))).backward();
  opt.step();
  CHECK(moved(x).to_vector() != out);
  const auto& first = static_cast<nn::Linear&>(moved[0]);
  CHECK(first.weight.impl() == after[0].impl());

  // Move assignment over a module that had its own parameters.
  nn::Sequential target = make_mlp();
  target = std::move(moved);
  const std::vector<AnyTensor> assigned = target.parameters();
  REQUIRE(assigned.size() == after.size());
  for (size_t i = 0; i < assigned.size(); ++i) CHECK(assigned[i].impl() == after[i].impl());
  CHECK(target.state_dict().size() == 4);

  // A module with a parameter and a buffer, moved out of a factory: both registrations follow the
  // members that forward reads.
  WithBuffer wb = make_with_buffer(true);
  REQUIRE(wb.named_parameters().size() == 1);
  REQUIRE(wb.named_buffers().size() == 1);
  CHECK(wb.named_parameters()[0].second.impl() == wb.scale.impl());
  CHECK(wb.named_buffers()[0].second.impl() == wb.count.impl());
  CHECK(wb(Tensor<float>::ones({2})).to_vector() == std::vector<float>{1.0f, 1.0f});
}

TEST_CASE("Module forward hook: before and after once per call through operator(), forward_any and Sequential, "
          "the output replaced, a typed forward() skips it", "[nn][module]") {
  struct Recorder : nn::Module::ForwardHook {
    std::vector<std::string> log;
    double add = 0;
    void before(nn::Module& m) override { log.push_back("before " + m.type_name()); }
    AnyTensor after(nn::Module& m, const AnyTensor& y) override {
      log.push_back("after " + m.type_name());
      return add == 0 ? y : op::add(y, add);
    }
  };
  manual_seed(3);
  auto lin = std::make_shared<nn::Linear>(3, 2);
  auto seq = std::make_shared<nn::Sequential>(lin, std::make_shared<nn::Tanh>());
  auto on_lin = std::make_shared<Recorder>();
  auto on_seq = std::make_shared<Recorder>();
  lin->set_forward_hook(on_lin);
  seq->set_forward_hook(on_seq);
  CHECK(lin->forward_hook() == on_lin);
  const auto x = Tensor<float>::ones({1, 3});
  const auto plain = lin->forward(x).to_vector();  // typed forward(): no hook
  CHECK(on_lin->log.empty());
  on_lin->add = 10;
  const auto hooked = (*lin)(x).to_vector();  // operator() reaches forward_any: one pair
  REQUIRE(hooked.size() == plain.size());
  for (size_t i = 0; i < plain.size(); ++i) CHECK(hooked[i] == plain[i] + 10);
  CHECK(on_lin->log == std::vector<std::string>{"before Linear", "after Linear"});
  on_lin->log.clear();
  (void)lin->forward_any(x);
  CHECK(on_lin->log == std::vector<std::string>{"before Linear", "after Linear"});
  on_lin->log.clear();
  on_lin->add = 0;
  (void)(*seq)(x);  // the Sequential's hook around its layers' hooks
  CHECK(on_seq->log == std::vector<std::string>{"before Sequential", "after Sequential"});
  CHECK(on_lin->log == std::vector<std::string>{"before Linear", "after Linear"});
  // The replaced output is what backward sees.
  on_lin->add = 1;
  auto loss = sum(square((*lin)(x)));
  loss.backward();
  CHECK(lin->bias.grad().defined());
  lin->set_forward_hook(nullptr);
  on_lin->log.clear();
  (void)(*lin)(x);
  CHECK(on_lin->log.empty());
}
