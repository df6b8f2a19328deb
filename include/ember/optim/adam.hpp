#pragma once
// optim::Adam and optim::AdamW, as torch.optim.Adam / torch.optim.AdamW.
//   Adam  defaults: lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=false
//   AdamW defaults: the same but weight_decay=1e-2, applied decoupled
// torch's `betas` tuple is the pair of hyperparameters "beta1", "beta2" here. The update, per
// parameter with a gradient (torch's _single_tensor_adam, same order of operations):
//   step += 1
//   g = maximize ? -grad : grad
//   Adam:  if weight_decay != 0:  g = g + weight_decay * p          (L2, coupled into the moments)
//   AdamW: p = p * (1 - lr * weight_decay)                           (decoupled)
//   exp_avg    = lerp(exp_avg, g, 1 - beta1)                          (= beta1 m + (1 - beta1) g)
//   exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * g * g
//   bias_correction1 = 1 - beta1^step;  bias_correction2 = 1 - beta2^step
//   amsgrad: max_exp_avg_sq = max(max_exp_avg_sq, exp_avg_sq); v = max_exp_avg_sq; else v = exp_avg_sq
//   denom = sqrt(v) / sqrt(bias_correction2) + eps
//   p = p - (lr / bias_correction1) * exp_avg / denom
// State: "step" (float32 CPU scalar), "exp_avg", "exp_avg_sq", and "max_exp_avg_sq" with amsgrad.
#include "ember/optim/optimizer_base.hpp"

namespace ember::optim {

struct AdamOptions {
  std::optional<double> lr;            // 1e-3
  std::optional<double> beta1;         // 0.9   (torch: betas[0])
  std::optional<double> beta2;         // 0.999 (torch: betas[1])
  std::optional<double> eps;           // 1e-8
  std::optional<double> weight_decay;  // Adam: 0 (L2); AdamW: 1e-2 (decoupled)
  std::optional<bool> amsgrad;         // false
  std::optional<bool> maximize;        // false
};

namespace detail {
// Adam and AdamW share everything but the default weight decay and how it is applied.
class AdamBase : public OptimizerBase<AdamBase, AdamOptions> {
 protected:
  AdamBase(const char* name, std::vector<AnyTensor> params, const AdamOptions& options, double default_wd,
           bool decoupled)
      : OptimizerBase(name, std::move(params), options, torch_defaults(default_wd)), decoupled_(decoupled) {}

  // torch's defaults with this weight decay (Adam's 0, AdamW's 1e-2).
  static Hyperparams torch_defaults(double weight_decay) {
    Hyperparams h = OptimizerBase::torch_defaults();
    h.set("weight_decay", weight_decay);
    return h;
  }

 private:
  friend OptimizerBase;
  static constexpr OptionField<AdamOptions> kOptionFields[] = {
      {"lr", &AdamOptions::lr, 1e-3},                    {"beta1", &AdamOptions::beta1, 0.9},
      {"beta2", &AdamOptions::beta2, 0.999},             {"eps", &AdamOptions::eps, 1e-8},
      {"weight_decay", &AdamOptions::weight_decay, 0.0}, {"amsgrad", &AdamOptions::amsgrad, false},
      {"maximize", &AdamOptions::maximize, false}};

  static void check(const HyperparamCheck& c) {
    c.nonneg("lr", "learning rate");
    c.nonneg("eps", "epsilon value");
    c.unit("beta1", "beta parameter at index 0:");
    c.unit("beta2", "beta parameter at index 1:");
    c.nonneg("weight_decay", "weight_decay value");
  }

  void update(const AdamOptions& o, AnyTensor& p, const AnyTensor& grad) {
    const double lr = *o.lr, beta1 = *o.beta1, beta2 = *o.beta2, eps = *o.eps, weight_decay = *o.weight_decay;
    const bool amsgrad = *o.amsgrad, maximize = *o.maximize;
    const DType sd = state_dtype(p.dtype());
    ParamState& st = state_for(p);
    if (st.empty()) {
      st.emplace_back("step", new_step_tensor());
      st.emplace_back("exp_avg", AnyTensor::zeros(p.shape(), sd, p.device()));
      st.emplace_back("exp_avg_sq", AnyTensor::zeros(p.shape(), sd, p.device()));
    }
    AnyTensor* max_sq = find_state(st, "max_exp_avg_sq");
    if (amsgrad && max_sq == nullptr) {
      st.emplace_back("max_exp_avg_sq", AnyTensor::zeros(p.shape(), sd, p.device()));
      max_sq = &st.back().second;
    }
    AnyTensor& exp_avg = *find_state(st, "exp_avg");
    AnyTensor& exp_avg_sq = *find_state(st, "exp_avg_sq");
    const double step = increment_step(*find_state(st, "step"));
    const double bias_correction1 = 1.0 - std::pow(beta1, step);
    const double bias_correction2 = 1.0 - std::pow(beta2, step);
    const double step_size = lr / bias_correction1;
    const double bias_correction2_sqrt = std::sqrt(bias_correction2);

    if (fused_ && fused_step_applies(p, grad, {&exp_avg, &exp_avg_sq, amsgrad ? max_sq : nullptr})) {
      // One pass over p, grad and the moments (Backend::adam_step), the composite's operations
      // in its order: the same values (bitwise on the CPU without FMA contraction).
      const AdamStepArgs a{p.dtype(), grad.dtype(), sd,        p.numel(), lr,
                           beta1,     beta2,        eps,       weight_decay, decoupled_,
                           amsgrad,   maximize,     step_size, bias_correction2_sqrt, grad_unscale_};
      if (a.n > 0)
        p.backend().adam_step(a, p.data_ptr(), grad.data_ptr(), exp_avg.data_ptr(), exp_avg_sq.data_ptr(),
                              amsgrad ? max_sq->data_ptr() : nullptr);
      return;
    }
    // The composite (set_fused(false), or tensors the kernel does not take).
    auto [param, g] = composite_inputs(p, grad, sd, maximize);
    if (weight_decay != 0.0) {
      if (decoupled_) {
        param = op::mul(param, 1.0 - lr * weight_decay);
      } else {
        g = op::add(g, op::mul(param, weight_decay));
      }
    }
    exp_avg = lerp(exp_avg, g, 1.0 - beta1);
    exp_avg_sq = op::add(op::mul(exp_avg_sq, beta2), op::mul(op::mul(g, 1.0 - beta2), g));
    AnyTensor v = exp_avg_sq;
    if (amsgrad) {
      *max_sq = op::maximum(*max_sq, exp_avg_sq);
      v = *max_sq;
    }
    AnyTensor denom = op::add(op::div(op::sqrt(v), bias_correction2_sqrt), eps);
    p.copy_(op::add(param, op::div(op::mul(exp_avg, -step_size), denom)));
  }

  bool decoupled_;
};
}  // namespace detail

// Adam with L2 weight decay added to the gradient (coupled): torch.optim.Adam.
class Adam : public detail::AdamBase {
 public:
  explicit Adam(std::vector<AnyTensor> params, const AdamOptions& options = {})
      : AdamBase("Adam", std::move(params), options, 0.0, /*decoupled=*/false) {}
  static Hyperparams torch_defaults() { return AdamBase::torch_defaults(0.0); }
};

// Adam with decoupled weight decay, p *= 1 - lr * weight_decay: torch.optim.AdamW.
class AdamW : public detail::AdamBase {
 public:
  explicit AdamW(std::vector<AnyTensor> params, const AdamOptions& options = {})
      : AdamBase("AdamW", std::move(params), options, 1e-2, /*decoupled=*/true) {}
  static Hyperparams torch_defaults() { return AdamBase::torch_defaults(1e-2); }
};

}  // namespace ember::optim
