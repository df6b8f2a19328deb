// Optimizers, gradient clipping and learning-rate schedulers.
//
// Each optimizer runs on a fixed problem against a reference written here in plain loops over
// doubles that follows the update rule published in the torch.optim documentation (the
// pseudo-code of each class's page; quoted above each reference), plus one or two steps worked out
// by hand. Schedulers are checked against their closed forms and against torch's recursive
// (chainable) get_lr, transcribed. Also: parameter groups, parameters without a gradient, state
// round trips (bitwise), device placement of the state, a convergence test and error messages.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <sstream>
#include <vector>

#include <ember/ember.hpp>

#include "gpu_skip.hpp"
#include "pretend_gpu.hpp"

using namespace ember;
using Catch::Contains;

namespace {

using Vec = std::vector<double>;

AnyTensor make_param(const Vec& v, DType dt = DType::Float64, const Shape& shape = {}) {
  AnyTensor t = AnyTensor(Tensor<double>::from_vector(v)).to(dt);
  if (shape.dim() > 0) t = t.reshape(shape).detach();
  t.set_requires_grad(true);
  return t;
}

void set_grad(AnyTensor& p, const Vec& g) {
  p.set_grad(AnyTensor(Tensor<double>::from_vector(g)).to(p.dtype()).reshape(p.shape()).detach().to(p.device()));
}

Vec values(const std::vector<AnyTensor>& ps) {
  Vec out;
  for (const auto& p : ps) {
    Vec v = p.to_double_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// Sets each parameter's gradient from a slice of one flat gradient vector.
void set_grads(std::vector<AnyTensor>& ps, const Vec& g) {
  size_t at = 0;
  for (auto& p : ps) {
    Vec part(g.begin() + static_cast<std::ptrdiff_t>(at), g.begin() + static_cast<std::ptrdiff_t>(at + p.numel()));
    set_grad(p, part);
    at += static_cast<size_t>(p.numel());
  }
}

// The fixed problem: L(theta) = sum_i c_i (theta_i - t_i)^2, so dL/dtheta_i = 2 c_i (theta_i - t_i).
struct Quadratic {
  Vec c{1.0, 0.5, 2.0, 0.25, 3.0};
  Vec t{0.5, 1.0, -1.5, 2.0, 0.0};
  Vec grad(const Vec& th) const {
    Vec g(th.size());
    for (size_t i = 0; i < th.size(); ++i) g[i] = 2.0 * c[i] * (th[i] - t[i]);
    return g;
  }
};
const Vec kTheta0{1.0, -2.0, 0.5, 3.0, -0.25};

// Two parameters holding kTheta0: a [3] and a [1, 2].
std::vector<AnyTensor> make_params(DType dt = DType::Float64) {
  return {make_param({kTheta0[0], kTheta0[1], kTheta0[2]}, dt), make_param({kTheta0[3], kTheta0[4]}, dt, {1, 2})};
}

void check_close(const Vec& got, const Vec& want, double rtol, double atol = 0.0) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
    CHECK(std::abs(got[i] - want[i]) <= atol + rtol * std::abs(want[i]));
  }
}

// Runs opt and the reference in lockstep on the quadratic, each taking the gradient at its own
// current point, and compares the parameters after every step.
template <class Ref>
void compare_with_reference(optim::Optimizer& opt, std::vector<AnyTensor> ps, Ref ref, int steps, double rtol,
                            double atol = 0.0) {
  const Quadratic q;
  Vec th = values(ps);
  for (int s = 0; s < steps; ++s) {
    set_grads(ps, q.grad(values(ps)));
    opt.step();
    ref.step(th, q.grad(th));
    INFO("after step " << s + 1);
    check_close(values(ps), th, rtol, atol);
  }
}

// torch.optim.SGD documentation, algorithm:
//   if λ ≠ 0: g_t ← g_t + λ θ_{t-1}
//   if μ ≠ 0: if t > 1: b_t ← μ b_{t-1} + (1 - τ) g_t  else: b_t ← g_t
//             if nesterov: g_t ← g_t + μ b_t  else: g_t ← b_t
//   θ_t ← θ_{t-1} - γ g_t
struct RefSGD {
  double lr, mu = 0.0, tau = 0.0, wd = 0.0;
  bool nesterov = false;
  Vec b;
  int t = 0;
  void step(Vec& th, Vec g) {
    ++t;
    b.resize(th.size(), 0.0);
    for (size_t i = 0; i < th.size(); ++i) {
      if (wd != 0.0) g[i] += wd * th[i];
      if (mu != 0.0) {
        b[i] = t > 1 ? mu * b[i] + (1.0 - tau) * g[i] : g[i];
        g[i] = nesterov ? g[i] + mu * b[i] : b[i];
      }
      th[i] -= lr * g[i];
    }
  }
};

// torch.optim.Adam / AdamW documentation, algorithm:
//   Adam:  if λ ≠ 0: g_t ← g_t + λ θ_{t-1}          AdamW: θ_t ← θ_{t-1} - γ λ θ_{t-1}
//   m_t ← β1 m_{t-1} + (1 - β1) g_t
//   v_t ← β2 v_{t-1} + (1 - β2) g_t^2
//   m̂_t ← m_t / (1 - β1^t)
//   if amsgrad: v_t^max ← max(v_{t-1}^max, v_t);  v̂_t ← v_t^max / (1 - β2^t)
//   else:       v̂_t ← v_t / (1 - β2^t)
//   θ_t ← θ_t - γ m̂_t / (sqrt(v̂_t) + ε)
// (The max is of the raw second moments, as torch's code takes it; older docs wrote it on v̂.)
struct RefAdam {
  double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.0;
  bool amsgrad = false, decoupled = false;
  Vec m, v, vmax;
  int t = 0;
  void step(Vec& th, Vec g) {
    ++t;
    m.resize(th.size(), 0.0);
    v.resize(th.size(), 0.0);
    vmax.resize(th.size(), 0.0);
    for (size_t i = 0; i < th.size(); ++i) {
      if (decoupled) {
        th[i] -= lr * wd * th[i];
      } else if (wd != 0.0) {
        g[i] += wd * th[i];
      }
      m[i] = b1 * m[i] + (1.0 - b1) * g[i];
      v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
      const double mhat = m[i] / (1.0 - std::pow(b1, t));
      vmax[i] = std::max(vmax[i], v[i]);
      const double vhat = (amsgrad ? vmax[i] : v[i]) / (1.0 - std::pow(b2, t));
      th[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
};

// torch.optim.RMSprop documentation, algorithm:
//   if λ ≠ 0: g_t ← g_t + λ θ_{t-1}
//   v_t ← α v_{t-1} + (1 - α) g_t^2
//   ṽ_t ← v_t
//   if centered: g^ave_t ← g^ave_{t-1} α + (1 - α) g_t;  ṽ_t ← ṽ_t - (g^ave_t)^2
//   if μ > 0: b_t ← μ b_{t-1} + g_t / (sqrt(ṽ_t) + ε);  θ_t ← θ_{t-1} - γ b_t
//   else:     θ_t ← θ_{t-1} - γ g_t / (sqrt(ṽ_t) + ε)
struct RefRMSprop {
  double lr = 1e-2, alpha = 0.99, eps = 1e-8, wd = 0.0, mu = 0.0;
  bool centered = false;
  Vec v, gave, b;
  void step(Vec& th, Vec g) {
    v.resize(th.size(), 0.0);
    gave.resize(th.size(), 0.0);
    b.resize(th.size(), 0.0);
    for (size_t i = 0; i < th.size(); ++i) {
      if (wd != 0.0) g[i] += wd * th[i];
      v[i] = alpha * v[i] + (1.0 - alpha) * g[i] * g[i];
      double vt = v[i];
      if (centered) {
        gave[i] = gave[i] * alpha + (1.0 - alpha) * g[i];
        vt -= gave[i] * gave[i];
      }
      if (mu > 0.0) {
        b[i] = mu * b[i] + g[i] / (std::sqrt(vt) + eps);
        th[i] -= lr * b[i];
      } else {
        th[i] -= lr * g[i] / (std::sqrt(vt) + eps);
      }
    }
  }
};

constexpr double kTight = 1e-12;  // float64 against the reference: a few roundings apart
constexpr int kSteps = 8;

}  // namespace

// ---------------------------------------------------------------------------------------------
// SGD

TEST_CASE("SGD: plain, against the reference and by hand (float64)", "[optim][sgd]") {
  auto ps = make_params();
  optim::SGD opt(ps, {.lr = 0.1});
  compare_with_reference(opt, ps, RefSGD{.lr = 0.1}, kSteps, kTight);
  // By hand: theta = 2, grad 0.5: theta <- 2 - 0.1 * 0.5 = 1.95.
  AnyTensor p = make_param({2.0});
  optim::SGD one({p}, {.lr = 0.1});
  set_grad(p, {0.5});
  one.step();
  CHECK(p.to_double_vector()[0] == Approx(1.95).epsilon(1e-15));
  CHECK(one.state(p) == nullptr);  // no momentum: no state, as in torch
}

TEST_CASE("SGD: momentum, dampening and Nesterov by hand over two steps (float64)", "[optim][sgd]") {
  // theta0 = 1, lr = 0.1, mu = 0.9, grad 0.5 at both steps.
  auto two_steps = [](optim::SGDOptions o) {
    AnyTensor p = make_param({1.0});
    optim::SGD opt({p}, o);
    Vec out;
    for (int s = 0; s < 2; ++s) {
      set_grad(p, {0.5});
      opt.step();
      out.push_back(p.to_double_vector()[0]);
    }
    return out;
  };
  // momentum: b1 = g = 0.5, theta1 = 1 - 0.05 = 0.95; b2 = 0.9*0.5 + 0.5 = 0.95, theta2 = 0.95 - 0.095 = 0.855
  auto m = two_steps({.lr = 0.1, .momentum = 0.9});
  CHECK(m[0] == Approx(0.95).epsilon(1e-15));
  CHECK(m[1] == Approx(0.855).epsilon(1e-15));
  // dampening 0.5: the first step takes the gradient undamped (b1 = 0.5, theta1 = 0.95);
  // b2 = 0.45 + 0.5*0.5 = 0.7, theta2 = 0.95 - 0.07 = 0.88
  auto d = two_steps({.lr = 0.1, .momentum = 0.9, .dampening = 0.5});
  CHECK(d[0] == Approx(0.95).epsilon(1e-15));
  CHECK(d[1] == Approx(0.88).epsilon(1e-15));
  // nesterov: b1 = 0.5, g = 0.5 + 0.9*0.5 = 0.95, theta1 = 0.905;
  //           b2 = 0.95, g = 0.5 + 0.9*0.95 = 1.355, theta2 = 0.905 - 0.1355 = 0.7695
  auto n = two_steps({.lr = 0.1, .momentum = 0.9, .nesterov = true});
  CHECK(n[0] == Approx(0.905).epsilon(1e-15));
  CHECK(n[1] == Approx(0.7695).epsilon(1e-15));
}

TEST_CASE("SGD: momentum, dampening, Nesterov, weight decay against the reference (float64)", "[optim][sgd]") {
  SECTION("momentum") {
    auto ps = make_params();
    optim::SGD opt(ps, {.lr = 0.05, .momentum = 0.9});
    compare_with_reference(opt, ps, RefSGD{.lr = 0.05, .mu = 0.9}, kSteps, kTight);
    REQUIRE(opt.state(ps[0]) != nullptr);
    CHECK(opt.state(ps[0])->size() == 1);
    CHECK(opt.state(ps[0])->at(0).first == "momentum_buffer");
  }
  SECTION("dampening") {
    auto ps = make_params();
    optim::SGD opt(ps, {.lr = 0.05, .momentum = 0.8, .dampening = 0.3});
    compare_with_reference(opt, ps, RefSGD{.lr = 0.05, .mu = 0.8, .tau = 0.3}, kSteps, kTight);
  }
  SECTION("nesterov") {
    auto ps = make_params();
    optim::SGD opt(ps, {.lr = 0.05, .momentum = 0.9, .nesterov = true});
    compare_with_reference(opt, ps, RefSGD{.lr = 0.05, .mu = 0.9, .nesterov = true}, kSteps, kTight);
  }
  SECTION("weight decay, with and without momentum") {
    auto ps = make_params();
    optim::SGD opt(ps, {.lr = 0.05, .weight_decay = 0.1});
    compare_with_reference(opt, ps, RefSGD{.lr = 0.05, .wd = 0.1}, kSteps, kTight);
    auto qs = make_params();
    optim::SGD opt2(qs, {.lr = 0.05, .momentum = 0.5, .dampening = 0.1, .weight_decay = 0.2});
    compare_with_reference(opt2, qs, RefSGD{.lr = 0.05, .mu = 0.5, .tau = 0.1, .wd = 0.2}, kSteps, kTight);
  }
}

// ---------------------------------------------------------------------------------------------
// Adam, AdamW

TEST_CASE("Adam: two steps by hand (float64)", "[optim][adam]") {
  // theta0 = 1, constant grad 0.5, lr = 0.1, default betas and eps. With a constant gradient the
  // bias-corrected moments are exact: m̂ = g, v̂ = g^2 (step 1: m = 0.05, v = 0.00025,
  // m̂ = 0.05/0.1 = 0.5, v̂ = 0.00025/0.001 = 0.25; step 2: m = 0.095, v = 0.00049975,
  // m̂ = 0.095/0.19 = 0.5, v̂ = 0.00049975/0.001999 = 0.25). So each step moves theta by
  // 0.1 * 0.5 / (0.5 + 1e-8) = 0.09999999800000004.
  AnyTensor p = make_param({1.0});
  optim::Adam opt({p}, {.lr = 0.1});
  set_grad(p, {0.5});
  opt.step();
  CHECK(p.to_double_vector()[0] == Approx(1.0 - 0.09999999800000004).epsilon(1e-14));
  set_grad(p, {0.5});
  opt.step();
  CHECK(p.to_double_vector()[0] == Approx(1.0 - 2 * 0.09999999800000004).epsilon(1e-14));
  const optim::ParamState* st = opt.state(p);
  REQUIRE(st != nullptr);
  REQUIRE(st->size() == 3);
  CHECK((*st)[0].first == "step");
  CHECK((*st)[1].first == "exp_avg");
  CHECK((*st)[2].first == "exp_avg_sq");
  CHECK((*st)[0].second.item_double() == 2.0);
  CHECK((*st)[0].second.dtype() == DType::Float32);
  CHECK((*st)[1].second.item_double() == Approx(0.095).epsilon(1e-14));
  CHECK((*st)[2].second.item_double() == Approx(0.00049975).epsilon(1e-14));
}

TEST_CASE("Adam: defaults, L2 weight decay and amsgrad against the reference (float64)", "[optim][adam]") {
  SECTION("defaults") {
    auto ps = make_params();
    optim::Adam opt(ps);
    CHECK(opt.defaults().at("lr") == 1e-3);
    CHECK(opt.defaults().at("beta1") == 0.9);
    CHECK(opt.defaults().at("beta2") == 0.999);
    CHECK(opt.defaults().at("eps") == 1e-8);
    CHECK(opt.defaults().at("weight_decay") == 0.0);
    CHECK(opt.defaults().at("amsgrad") == 0.0);
    compare_with_reference(opt, ps, RefAdam{}, kSteps, kTight);
  }
  SECTION("larger lr, other betas") {
    auto ps = make_params();
    optim::Adam opt(ps, {.lr = 0.1, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6});
    compare_with_reference(opt, ps, RefAdam{.lr = 0.1, .b1 = 0.8, .b2 = 0.99, .eps = 1e-6}, kSteps, kTight);
  }
  SECTION("beta1 >= 0.5 takes lerp's other branch") {
    auto ps = make_params();
    optim::Adam opt(ps, {.lr = 0.1, .beta1 = 0.3});
    compare_with_reference(opt, ps, RefAdam{.lr = 0.1, .b1 = 0.3}, kSteps, kTight);
  }
  SECTION("L2 weight decay is added to the gradient") {
    auto ps = make_params();
    optim::Adam opt(ps, {.lr = 0.1, .weight_decay = 0.5});
    compare_with_reference(opt, ps, RefAdam{.lr = 0.1, .wd = 0.5}, kSteps, kTight);
  }
  SECTION("amsgrad, where the running max matters") {
    // Gradients set by hand, large then small, with a short beta2 memory, so that v_t falls
    // below its running max and amsgrad's step differs from Adam's.
    const std::vector<Vec> grads{{1.0, -2.0}, {0.1, -0.2}, {0.05, 0.1}, {0.02, -0.01}, {0.01, 0.02}};
    auto run = [&](bool amsgrad) {
      AnyTensor p = make_param({0.5, -0.5});
      optim::Adam opt({p}, {.lr = 0.1, .beta2 = 0.5, .amsgrad = amsgrad});
      RefAdam ref{.lr = 0.1, .b2 = 0.5, .amsgrad = amsgrad};
      Vec th{0.5, -0.5};
      for (const Vec& g : grads) {
        set_grad(p, g);
        opt.step();
        ref.step(th, g);
        check_close(p.to_double_vector(), th, kTight);
      }
      if (amsgrad) {
        REQUIRE(opt.state(p)->size() == 4);
        CHECK(opt.state(p)->at(3).first == "max_exp_avg_sq");
      }
      return p.to_double_vector();
    };
    Vec with = run(true), without = run(false);
    CHECK(std::abs(with[0] - without[0]) > 1e-3);  // the max took effect
  }
}

TEST_CASE("AdamW: decoupled weight decay, by hand and against the reference (float64)", "[optim][adamw]") {
  optim::AdamW defaults_check(make_params());
  CHECK(defaults_check.defaults().at("weight_decay") == 1e-2);
  CHECK(defaults_check.defaults().at("lr") == 1e-3);
  // By hand: theta0 = 1, grad 0.5, lr 0.1, wd 0.1: theta <- 1 * (1 - 0.1*0.1) = 0.99, then the
  // Adam step of 0.09999999800000004: 0.89000000199999996.
  AnyTensor p = make_param({1.0});
  optim::AdamW opt({p}, {.lr = 0.1, .weight_decay = 0.1});
  set_grad(p, {0.5});
  opt.step();
  CHECK(p.to_double_vector()[0] == Approx(0.99 - 0.09999999800000004).epsilon(1e-14));
  SECTION("default weight decay") {
    auto ps = make_params();
    optim::AdamW o(ps, {.lr = 0.1});
    compare_with_reference(o, ps, RefAdam{.lr = 0.1, .wd = 1e-2, .decoupled = true}, kSteps, kTight);
  }
  SECTION("large weight decay with amsgrad; differs from Adam's L2") {
    auto ps = make_params();
    optim::AdamW o(ps, {.lr = 0.1, .weight_decay = 0.5, .amsgrad = true});
    compare_with_reference(o, ps, RefAdam{.lr = 0.1, .wd = 0.5, .amsgrad = true, .decoupled = true}, kSteps, kTight);
    auto qs = make_params();
    optim::Adam l2(qs, {.lr = 0.1, .weight_decay = 0.5, .amsgrad = true});
    const Quadratic q;
    for (int s = 0; s < kSteps; ++s) {
      set_grads(qs, q.grad(values(qs)));
      l2.step();
    }
    CHECK(std::abs(values(ps)[0] - values(qs)[0]) > 1e-3);
  }
}

// ---------------------------------------------------------------------------------------------
// RMSprop

TEST_CASE("RMSprop: one step by hand, then plain, momentum, centered against the reference", "[optim][rmsprop]") {
  // theta0 = 1, grad 0.5, defaults (lr 0.01, alpha 0.99): v = 0.01 * 0.25 = 0.0025, sqrt(v) = 0.05,
  // theta1 = 1 - 0.01 * 0.5 / (0.05 + 1e-8) = 1 - 0.1 / (1 + 2e-7) = 0.90000001999999600...
  AnyTensor p = make_param({1.0});
  optim::RMSprop one({p});
  set_grad(p, {0.5});
  one.step();
  CHECK(p.to_double_vector()[0] == Approx(1.0 - 0.1 / (1.0 + 2e-7)).epsilon(1e-14));
  CHECK(one.defaults().at("alpha") == 0.99);
  SECTION("plain") {
    auto ps = make_params();
    optim::RMSprop opt(ps, {.lr = 0.01});
    compare_with_reference(opt, ps, RefRMSprop{.lr = 0.01}, kSteps, kTight);
    CHECK(opt.state(ps[0])->size() == 2);  // step, square_avg
  }
  SECTION("momentum and weight decay") {
    auto ps = make_params();
    optim::RMSprop opt(ps, {.lr = 0.01, .alpha = 0.9, .weight_decay = 0.1, .momentum = 0.8});
    compare_with_reference(opt, ps, RefRMSprop{.lr = 0.01, .alpha = 0.9, .wd = 0.1, .mu = 0.8}, kSteps, kTight);
    CHECK(opt.state(ps[0])->at(2).first == "momentum_buffer");
  }
  SECTION("centered, with and without momentum") {
    auto ps = make_params();
    optim::RMSprop opt(ps, {.lr = 0.01, .alpha = 0.9, .centered = true});
    compare_with_reference(opt, ps, RefRMSprop{.lr = 0.01, .alpha = 0.9, .centered = true}, kSteps, kTight);
    auto qs = make_params();
    optim::RMSprop opt2(qs, {.lr = 0.01, .alpha = 0.9, .momentum = 0.5, .centered = true});
    compare_with_reference(opt2, qs, RefRMSprop{.lr = 0.01, .alpha = 0.9, .mu = 0.5, .centered = true}, kSteps,
                           kTight);
    std::vector<std::string> names;
    for (auto& [k, v] : *opt2.state(qs[0])) names.push_back(k);
    CHECK(names == std::vector<std::string>{"step", "square_avg", "momentum_buffer", "grad_avg"});
  }
}

// ---------------------------------------------------------------------------------------------
// Precision, devices

TEST_CASE("optimizers on float32 parameters stay within float32 rounding of the reference", "[optim][float32]") {
  SECTION("Adam") {
    auto ps = make_params(DType::Float32);
    optim::Adam opt(ps, {.lr = 0.05});
    compare_with_reference(opt, ps, RefAdam{.lr = 0.05}, 20, 1e-5, 1e-6);
    CHECK(ps[0].dtype() == DType::Float32);
    CHECK(opt.state(ps[0])->at(1).second.dtype() == DType::Float32);
  }
  SECTION("SGD with Nesterov momentum") {
    auto ps = make_params(DType::Float32);
    optim::SGD opt(ps, {.lr = 0.05, .momentum = 0.9, .nesterov = true});
    compare_with_reference(opt, ps, RefSGD{.lr = 0.05, .mu = 0.9, .nesterov = true}, 20, 1e-5, 1e-6);
  }
  SECTION("RMSprop centered") {
    auto ps = make_params(DType::Float32);
    optim::RMSprop opt(ps, {.lr = 0.01, .centered = true});
    compare_with_reference(opt, ps, RefRMSprop{.lr = 0.01, .centered = true}, 20, 1e-5, 1e-6);
  }
}

TEST_CASE("fp16 and bf16 parameters keep fp32 optimizer state", "[optim][half]") {
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    // Values exactly representable in both 16-bit formats.
    AnyTensor p = make_param({1.0, -0.5}, dt);
    optim::Adam opt({p}, {.lr = 0.125});
    RefAdam ref{.lr = 0.125};
    Vec th{1.0, -0.5};
    for (int s = 0; s < 3; ++s) {
      const Vec g{0.25 * (s + 1), -0.5};
      set_grad(p, g);
      opt.step();
      ref.step(th, g);
    }
    CHECK(p.dtype() == dt);
    for (auto& [k, v] : *opt.state(p)) CHECK(v.dtype() == DType::Float32);
    // 16-bit storage of the parameter: within its rounding (bf16: 8 bits of mantissa).
    check_close(p.to_double_vector(), th, 1e-2);
  }
}

TEST_CASE("optimizer state lives on the parameter's device, step on the CPU", "[optim][device]") {
  testing::PretendGpu pretend;  // a CPU-backed cuda:0 when there is no GPU; the real one otherwise
  const Device dev = Device::cuda(0);
  auto on_dev = [&](DType dt) {
    auto ps = make_params(dt);
    for (auto& p : ps) {
      p = p.detach().to(dev);
      p.set_requires_grad(true);
    }
    return ps;
  };
  auto cpu = make_params(DType::Float32);
  auto gpu = on_dev(DType::Float32);
  optim::Adam a(cpu, {.lr = 0.05, .weight_decay = 0.1, .amsgrad = true});
  optim::Adam b(gpu, {.lr = 0.05, .weight_decay = 0.1, .amsgrad = true});
  const Quadratic q;
  for (int s = 0; s < 5; ++s) {
    set_grads(cpu, q.grad(values(cpu)));
    set_grads(gpu, q.grad(values(gpu)));
    a.step();
    b.step();
  }
  // 1e-5 relative (about 80 ulp of fp32), not 1e-6: on a real GPU nvcc contracts the update's
  // a*b+c into FMAs and the reductions sum in another order, so after 5 Adam steps the parameters
  // legitimately differ from the CPU's by a few ulp per step; a wrong update is off by far more.
  check_close(values(gpu), values(cpu), 1e-5, 1e-6);
  CHECK(gpu[0].device() == dev);
  for (auto& [k, v] : *b.state(gpu[0])) CHECK(v.device() == (k == "step" ? Device::cpu() : dev));
  // clip_grad_norm_ on device gradients.
  set_grads(gpu, {3.0, 4.0, 0.0, 12.0, 0.0});
  CHECK(optim::clip_grad_norm_(gpu, 1.0) == Approx(13.0).epsilon(1e-6));
  CHECK(values({gpu[0].grad()})[0] == Approx(3.0 / 13.0).epsilon(1e-5));

  // A module moved after the optimizer has state (Module::to moves parameters in place): the
  // state follows at the next step, and the run matches one that stayed on the CPU.
  manual_seed(3);
  nn::Linear moved(2, 1);
  manual_seed(3);
  nn::Linear stayed(2, 1);
  optim::Adam om(moved.parameters(), {.lr = 0.1});
  optim::Adam os(stayed.parameters(), {.lr = 0.1});
  auto x = Tensor<float>::from_vector({1.0f, -1.0f, 0.5f, 2.0f}, {2, 2});
  auto train_step = [&](nn::Linear& lin, optim::Adam& opt, Device d) {
    opt.zero_grad();
    auto y = lin(x.to(d));
    mean(y * y).backward();
    opt.step();
  };
  train_step(moved, om, Device::cpu());
  train_step(stayed, os, Device::cpu());
  moved.to(dev);
  train_step(moved, om, dev);
  train_step(stayed, os, Device::cpu());
  CHECK(optim::find_state(*om.state(moved.weight), "exp_avg")->device() == dev);
  CHECK(optim::find_state(*om.state(moved.weight), "step")->device() == Device::cpu());
  check_close(moved.weight.to_double_vector(), stayed.weight.to_double_vector(), 1e-6, 1e-7);
}

// ---------------------------------------------------------------------------------------------
// Groups, missing gradients, zero_grad, maximize

TEST_CASE("parameter groups: per-group lr and weight decay, unset options take the defaults", "[optim][groups]") {
  AnyTensor a = make_param({1.0, -2.0, 0.5});
  AnyTensor b = make_param({3.0, -0.25});
  optim::SGD opt({a}, {.lr = 0.1, .momentum = 0.9});
  opt.add_param_group({b}, {.lr = 0.01, .weight_decay = 0.5});
  REQUIRE(opt.param_groups().size() == 2);
  CHECK(opt.param_groups()[1].lr() == 0.01);
  CHECK(opt.param_groups()[1].at("momentum") == 0.9);  // inherited from the constructor, as in torch
  CHECK(opt.param_groups()[1].at("weight_decay") == 0.5);
  CHECK(opt.param_groups()[0].at("weight_decay") == 0.0);
  RefSGD ra{.lr = 0.1, .mu = 0.9}, rb{.lr = 0.01, .mu = 0.9, .wd = 0.5};
  Vec ta = a.to_double_vector(), tb = b.to_double_vector();
  auto grad = [](const Vec& th) {
    Vec g;
    for (double x : th) g.push_back(2.0 * x - 0.5);
    return g;
  };
  for (int s = 0; s < 4; ++s) {
    if (s == 2) {  // a scheduler's way in: change a group's lr between steps
      opt.param_groups()[0]["lr"] = 0.05;
      ra.lr = 0.05;
    }
    set_grad(a, grad(a.to_double_vector()));
    set_grad(b, grad(b.to_double_vector()));
    opt.step();
    ra.step(ta, grad(ta));
    rb.step(tb, grad(tb));
    check_close(a.to_double_vector(), ta, kTight);
    check_close(b.to_double_vector(), tb, kTight);
  }
  CHECK_THROWS_WITH(opt.param_groups()[0]["lrr"] = 1.0, Contains("no hyperparameter 'lrr'") && Contains("lr, momentum"));
  CHECK_THROWS_WITH(opt.add_param_group({a}), Contains("SGD") && Contains("more than once"));
  CHECK_THROWS_WITH(opt.add_param_group({make_param({1.0})}, {.lr = -1.0}), Contains("SGD: invalid learning rate"));
  CHECK(opt.param_groups().size() == 2);
}

TEST_CASE("a parameter without a gradient is skipped: unchanged, and no state is created", "[optim][groups]") {
  auto check_skips = [](optim::Optimizer& opt, AnyTensor& with, AnyTensor& without) {
    const Vec before = without.to_double_vector(), with_before = with.to_double_vector();
    for (int s = 0; s < 3; ++s) {
      set_grad(with, {0.5, -0.5});
      opt.step();
    }
    CHECK(without.to_double_vector() == before);
    CHECK(opt.state(without) == nullptr);
    CHECK(with.to_double_vector() != with_before);
    auto sd = opt.state_dict();
    CHECK(sd.state.size() == 1);
    CHECK(sd.state.count(0) == 1);  // index 0 is `with`, index 1 has no entry
  };
  {
    AnyTensor a = make_param({1.0, 2.0}), b = make_param({3.0, 4.0});
    optim::SGD opt({a, b}, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1});
    check_skips(opt, a, b);
  }
  {
    AnyTensor a = make_param({1.0, 2.0}), b = make_param({3.0, 4.0});
    optim::Adam opt({a, b}, {.weight_decay = 0.1});
    check_skips(opt, a, b);
  }
  {
    AnyTensor a = make_param({1.0, 2.0}), b = make_param({3.0, 4.0});
    optim::AdamW opt({a, b});
    check_skips(opt, a, b);
  }
  {
    AnyTensor a = make_param({1.0, 2.0}), b = make_param({3.0, 4.0});
    optim::RMSprop opt({a, b}, {.momentum = 0.5, .centered = true});
    check_skips(opt, a, b);
  }
}

TEST_CASE("zero_grad drops gradients, or zeroes them in place", "[optim][groups]") {
  AnyTensor a = make_param({1.0, 2.0});
  optim::SGD opt({a});
  set_grad(a, {0.5, 0.5});
  AnyTensor held = a.grad();
  opt.zero_grad(/*set_to_none=*/false);
  REQUIRE(a.grad().defined());
  CHECK(a.grad().same(held));
  CHECK(held.to_double_vector() == Vec{0.0, 0.0});
  opt.zero_grad();
  CHECK_FALSE(a.grad().defined());
}

TEST_CASE("maximize ascends: the same as descending on the negated gradient", "[optim][maximize]") {
  auto check = [](auto make) {
    AnyTensor up = make_param({1.0, -2.0}), down = make_param({1.0, -2.0});
    auto o_up = make(up, true);
    auto o_down = make(down, false);
    for (int s = 0; s < 4; ++s) {
      set_grad(up, {0.5 + s, -0.25});
      set_grad(down, {-0.5 - s, 0.25});
      o_up->step();
      o_down->step();
    }
    CHECK(up.to_double_vector() == down.to_double_vector());
    CHECK(up.to_double_vector() != Vec{1.0, -2.0});
  };
  check([](AnyTensor p, bool m) { return std::make_unique<optim::SGD>(std::vector<AnyTensor>{p}, optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .maximize = m}); });
  check([](AnyTensor p, bool m) { return std::make_unique<optim::Adam>(std::vector<AnyTensor>{p}, optim::AdamOptions{.lr = 0.1, .maximize = m}); });
  check([](AnyTensor p, bool m) { return std::make_unique<optim::AdamW>(std::vector<AnyTensor>{p}, optim::AdamOptions{.lr = 0.1, .weight_decay = 0.0, .maximize = m}); });
  check([](AnyTensor p, bool m) { return std::make_unique<optim::RMSprop>(std::vector<AnyTensor>{p}, optim::RMSpropOptions{.momentum = 0.5, .centered = true, .maximize = m}); });
}

// ---------------------------------------------------------------------------------------------
// Gradient clipping

TEST_CASE("clip_grad_norm_: L2 norm by hand, scales only when over the limit", "[optim][clip]") {
  // grads [3, 4] and [12]: total = sqrt(9 + 16 + 144) = 13.
  AnyTensor a = make_param({0.0, 0.0}), b = make_param({0.0}), none = make_param({5.0});
  std::vector<AnyTensor> ps{a, b, none};  // `none` has no gradient: skipped
  set_grad(a, {3.0, 4.0});
  set_grad(b, {12.0});
  CHECK(optim::clip_grad_norm_(ps, 20.0) == Approx(13.0).epsilon(1e-15));
  CHECK(a.grad().to_double_vector() == Vec{3.0, 4.0});  // under the limit: untouched
  // max_norm 6.5: coef = 6.5 / (13 + 1e-6) = 0.49999996153846450...
  const double coef = 6.5 / (13.0 + 1e-6);
  CHECK(optim::clip_grad_norm_(ps, 6.5) == Approx(13.0).epsilon(1e-15));
  check_close(a.grad().to_double_vector(), {3.0 * coef, 4.0 * coef}, 1e-15);
  check_close(b.grad().to_double_vector(), {12.0 * coef}, 1e-15);
  CHECK_FALSE(none.grad().defined());
  // The new total is just under max_norm.
  CHECK(optim::clip_grad_norm_(ps, 100.0) == Approx(6.5).epsilon(1e-6));
  CHECK(optim::clip_grad_norm_(std::vector<AnyTensor>{none}, 1.0) == 0.0);  // no gradients at all
}

TEST_CASE("clip_grad_norm_: infinity norm, 1-norm, float32, non-finite totals", "[optim][clip]") {
  AnyTensor a = make_param({0.0, 0.0}), b = make_param({0.0});
  std::vector<AnyTensor> ps{a, b};
  SECTION("inf norm: max |g| = 3") {
    set_grad(a, {-3.0, 1.0});
    set_grad(b, {2.0});
    CHECK(optim::clip_grad_norm_(ps, 1.0, INFINITY) == 3.0);
    const double coef = 1.0 / (3.0 + 1e-6);
    check_close(a.grad().to_double_vector(), {-3.0 * coef, coef}, 1e-15);
    check_close(b.grad().to_double_vector(), {2.0 * coef}, 1e-15);
  }
  SECTION("1-norm: 3 + 1 + 2 = 6; 3-norm: (27 + 1 + 8)^(1/3)") {
    set_grad(a, {-3.0, 1.0});
    set_grad(b, {2.0});
    CHECK(optim::clip_grad_norm_(ps, 100.0, 1.0) == Approx(6.0).epsilon(1e-15));
    CHECK(optim::clip_grad_norm_(ps, 100.0, 3.0) == Approx(std::cbrt(36.0)).epsilon(1e-14));
  }
  SECTION("float32: torch's coefficient, reciprocal(total + 1e-6) * max_norm in float") {
    AnyTensor f = make_param({0.0, 0.0, 0.0}, DType::Float32);
    set_grad(f, {3.0, 4.0, 12.0});
    CHECK(optim::clip_grad_norm_({f}, 6.5) == 13.0);
    const float c = (1.0f / (13.0f + 1e-6f)) * 6.5f;
    CHECK(Tensor<float>(f.grad()).to_vector() == std::vector<float>{3.0f * c, 4.0f * c, 12.0f * c});
  }
  SECTION("non-finite") {
    set_grad(a, {INFINITY, 1.0});
    set_grad(b, {2.0});
    CHECK_THROWS_WITH(optim::clip_grad_norm_(ps, 1.0, 2.0, /*error_if_nonfinite=*/true),
                      Contains("non-finite") && Contains("error_if_nonfinite=false"));
    CHECK(a.grad().to_double_vector()[1] == 1.0);  // the error left the gradients alone
    // As torch: scaled by max_norm / inf = 0 anyway, so inf becomes NaN and finite values 0.
    CHECK(std::isinf(optim::clip_grad_norm_(ps, 1.0)));
    CHECK(std::isnan(a.grad().to_double_vector()[0]));
    CHECK(a.grad().to_double_vector()[1] == 0.0);
  }
  SECTION("bad arguments") {
    set_grad(a, {1.0, 1.0});
    CHECK_THROWS_WITH(optim::clip_grad_norm_(ps, -1.0), Contains("clip_grad_norm_: max_norm must be >= 0"));
    CHECK_THROWS_WITH(optim::clip_grad_norm_(ps, 1.0, 0.0), Contains("norm_type must be a positive number"));
    CHECK_THROWS_WITH(optim::clip_grad_norm_(ps, 1.0, -INFINITY), Contains("norm_type"));
  }
}

TEST_CASE("clip_grad_value_ clamps every gradient element", "[optim][clip]") {
  AnyTensor a = make_param({0.0, 0.0, 0.0}), b = make_param({0.0}, DType::Float32), none = make_param({1.0});
  set_grad(a, {-3.0, 0.5, 2.0});
  set_grad(b, {-0.25});
  AnyTensor held = a.grad();
  optim::clip_grad_value_({a, b, none}, 1.0);
  CHECK(held.to_double_vector() == Vec{-1.0, 0.5, 1.0});  // in place: held handles see it
  CHECK(b.grad().to_double_vector() == Vec{-0.25});
  CHECK_FALSE(none.grad().defined());
  CHECK_THROWS_WITH(optim::clip_grad_value_({a}, -1.0), Contains("clip_value must be >= 0"));
}

// ---------------------------------------------------------------------------------------------
// Schedulers

namespace {
// Two groups with base lrs 1.0 and 0.5.
struct TwoGroups {
  AnyTensor a = make_param({1.0}), b = make_param({2.0});
  optim::SGD opt{{a}, {.lr = 1.0, .momentum = 0.9}};
  TwoGroups() { opt.add_param_group({b}, {.lr = 0.5}); }
};

// Steps a scheduler n times and returns lr[group] for epochs 0..n (epoch 0: after construction).
std::vector<Vec> lr_sequence(optim::LRScheduler& s, int n) {
  std::vector<Vec> out;
  for (int t = 0; t <= n; ++t) {
    if (t > 0) s.step();
    REQUIRE(s.last_epoch() == t);
    const Vec& last = s.get_last_lr();
    out.push_back(last);
    for (size_t g = 0; g < last.size(); ++g) CHECK(s.optimizer().param_groups()[g].lr() == last[g]);
  }
  return out;
}

void check_sequence(const std::vector<Vec>& got, const std::function<double(size_t, int)>& want, double rtol,
                    double atol = 0.0) {
  for (size_t t = 0; t < got.size(); ++t)
    for (size_t g = 0; g < got[t].size(); ++g) {
      const double w = want(g, static_cast<int>(t));
      INFO("epoch " << t << ", group " << g << ": got " << got[t][g] << ", want " << w);
      CHECK(std::abs(got[t][g] - w) <= atol + rtol * std::abs(w));
    }
}

// torch's recursive (chainable) get_lr, transcribed: lr_t from lr_{t-1}.
std::vector<Vec> torch_recursive(const Vec& base, int n, const std::function<double(double, double, int)>& next) {
  std::vector<Vec> out{base};
  for (int t = 1; t <= n; ++t) {
    Vec v;
    for (size_t g = 0; g < base.size(); ++g) v.push_back(next(out.back()[g], base[g], t));
    out.push_back(v);
  }
  return out;
}
const Vec kBase{1.0, 0.5};
constexpr int kEpochs = 20;
constexpr double kPi = std::numbers::pi;
}  // namespace

TEST_CASE("StepLR, MultiStepLR, ExponentialLR: closed form, by hand, and torch's recursion", "[optim][sched]") {
  SECTION("StepLR") {
    TwoGroups m;
    optim::StepLR s(m.opt, 3, 0.5);
    auto got = lr_sequence(s, kEpochs);
    // By hand: 1, 1, 1, 0.5, 0.5, 0.5, 0.25, ...
    CHECK(got[2][0] == 1.0);
    CHECK(got[3][0] == 0.5);
    CHECK(got[6][1] == 0.125);
    check_sequence(got, [](size_t g, int t) { return kBase[g] * std::pow(0.5, t / 3); }, 0.0);
    auto rec = torch_recursive(kBase, kEpochs, [](double lr, double, int t) { return t % 3 == 0 ? lr * 0.5 : lr; });
    check_sequence(got, [&](size_t g, int t) { return rec[static_cast<size_t>(t)][g]; }, 1e-15);
    optim::StepLR d(m.opt, 1);
    CHECK(d.get_last_lr()[0] == got.back()[0]);  // the base is the group's lr now
    d.step();
    CHECK(d.get_last_lr()[0] == Approx(got.back()[0] * 0.1).epsilon(1e-15));  // gamma defaults to 0.1
  }
  SECTION("MultiStepLR (unsorted milestones, one repeated)") {
    TwoGroups m;
    optim::MultiStepLR s(m.opt, {12, 4, 7, 12}, 0.1);
    auto got = lr_sequence(s, kEpochs);
    CHECK(got[3][0] == 1.0);
    CHECK(got[4][0] == Approx(0.1).epsilon(1e-15));
    CHECK(got[7][0] == Approx(0.01).epsilon(1e-15));
    CHECK(got[12][1] == Approx(0.5e-4).epsilon(1e-15));  // 12 counts twice
    auto rec = torch_recursive(kBase, kEpochs, [](double lr, double, int t) {
      const int hits = (t == 4) + (t == 7) + 2 * (t == 12);
      return lr * std::pow(0.1, hits);
    });
    check_sequence(got, [&](size_t g, int t) { return rec[static_cast<size_t>(t)][g]; }, 1e-14);
  }
  SECTION("ExponentialLR") {
    TwoGroups m;
    optim::ExponentialLR s(m.opt, 0.9);
    auto got = lr_sequence(s, kEpochs);
    CHECK(got[2][0] == Approx(0.81).epsilon(1e-15));
    check_sequence(got, [](size_t g, int t) { return kBase[g] * std::pow(0.9, t); }, 0.0);
    auto rec = torch_recursive(kBase, kEpochs, [](double lr, double, int) { return lr * 0.9; });
    check_sequence(got, [&](size_t g, int t) { return rec[static_cast<size_t>(t)][g]; }, 1e-14);
  }
}

TEST_CASE("CosineAnnealingLR: closed form, by hand, and torch's recursion past T_max", "[optim][sched]") {
  TwoGroups m;
  const int T = 8;
  const double eta_min = 0.1;
  optim::CosineAnnealingLR s(m.opt, T, eta_min);
  auto got = lr_sequence(s, kEpochs);  // beyond T_max the cosine continues, as torch's does
  // By hand: t = 4 is half way: 0.1 + 0.9 * (1 + cos(pi/2)) / 2 = 0.55; t = 8: eta_min; t = 16: base again.
  CHECK(got[4][0] == Approx(0.55).epsilon(1e-15));
  CHECK(got[8][0] == Approx(0.1).epsilon(1e-15));
  CHECK(got[16][0] == Approx(1.0).epsilon(1e-15));
  check_sequence(got, [&](size_t g, int t) { return eta_min + (kBase[g] - eta_min) * (1 + std::cos(kPi * t / T)) / 2; },
                 0.0);
  // torch.optim.lr_scheduler.CosineAnnealingLR.get_lr:
  auto rec = torch_recursive(kBase, kEpochs, [&](double lr, double base, int t) {
    if ((t - 1 - T) % (2 * T) == 0) return lr + (base - eta_min) * (1 - std::cos(kPi / T)) / 2;
    return (1 + std::cos(kPi * t / T)) / (1 + std::cos(kPi * (t - 1) / T)) * (lr - eta_min) + eta_min;
  });
  check_sequence(got, [&](size_t g, int t) { return rec[static_cast<size_t>(t)][g]; }, 1e-13, 1e-15);
}

TEST_CASE("WarmupCosineLR: linear warmup then cosine to min_lr, then held", "[optim][sched]") {
  SECTION("from zero, min_lr 0.1") {
    TwoGroups m;
    optim::WarmupCosineLR s(m.opt, {.warmup_steps = 5, .total_steps = 15, .min_lr = 0.1});
    auto got = lr_sequence(s, kEpochs);
    // By hand (group 0, base 1): 0, 0.2, 0.4, 0.6, 0.8, then 1 at t = 5; half way (t = 10):
    // 0.1 + 0.9 * 0.5 = 0.55; t = 15 and after: 0.1.
    CHECK(got[0][0] == 0.0);
    CHECK(got[1][0] == Approx(0.2).epsilon(1e-15));
    CHECK(got[4][1] == Approx(0.4).epsilon(1e-15));
    CHECK(got[5][0] == 1.0);
    CHECK(got[10][0] == Approx(0.55).epsilon(1e-15));
    CHECK(got[15][0] == 0.1);
    CHECK(got[20][1] == 0.1);
    // The documented formula, which is torch's SequentialLR(LinearLR(start_factor=0 .. 1, 5 iters),
    // CosineAnnealingLR(T_max=10, eta_min=0.1), milestones=[5]) up to t = 15.
    check_sequence(got, [](size_t g, int t) {
      if (t < 5) return kBase[g] * t / 5.0;
      if (t >= 15) return 0.1;
      return 0.1 + (kBase[g] - 0.1) * (1 + std::cos(kPi * (t - 5) / 10.0)) / 2;
    }, 1e-15);
  }
  SECTION("from a start factor, no warmup edge cases") {
    TwoGroups m;
    optim::WarmupCosineLR s(m.opt, {.warmup_steps = 4, .total_steps = 10, .start_factor = 0.25});
    auto got = lr_sequence(s, 12);
    CHECK(got[0][0] == 0.25);
    CHECK(got[2][0] == Approx(0.625).epsilon(1e-15));  // 0.25 + 0.75 * 2/4
    CHECK(got[10][0] == 0.0);
    TwoGroups m2;
    optim::WarmupCosineLR none(m2.opt, {.warmup_steps = 0, .total_steps = 4});
    CHECK(none.get_last_lr()[0] == 1.0);
    none.step();
    CHECK(none.get_last_lr()[0] == Approx((1 + std::cos(kPi / 4)) / 2).epsilon(1e-15));
  }
}

namespace {
// torch.optim.lr_scheduler.OneCycleLR, transcribed from its __init__ and get_lr: returns
// {lr, momentum} at step t for one group.
std::pair<double, double> onecycle_ref(int t, double max_lr, int total, double pct_start, bool cos, bool three_phase,
                                       double base_m = 0.85, double max_m = 0.95, double div = 25.0,
                                       double final_div = 1e4) {
  const double initial = max_lr / div, min_lr = initial / final_div;
  struct P {
    double end, slr, elr, sm, em;
  };
  std::vector<P> phases;
  if (three_phase) {
    phases = {{pct_start * total - 1, initial, max_lr, max_m, base_m},
              {2 * pct_start * total - 2, max_lr, initial, base_m, max_m},
              {total - 1.0, initial, min_lr, max_m, max_m}};
  } else {
    phases = {{pct_start * total - 1, initial, max_lr, max_m, base_m}, {total - 1.0, max_lr, min_lr, base_m, max_m}};
  }
  auto anneal = [&](double start, double end, double pct) {
    if (cos) return end + (start - end) / 2.0 * (std::cos(kPi * pct) + 1);
    return (end - start) * pct + start;
  };
  double start_step = 0;
  for (size_t i = 0; i < phases.size(); ++i) {
    if (t <= phases[i].end || i + 1 == phases.size()) {
      const double pct = (t - start_step) / (phases[i].end - start_step);
      return {anneal(phases[i].slr, phases[i].elr, pct), anneal(phases[i].sm, phases[i].em, pct)};
    }
    start_step = phases[i].end;
  }
  return {0, 0};
}
}  // namespace

TEST_CASE("OneCycleLR: torch's phases for lr and momentum, cos and linear, three-phase", "[optim][sched]") {
  SECTION("by hand: max_lr 1, 10 steps, cos") {
    TwoGroups m;
    optim::OneCycleLR s(m.opt, {.max_lr = 1.0, .total_steps = 10});
    // Starts at max_lr / 25 = 0.04 with momentum 0.95; peaks at step 0.3*10 - 1 = 2 with momentum
    // 0.85; ends at step 9 at 0.04 / 1e4 = 4e-6 with momentum 0.95.
    CHECK(s.get_last_lr()[0] == Approx(0.04).epsilon(1e-15));
    CHECK(m.opt.param_groups()[0].at("momentum") == Approx(0.95).epsilon(1e-15));
    CHECK(m.opt.param_groups()[1].at("momentum") == Approx(0.95).epsilon(1e-15));
    s.step();
    s.step();
    CHECK(s.get_last_lr()[0] == 1.0);
    CHECK(s.get_last_lr()[1] == 1.0);  // one max_lr for every group
    CHECK(m.opt.param_groups()[0].at("momentum") == Approx(0.85).epsilon(1e-15));
    for (int i = 0; i < 7; ++i) s.step();
    CHECK(s.get_last_lr()[0] == Approx(4e-6).epsilon(1e-12));
    CHECK(m.opt.param_groups()[0].at("momentum") == Approx(0.95).epsilon(1e-15));
    s.step();  // step 10 == total_steps is allowed, as in torch
    CHECK_THROWS_WITH(s.step(), Contains("OneCycleLR: tried to step 11 times") && Contains("total steps is 10"));
    CHECK(s.last_epoch() == 10);  // the failed step changed nothing
  }
  struct Case {
    int total;
    double pct;
    bool cos, three;
  };
  for (Case c : {Case{20, 0.3, true, false}, Case{20, 0.25, false, false}, Case{20, 0.3, true, true},
                 Case{37, 0.4, false, true}}) {
    INFO("total " << c.total << " pct_start " << c.pct << (c.cos ? " cos" : " linear") << (c.three ? " three-phase" : ""));
    TwoGroups m;
    optim::OneCycleLR s(m.opt, {.max_lr = {0.8, 0.2}, .total_steps = c.total, .pct_start = c.pct,
                                .anneal_strategy = c.cos ? "cos" : "linear", .three_phase = c.three});
    for (int t = 0; t <= c.total; ++t) {
      if (t > 0) s.step();
      for (size_t g = 0; g < 2; ++g) {
        auto [lr, mom] = onecycle_ref(t, g == 0 ? 0.8 : 0.2, c.total, c.pct, c.cos, c.three);
        CHECK(s.get_last_lr()[g] == lr);  // the same formula: bitwise
        CHECK(m.opt.param_groups()[g].at("momentum") == mom);
      }
    }
  }
  SECTION("cycles beta1 of Adam; SGD then steps with the cycled momentum") {
    AnyTensor p = make_param({1.0});
    optim::Adam adam({p}, {.beta2 = 0.99});
    optim::OneCycleLR s(adam, {.max_lr = 0.01, .total_steps = 10, .base_momentum = 0.8, .max_momentum = 0.9});
    CHECK(adam.param_groups()[0].at("beta1") == Approx(0.9).epsilon(1e-15));
    s.step();
    s.step();
    CHECK(adam.param_groups()[0].at("beta1") == Approx(0.8).epsilon(1e-15));
    CHECK(adam.param_groups()[0].at("beta2") == 0.99);
    // cycle_momentum=false leaves momentum alone.
    TwoGroups m;
    optim::OneCycleLR off(m.opt, {.max_lr = 1.0, .total_steps = 10, .cycle_momentum = false});
    CHECK(m.opt.param_groups()[1].at("momentum") == 0.9);
  }
}

TEST_CASE("scheduler state round trip continues the same sequence", "[optim][sched][state]") {
  TwoGroups m1;
  optim::OneCycleLR s1(m1.opt, {.max_lr = 1.0, .total_steps = 30, .three_phase = true});
  for (int i = 0; i < 7; ++i) s1.step();
  optim::SchedulerStateDict sd = s1.state_dict();
  CHECK(sd.last_epoch == 7);
  TwoGroups m2;
  m2.opt.load_state_dict(m1.opt.state_dict());
  optim::OneCycleLR s2(m2.opt, {.max_lr = 1.0, .total_steps = 30, .three_phase = true});
  s2.load_state_dict(sd);
  CHECK(s2.last_epoch() == 7);
  CHECK(s2.get_last_lr() == s1.get_last_lr());
  for (int i = 0; i < 10; ++i) {
    s1.step();
    s2.step();
    CHECK(s2.get_last_lr() == s1.get_last_lr());
    CHECK(m2.opt.param_groups()[0].at("momentum") == m1.opt.param_groups()[0].at("momentum"));
  }
  TwoGroups m3;
  optim::StepLR s3(m3.opt, 2);
  auto sd3 = s3.state_dict();
  sd3.base_lrs.pop_back();
  CHECK_THROWS_WITH(s3.load_state_dict(sd3), Contains("StepLR.load_state_dict") && Contains("1 parameter group"));
  sd.last_epoch = 31;
  CHECK_THROWS_WITH(s2.load_state_dict(sd), Contains("tried to step 31 times"));
}

TEST_CASE("scheduler errors name the scheduler and the option", "[optim][sched][errors]") {
  TwoGroups m;
  CHECK_THROWS_WITH(optim::StepLR(m.opt, 0), Contains("StepLR: step_size must be >= 1, got 0"));
  CHECK_THROWS_WITH(optim::CosineAnnealingLR(m.opt, 0), Contains("CosineAnnealingLR: T_max must be >= 1"));
  CHECK_THROWS_WITH(optim::WarmupCosineLR(m.opt, {.warmup_steps = 10, .total_steps = 5}),
                    Contains("WarmupCosineLR: total_steps must be >= 1 and >= warmup_steps"));
  CHECK_THROWS_WITH(optim::WarmupCosineLR(m.opt, {.total_steps = 5, .start_factor = 2.0}),
                    Contains("start_factor must be in [0, 1]"));
  CHECK_THROWS_WITH(optim::OneCycleLR(m.opt, {.max_lr = 1.0, .total_steps = 0}),
                    Contains("OneCycleLR: expected a positive total_steps, got 0"));
  CHECK_THROWS_WITH(optim::OneCycleLR(m.opt, {.max_lr = 1.0, .total_steps = 10, .pct_start = 1.5}),
                    Contains("pct_start between 0 and 1, got 1.5"));
  CHECK_THROWS_WITH(optim::OneCycleLR(m.opt, {.max_lr = 1.0, .total_steps = 10, .anneal_strategy = "cosine"}),
                    Contains("anneal_strategy must be one of 'cos' or 'linear', got 'cosine'"));
  CHECK_THROWS_WITH(optim::OneCycleLR(m.opt, {.max_lr = {1.0, 2.0, 3.0}, .total_steps = 10}),
                    Contains("expected 1 or 2 values for max_lr"));
  CHECK_THROWS_WITH(optim::OneCycleLR(m.opt, {.max_lr = 1.0, .total_steps = 100, .pct_start = 0.01}),
                    Contains("phase 1 of the schedule is empty"));
  optim::StepLR s(m.opt, 2);
  m.opt.add_param_group({make_param({0.0})});
  CHECK_THROWS_WITH(s.step(), Contains("StepLR: built for 2 parameter group(s) but the optimizer now has 3"));
}

// ---------------------------------------------------------------------------------------------
// Optimizer state dicts

namespace {
// Runs `steps` steps of the quadratic on ps.
void run_steps(optim::Optimizer& opt, std::vector<AnyTensor>& ps, int steps) {
  const Quadratic q;
  for (int s = 0; s < steps; ++s) {
    set_grads(ps, q.grad(values(ps)));
    opt.step();
  }
}
std::vector<AnyTensor> fresh_copy(const std::vector<AnyTensor>& ps) {
  std::vector<AnyTensor> out;
  for (const auto& p : ps) {
    AnyTensor c = p.detach().clone();
    c.set_requires_grad(true);
    out.push_back(c);
  }
  return out;
}

// k steps, save, a new optimizer (built with other hyperparameters) over a copy of the
// parameters, load, k more steps: bitwise equal to 2k uninterrupted steps.
template <class Opt, class Options>
void check_round_trip(const Options& options, DType dt, int k = 4) {
  auto a = make_params(dt);
  Opt uninterrupted(a, options);
  run_steps(uninterrupted, a, 2 * k);

  auto b = make_params(dt);
  Opt first(b, options);
  run_steps(first, b, k);
  optim::OptimizerStateDict sd = first.state_dict();
  auto c = fresh_copy(b);  // the parameters as a checkpoint would restore them
  run_steps(first, b, 1);  // the saved dict is a snapshot: later steps do not change it
  Opt resumed(c);  // default options: load_state_dict restores the saved ones
  resumed.load_state_dict(sd);
  CHECK(resumed.param_groups()[0].options == first.param_groups()[0].options);
  run_steps(resumed, c, k);
  CHECK(values(c) == values(a));
  const optim::ParamState* st = resumed.state(c[0]);
  REQUIRE(st != nullptr);
  for (const auto& [name, t] : *st) {
    const AnyTensor* want = optim::find_state(*uninterrupted.state(a[0]), name);
    REQUIRE(want != nullptr);
    CHECK(t.to_double_vector() == want->to_double_vector());
  }
}
}  // namespace

TEST_CASE("optimizer state round trip: resumed runs are bitwise equal to uninterrupted ones", "[optim][state]") {
  check_round_trip<optim::SGD>(optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true}, DType::Float64);
  check_round_trip<optim::Adam>(optim::AdamOptions{.lr = 0.05, .weight_decay = 0.1, .amsgrad = true}, DType::Float64);
  check_round_trip<optim::Adam>(optim::AdamOptions{.lr = 0.05}, DType::Float32);
  check_round_trip<optim::AdamW>(optim::AdamOptions{.lr = 0.05}, DType::Float32);
  check_round_trip<optim::RMSprop>(optim::RMSpropOptions{.lr = 0.01, .momentum = 0.5, .centered = true},
                                   DType::Float64);
}

TEST_CASE("optimizer state_dict follows torch's layout", "[optim][state]") {
  AnyTensor a = make_param({1.0, 2.0}), b = make_param({3.0}), c = make_param({4.0, 5.0});
  optim::Adam opt({a, b}, {.lr = 0.1});
  opt.add_param_group({c}, {.lr = 0.01});
  set_grad(a, {0.1, 0.2});
  set_grad(c, {0.3, 0.4});
  opt.step();
  opt.step();
  auto sd = opt.state_dict();
  REQUIRE(sd.param_groups.size() == 2);
  CHECK(sd.param_groups[0].params == std::vector<int64_t>{0, 1});
  CHECK(sd.param_groups[1].params == std::vector<int64_t>{2});
  CHECK(sd.param_groups[1].options.at("lr") == 0.01);
  CHECK(sd.param_groups[0].options.names() == "lr, beta1, beta2, eps, weight_decay, amsgrad, maximize");
  CHECK(sd.state.size() == 2);  // b had no gradient
  REQUIRE(sd.state.count(2) == 1);
  const optim::ParamState& st = sd.state.at(2);
  CHECK(st[0].first == "step");
  CHECK(st[0].second.item_double() == 2.0);
  CHECK(st[1].first == "exp_avg");
  CHECK(st[1].second.shape() == c.shape());
  // A snapshot: not the live tensors.
  CHECK_FALSE(st[1].second.same(*optim::find_state(*opt.state(c), "exp_avg")));
}

TEST_CASE("load_state_dict checks the dict against the optimizer and names what differs", "[optim][state][errors]") {
  AnyTensor a = make_param({1.0, 2.0}), b = make_param({3.0});
  optim::Adam opt({a, b});
  set_grad(a, {0.1, 0.2});
  opt.step();
  const auto good = opt.state_dict();
  const auto before = a.to_double_vector();

  auto wrong_groups = good;
  wrong_groups.param_groups.push_back(wrong_groups.param_groups[0]);
  CHECK_THROWS_WITH(opt.load_state_dict(wrong_groups),
                    Contains("Adam.load_state_dict: the state dict has 2 parameter group(s), the optimizer has 1"));
  auto wrong_count = good;
  wrong_count.param_groups[0].params.push_back(7);
  CHECK_THROWS_WITH(opt.load_state_dict(wrong_count), Contains("has 3 parameter(s), the optimizer's has 2"));
  auto wrong_shape = good;
  wrong_shape.state.at(0)[1].second = Tensor<double>::zeros({3});
  CHECK_THROWS_WITH(opt.load_state_dict(wrong_shape),
                    Contains("state 'exp_avg' of parameter 0 is float64[3]") && Contains("parameter is float64[2]"));
  auto stray = good;
  stray.state[5] = good.state.at(0);
  CHECK_THROWS_WITH(opt.load_state_dict(stray), Contains("state for parameter index 5 which no parameter group lists"));
  AnyTensor s1 = make_param({1.0, 2.0}), s2 = make_param({3.0});
  optim::SGD sgd({s1, s2}, {.momentum = 0.9});
  CHECK_THROWS_WITH(opt.load_state_dict(sgd.state_dict()), Contains("lacks hyperparameter 'beta1'"));
  auto bad_value = good;
  bad_value.param_groups[0].options["beta2"] = 1.5;
  CHECK_THROWS_WITH(opt.load_state_dict(bad_value), Contains("Adam: invalid beta parameter at index 1: beta2=1.5"));
  // Nothing was changed by the failed loads.
  set_grad(a, {0.1, 0.2});
  AnyTensor a2 = a.detach().clone();
  a2.set_requires_grad(true);
  optim::Adam twin({a2, make_param({3.0})});
  twin.load_state_dict(good);
  set_grad(a2, {0.1, 0.2});
  opt.step();
  twin.step();
  CHECK(a.to_double_vector() == a2.to_double_vector());
  CHECK(before != a.to_double_vector());
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST_CASE("invalid options: errors name the optimizer and the option", "[optim][errors]") {
  auto ps = [] { return std::vector<AnyTensor>{make_param({1.0})}; };
  CHECK_THROWS_WITH(optim::SGD(ps(), {.lr = -0.1}), Contains("SGD: invalid learning rate lr=-0.1"));
  CHECK_THROWS_WITH(optim::SGD(ps(), {.momentum = -0.5}), Contains("SGD: invalid momentum value momentum=-0.5"));
  CHECK_THROWS_WITH(optim::SGD(ps(), {.weight_decay = -1}), Contains("SGD: invalid weight_decay value"));
  CHECK_THROWS_WITH(optim::SGD(ps(), {.nesterov = true}), Contains("SGD: nesterov=true requires momentum > 0"));
  CHECK_THROWS_WITH(optim::SGD(ps(), {.momentum = 0.9, .dampening = 0.1, .nesterov = true}),
                    Contains("dampening = 0"));
  CHECK_THROWS_WITH(optim::Adam(ps(), {.lr = -1e-3}), Contains("Adam: invalid learning rate lr=-0.001"));
  CHECK_THROWS_WITH(optim::Adam(ps(), {.beta1 = 1.0}), Contains("Adam: invalid beta parameter at index 0: beta1=1"));
  CHECK_THROWS_WITH(optim::Adam(ps(), {.beta2 = -0.1}), Contains("Adam: invalid beta parameter at index 1: beta2=-0.1"));
  CHECK_THROWS_WITH(optim::AdamW(ps(), {.eps = -1e-8}), Contains("AdamW: invalid epsilon value eps=-1e-08"));
  CHECK_THROWS_WITH(optim::AdamW(ps(), {.weight_decay = -0.01}), Contains("AdamW: invalid weight_decay value"));
  CHECK_THROWS_WITH(optim::RMSprop(ps(), {.alpha = -0.5}), Contains("RMSprop: invalid alpha value alpha=-0.5"));
  CHECK_THROWS_WITH(optim::RMSprop(ps(), {.momentum = -0.5}), Contains("RMSprop: invalid momentum value"));
  CHECK_THROWS_WITH(optim::RMSprop(ps(), {.eps = -1.0}), Contains("RMSprop: invalid epsilon value"));
  CHECK_THROWS_WITH(optim::SGD({}), Contains("SGD: optimizer got an empty parameter list"));
  CHECK_THROWS_WITH(optim::Adam({}), Contains("Adam: optimizer got an empty parameter list"));
  AnyTensor p = make_param({1.0});
  CHECK_THROWS_WITH(optim::SGD({p, p}), Contains("SGD: parameter 1") && Contains("appears more than once"));
  AnyTensor non_leaf = op::mul(p, 2.0);
  CHECK_THROWS_WITH(optim::Adam({non_leaf}), Contains("Adam: can't optimize a non-leaf tensor"));
  CHECK_THROWS_WITH(optim::SGD({AnyTensor(Tensor<int64_t>::zeros({2}))}), Contains("SGD: parameter 0 must be floating point"));
  CHECK_THROWS_AS(optim::SGD({AnyTensor()}), ValueError);
}

// ---------------------------------------------------------------------------------------------
// Convergence

TEST_CASE("Adam fits nn::Linear to a linear target (float32)", "[optim][convergence]") {
  // y = x . (1.5, -2, 0.5) + 0.3 on 64 fixed random points; MSE loss. From the default init the
  // loss starts above 0.5 and must fall below 1e-5 within 300 steps at lr 0.05.
  manual_seed(7);
  nn::Linear lin(3, 1);
  auto x = Tensor<float>::randn({64, 3});
  auto w = Tensor<float>::from_vector({1.5f, -2.0f, 0.5f}, {3, 1});
  Tensor<float> y;
  {
    NoGradGuard ng;
    y = matmul(x, w) + 0.3;
  }
  optim::Adam opt(lin.parameters(), {.lr = 0.05});
  auto loss_now = [&] {
    auto d = lin(x) - y;
    return mean(d * d);
  };
  const double initial = loss_now().item();
  CHECK(initial > 0.5);
  double loss = initial;
  for (int s = 0; s < 300; ++s) {
    opt.zero_grad();
    auto l = loss_now();
    l.backward();
    opt.step();
    loss = l.item();
  }
  INFO("initial loss " << initial << ", final loss " << loss);
  CHECK(loss < 1e-5);
  auto wv = lin.weight.to_double_vector();
  CHECK(wv[0] == Approx(1.5).margin(1e-2));
  CHECK(wv[1] == Approx(-2.0).margin(1e-2));
  CHECK(lin.bias.to_double_vector()[0] == Approx(0.3).margin(1e-2));
}

TEST_CASE("a training loop: SGD + momentum, clip_grad_norm_ and WarmupCosineLR converge (float32)",
          "[optim][convergence]") {
  manual_seed(11);
  nn::Linear lin(4, 2);
  auto x = Tensor<float>::randn({32, 4});
  auto w = Tensor<float>::randn({4, 2});
  Tensor<float> y;
  {
    NoGradGuard ng;
    y = matmul(x, w);
  }
  optim::SGD opt(lin.parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::WarmupCosineLR sched(opt, {.warmup_steps = 10, .total_steps = 200, .min_lr = 1e-3});
  double first = 0, last = 0, max_norm_seen = 0;
  for (int s = 0; s < 200; ++s) {
    opt.zero_grad();
    auto d = lin(x) - y;
    auto l = mean(d * d);
    l.backward();
    max_norm_seen = std::max(max_norm_seen, optim::clip_grad_norm_(lin.parameters(), 1.0));
    opt.step();
    sched.step();
    (s == 0 ? first : last) = l.item();
  }
  INFO("first loss " << first << ", last loss " << last << ", largest gradient norm " << max_norm_seen);
  CHECK(max_norm_seen > 1.0);  // clipping was active at some point
  CHECK(last < 1e-4);
  CHECK(first > 100 * last);
}

// ---------------------------------------------------------------- the fused Adam / AdamW step

namespace {

std::unique_ptr<optim::detail::AdamBase> make_adam(bool adamw, const AnyTensor& p, const optim::AdamOptions& o) {
  if (adamw) return std::make_unique<optim::AdamW>(std::vector<AnyTensor>{p}, o);
  return std::make_unique<optim::Adam>(std::vector<AnyTensor>{p}, o);
}

// Runs `steps` steps of Adam or AdamW from the same start with the fused kernel on or off and
// returns the parameter values and state after each step.
std::vector<std::vector<double>> adam_trajectory(bool fused, bool adamw, DType pdt, DType gdt,
                                                 const optim::AdamOptions& o, int steps) {
  Generator gen(77);
  AnyTensor p = Tensor<double>::randn({37, 11}, Device::cpu(), 0.0, 1.0, gen).to(pdt);
  p.set_requires_grad(true);
  auto opt = make_adam(adamw, p, o);
  opt->set_fused(fused);
  std::vector<std::vector<double>> out;
  for (int s = 0; s < steps; ++s) {
    AnyTensor g = Tensor<double>::randn({37, 11}, Device::cpu(), 0.0, s == 1 ? 1e-3 : 2.0, gen).to(gdt);
    if (s == 2) g = op::mul(g, 0.0);  // a zero gradient: the moments decay, amsgrad keeps its max
    p.set_grad(g);
    opt->step();
    out.push_back(p.to_double_vector());
    for (const char* name : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}) {
      auto sd = opt->state_dict();
      for (const auto& [k, t] : sd.state.at(0))
        if (k == name) out.push_back(t.to_double_vector());
    }
  }
  return out;
}

}  // namespace

TEST_CASE("fused Adam / AdamW step equals the composite: weight decay, amsgrad, maximize, dtypes",
          "[optim][adam][fused]") {
  struct Case {
    bool adamw;
    optim::AdamOptions o;
  };
  const Case cases[] = {
      {false, {}},
      {false, {.weight_decay = 0.1, .amsgrad = true}},
      {true, {}},
      {true, {.lr = 0.05, .beta1 = 0.3, .beta2 = 0.9, .eps = 1e-6, .weight_decay = 0.2, .amsgrad = true,
              .maximize = true}},
      {false, {.beta1 = 0.7, .maximize = true}},  // lerp weight 1 - beta1 = 0.3, 0.7 above, 1.0 below
      {true, {.beta1 = 0.0}},
  };
  const std::pair<DType, DType> dtypes[] = {{DType::Float64, DType::Float64},
                                            {DType::Float32, DType::Float32},
                                            {DType::Float16, DType::Float16},
                                            {DType::BFloat16, DType::Float32}};
  for (const Case& c : cases) {
    for (const auto& [pdt, gdt] : dtypes) {
      INFO((c.adamw ? "AdamW" : "Adam") << " param " << dtype_name(pdt) << " grad " << dtype_name(gdt));
      auto f = adam_trajectory(true, c.adamw, pdt, gdt, c.o, 4);
      auto r = adam_trajectory(false, c.adamw, pdt, gdt, c.o, 4);
      REQUIRE(f.size() == r.size());
      for (size_t i = 0; i < f.size(); ++i) {
        INFO("vector " << i);
        REQUIRE(f[i] == r[i]);  // bitwise: the same operations in the same order (no FMA at x86-64's baseline)
      }
    }
  }
}

TEST_CASE("fused Adam: on a device (pretend cuda:0 in CI) it updates the device tensors as on the CPU",
          "[optim][adam][fused][device]") {
  testing::PretendGpu pretend;
  if (!testing::cuda_device_or_skip()) return;
  Generator gen(5);
  auto p0 = Tensor<float>::randn({300}, Device::cpu(), 0.0, 1.0, gen);
  auto g0 = Tensor<float>::randn({300}, Device::cpu(), 0.0, 1.0, gen);
  auto run = [&](Device d, bool fused) {
    AnyTensor p = p0.to(d).detach().clone();  // to(cpu) of a CPU tensor shares its storage
    p.set_requires_grad(true);
    optim::AdamW opt({p}, {.lr = 0.01, .amsgrad = true});
    opt.set_fused(fused);
    for (int s = 0; s < 3; ++s) {
      p.set_grad(g0.to(d));
      opt.step();
    }
    REQUIRE(p.device() == d);
    return p.to(Device::cpu()).to_double_vector();
  };
  const auto cpu = run(Device::cpu(), false);
  REQUIRE(run(Device::cpu(), true) == cpu);
  const auto dev = run(Device::cuda(0), true);
  double worst = 0;
  for (size_t i = 0; i < cpu.size(); ++i) worst = std::max(worst, std::abs(dev[i] - cpu[i]));
  INFO("largest difference " << worst);
  REQUIRE(dev == cpu);
}

TEST_CASE("parity: fused Adam / AdamW step, CPU versus CUDA", "[optim][adam][fused][cuda][parity]") {
  EMBER_REQUIRE_GPU();
  const std::pair<DType, DType> dtypes[] = {{DType::Float32, DType::Float32},
                                            {DType::Float64, DType::Float64},
                                            {DType::Float16, DType::Float16},
                                            {DType::BFloat16, DType::Float32}};
  for (bool adamw : {false, true}) {
    for (const auto& [pdt, gdt] : dtypes) {
      const optim::AdamOptions o{.lr = 0.01, .weight_decay = 0.05, .amsgrad = true};
      Generator gen(11);
      AnyTensor p0 = Tensor<double>::randn({100003}, Device::cpu(), 0.0, 1.0, gen).to(pdt);
      std::vector<AnyTensor> grads;
      for (int s = 0; s < 3; ++s) grads.push_back(Tensor<double>::randn({100003}, Device::cpu(), 0.0, 1.0, gen).to(gdt));
      auto run = [&](Device d) {
        AnyTensor p = p0.to(d).detach().clone();
        p.set_requires_grad(true);
        auto opt = make_adam(adamw, p, o);
        for (const AnyTensor& g : grads) {
          p.set_grad(g.to(d));
          opt->step();
        }
        return p.to(Device::cpu()).to_double_vector();
      };
      INFO((adamw ? "AdamW" : "Adam") << " " << dtype_name(pdt) << " / " << dtype_name(gdt));
      REQUIRE(run(Device::cuda(0)) == run(Device::cpu()));  // the same rounded operations in the same order
    }
  }
}

// ---------------------------------------------------------------- fused SGD and RMSprop steps
namespace {

// Runs `steps` steps of the optimizer `make(p)` returns (set_fused(fused)) from one start on
// `device` and returns the parameter and every state tensor after each step. The gradients vary in
// scale, one is zero; `between(opt, s)` may change the options before step s.
template <class Make, class Between>
std::vector<std::vector<double>> fused_trajectory(bool fused, DType pdt, DType gdt, Make make, Between between,
                                                  int steps = 4, Device device = Device::cpu()) {
  Generator gen(91);
  AnyTensor p = Tensor<double>::randn({37, 11}, Device::cpu(), 0.0, 1.0, gen).to(pdt).to(device).detach().clone();
  p.set_requires_grad(true);
  auto opt = make(p);
  opt->set_fused(fused);
  std::vector<std::vector<double>> out;
  for (int s = 0; s < steps; ++s) {
    AnyTensor g = Tensor<double>::randn({37, 11}, Device::cpu(), 0.0, s == 1 ? 1e-3 : 2.0, gen).to(gdt);
    if (s == 2) g = op::mul(g, 0.0);
    between(*opt, s);
    p.set_grad(g.to(device));
    opt->step();
    out.push_back(p.to(Device::cpu()).to_double_vector());
    const auto sd = opt->state_dict();
    if (auto it = sd.state.find(0); it != sd.state.end())
      for (const auto& [name, t] : it->second) {
        std::vector<double> v = t.to(Device::cpu()).to_double_vector();
        v.insert(v.begin(), static_cast<double>(std::hash<std::string>{}(name) % 1000));  // the name counts too
        out.push_back(std::move(v));
      }
  }
  return out;
}

const std::pair<DType, DType> kFusedDtypes[] = {{DType::Float64, DType::Float64},
                                                {DType::Float32, DType::Float32},
                                                {DType::Float16, DType::Float16},
                                                {DType::BFloat16, DType::Float32}};

void require_same_trajectories(const std::vector<std::vector<double>>& f, const std::vector<std::vector<double>>& r) {
  REQUIRE(f.size() == r.size());
  for (size_t i = 0; i < f.size(); ++i) {
    INFO("vector " << i);
    size_t bad = 0;
    while (bad < std::min(f[i].size(), r[i].size()) && f[i][bad] == r[i][bad]) ++bad;
    INFO("first difference at " << bad << ": " << (bad < f[i].size() ? f[i][bad] : -1.0) << " vs "
                                 << (bad < r[i].size() ? r[i][bad] : -1.0));
    REQUIRE(f[i] == r[i]);  // bitwise: the same operations in the same order (no FMA at x86-64's baseline)
  }
}

auto no_change = [](auto&, int) {};

// A pretend cuda:0 that counts the fused steps it runs (active only without a real GPU).
class CountingStepBackend : public testing::PretendCudaBackend {
 public:
  int sgd = 0, rmsprop = 0;
  void sgd_step(const SgdStepArgs& a, void* param, void* grad, void* buf) override {
    ++sgd;
    PretendCudaBackend::sgd_step(a, param, grad, buf);
  }
  void rmsprop_step(const RmspropStepArgs& a, void* param, void* grad, void* sq, void* ga, void* buf) override {
    ++rmsprop;
    PretendCudaBackend::rmsprop_step(a, param, grad, sq, ga, buf);
  }
};
using CountingStepGpu = testing::StandIn<CountingStepBackend, testing::CudaStandIn::Always>;
CountingStepBackend& counting_step_backend() { return CountingStepGpu::backend(); }

}  // namespace

TEST_CASE("fused SGD step equals the composite: momentum, dampening, Nesterov, weight decay, maximize, dtypes",
          "[optim][sgd][fused]") {
  const optim::SGDOptions cases[] = {
      {.lr = 0.1},
      {.lr = 0.1, .momentum = 0.9},
      {.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01},
      {.lr = 0.05, .momentum = 0.8, .weight_decay = 0.2, .nesterov = true, .maximize = true},
      {.lr = 0.3, .weight_decay = 0.1, .maximize = true},
      {.lr = 0.01, .momentum = 0.5, .dampening = 0.5},
  };
  for (const optim::SGDOptions& o : cases) {
    for (const auto& [pdt, gdt] : kFusedDtypes) {
      INFO("SGD momentum " << o.momentum.value_or(0) << " param " << dtype_name(pdt) << " grad " << dtype_name(gdt));
      auto make = [&](AnyTensor& p) { return std::make_unique<optim::SGD>(std::vector<AnyTensor>{p}, o); };
      require_same_trajectories(fused_trajectory(true, pdt, gdt, make, no_change),
                                fused_trajectory(false, pdt, gdt, make, no_change));
    }
  }
  // Momentum switched on after two steps (a scheduler cycling it): the buffer starts from g then.
  auto make = [](AnyTensor& p) { return std::make_unique<optim::SGD>(std::vector<AnyTensor>{p}, optim::SGDOptions{.lr = 0.1}); };
  auto later = [](optim::SGD& opt, int s) {
    if (s == 2) opt.param_groups()[0]["momentum"] = 0.9;
  };
  require_same_trajectories(fused_trajectory(true, DType::Float32, DType::Float32, make, later),
                            fused_trajectory(false, DType::Float32, DType::Float32, make, later));
}

TEST_CASE("fused RMSprop step equals the composite: centered, momentum, weight decay, maximize, dtypes",
          "[optim][rmsprop][fused]") {
  const optim::RMSpropOptions cases[] = {
      {},
      {.centered = true},
      {.momentum = 0.9},
      {.lr = 0.05, .weight_decay = 0.1, .momentum = 0.5, .centered = true, .maximize = true},
      {.alpha = 0.3, .centered = true},  // lerp weight 1 - alpha = 0.7: the other branch
      {.lr = 0.001, .alpha = 0.9, .eps = 1e-3},
  };
  for (const optim::RMSpropOptions& o : cases) {
    for (const auto& [pdt, gdt] : kFusedDtypes) {
      INFO("RMSprop centered " << o.centered.value_or(false) << " momentum " << o.momentum.value_or(0) << " param "
                               << dtype_name(pdt) << " grad " << dtype_name(gdt));
      auto make = [&](AnyTensor& p) { return std::make_unique<optim::RMSprop>(std::vector<AnyTensor>{p}, o); };
      require_same_trajectories(fused_trajectory(true, pdt, gdt, make, no_change),
                                fused_trajectory(false, pdt, gdt, make, no_change));
    }
  }
  // Momentum and centering switched on later: their buffers are created then, as zeros.
  auto make = [](AnyTensor& p) { return std::make_unique<optim::RMSprop>(std::vector<AnyTensor>{p}); };
  auto later = [](optim::RMSprop& opt, int s) {
    if (s == 1) opt.param_groups()[0]["momentum"] = 0.9;
    if (s == 2) opt.param_groups()[0]["centered"] = 1.0;
  };
  require_same_trajectories(fused_trajectory(true, DType::Float32, DType::Float32, make, later),
                            fused_trajectory(false, DType::Float32, DType::Float32, make, later));
}

TEST_CASE("fused SGD / RMSprop: the kernel is what runs, once per parameter and step, on the parameter's device",
          "[optim][sgd][rmsprop][fused][device]") {
  if (cuda::is_available()) {
    std::cout << "SKIPPED: a real GPU is present (the counting pretend device needs none; the parity test runs)\n";
    return;
  }
  CountingStepGpu counting;
  CountingStepBackend& b = counting_step_backend();
  b.sgd = b.rmsprop = 0;
  auto sgd = [](AnyTensor& p) {
    return std::make_unique<optim::SGD>(std::vector<AnyTensor>{p}, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  };
  auto rms = [](AnyTensor& p) {
    return std::make_unique<optim::RMSprop>(std::vector<AnyTensor>{p}, optim::RMSpropOptions{.centered = true});
  };
  const auto sgd_dev = fused_trajectory(true, DType::Float32, DType::Float32, sgd, no_change, 4, Device::cuda(0));
  const auto rms_dev = fused_trajectory(true, DType::Float32, DType::Float32, rms, no_change, 4, Device::cuda(0));
  CHECK(b.sgd == 4);
  CHECK(b.rmsprop == 4);
  require_same_trajectories(sgd_dev, fused_trajectory(false, DType::Float32, DType::Float32, sgd, no_change));
  require_same_trajectories(rms_dev, fused_trajectory(false, DType::Float32, DType::Float32, rms, no_change));
  // set_fused(false) takes the composite: no kernel call.
  fused_trajectory(false, DType::Float32, DType::Float32, sgd, no_change, 2, Device::cuda(0));
  fused_trajectory(false, DType::Float32, DType::Float32, rms, no_change, 2, Device::cuda(0));
  CHECK(b.sgd == 4);
  CHECK(b.rmsprop == 4);
}

TEST_CASE("fused SGD / RMSprop steps reject integer parameters and non-float state with the op's name",
          "[optim][fused][errors]") {
  cpu::CpuBackend cpu;
  float p[4] = {}, g[4] = {}, s[4] = {};
  SgdStepArgs sa;
  sa.n = 4;
  sa.param_dtype = DType::Int32;
  REQUIRE_THROWS_WITH(cpu.sgd_step(sa, p, g, nullptr),
                      Contains("sgd_step: floating parameters and gradients only, got int32 and float32"));
  RmspropStepArgs ra;
  ra.n = 4;
  ra.state_dtype = DType::Float16;
  REQUIRE_THROWS_WITH(cpu.rmsprop_step(ra, p, g, s, nullptr, nullptr),
                      Contains("rmsprop_step: the state is float32 or float64, got float16"));
}

TEST_CASE("parity: fused SGD and RMSprop steps, CPU versus CUDA", "[optim][sgd][rmsprop][fused][cuda][parity]") {
  EMBER_REQUIRE_GPU();
  auto sgd = [](AnyTensor& p) {
    return std::make_unique<optim::SGD>(std::vector<AnyTensor>{p},
                                        optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true});
  };
  auto rms = [](AnyTensor& p) {
    return std::make_unique<optim::RMSprop>(
        std::vector<AnyTensor>{p}, optim::RMSpropOptions{.weight_decay = 0.05, .momentum = 0.5, .centered = true});
  };
  for (const auto& [pdt, gdt] : kFusedDtypes) {
    INFO(dtype_name(pdt) << " / " << dtype_name(gdt));
    // the same rounded operations in the same order
    REQUIRE(fused_trajectory(true, pdt, gdt, sgd, no_change, 3, Device::cuda(0)) ==
            fused_trajectory(true, pdt, gdt, sgd, no_change, 3));
    REQUIRE(fused_trajectory(true, pdt, gdt, rms, no_change, 3, Device::cuda(0)) ==
            fused_trajectory(true, pdt, gdt, rms, no_change, 3));
  }
}
