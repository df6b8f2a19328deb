#pragma once
// Finite-difference gradient checking in double (the project's harness for every differentiable
// op). The function's output is reduced to a scalar with fixed random weights, L = sum(f(x) * w),
// so every output element's gradient is exercised. Each input's .grad is prefilled with known
// random values first, so the check also proves that backward adds to, not overwrites, .grad.
// Pass rule: |analytic - numeric| <= atol + rtol * |numeric|, central differences with step eps.
#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <ember/ember.hpp>

namespace ember::testing {

struct GradCheckResult {
  bool ok = true;
  int checked = 0;
  double max_abs_error = 0;
  std::string report;  // the first mismatches, for the failure message
};

struct GradCheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
  uint64_t seed = 1234;
};

using GradFn = std::function<AnyTensor(const std::vector<AnyTensor>&)>;

// `params` are leaves that f uses by itself (a module's parameters, float64 on the cpu): they are
// checked too, after the inputs, and perturbed in place.
inline GradCheckResult gradcheck(const GradFn& f, const std::vector<AnyTensor>& inputs,
                                 const std::vector<AnyTensor>& params, GradCheckOptions opt = {}) {
  GradCheckResult res;
  std::vector<AnyTensor> xs, args;
  for (const AnyTensor& in : inputs) {
    EMBER_CHECK(in.dtype() == DType::Float64 && in.device().is_cpu(), DTypeError,
                "gradcheck: inputs must be float64 on the cpu, got ", in.desc());
    AnyTensor x = in.detach().clone();
    x.set_requires_grad(true);
    xs.push_back(x);
  }
  args = xs;
  for (const AnyTensor& p : params) {
    EMBER_CHECK(p.dtype() == DType::Float64 && p.device().is_cpu() && p.is_leaf() && p.requires_grad(), DTypeError,
                "gradcheck: parameters must be float64 leaves on the cpu that require grad, got ", p.desc());
    xs.push_back(p);
  }
  Generator gen(opt.seed);
  // Fixed weights that turn the output into a scalar.
  AnyTensor y0;
  {
    NoGradGuard ng;
    y0 = f(args);
  }
  AnyTensor w = Tensor<double>::randn(y0.shape(), Device::cpu(), 0.0, 1.0, gen);
  auto loss_value = [&]() {
    NoGradGuard ng;
    AnyTensor y = f(args);
    const double* yp = static_cast<const double*>(y.data_ptr());
    const double* wp = static_cast<const double*>(w.data_ptr());
    double s = 0;
    for (int64_t i = 0; i < y.numel(); ++i) s += yp[i] * wp[i];
    return s;
  };
  // Prefill .grad with known values; backward must add to them.
  std::vector<AnyTensor> prefill;
  for (AnyTensor& x : xs) {
    AnyTensor g0 = Tensor<double>::randn(x.shape(), Device::cpu(), 0.0, 1.0, gen);
    prefill.push_back(g0);
    x.set_grad(g0.clone());
  }
  AnyTensor y = f(args);
  AnyTensor loss = op::sum(op::mul(y, w));
  loss.backward();

  std::ostringstream rep;
  int reported = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    AnyTensor x = xs[i];
    AnyTensor g = x.grad();
    std::vector<double> analytic(static_cast<size_t>(x.numel()), 0.0);
    if (g.defined()) {
      std::vector<double> gv = g.to_double_vector(), g0 = prefill[i].to_double_vector();
      for (size_t j = 0; j < analytic.size(); ++j) analytic[j] = gv[j] - g0[j];
    } else {
      // No gradient arrived: the prefilled value must be untouched, and the analytic gradient is 0.
    }
    double* xp = static_cast<double*>(x.data_ptr());
    for (int64_t j = 0; j < x.numel(); ++j) {
      const double orig = xp[j];
      xp[j] = orig + opt.eps;
      const double lp = loss_value();
      xp[j] = orig - opt.eps;
      const double lm = loss_value();
      xp[j] = orig;
      const double numeric = (lp - lm) / (2 * opt.eps);
      const double a = analytic[static_cast<size_t>(j)];
      const double err = std::fabs(a - numeric);
      res.checked++;
      res.max_abs_error = std::max(res.max_abs_error, err);
      if (!(err <= opt.atol + opt.rtol * std::fabs(numeric))) {
        res.ok = false;
        if (reported++ < 5)
          rep << "input " << i << " element " << j << ": analytic " << a << " numeric " << numeric << " (error " << err
              << ")\n";
      }
    }
  }
  res.report = rep.str();
  return res;
}

inline GradCheckResult gradcheck(const GradFn& f, const std::vector<AnyTensor>& inputs, GradCheckOptions opt = {}) {
  return gradcheck(f, inputs, {}, opt);
}

// Fresh double inputs of the given shapes, values in [lo, hi), from a seed.
inline std::vector<AnyTensor> random_inputs(const std::vector<Shape>& shapes, uint64_t seed, double lo = -1.0,
                                            double hi = 1.0) {
  Generator gen(seed);
  std::vector<AnyTensor> v;
  for (const Shape& s : shapes) v.push_back(Tensor<double>::rand(s, Device::cpu(), lo, hi, gen));
  return v;
}

}  // namespace ember::testing

// CHECK_GRADIENTS(f, inputs): runs gradcheck and reports the mismatches on failure.
#define CHECK_GRADIENTS(f, inputs)                                        \
  do {                                                                    \
    auto _gc = ::ember::testing::gradcheck((f), (inputs));                \
    INFO(_gc.report);                                                     \
    CHECK(_gc.checked > 0);                                               \
    CHECK(_gc.ok);                                                        \
  } while (0)

// CHECK_MODULE_GRADIENTS(f, inputs, module): also checks the module's parameters (which must
// be float64: module.to(DType::Float64)).
#define CHECK_MODULE_GRADIENTS(f, inputs, module)                             \
  do {                                                                        \
    auto _gc = ::ember::testing::gradcheck((f), (inputs), (module).parameters()); \
    INFO(_gc.report);                                                         \
    CHECK(_gc.checked > 0);                                                   \
    CHECK(_gc.ok);                                                            \
  } while (0)
