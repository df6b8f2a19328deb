// Mixed precision: amp::GradScaler (torch.amp.GradScaler's semantics), the weight cast cache
// (amp::CastCacheGuard) and gradient accumulation (train::GradientAccumulator).
//
// Scale sequences are written out by hand from torch's update rule; skipped steps are checked
// bitwise (parameters and optimizer state); a scaled run is compared bitwise with an unscaled fp32
// control run (the scale is a power of two, so scaling commutes exactly with the arithmetic).
// The fp16 training run executes on a real GPU when there is one, and in CI on the pretend device
// (CPU kernels posing as cuda:0, half emulated).
#include "ember/backend/cpu/cpu_backend.hpp"
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <tuple>
#include <vector>

#include <ember/ember.hpp>
#include <ember/train/accumulate.hpp>

#include "gpu_skip.hpp"
#include "pretend_gpu.hpp"

using namespace ember;
using Catch::Contains;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The raw bytes of a tensor (any device).
std::vector<unsigned char> bytes_of(const AnyTensor& t) {
  AnyTensor h = t.detach().to(Device::cpu());
  std::vector<unsigned char> b(h.nbytes());
  if (!b.empty()) std::memcpy(b.data(), h.data_ptr(), b.size());
  return b;
}

std::vector<std::vector<unsigned char>> bytes_of(const std::vector<AnyTensor>& ts) {
  std::vector<std::vector<unsigned char>> out;
  for (const auto& t : ts) out.push_back(bytes_of(t));
  return out;
}

// Writes value v into element i of t (any device and floating dtype), not recorded.
void poke(const AnyTensor& t, int64_t i, double v) {
  std::vector<double> vals = t.to_double_vector();
  vals.at(static_cast<size_t>(i)) = v;
  AnyTensor src = AnyTensor(Tensor<double>::from_vector(vals, t.shape())).to(t.dtype()).to(t.device());
  AnyTensor dst = t;
  dst.copy_(src);
}

// Bitwise equality of two tensor lists, as one bool (Catch would print every byte otherwise).
bool same_bytes(const std::vector<AnyTensor>& a, const std::vector<AnyTensor>& b) { return bytes_of(a) == bytes_of(b); }

bool all_finite(const std::vector<AnyTensor>& ts) {
  for (const auto& t : ts)
    for (double v : t.to_double_vector())
      if (!std::isfinite(v)) return false;
  return true;
}

// Optimizer state dicts equal bit for bit (same parameters, same names, same bytes).
bool same_state(const optim::OptimizerStateDict& a, const optim::OptimizerStateDict& b) {
  if (a.state.size() != b.state.size()) return false;
  for (const auto& [i, st] : a.state) {
    auto it = b.state.find(i);
    if (it == b.state.end() || it->second.size() != st.size()) return false;
    for (size_t j = 0; j < st.size(); ++j) {
      if (st[j].first != it->second[j].first) return false;
      if (bytes_of(st[j].second) != bytes_of(it->second[j].second)) return false;
    }
  }
  return true;
}

std::shared_ptr<nn::Sequential> make_mlp(uint64_t seed, int64_t in = 4, int64_t hidden = 8, int64_t out = 2) {
  manual_seed(seed);
  auto m = std::make_shared<nn::Sequential>();
  m->emplace<nn::Linear>(in, hidden);
  m->emplace<nn::Tanh>();
  m->emplace<nn::Linear>(hidden, out);
  return m;
}

struct Batch {
  Tensor<float> x, y;
};

Batch make_batch(uint64_t seed, int64_t n, int64_t in = 4, int64_t out = 2, Device d = Device::cpu()) {
  Generator g(seed);
  return {Tensor<float>::randn({n, in}, Device::cpu(), 0.0, 1.0, g).to(d),
          Tensor<float>::randn({n, out}, Device::cpu(), 0.0, 1.0, g).to(d)};
}

Tensor<float> mlp_loss(nn::Sequential& m, const Batch& b) { return nn::functional::mse_loss(m(b.x), b.y); }

// One parameter p = [1, 2, 3] (on device d) with loss sum(p * p): gradient 2p, known exactly.
AnyTensor make_param(Device d = Device::cpu()) {
  AnyTensor p = AnyTensor(Tensor<float>::from_vector({1.0f, 2.0f, 3.0f})).to(d);
  p.set_requires_grad(true);
  return p;
}
AnyTensor square_loss(const AnyTensor& p) { return op::sum(op::mul(p, p)); }

// A stand-in for cuda:0 that counts device-to-host reads (to check the scaler's synchronisations).
class CountingCudaBackend : public cpu::CpuBackend {
 public:
  Device device() const override { return Device::cuda(0); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    ++reads;
    cpu::CpuBackend::copy_to_host(dst, src, bytes);
  }
  // What the fused-unscale test counts: the unscale_ multiplications, the inf checks, the SGD
  // kernels and the unscale factor the last one got.
  void unary(UnaryOp op, DType t, const void* x, void* out, int64_t n, double a, double b) override {
    if (op == UnaryOp::MulScalar) ++mul_scalars;
    cpu::CpuBackend::unary(op, t, x, out, n, a, b);
  }
  void nonfinite_check(DType t, const void* x, int64_t n, uint8_t* flag) override {
    ++checks;
    cpu::CpuBackend::nonfinite_check(t, x, n, flag);
  }
  void sgd_step(const SgdStepArgs& a, void* param, void* grad, void* buf) override {
    ++sgd_steps;
    last_grad_unscale = a.grad_unscale;
    cpu::CpuBackend::sgd_step(a, param, grad, buf);
  }
  int64_t reads = 0, mul_scalars = 0, checks = 0, sgd_steps = 0;
  double last_grad_unscale = 0.0;
};

using CountingGpu = testing::StandIn<CountingCudaBackend, testing::CudaStandIn::Always>;
CountingCudaBackend& counting_backend() { return CountingGpu::backend(); }

// The counting stand-in replaces cuda:0 only where there is no real GPU: elsewhere the tests that
// count its calls say so and return.
bool real_gpu_present() {
  if (!cuda::is_available()) return false;
  std::cout << "(counting device not installed: a real GPU is present)" << std::endl;
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------- GradScaler

TEST_CASE("GradScaler defaults are torch's", "[amp][scaler]") {
  amp::GradScaler s;
  CHECK(s.is_enabled());
  CHECK(s.get_scale() == 65536.0);
  CHECK(s.get_growth_factor() == 2.0);
  CHECK(s.get_backoff_factor() == 0.5);
  CHECK(s.get_growth_interval() == 2000);
  CHECK(s.growth_tracker() == 0);
  CHECK_FALSE(s.scale_tensor().defined());  // created lazily by the first scale()
}

TEST_CASE("GradScaler scales the loss and its gradients, and unscale_ restores them exactly", "[amp][scaler]") {
  amp::GradScaler scaler({.init_scale = 1024.0});
  AnyTensor p = make_param();
  optim::SGD opt({p}, {.lr = 0.5});
  AnyTensor loss = square_loss(p);  // 14
  AnyTensor scaled = scaler.scale(loss);
  CHECK(scaled.dtype() == DType::Float32);
  CHECK(scaled.item_double() == 14.0 * 1024.0);
  REQUIRE(scaler.scale_tensor().defined());
  CHECK(scaler.scale_tensor().dtype() == DType::Float32);
  CHECK(scaler.scale_tensor().dim() == 0);
  CHECK(scaler.scale_tensor().item_double() == 1024.0);
  scaled.backward();
  CHECK(p.grad().to_double_vector() == std::vector<double>{2048.0, 4096.0, 6144.0});
  scaler.unscale_(opt);
  CHECK(p.grad().to_double_vector() == std::vector<double>{2.0, 4.0, 6.0});
  CHECK(scaler.step(opt));  // already unscaled: steps with the true gradient
  CHECK(p.to_double_vector() == std::vector<double>{0.0, 0.0, 0.0});
  scaler.update();
  CHECK(scaler.get_scale() == 1024.0);
  CHECK(scaler.growth_tracker() == 1);
}

TEST_CASE("GradScaler scale sequence for growth 2, backoff 0.25, interval 2, init 4", "[amp][scaler]") {
  amp::GradScaler scaler({.init_scale = 4.0, .growth_factor = 2.0, .backoff_factor = 0.25, .growth_interval = 2});
  AnyTensor p = make_param();
  optim::SGD opt({p}, {.lr = 0.0});
  // Events per iteration (0 clean, 1 inf, 2 nan) and, written out from torch's rule, the scale and
  // growth tracker after each update():
  //   start 4 | clean: t1 -> 4 | clean: t2 = interval -> 8, t0 | inf: 8 * 0.25 = 2, t0 |
  //   clean: 2, t1 | clean: 4, t0 | clean: 4, t1 | nan: 1, t0 | clean: 1, t1 | clean: 2, t0
  const std::vector<int> events{0, 0, 1, 0, 0, 0, 2, 0, 0};
  const std::vector<double> want_scale{4, 8, 2, 2, 4, 4, 1, 1, 2};
  const std::vector<int64_t> want_tracker{1, 0, 0, 1, 0, 1, 0, 1, 0};
  std::vector<double> scales{scaler.get_scale()}, seen_in_grad;
  for (size_t i = 0; i < events.size(); ++i) {
    INFO("iteration " << i);
    opt.zero_grad();
    scaler.scale(square_loss(p)).backward();
    seen_in_grad.push_back(p.grad().to_double_vector()[0] / 2.0);  // d(sum p^2)/dp0 = 2 at p0 = 1
    if (events[i] == 1) poke(p.grad(), 1, kInf);
    if (events[i] == 2) poke(p.grad(), 2, kNaN);
    CHECK(scaler.step(opt) == (events[i] == 0));
    scaler.update();
    CHECK(scaler.get_scale() == want_scale[i]);
    CHECK(scaler.growth_tracker() == want_tracker[i]);
    CHECK(scaler.scale_tensor().item_double() == want_scale[i]);  // device value == host mirror
    scales.push_back(scaler.get_scale());
  }
  // The exact sequence of scales: 4, 4, 8, then an inf halves it to 2.
  CHECK(scales == std::vector<double>{4, 4, 8, 2, 2, 4, 4, 1, 1, 2});
  // Each iteration's gradients were scaled by the scale in force.
  CHECK(seen_in_grad == std::vector<double>{4, 4, 8, 2, 2, 4, 4, 1, 1});
}

TEST_CASE("GradScaler finds an inf or a NaN in each gradient and skips the step bitwise", "[amp][scaler]") {
  auto model = make_mlp(3);
  auto params = model->parameters();
  REQUIRE(params.size() == 4);
  optim::Adam opt(params, {.lr = 1e-2});
  amp::GradScaler scaler({.init_scale = 256.0});
  Batch b = make_batch(5, 16);
  // A clean step first, so that Adam has state (step, exp_avg, exp_avg_sq) to leave alone.
  scaler.scale(mlp_loss(*model, b)).backward();
  REQUIRE(scaler.step(opt));
  scaler.update();
  double expected_scale = 256.0;
  for (size_t i = 0; i < params.size(); ++i) {
    for (double bad : {kInf, -kInf, kNaN}) {
      INFO("parameter " << i << ", injected " << bad);
      opt.zero_grad();
      scaler.scale(mlp_loss(*model, b)).backward();
      const int64_t at = params[i].numel() - 1;  // the last element: the check must scan everything
      poke(params[i].grad(), at, bad);
      auto before = bytes_of(params);
      auto state_before = opt.state_dict();
      CHECK_FALSE(scaler.step(opt));
      CHECK((bytes_of(params) == before));
      CHECK(same_state(opt.state_dict(), state_before));
      scaler.update();
      expected_scale *= 0.5;
      CHECK(scaler.get_scale() == expected_scale);
      CHECK(scaler.growth_tracker() == 0);
    }
  }
  // And the step is taken again once the gradients are clean.
  opt.zero_grad();
  scaler.scale(mlp_loss(*model, b)).backward();
  auto before = bytes_of(params);
  CHECK(scaler.step(opt));
  CHECK((bytes_of(params) != before));
}

TEST_CASE("GradScaler scaled run equals an unscaled fp32 control run bitwise", "[amp][scaler]") {
  for (int use_adam = 0; use_adam < 2; ++use_adam) {
    INFO((use_adam ? "Adam" : "SGD with momentum"));
    auto scaled_model = make_mlp(11), control_model = make_mlp(11);
    auto sp = scaled_model->parameters(), cp = control_model->parameters();
    REQUIRE(same_bytes(sp, cp));
    std::unique_ptr<optim::Optimizer> sopt, copt;
    if (use_adam) {
      sopt = std::make_unique<optim::Adam>(sp, optim::AdamOptions{.lr = 1e-2});
      copt = std::make_unique<optim::Adam>(cp, optim::AdamOptions{.lr = 1e-2});
    } else {
      sopt = std::make_unique<optim::SGD>(sp, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
      copt = std::make_unique<optim::SGD>(cp, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    }
    amp::GradScaler scaler({.init_scale = 128.0, .growth_interval = 1});
    const int steps = 8, inf_step = 3;
    int unskipped = 0, skipped = 0;
    for (int s = 0; s < steps; ++s) {
      Batch b = make_batch(100 + static_cast<uint64_t>(s), 16);
      sopt->zero_grad();
      scaler.scale(mlp_loss(*scaled_model, b)).backward();
      if (s == inf_step) poke(sp[0].grad(), 0, kInf);
      const bool stepped = scaler.step(*sopt);
      CHECK(stepped == (s != inf_step));
      scaler.update();
      (stepped ? unskipped : skipped) += 1;
      if (s != inf_step) {  // the control run simply does not take the skipped step
        copt->zero_grad();
        mlp_loss(*control_model, b).backward();
        copt->step();
      }
      CHECK(same_bytes(sp, cp));
    }
    CHECK(unskipped == steps - 1);
    CHECK(skipped == 1);
    // The formula: scale = 128 * 2^unskipped * 0.5^skipped (growth_interval 1).
    CHECK(scaler.get_scale() == 128.0 * std::pow(2.0, unskipped) * std::pow(0.5, skipped));
    CHECK(same_state(sopt->state_dict(), copt->state_dict()));
  }
}

TEST_CASE("GradScaler never grows the scale to inf and backs off from a huge init scale", "[amp][scaler]") {
  SECTION("growth that would overflow float32 keeps the scale (torch's isfinite rule)") {
    amp::GradScaler scaler({.init_scale = std::ldexp(1.0, 120), .growth_factor = std::ldexp(1.0, 20),
                            .growth_interval = 1});
    AnyTensor p = make_param();
    optim::SGD opt({p}, {.lr = 0.0});
    scaler.scale(square_loss(p)).backward();  // grads 2^121 .. 6 * 2^120: finite in fp32
    CHECK(scaler.step(opt));
    scaler.update();
    CHECK(scaler.get_scale() == std::ldexp(1.0, 120));  // 2^140 is inf in float32: not taken
    CHECK(scaler.growth_tracker() == 0);
    CHECK(std::isfinite(scaler.scale_tensor().item_double()));
  }
  SECTION("an MLP trained from init scale 2^60 with growth 2^33 per step") {
    // 2^60 -> 2^93 -> 2^126, where the scaled gradients (a sum-reduced loss, targets ~10)
    // overflow float32: it backs off, and growth past float32's range is never taken.
    auto model = make_mlp(21);
    auto params = model->parameters();
    optim::SGD opt(params, {.lr = 1e-3});
    amp::GradScaler scaler({.init_scale = std::ldexp(1.0, 60), .growth_factor = std::ldexp(1.0, 33),
                            .backoff_factor = 0.5, .growth_interval = 1});
    int stepped = 0, skipped = 0;
    double first_loss = 0, last_loss = 0;
    Batch b = make_batch(22, 32);
    b.y = b.y * 10.0;
    for (int s = 0; s < 80; ++s) {
      opt.zero_grad();
      Tensor<float> loss = nn::functional::mse_loss((*model)(b.x), b.y, "sum");
      if (s == 0) first_loss = loss.item();
      last_loss = loss.item();
      scaler.scale(loss).backward();
      (scaler.step(opt) ? stepped : skipped) += 1;
      scaler.update();
      const double sc = scaler.get_scale();
      INFO("step " << s << " scale " << sc);
      REQUIRE(std::isfinite(sc));
      REQUIRE(sc > 0.0);
      REQUIRE(scaler.scale_tensor().item_double() == sc);
      REQUIRE(all_finite(params));
    }
    CHECK(skipped > 0);
    CHECK(stepped > 40);
    CHECK(last_loss < first_loss);
  }
}

TEST_CASE("GradScaler state dict uses torch's names and round-trips", "[amp][scaler]") {
  amp::GradScaler a({.init_scale = 32.0, .growth_factor = 4.0, .backoff_factor = 0.25, .growth_interval = 3});
  AnyTensor p = make_param();
  optim::SGD opt({p}, {.lr = 0.0});
  auto iterate = [&](amp::GradScaler& s, bool inf) {
    opt.zero_grad();
    s.scale(square_loss(p)).backward();
    if (inf) poke(p.grad(), 0, kInf);
    s.step(opt);
    s.update();
  };
  iterate(a, false);
  iterate(a, false);
  iterate(a, false);  // grows to 128
  iterate(a, true);   // backs off to 32
  iterate(a, false);  // tracker 1
  amp::GradScalerStateDict sd = a.state_dict();
  std::vector<std::string> keys;
  for (const auto& [k, v] : sd) keys.push_back(k);
  CHECK(keys == std::vector<std::string>{"scale", "growth_factor", "backoff_factor", "growth_interval",
                                         "_growth_tracker"});
  CHECK(sd.at("scale") == 32.0);
  CHECK(sd.at("growth_factor") == 4.0);
  CHECK(sd.at("backoff_factor") == 0.25);
  CHECK(sd.at("growth_interval") == 3.0);
  CHECK(sd.at("_growth_tracker") == 1.0);

  amp::GradScaler b;  // defaults, overwritten by the load
  b.load_state_dict(sd);
  CHECK(b.get_scale() == 32.0);  // before its first scale(): the loaded scale
  CHECK(b.get_growth_factor() == 4.0);
  CHECK(b.get_backoff_factor() == 0.25);
  CHECK(b.get_growth_interval() == 3);
  CHECK(b.growth_tracker() == 1);
  CHECK(b.state_dict() == sd);
  // Both continue identically: two clean steps complete the interval and grow to 128.
  for (amp::GradScaler* s : {&a, &b}) {
    iterate(*s, false);
    CHECK(s->get_scale() == 32.0);
    iterate(*s, false);
    CHECK(s->get_scale() == 128.0);
    CHECK(s->scale_tensor().item_double() == 128.0);
  }
  // Loading into a scaler that already has its device scale updates that too.
  a.load_state_dict(sd);
  CHECK(a.get_scale() == 32.0);
  CHECK(a.scale_tensor().item_double() == 32.0);

  SECTION("bad state dicts are refused before anything changes") {
    CHECK_THROWS_WITH(b.load_state_dict({}), Contains("empty, possibly because it was saved from a disabled"));
    auto missing = sd;
    missing = amp::GradScalerStateDict{{"scale", 2.0}, {"growth_factor", 2.0}};
    CHECK_THROWS_WITH(b.load_state_dict(missing), Contains("missing key 'backoff_factor'"));
    auto extra = sd;
    extra.set("growth", 2.0);
    CHECK_THROWS_WITH(b.load_state_dict(extra), Contains("unexpected key 'growth'"));
    auto bad = sd;
    bad["growth_factor"] = 0.5;
    CHECK_THROWS_WITH(b.load_state_dict(bad), Contains("growth factor must be > 1.0"));
    bad = sd;
    bad["scale"] = kInf;
    CHECK_THROWS_AS(b.load_state_dict(bad), ValueError);
    bad = sd;
    bad["_growth_tracker"] = 1.5;
    CHECK_THROWS_WITH(b.load_state_dict(bad), Contains("_growth_tracker"));
    CHECK(b.get_scale() == 128.0);  // unchanged by the failed loads
  }
}

TEST_CASE("GradScaler disabled is an identity", "[amp][scaler]") {
  amp::GradScaler scaler({.init_scale = 1024.0, .enabled = false});
  CHECK_FALSE(scaler.is_enabled());
  CHECK(scaler.get_scale() == 1.0);
  AnyTensor p = make_param();
  optim::SGD opt({p}, {.lr = 0.25});
  AnyTensor loss = square_loss(p);
  AnyTensor scaled = scaler.scale(loss);
  CHECK(scaled.same(loss));
  Tensor<float> typed = scaler.scale(Tensor<float>(loss));
  CHECK(typed.same(loss));
  scaled.backward();
  scaler.unscale_(opt);
  scaler.unscale_(opt);  // no stage tracking either
  CHECK(p.grad().to_double_vector() == std::vector<double>{2.0, 4.0, 6.0});
  poke(p.grad(), 0, kInf);  // a disabled scaler checks nothing: the step goes ahead
  CHECK(scaler.step(opt));
  const auto after = p.to_double_vector();
  CHECK(std::isinf(after[0]));
  CHECK(after[1] == 1.0);
  CHECK(after[2] == 1.5);
  scaler.update();
  scaler.update(8.0);
  CHECK(scaler.get_scale() == 1.0);
  CHECK_FALSE(scaler.scale_tensor().defined());
  CHECK(scaler.state_dict().size() == 0);
  scaler.load_state_dict({{"scale", 8.0}});  // ignored, as torch
  CHECK(scaler.get_scale() == 1.0);
}

TEST_CASE("GradScaler call-order errors carry torch's messages", "[amp][scaler]") {
  AnyTensor p = make_param();
  optim::SGD opt({p}, {.lr = 0.1});
  amp::GradScaler scaler;
  CHECK_THROWS_WITH(scaler.unscale_(opt), Contains("Attempted unscale_ but _scale is None"));
  CHECK_THROWS_WITH(scaler.step(opt), Contains("Attempted step but _scale is None"));
  CHECK_THROWS_WITH(scaler.update(), Contains("Attempted update but _scale is None"));
  {
    // No gradient: step() unscales (recording nothing), then finds no checks. As in torch, the
    // optimizer counts as unscaled afterwards, and update() has nothing to go on.
    amp::GradScaler s2;
    s2.scale(square_loss(p));
    CHECK_THROWS_WITH(s2.step(opt), Contains("No inf checks were recorded for this optimizer"));
    CHECK_THROWS_WITH(s2.update(), Contains("No inf checks were recorded prior to update"));
    CHECK_THROWS_WITH(s2.unscale_(opt), Contains("unscale_() has already been called"));
  }
  AnyTensor scaled = scaler.scale(square_loss(p));
  scaled.backward();
  scaler.unscale_(opt);
  CHECK_THROWS_WITH(scaler.unscale_(opt),
                    Contains("unscale_() has already been called on this optimizer since the last update()"));
  const auto grad_after_one = p.grad().to_double_vector();
  CHECK(grad_after_one == std::vector<double>{2.0, 4.0, 6.0});  // the failed second call changed nothing
  CHECK(scaler.step(opt));
  CHECK_THROWS_WITH(scaler.step(opt), Contains("step() has already been called since the last update()"));
  CHECK_THROWS_WITH(scaler.unscale_(opt), Contains("unscale_() is being called after step()"));
  scaler.update();
  // After update() the next iteration may unscale_ and step again.
  opt.zero_grad();
  scaler.scale(square_loss(p)).backward();
  CHECK_NOTHROW(scaler.unscale_(opt));
  CHECK_NOTHROW(scaler.step(opt));
  CHECK_NOTHROW(scaler.update());
  SECTION("invalid options") {
    CHECK_THROWS_WITH(amp::GradScaler({.growth_factor = 1.0}), Contains("growth factor must be > 1.0"));
    CHECK_THROWS_WITH(amp::GradScaler({.backoff_factor = 1.0}), Contains("backoff factor must be in (0, 1)"));
    CHECK_THROWS_WITH(amp::GradScaler({.growth_interval = 0}), Contains("growth_interval must be a positive"));
    CHECK_THROWS_WITH(amp::GradScaler({.init_scale = 0.0}), Contains("init_scale must be a positive finite"));
    CHECK_THROWS_WITH(amp::GradScaler({.init_scale = 1e39}), Contains("init_scale must be a positive finite"));
    CHECK_NOTHROW(amp::GradScaler({.growth_factor = 1.0, .enabled = false}));  // unchecked when disabled
  }
}

TEST_CASE("GradScaler update with a new scale", "[amp][scaler]") {
  AnyTensor p = make_param();
  optim::SGD opt({p}, {.lr = 0.0});
  amp::GradScaler scaler({.init_scale = 16.0, .growth_interval = 3});
  scaler.scale(square_loss(p)).backward();
  scaler.step(opt);
  scaler.update();
  CHECK(scaler.growth_tracker() == 1);
  opt.zero_grad();
  scaler.scale(square_loss(p)).backward();
  scaler.step(opt);
  scaler.update(512.0);
  CHECK(scaler.get_scale() == 512.0);
  CHECK(scaler.scale_tensor().item_double() == 512.0);
  CHECK(scaler.growth_tracker() == 1);  // torch leaves the tracker alone
  scaler.update(AnyTensor(Tensor<float>::scalar(64.0f)));
  CHECK(scaler.get_scale() == 64.0);
  CHECK_THROWS_WITH(scaler.update(AnyTensor(Tensor<float>::zeros({2}))), Contains("1-element"));
}

TEST_CASE("GradScaler unscale_ then clip_grad_norm_ clips the true gradients", "[amp][scaler]") {
  auto scaled_model = make_mlp(31), control_model = make_mlp(31);
  auto sp = scaled_model->parameters(), cp = control_model->parameters();
  optim::SGD sopt(sp, {.lr = 0.1}), copt(cp, {.lr = 0.1});
  amp::GradScaler scaler({.init_scale = 4096.0});
  for (int s = 0; s < 4; ++s) {
    Batch b = make_batch(40 + static_cast<uint64_t>(s), 16);
    sopt.zero_grad();
    copt.zero_grad();
    scaler.scale(mlp_loss(*scaled_model, b)).backward();
    mlp_loss(*control_model, b).backward();
    scaler.unscale_(sopt);
    CHECK(same_bytes({sp[0].grad(), sp[3].grad()}, {cp[0].grad(), cp[3].grad()}));
    const double snorm = optim::clip_grad_norm_(sp, 0.05);
    const double cnorm = optim::clip_grad_norm_(cp, 0.05);
    CHECK(snorm == cnorm);  // the true norm, not 4096 times it
    CHECK(snorm > 0.05);    // so clipping is active
    CHECK(scaler.step(sopt));
    copt.step();
    scaler.update();
    CHECK(same_bytes(sp, cp));
  }
}

TEST_CASE("GradScaler unscales fp16 and bf16 gradients and finds their infs", "[amp][scaler]") {
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    INFO(dtype_name(dt));
    AnyTensor p = AnyTensor(Tensor<float>::from_vector({0.5f, -1.0f, 2.0f, 0.25f})).to(dt);
    p.set_requires_grad(true);
    optim::SGD opt({p}, {.lr = 1.0});
    amp::GradScaler scaler({.init_scale = 1024.0});
    AnyTensor loss = op::sum(op::mul(p, p));  // in dt
    AnyTensor scaled = scaler.scale(loss);
    CHECK(scaled.dtype() == DType::Float32);  // an fp16/bf16 output is scaled in fp32
    scaled.backward();
    REQUIRE(p.grad().dtype() == dt);
    CHECK(p.grad().to_double_vector() == std::vector<double>{1024.0, -2048.0, 4096.0, 512.0});
    scaler.unscale_(opt);
    CHECK(p.grad().to_double_vector() == std::vector<double>{1.0, -2.0, 4.0, 0.5});
    CHECK(scaler.step(opt));
    CHECK(p.to_double_vector() == std::vector<double>{-0.5, 1.0, -2.0, -0.25});
    scaler.update();
    for (double bad : {kInf, kNaN}) {
      opt.zero_grad();
      scaler.scale(op::sum(op::mul(p, p))).backward();
      poke(p.grad(), 3, bad);
      auto before = bytes_of(p);
      CHECK_FALSE(scaler.step(opt));
      CHECK((bytes_of(p) == before));
      scaler.update();
    }
    CHECK(scaler.get_scale() == 256.0);
  }
}

TEST_CASE("GradScaler with two optimizers skips both on an inf in either", "[amp][scaler]") {
  AnyTensor a = make_param(), b = make_param();
  optim::SGD oa({a}, {.lr = 0.5}), ob({b}, {.lr = 0.5});
  amp::GradScaler scaler({.init_scale = 8.0});
  scaler.scale(op::add(square_loss(a), square_loss(b))).backward();
  poke(b.grad(), 1, kInf);
  CHECK(scaler.step(oa));        // a's gradients are clean: oa steps
  CHECK_FALSE(scaler.step(ob));  // b's are not
  scaler.update();               // any inf backs off, as torch combines the optimizers' checks
  CHECK(scaler.get_scale() == 4.0);
  CHECK(a.to_double_vector() == std::vector<double>{0.0, 0.0, 0.0});
  CHECK(b.to_double_vector() == std::vector<double>{1.0, 2.0, 3.0});
}

TEST_CASE("GradScaler reads the device at most once per step", "[amp][scaler]") {
  if (real_gpu_present()) return;
  CountingGpu gpu;
  CountingCudaBackend& dev = counting_backend();
  {
    const Device d = Device::cuda(0);
    AnyTensor p = make_param(d);
    optim::SGD opt({p}, {.lr = 0.125});
    amp::GradScaler scaler({.init_scale = 64.0, .growth_interval = 1});
    for (int it = 0; it < 3; ++it) {
      INFO("iteration " << it);
      opt.zero_grad();
      AnyTensor loss = square_loss(p);
      int64_t r0 = dev.reads;
      AnyTensor scaled = scaler.scale(loss);
      CHECK(dev.reads == r0);  // scale(): no read
      scaled.backward();
      r0 = dev.reads;
      scaler.unscale_(opt);
      CHECK(dev.reads == r0);  // unscale_: kernels only
      optim::clip_grad_value_(opt.param_groups()[0].params, 100.0);
      r0 = dev.reads;
      CHECK(scaler.step(opt));
      CHECK(dev.reads == r0 + 1);  // the one read: the found-inf flag
      r0 = dev.reads;
      scaler.update();
      const double sc = scaler.get_scale();
      auto sd = scaler.state_dict();
      CHECK(dev.reads == r0);  // update, get_scale and state_dict use the host mirror
      CHECK(sc == 64.0 * std::pow(2.0, it + 1));
      CHECK(sd.at("scale") == sc);
    }
    // unscale_ without step(): update() has to read the flag itself (once).
    opt.zero_grad();
    scaler.scale(square_loss(p)).backward();
    scaler.unscale_(opt);
    int64_t r0 = dev.reads;
    scaler.update();
    CHECK(dev.reads == r0 + 1);
    CHECK(scaler.scale_tensor().device() == d);
  }
}

// ---------------------------------------------------------------------------- fused unscale
namespace {
// An optimizer of each kind that fuses the unscale into its step, options switched on broadly.
std::unique_ptr<optim::Optimizer> make_fusing_optimizer(int kind, const AnyTensor& p) {
  std::vector<AnyTensor> ps{p};
  switch (kind) {
    case 0: return std::make_unique<optim::SGD>(ps, optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true});
    case 1: return std::make_unique<optim::Adam>(ps, optim::AdamOptions{.lr = 1e-2, .weight_decay = 0.01});
    case 2: return std::make_unique<optim::AdamW>(ps, optim::AdamOptions{.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true});
    default: return std::make_unique<optim::RMSprop>(ps, optim::RMSpropOptions{.lr = 1e-2, .momentum = 0.5, .centered = true});
  }
}
const char* const kFusingNames[] = {"SGD", "Adam", "AdamW", "RMSprop"};

// Six iterations of a scaled training step on one parameter (pdt) with gradients of gdt: the
// gradient is a fixed random one times the current scale (what backward of the scaled loss
// gives), with an inf in iteration 3. Growth every 2 clean steps, so the scale changes both ways.
// Returns, per iteration, whether it stepped, the scale, the parameter's and the gradient's
// bytes after step() and the optimizer's state.
std::vector<std::vector<unsigned char>> scaled_trajectory(int kind, DType pdt, DType gdt, bool fuse,
                                                          Device d = Device::cpu()) {
  Generator gen(7);
  AnyTensor p = Tensor<double>::randn({53, 7}, Device::cpu(), 0.0, 1.0, gen).to(pdt).to(d).detach().clone();
  p.set_requires_grad(true);
  auto opt = make_fusing_optimizer(kind, p);
  amp::GradScaler scaler({.init_scale = 1024.0, .growth_factor = 2.0, .backoff_factor = 0.5, .growth_interval = 2});
  scaler.set_fuse_unscale(fuse);
  std::vector<std::vector<unsigned char>> out;
  for (int it = 0; it < 6; ++it) {
    (void)scaler.scale(AnyTensor::zeros(Shape{}, DType::Float32, d));  // the scale exists
    AnyTensor g = Tensor<double>::randn({53, 7}, Device::cpu(), 0.0, it == 4 ? 1e-3 : 1.0, gen);
    p.set_grad(op::mul(g, scaler.get_scale()).to(gdt).to(d));
    if (it == 3) poke(p.grad(), 100, kInf);
    const bool stepped = scaler.step(*opt);
    out.push_back({static_cast<unsigned char>(stepped)});
    const double sc = scaler.get_scale();
    const auto* sb = reinterpret_cast<const unsigned char*>(&sc);
    out.emplace_back(sb, sb + sizeof sc);
    out.push_back(bytes_of(p));
    out.push_back(bytes_of(p.grad()));
    const auto sd = opt->state_dict();
    for (const auto& [i, st] : sd.state)
      for (const auto& [name, t] : st) out.push_back(bytes_of(t));
    scaler.update();
  }
  return out;
}
}  // namespace

TEST_CASE("GradScaler step with the unscale fused into SGD / Adam / AdamW / RMSprop equals unscale_ then step, bitwise",
          "[amp][scaler][fused]") {
  const std::pair<DType, DType> dtypes[] = {{DType::Float32, DType::Float32},
                                            {DType::Float64, DType::Float64},
                                            {DType::Float16, DType::Float16},
                                            {DType::BFloat16, DType::Float32},
                                            {DType::Float32, DType::Float16}};
  for (int kind = 0; kind < 4; ++kind) {
    for (const auto& [pdt, gdt] : dtypes) {
      INFO(kFusingNames[kind] << ", parameter " << dtype_name(pdt) << ", gradient " << dtype_name(gdt));
      const auto fused = scaled_trajectory(kind, pdt, gdt, true);
      const auto reference = scaled_trajectory(kind, pdt, gdt, false);
      REQUIRE(fused.size() == reference.size());
      for (size_t i = 0; i < fused.size(); ++i) {
        INFO("record " << i);
        REQUIRE(fused[i] == reference[i]);  // parameter, unscaled gradient, state, verdict and scale
      }
      REQUIRE(fused[0] == std::vector<unsigned char>{1});  // the first iteration stepped
    }
  }
}

TEST_CASE("GradScaler fused unscale: step() checks, then one kernel unscales and steps, and the fallbacks",
          "[amp][scaler][fused]") {
  if (real_gpu_present()) return;
  CountingGpu gpu;
  CountingCudaBackend& dev = counting_backend();
  AnyTensor p = make_param(Device::cuda(0));
  optim::SGD opt({p}, {.lr = 0.125, .momentum = 0.5});
  amp::GradScaler scaler({.init_scale = 64.0, .growth_interval = 1000});
  auto iteration = [&](auto before_step) {
    opt.zero_grad();
    scaler.scale(square_loss(p)).backward();
    before_step();
    const int64_t m0 = dev.mul_scalars, c0 = dev.checks, s0 = dev.sgd_steps;
    const bool stepped = scaler.step(opt);
    scaler.update();
    return std::tuple{stepped, dev.mul_scalars - m0, dev.checks - c0, dev.sgd_steps - s0};
  };
  SECTION("fused: one check, no separate multiplication, the kernel gets 1 / scale") {
    const auto [stepped, muls, checks, steps] = iteration([] {});
    CHECK(stepped);
    CHECK(muls == 0);
    CHECK(checks == 1);
    CHECK(steps == 1);
    CHECK(dev.last_grad_unscale == 1.0 / 64.0);
    CHECK(p.grad().to_double_vector() == std::vector<double>{2.0, 4.0, 6.0});  // left unscaled, as unscale_ leaves it
    CHECK(p.to_double_vector() == std::vector<double>{0.75, 1.5, 2.25});         // p - 0.125 * 2p (first momentum step)
  }
  SECTION("an inf: no step, the gradients unscaled all the same") {
    const auto [stepped, muls, checks, steps] = iteration([&] { poke(p.grad(), 1, kInf); });
    CHECK_FALSE(stepped);
    CHECK(muls == 1);
    CHECK(steps == 0);
    const auto g = p.grad().to_double_vector();
    CHECK(g[0] == 2.0);
    CHECK(g[2] == 6.0);
  }
  SECTION("set_fuse_unscale(false), unscale_ called first, or a non-fused optimizer: unscale_ then step") {
    int variant = GENERATE(0, 1, 2);
    INFO("variant " << variant);
    if (variant == 0) scaler.set_fuse_unscale(false);
    if (variant == 2) opt.set_fused(false);
    const auto [stepped, muls, checks, steps] = iteration([&] {
      if (variant == 1) scaler.unscale_(opt);
    });
    CHECK(stepped);
    CHECK(checks == (variant == 1 ? 0 : 1));
    if (variant == 2)
      CHECK(muls >= 1);  // unscale_'s, then the composite step's own scalar products
    else
      CHECK(muls == (variant == 1 ? 0 : 1));  // (variant 1: unscale_ ran before the count)
    CHECK(steps == (variant == 2 ? 0 : 1));
    if (variant != 2) CHECK(dev.last_grad_unscale == 1.0);
    CHECK(p.grad().to_double_vector() == std::vector<double>{2.0, 4.0, 6.0});
    CHECK(p.to_double_vector() == std::vector<double>{0.75, 1.5, 2.25});  // 1 - 0.125 * 2 = 0.75, ...
  }
}

TEST_CASE("parity: the GradScaler's unscale fused into the optimizer steps, CPU versus CUDA",
          "[amp][scaler][fused][cuda][parity]") {
  EMBER_REQUIRE_GPU();
  const std::pair<DType, DType> dtypes[] = {{DType::Float32, DType::Float32},
                                            {DType::Float64, DType::Float64},
                                            {DType::Float16, DType::Float16},
                                            {DType::BFloat16, DType::Float32}};
  for (int kind = 0; kind < 4; ++kind) {
    for (const auto& [pdt, gdt] : dtypes) {
      INFO(kFusingNames[kind] << ", parameter " << dtype_name(pdt) << ", gradient " << dtype_name(gdt));
      // The same rounded operations in the same order (kernels/optim_step.cuh): bitwise.
      REQUIRE(scaled_trajectory(kind, pdt, gdt, true, Device::cuda(0)) == scaled_trajectory(kind, pdt, gdt, true));
    }
  }
}

TEST_CASE("Optimizer::step_unscaling refuses an optimizer that does not fuse the unscale", "[amp][scaler][fused][errors]") {
  AnyTensor p = make_param();
  optim::SGD opt({p}, {.lr = 0.5});
  opt.set_fused(false);
  CHECK_FALSE(opt.fuses_grad_unscale());
  REQUIRE_THROWS_WITH(opt.step_unscaling(0.5), Catch::Matchers::Contains("SGD.step_unscaling: this optimizer does not fuse"));
  opt.set_fused(true);
  CHECK(opt.fuses_grad_unscale());
}

// ---------------------------------------------------------------------------- fp16 training

namespace {
struct Fp16RunResult {
  int stepped = 0, skipped = 0;
  double first_loss = 0, last_loss = 0, final_scale = 0;
  bool params_finite = true;
  bool scale_finite = true;
  std::vector<double> scales;
};

// An MLP whose forward runs in half (fp32 master weights), trained with an initial scale of 2^24:
// the first scaled gradients overflow fp16, the scaler backs off, then training proceeds.
Fp16RunResult train_fp16_mlp(Device d) {
  auto model = make_mlp(41, 8, 32, 1);
  model->to(d);
  auto params = model->parameters();
  optim::Adam opt(params, {.lr = 1e-2});
  amp::GradScaler scaler({.init_scale = std::ldexp(1.0, 24)});
  Generator g(42);
  Tensor<float> x = Tensor<float>::randn({64, 8}, Device::cpu(), 0.0, 1.0, g);
  // A smooth target: y = tanh(sum of the first four features) - 0.5 * x_5.
  std::vector<float> xv = x.to_vector(), yv(64);
  for (int i = 0; i < 64; ++i) {
    float s = 0;
    for (int j = 0; j < 4; ++j) s += xv[static_cast<size_t>(i * 8 + j)];
    yv[static_cast<size_t>(i)] = std::tanh(s) - 0.5f * xv[static_cast<size_t>(i * 8 + 5)];
  }
  Tensor<float> y = Tensor<float>::from_vector(yv, {64, 1});
  x = x.to(d);
  y = y.to(d);
  Fp16RunResult r;
  for (int s = 0; s < 150; ++s) {
    opt.zero_grad();
    {
      amp::CastCacheGuard cache;
      Tensor<half> out = (*model)(x.to<half>());
      Tensor<float> loss = nn::functional::mse_loss(out, y);
      const double l = loss.item();
      if (s == 0) r.first_loss = l;
      r.last_loss = l;
      scaler.scale(loss).backward();
    }
    (scaler.step(opt) ? r.stepped : r.skipped) += 1;
    scaler.update();
    r.scales.push_back(scaler.get_scale());
    r.scale_finite = r.scale_finite && std::isfinite(scaler.get_scale()) && scaler.get_scale() > 0;
  }
  r.params_finite = all_finite(params);
  r.final_scale = scaler.get_scale();
  return r;
}

void check_fp16_run(const Fp16RunResult& r) {
  INFO("stepped " << r.stepped << " skipped " << r.skipped << " loss " << r.first_loss << " -> " << r.last_loss
                  << " final scale " << r.final_scale);
  CHECK(r.skipped >= 1);                         // 2^24 overflows fp16 gradients
  CHECK(r.scales.front() == std::ldexp(1.0, 23));  // the first step is skipped and backs off
  CHECK(r.final_scale < std::ldexp(1.0, 24));
  CHECK(r.stepped >= 100);
  CHECK(r.params_finite);
  CHECK(r.scale_finite);
  CHECK(std::isfinite(r.last_loss));
  CHECK(r.last_loss < 0.5 * r.first_loss);
}
}  // namespace

TEST_CASE("GradScaler fp16 MLP on cuda backs off from 2^24 and trains", "[amp][gpu]") {
  EMBER_REQUIRE_GPU();
  check_fp16_run(train_fp16_mlp(Device::cuda(0)));
}

TEST_CASE("GradScaler fp16 MLP on the pretend device backs off from 2^24 and trains", "[amp][pretend]") {
  testing::PretendGpu gpu;
  check_fp16_run(train_fp16_mlp(Device::cuda(0)));
}

// ---------------------------------------------------------------------------- cast cache

TEST_CASE("CastCacheGuard casts a parameter once per scope", "[amp][cast_cache]") {
  AnyTensor w = AnyTensor(Tensor<float>::from_vector({1.0f, -2.0f, 0.5f, 3.0f}, {2, 2}));
  w.set_requires_grad(true);
  CHECK_FALSE(amp::cast_cache_enabled());
  // Outside a scope every use casts anew.
  CHECK_FALSE(nn::param_as<half>(w).same(nn::param_as<half>(w)));
  AnyTensor first;
  {
    amp::CastCacheGuard cache;
    CHECK(amp::cast_cache_enabled());
    const auto s0 = amp::cast_cache_stats();
    Tensor<half> a = nn::param_as<half>(w);
    Tensor<half> b = nn::param_as<half>(w);
    const auto s1 = amp::cast_cache_stats();
    CHECK(a.same(b));
    CHECK(s1.casts - s0.casts == 1);
    CHECK(s1.hits - s0.hits == 1);
    CHECK(s1.entries == 1);
    CHECK(a.to_double_vector() == w.to_double_vector());
    CHECK(nn::param_as<float>(w).same(w));  // no cast needed: the parameter itself
    Tensor<bfloat16> c = nn::param_as<bfloat16>(w);  // another dtype: its own entry
    CHECK(amp::cast_cache_stats().entries == 2);
    CHECK(nn::param_as<bfloat16>(w).same(c));
    first = a;
    {
      amp::CastCacheGuard nested;  // shares the cache, and does not empty it when it ends
      CHECK(nn::param_as<half>(w).same(first));
    }
    CHECK(nn::param_as<half>(w).same(first));
  }
  CHECK_FALSE(amp::cast_cache_enabled());
  CHECK(amp::cast_cache_stats().entries == 0);
  {
    amp::CastCacheGuard cache;
    Tensor<half> again = nn::param_as<half>(w);
    CHECK_FALSE(again.same(first));  // a new scope makes a new cast
    amp::clear_cast_cache();
    CHECK_FALSE(nn::param_as<half>(w).same(again));
  }
}

TEST_CASE("CastCacheGuard leaves buffers, non-leaves and no-grad casts alone", "[amp][cast_cache]") {
  AnyTensor buffer = AnyTensor(Tensor<float>::from_vector({1.0f, 2.0f}));  // does not require grad
  AnyTensor w = AnyTensor(Tensor<float>::from_vector({1.0f, 2.0f}));
  w.set_requires_grad(true);
  AnyTensor non_leaf = op::mul(w, 2.0);
  amp::CastCacheGuard cache;
  const auto s0 = amp::cast_cache_stats();
  CHECK_FALSE(nn::param_as<half>(buffer).same(nn::param_as<half>(buffer)));
  CHECK_FALSE(nn::param_as<half>(non_leaf).same(nn::param_as<half>(non_leaf)));
  {
    NoGradGuard no_grad;
    Tensor<half> a = nn::param_as<half>(w);
    CHECK_FALSE(a.same(nn::param_as<half>(w)));
    CHECK_FALSE(a.requires_grad());
  }
  CHECK(amp::cast_cache_stats().casts == s0.casts);
  // A cast made after the no-grad ones is cached and carries the gradient.
  Tensor<half> c = nn::param_as<half>(w);
  CHECK(c.requires_grad());
  CHECK(amp::cast_cache_stats().casts == s0.casts + 1);
}

TEST_CASE("CastCacheGuard gradients reach the fp32 master as without the cache", "[amp][cast_cache]") {
  // y = W (W x): W used twice. Small integers keep every fp16 product and sum exact, so the cached
  // run (fp16 sum of the two uses, one conversion) and the plain run agree bitwise.
  auto run = [](bool cached) {
    AnyTensor w = AnyTensor(Tensor<float>::from_vector({1, -2, 0, 3, 1, -1, 2, 0, 1}, {3, 3}));
    w.set_requires_grad(true);
    Tensor<half> x = Tensor<float>::from_vector({1, 2, -1, 0, 1, 2}, {2, 3}).to<half>();
    std::unique_ptr<amp::CastCacheGuard> guard;
    if (cached) guard = std::make_unique<amp::CastCacheGuard>();
    const auto s0 = amp::cast_cache_stats();
    Tensor<half> h = matmul(x, nn::param_as<half>(w), false, true);
    Tensor<half> y = matmul(h, nn::param_as<half>(w), false, true);
    const int64_t casts = amp::cast_cache_stats().casts - s0.casts;
    Tensor<float> loss = sum(y.to<float>() * Tensor<float>::from_vector({1, 2, 3, -1, 0, 1}, {2, 3}));
    loss.backward();
    return std::make_pair(w.grad().to_double_vector(), casts);
  };
  auto [plain, plain_casts] = run(false);
  auto [cached, cached_casts] = run(true);
  CHECK(plain_casts == 0);
  CHECK(cached_casts == 1);
  CHECK(cached == plain);
  bool nonzero = false;
  for (double v : plain) nonzero = nonzero || v != 0.0;
  CHECK(nonzero);

  SECTION("a Linear applied twice in fp16, random weights") {
    auto grads = [](bool cached) {
      manual_seed(51);
      nn::Linear lin(6, 6);
      Generator g(52);
      Tensor<half> x = Tensor<float>::randn({5, 6}, Device::cpu(), 0.0, 1.0, g).to<half>();
      std::unique_ptr<amp::CastCacheGuard> guard;
      if (cached) guard = std::make_unique<amp::CastCacheGuard>();
      Tensor<float> loss = sum(square(lin(tanh(lin(x))).to<float>()));
      loss.backward();
      return std::make_pair(lin.weight.grad().to_double_vector(), lin.bias.grad().to_double_vector());
    };
    auto [pw, pb] = grads(false);
    auto [cw, cb] = grads(true);
    REQUIRE(pw.size() == cw.size());
    double scale = 0, worst = 0;
    for (size_t i = 0; i < pw.size(); ++i) {
      scale = std::max(scale, std::fabs(pw[i]));
      worst = std::max(worst, std::fabs(pw[i] - cw[i]));
    }
    for (size_t i = 0; i < pb.size(); ++i) worst = std::max(worst, std::fabs(pb[i] - cb[i]));
    INFO("worst " << worst << " scale " << scale);
    CHECK(scale > 0);
    CHECK(worst <= 2e-3 * scale);  // the two uses' gradients are summed in fp16 (as torch's cache)
  }
}

TEST_CASE("CastCacheGuard serves several backward passes in one scope", "[amp][cast_cache]") {
  // Two micro-batches through the same cached casts, each with its own backward: the gradients
  // accumulate exactly as with fresh casts per micro-batch.
  auto run = [](bool cached) {
    auto model = make_mlp(61, 4, 8, 2);
    std::unique_ptr<amp::CastCacheGuard> guard;
    if (cached) guard = std::make_unique<amp::CastCacheGuard>();
    const auto s0 = amp::cast_cache_stats();
    for (uint64_t mb = 0; mb < 2; ++mb) {
      Batch b = make_batch(62 + mb, 8);
      Tensor<float> loss = nn::functional::mse_loss((*model)(b.x.to<half>()), b.y);
      loss.backward();
    }
    const auto s1 = amp::cast_cache_stats();
    return std::make_pair(bytes_of(model->parameters()[0].grad()), s1.casts - s0.casts);
  };
  auto [plain, plain_casts] = run(false);
  auto [cached, cached_casts] = run(true);
  CHECK(plain_casts == 0);
  CHECK(cached_casts == 4);  // two weights and two biases, once each for both micro-batches
  CHECK((cached == plain));  // each parameter is used once per forward: bitwise the same
}

TEST_CASE("CastCacheGuard casts again a parameter moved by Module::to", "[amp][cast_cache]") {
  nn::Linear lin(2, 2);
  amp::CastCacheGuard cache;
  Tensor<half> a = nn::param_as<half>(lin.weight);
  lin.to(DType::Float64);  // the same TensorImpl, new storage
  Tensor<half> b = nn::param_as<half>(lin.weight);
  CHECK_FALSE(a.same(b));
  CHECK(b.to_double_vector() == lin.weight.to(DType::Float16).to_double_vector());
}

// ---------------------------------------------------------------------------- accumulation

TEST_CASE("GradientAccumulator counts micro-batches and divides the loss", "[amp][accumulate]") {
  train::GradientAccumulator acc(3);
  CHECK(acc.accumulation_steps() == 3);
  std::vector<int> sync, last, should;
  for (int i = 0; i < 7; ++i) {
    should.push_back(acc.should_sync());
    last.push_back(acc.is_last_micro_batch());
    sync.push_back(acc.sync_step());
  }
  CHECK(should == std::vector<int>{0, 0, 1, 0, 0, 1, 0});
  CHECK(last == should);
  CHECK(sync == std::vector<int>{0, 0, 1, 0, 0, 1, 0});
  CHECK(acc.micro_batch() == 1);
  acc.reset();
  CHECK(acc.is_first_micro_batch());
  Tensor<float> loss = Tensor<float>::scalar(6.0f);
  CHECK(acc.scale_loss(loss).item() == 2.0f);
  train::GradientAccumulator one(1);
  CHECK(one.scale_loss(loss).same(loss));
  CHECK(one.should_sync());
  CHECK(one.sync_step());
  acc.set_accumulation_steps(2);
  CHECK(acc.scale_loss(loss).item() == 3.0f);
  CHECK_THROWS_WITH(train::GradientAccumulator(0), Contains("accumulation_steps must be >= 1"));
  CHECK_THROWS_AS(acc.scale_loss(Tensor<int32_t>::scalar(1)), DTypeError);
}

namespace {
// Gradients of `model` (flattened) for one batch of k*b samples, or for k micro-batches of b.
std::vector<double> flat_grads(nn::Module& m) {
  std::vector<double> out;
  for (auto& p : m.parameters()) {
    auto v = p.grad().to_double_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double scale = 0, worst = 0;
  for (double v : b) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst / scale;
}

template <class MakeModel>
std::pair<std::vector<double>, std::vector<double>> full_vs_accumulated(MakeModel make, int64_t k, int64_t b,
                                                                        bool train_mode = true) {
  const int64_t n = k * b;
  Batch all = make_batch(71, n, 4, 2);
  auto full = make();
  full->train(train_mode);
  nn::functional::mse_loss((*full)(all.x), all.y).backward();
  auto acc_model = make();
  acc_model->train(train_mode);
  train::GradientAccumulator acc(k);
  int syncs = 0;
  for (int64_t i = 0; i < k; ++i) {
    Batch mb{all.x.slice(i * b, (i + 1) * b), all.y.slice(i * b, (i + 1) * b)};
    acc.scale_loss(nn::functional::mse_loss((*acc_model)(mb.x), mb.y)).backward();
    syncs += acc.sync_step();
  }
  CHECK(syncs == 1);
  return {flat_grads(*full), flat_grads(*acc_model)};
}
}  // namespace

TEST_CASE("GradientAccumulator k micro-batches give the gradients of one batch of k times b", "[amp][accumulate]") {
  auto make = [] { return make_mlp(73, 4, 16, 2); };
  auto [full, accumulated] = full_vs_accumulated(make, 4, 8);
  REQUIRE(full.size() == accumulated.size());
  const double rel = max_rel_diff(accumulated, full);
  INFO("max relative difference " << rel);
  CHECK(rel <= 1e-6);  // relative to the largest gradient element
  double largest = 0;
  for (double v : full) largest = std::max(largest, std::fabs(v));
  for (size_t i = 0; i < full.size(); ++i) {  // and element by element, with a floor for tiny elements
    INFO("element " << i << ": " << accumulated[i] << " vs " << full[i]);
    CHECK(std::fabs(accumulated[i] - full[i]) <= 1e-6 * std::fabs(full[i]) + 1e-7 * largest);
  }
}

TEST_CASE("GradientAccumulator with BatchNorm is not the full batch", "[amp][accumulate]") {
  // Per-micro-batch statistics differ from full-batch statistics: the gradients differ (the header
  // documents it). In eval mode BatchNorm uses its running statistics, per sample: they agree.
  auto make = [] {
    manual_seed(81);
    auto m = std::make_shared<nn::Sequential>();
    m->emplace<nn::Linear>(4, 8);
    m->emplace<nn::BatchNorm1d>(8);
    m->emplace<nn::Tanh>();
    m->emplace<nn::Linear>(8, 2);
    return m;
  };
  auto [full, accumulated] = full_vs_accumulated(make, 4, 8, /*train_mode=*/true);
  const double rel = max_rel_diff(accumulated, full);
  INFO("train mode: max relative difference " << rel);
  CHECK(rel > 1e-3);
  auto [full_eval, acc_eval] = full_vs_accumulated(make, 4, 8, /*train_mode=*/false);
  const double rel_eval = max_rel_diff(acc_eval, full_eval);
  INFO("eval mode: max relative difference " << rel_eval);
  CHECK(rel_eval <= 1e-6);
}

TEST_CASE("GradientAccumulator with GradScaler skips the step on an inf in any micro-batch", "[amp][accumulate]") {
  const int64_t k = 3, b = 8;
  for (int64_t poisoned = -1; poisoned < k; ++poisoned) {
    INFO("poisoned micro-batch " << poisoned << " (-1: none)");
    auto model = make_mlp(91, 4, 8, 2);
    auto params = model->parameters();
    optim::Adam opt(params, {.lr = 1e-2});
    amp::GradScaler scaler({.init_scale = 1024.0});
    train::GradientAccumulator acc(k);
    // A clean first step, so that Adam has state.
    for (int64_t i = 0; i < k; ++i) {
      Batch mb = make_batch(92 + static_cast<uint64_t>(i), b);
      scaler.scale(acc.scale_loss(mlp_loss(*model, mb))).backward();
      if (acc.sync_step()) {
        REQUIRE(scaler.step(opt));
        scaler.update();
        opt.zero_grad();
      }
    }
    auto before = bytes_of(params);
    auto state_before = opt.state_dict();
    bool stepped = false, synced = false;
    for (int64_t i = 0; i < k; ++i) {
      Batch mb = make_batch(95 + static_cast<uint64_t>(i), b);
      if (i == poisoned) poke(mb.y, 5, kInf);  // one target: an inf loss, inf/NaN gradients
      scaler.scale(acc.scale_loss(mlp_loss(*model, mb))).backward();
      if (acc.sync_step()) {
        synced = true;
        stepped = scaler.step(opt);
        scaler.update();
        opt.zero_grad();
      }
    }
    CHECK(synced);
    CHECK(stepped == (poisoned < 0));
    if (poisoned >= 0) {
      CHECK((bytes_of(params) == before));
      CHECK(same_state(opt.state_dict(), state_before));
      CHECK(scaler.get_scale() == 512.0);
    } else {
      CHECK((bytes_of(params) != before));
      CHECK(scaler.get_scale() == 1024.0);
    }
  }
}

TEST_CASE("GradientAccumulator with GradScaler matches the unscaled accumulation bitwise", "[amp][accumulate]") {
  auto scaled_model = make_mlp(101), control_model = make_mlp(101);
  auto sp = scaled_model->parameters(), cp = control_model->parameters();
  optim::SGD sopt(sp, {.lr = 0.1}), copt(cp, {.lr = 0.1});
  amp::GradScaler scaler({.init_scale = 512.0, .growth_interval = 2});
  train::GradientAccumulator acc(4);
  for (int i = 0; i < 12; ++i) {
    Batch mb = make_batch(102 + static_cast<uint64_t>(i), 4);
    Tensor<float> scaled_loss = scaler.scale(acc.scale_loss(mlp_loss(*scaled_model, mb)));
    scaled_loss.backward();
    acc.scale_loss(mlp_loss(*control_model, mb)).backward();
    if (acc.sync_step()) {
      CHECK(scaler.step(sopt));
      scaler.update();
      copt.step();
      sopt.zero_grad();
      copt.zero_grad();
      CHECK(same_bytes(sp, cp));
    }
  }
  CHECK(scaler.get_scale() == 1024.0);  // three clean steps, interval 2: one growth
}
