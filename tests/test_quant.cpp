// INT8 (include/ember/quant/): the fake_quantize op (ties to even, saturation, the
// straight-through gradient, its errors), per-channel weight quantization, the max / percentile /
// MSE observers, QuantLinear and QuantConv2d in their three modes, calibration over a DataLoader,
// quantization-aware training, and the weight-only Int8Linear.
#include <cmath>
#include <cstring>

#include <catch2/catch.hpp>

#include "ember/data/dataloader.hpp"
#include "ember/ember.hpp"
#include "ember/quant/quantize.hpp"
#include "test_util.hpp"

using namespace ember;
using ember::testing::message_of;
using Catch::Matchers::Contains;

namespace {
FloatTensor randn(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return FloatTensor::randn(s, Device::cpu(), 0.0, 1.0, g);
}
}  // namespace

TEST_CASE("fake_quantize: round half to even, saturation to [-128, 127], NaN kept, in every float dtype", "[quant]") {
  const std::vector<double> x{0.25, 0.75, 1.25, -0.25, -0.75, 0.3, 63.4, 64.0, -64.0, -64.3, 1e9, -1e9};
  const std::vector<double> want{0.0, 1.0, 1.0, -0.0, -1.0, 0.5, 63.5, 63.5, -64.0, -64.0, 63.5, -64.0};
  for (DType t : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
    INFO(dtype_name(t));
    AnyTensor a = AnyTensor(Tensor<double>::from_vector(x, {12})).to(t);
    const auto got = op::fake_quantize(a, 0.5).to_double_vector();
    for (size_t i = 0; i < x.size(); ++i) {
      INFO("x = " << x[i]);
      CHECK(got[i] == want[i]);
    }
  }
  // qmax 7: int4-like.
  CHECK(op::fake_quantize(Tensor<double>::from_vector({10.0, -10.0}, {2}), 1.0, 7.0).to_double_vector() ==
        std::vector<double>{7.0, -8.0});
}

TEST_CASE("fake_quantize: the straight-through gradient is 1 inside the range and 0 where clamped", "[quant][grad]") {
  // Not a finite-difference check: the quantizer's true derivative is 0 almost everywhere; the
  // straight-through estimator (PyTorch's fake_quantize gradient) is the definition under test.
  auto x = Tensor<double>::from_vector({-100.0, -64.0, -1.3, 0.0, 2.6, 63.5, 63.8, 100.0}, {8}).set_requires_grad();
  // Backward adds into a gradient that is there already.
  sum(fake_quantize(x, 0.5) * Tensor<double>::from_vector({1, 2, 3, 4, 5, 6, 7, 8}, {8})).backward();
  CHECK(Tensor<double>(x.grad()).to_vector() == std::vector<double>{0, 2, 3, 4, 5, 6, 0, 0});
}

TEST_CASE("fake_quantize: bad scales, qmax and dtypes name the op and the tensor", "[quant][errors]") {
  auto x = randn({3}, 1);
  CHECK_THAT(message_of([&] { op::fake_quantize(x, 0.0); }), Contains("fake_quantize: scale must be positive") &&
                                                                 Contains("float32"));
  CHECK_THAT(message_of([&] { op::fake_quantize(x, NAN); }), Contains("scale must be positive and finite"));
  CHECK_THAT(message_of([&] { op::fake_quantize(x, 1.0, 0.5); }), Contains("qmax must be a whole number"));
  CHECK_THAT(message_of([&] { op::fake_quantize(Tensor<int64_t>::from_vector({1}, {1}), 1.0); }),
             Contains("floating-point input expected") && Contains("int64"));
}

TEST_CASE("quant: per-channel weight scales, integers and the fake-quantized weight agree", "[quant]") {
  auto w = Tensor<float>::from_vector({0.5f, -1.27f, 0.01f, 0.f, 0.f, 0.f, 2.54f, 1.27f, -0.3f}, {3, 3});
  const auto s = quant::weight_scales(w);
  CHECK(s == std::vector<float>{1.27f / 127, 1.0f, 2.54f / 127});  // an all-zero channel gets 1
  const auto q = quant::quantize_weight(w, s);
  CHECK(std::vector<int>(q.begin(), q.end()) == std::vector<int>{50, -127, 1, 0, 0, 0, 127, 64, -15});
  // Dequantized: q * s, the same values the fake quantization gives.
  const auto fq = quant::fake_quantize_per_channel(w, s).to_vector();
  for (size_t i = 0; i < q.size(); ++i) CHECK(fq[i] == Approx(q[i] * s[i / 3]).epsilon(1e-6));
}

TEST_CASE("quant observers: max, percentile and MSE choose the ranges their rules define", "[quant]") {
  // 100,000 values: a normal bulk and a few large outliers.
  auto x = randn({100000}, 2);
  std::vector<double> v = AnyTensor(x).to_double_vector();
  v[0] = 40.0;
  v[1] = -35.0;
  auto t = Tensor<double>::from_vector(v, {100000});
  quant::Observer mx({.kind = quant::ObserverKind::Max});
  quant::Observer pc({.kind = quant::ObserverKind::Percentile, .percentile = 99.9});
  quant::Observer ms({.kind = quant::ObserverKind::Mse});
  // Two batches, the larger values second: the histogram widens.
  for (auto* o : {&mx, &pc, &ms}) {
    o->observe(t.slice(50000, 100000));
    o->observe(t.slice(0, 50000));
  }
  CHECK(mx.amax() == 40.0);
  CHECK(mx.values_seen() == 100000);
  // 99.9% of |N(0,1)| lies below 3.29; the histogram's bins are 40 / 2048 wide, widened once.
  CHECK(pc.amax() == Approx(3.29).margin(0.1));
  // MSE trades the two outliers' clipping against the bulk's rounding: less than the max, more than
  // the percentile (two values clipped by 10 and 5 cost less than a step of 40 / 127 on 100,000).
  CHECK(ms.amax() < mx.amax());
  CHECK(ms.amax() > pc.amax());
  // Its error is below the max observer's and the percentile's on these values.
  auto mse_of = [&](double amax) {
    double e = 0;
    for (double a : v) {
      const double s = amax / 127, q = std::clamp(std::nearbyint(a / s), -128.0, 127.0) * s;
      e += (a - q) * (a - q);
    }
    return e;
  };
  CHECK(mse_of(ms.amax()) < mse_of(mx.amax()));
  CHECK(mse_of(ms.amax()) < mse_of(pc.amax()));
  CHECK(mx.scale() == Approx(40.0 / 127));
  quant::Observer empty;
  CHECK_THROWS_WITH(empty.amax(), Contains("nothing observed yet"));
  CHECK_THROWS_WITH(empty.observe(Tensor<float>::from_vector({NAN}, {1})), Contains("non-finite"));
  CHECK_THROWS_WITH(quant::Observer({.percentile = 0}), Contains("percentile must be in (0, 100]"));
}

TEST_CASE("QuantLinear and QuantConv2d: float mode is the layer, fake-quant mode computes the INT8 model",
          "[quant]") {
  Generator g(3);
  GeneratorScope scope(g);
  auto lin = std::make_shared<nn::Linear>(8, 5, nn::LinearOptions{.activation = LinearActivation::Relu});
  auto conv = std::make_shared<nn::Conv2d>(2, 3, 3, nn::Conv2dOptions{.padding = {1, 1}});
  quant::QuantLinear ql(lin);
  quant::QuantConv2d qc(conv);
  // The state dict is the layer's plus the input's range.
  std::vector<std::string> names;
  for (auto& [n, t] : ql.state_dict()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"weight", "bias", "input_amax"});
  const FloatTensor x = randn({4, 8}, 4), xc = randn({2, 2, 5, 5}, 5);
  NoGradGuard no_grad;
  auto bits = [](const FloatTensor& t) { return t.to_vector(); };
  CHECK(bits(ql(x)) == bits((*lin)(x)));
  CHECK(bits(qc(xc)) == bits((*conv)(xc)));
  CHECK_THROWS_WITH((ql.set_mode(quant::QuantMode::FakeQuant), ql(x)), Contains("not calibrated"));
  ql.set_mode(quant::QuantMode::Calibrate);
  qc.set_mode(quant::QuantMode::Calibrate);
  ql(x);
  qc(xc);
  ql.finish_calibration();
  qc.finish_calibration();
  CHECK(ql.input_amax.item_double() == Approx(AnyTensor(abs(x)).to_double_vector().empty() ? 0 : [&] {
          double m = 0;
          for (double a : AnyTensor(x).to_double_vector()) m = std::max(m, std::abs(a));
          return m;
        }()));
  ql.set_mode(quant::QuantMode::FakeQuant);
  qc.set_mode(quant::QuantMode::FakeQuant);
  // By hand: the input and the weight quantized and dequantized, then the float layer's op.
  const double sx = ql.input_amax.item_double() / 127;
  const FloatTensor wq = quant::fake_quantize_per_channel(FloatTensor(lin->weight), quant::weight_scales(lin->weight));
  const FloatTensor want = relu(linear(fake_quantize(x, sx), wq, FloatTensor(lin->bias)));
  CHECK(bits(ql(x)) == bits(want));
  const auto fq = bits(ql(x)), fl = bits((*lin)(x));
  double worst = 0;
  for (size_t i = 0; i < fq.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(fq[i] - fl[i])));
  CHECK(worst > 0);     // quantization changed something
  CHECK(worst < 0.1);   // and not much
  const double sxc = qc.input_amax.item_double() / 127;
  const FloatTensor wc = quant::fake_quantize_per_channel(FloatTensor(conv->weight), quant::weight_scales(conv->weight));
  CHECK(bits(qc(xc)) == bits(conv2d(fake_quantize(xc, sxc), wc, FloatTensor(conv->bias), {{1, 1}, {1, 1}, {1, 1}, 1})));
}

TEST_CASE("quant::calibrate over a DataLoader, then quantization-aware training lowers the loss", "[quant][train]") {
  Generator g(6);
  GeneratorScope scope(g);
  // A regression y = sum(x) on 256 samples.
  const FloatTensor xs = randn({256, 6}, 7);
  const FloatTensor ys = sum(xs, {1}, true);
  data::TensorDataset ds({{"x", xs}, {"y", ys}}, "regression");
  data::DataLoader loader(ds, {.batch_size = 32});
  nn::Sequential model;
  model.emplace<nn::Linear>(6, 16, nn::LinearOptions{.activation = LinearActivation::Relu});
  auto inner = std::make_shared<nn::Sequential>();
  inner->emplace<nn::Linear>(16, 1);
  model.push_back(inner);
  auto q = quant::prepare(model, {.observer = {.kind = quant::ObserverKind::Percentile, .percentile = 99.0}});
  CHECK(q->named_modules().size() == model.named_modules().size());
  CHECK((*q)[0].type_name() == "QuantLinear");
  CHECK(dynamic_cast<nn::Sequential&>((*q)[1])[0].type_name() == "QuantLinear");
  const int64_t n = quant::calibrate(*q, loader, [](const data::Batch& b) { return b["x"]; }, 5);
  CHECK(n == 5);
  auto& first = dynamic_cast<quant::QuantLinear&>((*q)[0]);
  CHECK(first.mode() == quant::QuantMode::FakeQuant);
  CHECK(first.observer().values_seen() == 5 * 32 * 6);
  CHECK(first.input_amax.item_double() > 0);
  // QAT: the shared parameters train through the fake quantization.
  optim::Adam opt(q->parameters(), {.lr = 1e-2});
  auto loss_of = [&] {
    return nn::functional::mse_loss(q->forward(xs), ys);
  };
  const float before = loss_of().item();
  for (int step = 0; step < 60; ++step) {
    opt.zero_grad();
    FloatTensor l = loss_of();
    l.backward();
    opt.step();
  }
  const float after = loss_of().item();
  CHECK(after < 0.5f * before);
  CHECK_THROWS_WITH(quant::set_mode(*std::make_shared<nn::Sequential>(), quant::QuantMode::Float),
                    Contains("no QuantLinear or QuantConv2d"));
}

TEST_CASE("Int8Linear: a quarter of the weights' memory, the output of the dequantized weights", "[quant]") {
  Generator g(8);
  GeneratorScope scope(g);
  nn::Linear lin(64, 32, nn::LinearOptions{.activation = LinearActivation::Gelu});
  quant::Int8Linear q(lin);
  CHECK(q.weight_int8.nbytes() * 4 == lin.weight.nbytes());
  CHECK(q.parameters().empty());
  const FloatTensor x = randn({5, 64}, 9);
  NoGradGuard no_grad;
  const auto s = quant::weight_scales(lin.weight);
  const FloatTensor wq = quant::fake_quantize_per_channel(FloatTensor(lin.weight), s);
  // The dequantized weight is the fake-quantized one (q * s, in float).
  const auto dq = q.dequantized_weight<float>().to_vector(), fq = wq.to_vector();
  for (size_t i = 0; i < dq.size(); ++i) REQUIRE(dq[i] == Approx(fq[i]).epsilon(1e-6));
  const auto y = q(x).to_vector(), yf = lin(x).to_vector();
  double worst = 0;
  for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(y[i] - yf[i])));
  CHECK(worst > 0);
  CHECK(worst < 0.05);
  // In bf16 activations too.
  CHECK(q.forward_any(AnyTensor(x).to(DType::BFloat16)).dtype() == DType::BFloat16);
  auto seq = std::make_shared<nn::Sequential>();
  seq->emplace<nn::Linear>(4, 4);
  seq->emplace<nn::ReLU>();
  auto w8 = quant::weight_only_int8(*seq);
  CHECK((*w8)[0].type_name() == "Int8Linear");
  CHECK((*w8)[1].type_name() == "ReLU");
}
