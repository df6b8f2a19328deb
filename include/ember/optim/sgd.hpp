#pragma once
// optim::SGD: stochastic gradient descent with momentum, dampening, Nesterov momentum, L2 weight
// decay and maximize, as torch.optim.SGD (defaults lr=1e-3, momentum=0, dampening=0,
// weight_decay=0, nesterov=false, maximize=false). The update, per parameter with a gradient
// (torch's _single_tensor_sgd, in the same order of operations):
//   g = maximize ? -grad : grad
//   if weight_decay != 0:  g = g + weight_decay * p
//   if momentum != 0:
//     buf = (first step) ? copy of g : momentum * buf + (1 - dampening) * g
//     g = nesterov ? g + momentum * buf : buf
//   p = p - lr * g
// State: "momentum_buffer" (only when momentum != 0); SGD keeps no step count.
// The step runs as one fused kernel per parameter (Backend::sgd_step) unless set_fused(false).
#include "ember/optim/optimizer_base.hpp"

namespace ember::optim {

struct SGDOptions {
  std::optional<double> lr;            // 1e-3
  std::optional<double> momentum;      // 0
  std::optional<double> dampening;     // 0
  std::optional<double> weight_decay;  // 0
  std::optional<bool> nesterov;        // false
  std::optional<bool> maximize;        // false
};

class SGD : public OptimizerBase<SGD, SGDOptions> {
 public:
  explicit SGD(std::vector<AnyTensor> params, const SGDOptions& options = {})
      : OptimizerBase("SGD", std::move(params), options) {}

 private:
  friend OptimizerBase;
  static constexpr OptionField<SGDOptions> kOptionFields[] = {
      {"lr", &SGDOptions::lr, 1e-3},              {"momentum", &SGDOptions::momentum, 0.0},
      {"dampening", &SGDOptions::dampening, 0.0}, {"weight_decay", &SGDOptions::weight_decay, 0.0},
      {"nesterov", &SGDOptions::nesterov, false}, {"maximize", &SGDOptions::maximize, false}};

  static void check(const HyperparamCheck& c) {
    c.nonneg("lr", "learning rate");
    c.nonneg("momentum", "momentum value");
    c.nonneg("weight_decay", "weight_decay value");
    if (c.flag("nesterov") && (c.at("momentum") <= 0.0 || c.at("dampening") != 0.0))
      c.invalid(::ember::detail::str_cat("nesterov=true requires momentum > 0 and dampening = 0 (got momentum=",
                                         c.at("momentum"), ", dampening=", c.at("dampening"), ")"));
  }

  void update(const SGDOptions& o, AnyTensor& p, const AnyTensor& grad) {
    const double lr = *o.lr, momentum = *o.momentum, dampening = *o.dampening, weight_decay = *o.weight_decay;
    const bool nesterov = *o.nesterov, maximize = *o.maximize;
    const DType sd = detail::state_dtype(p.dtype());
    if (fused_) {
      AnyTensor* buf = momentum != 0.0 ? find_state(state_for(p), "momentum_buffer") : nullptr;
      if (detail::fused_step_applies(p, grad, {buf})) {
        // One pass over p, grad and the buffer (Backend::sgd_step), the composite's operations
        // in its order: the same values (bitwise on the CPU without FMA contraction).
        const bool first = momentum != 0.0 && buf == nullptr;
        if (first) {
          ParamState& st = state_for(p);
          st.emplace_back("momentum_buffer", AnyTensor::empty(p.shape(), sd, p.device()));
          buf = &st.back().second;
        }
        const SgdStepArgs a{p.dtype(), grad.dtype(), sd, p.numel(), lr, momentum, dampening, weight_decay,
                            nesterov, maximize, first, grad_unscale_};
        if (a.n > 0) p.backend().sgd_step(a, p.data_ptr(), grad.data_ptr(), buf ? buf->data_ptr() : nullptr);
        return;
      }
    }
    // The composite (set_fused(false), or tensors the kernel does not take).
    auto [param, g] = composite_inputs(p, grad, sd, maximize);
    if (weight_decay != 0.0) g = op::add(g, op::mul(param, weight_decay));
    if (momentum != 0.0) {
      ParamState& st = state_for(p);
      AnyTensor* buf = find_state(st, "momentum_buffer");
      if (buf == nullptr) {
        st.emplace_back("momentum_buffer", detail::copy_of(g));
        buf = &st.back().second;
      } else {
        *buf = op::add(op::mul(*buf, momentum), detail::scaled(g, 1.0 - dampening));
      }
      g = nesterov ? op::add(g, op::mul(*buf, momentum)) : *buf;
    }
    p.copy_(op::add(param, op::mul(g, -lr)));
  }
};

}  // namespace ember::optim
