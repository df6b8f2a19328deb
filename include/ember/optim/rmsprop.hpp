#pragma once
// optim::RMSprop, as torch.optim.RMSprop (defaults lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0,
// momentum=0, centered=false, maximize=false). The update, per parameter with a gradient (torch's
// _single_tensor_rmsprop, same order of operations):
//   step += 1
//   g = maximize ? -grad : grad
//   if weight_decay != 0:  g = g + weight_decay * p
//   square_avg = alpha * square_avg + (1 - alpha) * g * g
//   centered:  grad_avg = lerp(grad_avg, g, 1 - alpha);  avg = sqrt(square_avg - grad_avg^2) + eps
//   else:      avg = sqrt(square_avg) + eps
//   momentum > 0:  buf = momentum * buf + g / avg;  p = p - lr * buf
//   else:          p = p - lr * g / avg
// State: "step" (float32 CPU scalar), "square_avg", "momentum_buffer" (momentum > 0),
// "grad_avg" (centered). A buffer is created when first needed, so turning momentum on later (a
// OneCycleLR cycling it) works. The step runs as one fused kernel per parameter
// (Backend::rmsprop_step) unless set_fused(false).
#include "ember/optim/optimizer_base.hpp"

namespace ember::optim {

struct RMSpropOptions {
  std::optional<double> lr;            // 1e-2
  std::optional<double> alpha;         // 0.99
  std::optional<double> eps;           // 1e-8
  std::optional<double> weight_decay;  // 0
  std::optional<double> momentum;      // 0
  std::optional<bool> centered;        // false
  std::optional<bool> maximize;        // false
};

class RMSprop : public OptimizerBase<RMSprop, RMSpropOptions> {
 public:
  explicit RMSprop(std::vector<AnyTensor> params, const RMSpropOptions& options = {})
      : OptimizerBase("RMSprop", std::move(params), options) {}

 private:
  friend OptimizerBase;
  static constexpr OptionField<RMSpropOptions> kOptionFields[] = {
      {"lr", &RMSpropOptions::lr, 1e-2},            {"alpha", &RMSpropOptions::alpha, 0.99},
      {"eps", &RMSpropOptions::eps, 1e-8},          {"weight_decay", &RMSpropOptions::weight_decay, 0.0},
      {"momentum", &RMSpropOptions::momentum, 0.0}, {"centered", &RMSpropOptions::centered, false},
      {"maximize", &RMSpropOptions::maximize, false}};

  static void check(const HyperparamCheck& c) {
    c.nonneg("lr", "learning rate");
    c.nonneg("eps", "epsilon value");
    c.nonneg("momentum", "momentum value");
    c.nonneg("weight_decay", "weight_decay value");
    c.nonneg("alpha", "alpha value");
  }

  void update(const RMSpropOptions& o, AnyTensor& p, const AnyTensor& grad) {
    const double lr = *o.lr, alpha = *o.alpha, eps = *o.eps, weight_decay = *o.weight_decay, momentum = *o.momentum;
    const bool centered = *o.centered, maximize = *o.maximize;
    const DType sd = detail::state_dtype(p.dtype());
    ParamState& st = state_for(p);
    if (st.empty()) {
      st.emplace_back("step", detail::new_step_tensor());
      st.emplace_back("square_avg", AnyTensor::zeros(p.shape(), sd, p.device()));
    }
    // Buffers, in torch's order; also created later if momentum or centered is switched on.
    if (momentum > 0.0 && !find_state(st, "momentum_buffer"))
      st.emplace_back("momentum_buffer", AnyTensor::zeros(p.shape(), sd, p.device()));
    if (centered && !find_state(st, "grad_avg"))
      st.emplace_back("grad_avg", AnyTensor::zeros(p.shape(), sd, p.device()));
    detail::increment_step(*find_state(st, "step"));
    AnyTensor& square_avg = *find_state(st, "square_avg");

    AnyTensor* grad_avg_state = centered ? find_state(st, "grad_avg") : nullptr;
    AnyTensor* buf_state = momentum > 0.0 ? find_state(st, "momentum_buffer") : nullptr;
    if (fused_ && detail::fused_step_applies(p, grad, {&square_avg, grad_avg_state, buf_state})) {
      // One pass over p, grad and the buffers (Backend::rmsprop_step), the composite's
      // operations in its order: the same values (bitwise on the CPU without FMA contraction).
      const RmspropStepArgs a{p.dtype(), grad.dtype(), sd,       p.numel(), lr, alpha, eps, weight_decay,
                              momentum,  centered,     maximize, grad_unscale_};
      if (a.n > 0)
        p.backend().rmsprop_step(a, p.data_ptr(), grad.data_ptr(), square_avg.data_ptr(),
                                 grad_avg_state ? grad_avg_state->data_ptr() : nullptr,
                                 buf_state ? buf_state->data_ptr() : nullptr);
      return;
    }
    // The composite (set_fused(false), or tensors the kernel does not take).
    auto [param, g] = composite_inputs(p, grad, sd, maximize);
    if (weight_decay != 0.0) g = op::add(g, op::mul(param, weight_decay));
    square_avg = op::add(op::mul(square_avg, alpha), op::mul(op::mul(g, 1.0 - alpha), g));
    AnyTensor avg;
    if (centered) {
      AnyTensor& grad_avg = *find_state(st, "grad_avg");
      grad_avg = detail::lerp(grad_avg, g, 1.0 - alpha);
      avg = op::sqrt(op::add(square_avg, op::mul(op::neg(grad_avg), grad_avg)));
    } else {
      avg = op::sqrt(square_avg);
    }
    avg = op::add(avg, eps);
    if (momentum > 0.0) {
      AnyTensor& buf = *find_state(st, "momentum_buffer");
      buf = op::add(op::mul(buf, momentum), op::div(g, avg));
      p.copy_(op::add(param, op::mul(buf, -lr)));
    } else {
      p.copy_(op::add(param, op::div(op::mul(g, -lr), avg)));
    }
  }
};

}  // namespace ember::optim
