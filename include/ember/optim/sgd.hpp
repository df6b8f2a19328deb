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
#include "ember/optim/optimizer.hpp"

namespace ember::optim {

struct SGDOptions {
  std::optional<double> lr;            // 1e-3
  std::optional<double> momentum;      // 0
  std::optional<double> dampening;     // 0
  std::optional<double> weight_decay;  // 0
  std::optional<bool> nesterov;        // false
  std::optional<bool> maximize;        // false
};

class SGD : public Optimizer {
 public:
  explicit SGD(std::vector<AnyTensor> params, const SGDOptions& options = {})
      : Optimizer("SGD", resolve(torch_defaults(), options)) {
    EMBER_CHECK(!params.empty(), ValueError, "SGD: optimizer got an empty parameter list");
    add_group(std::move(params), defaults_);
  }

  // A new group; options left unset take the constructor's values.
  void add_param_group(std::vector<AnyTensor> params, const SGDOptions& options = {}) {
    add_group(std::move(params), resolve(defaults_, options));
  }

  void step() override {
    trace::PhaseScope phase(trace::Phase::Optimizer);  // the profiler's optimizer phase
    NoGradGuard no_grad;
    for (ParamGroup& group : groups_) {
      const Hyperparams& h = group.options;
      const double lr = h.at("lr"), momentum = h.at("momentum"), dampening = h.at("dampening"),
                   weight_decay = h.at("weight_decay");
      const bool nesterov = flag(h, "nesterov"), maximize = flag(h, "maximize");
      for (AnyTensor& p : group.params) {
        const AnyTensor grad = grad_of(p);
        if (!grad.defined()) continue;
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
            continue;
          }
        }
        // The composite (set_fused(false), or tensors the kernel does not take).
        unscale_for_composite(grad);
        const AnyTensor param = detail::value_as(p, sd);
        AnyTensor g = detail::value_as(grad, sd);
        if (maximize) g = op::neg(g);
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
    }
  }

  // The fused step (default on): one kernel per parameter instead of 3-7 elementwise ops.
  // set_fused(false) takes the composite, the reference the kernel is tested against.
  void set_fused(bool on) { fused_ = on; }
  bool fused() const { return fused_; }
  // The GradScaler's unscale runs inside the fused kernel (Optimizer::step_unscaling).
  bool fuses_grad_unscale() const override { return fused_; }

  static Hyperparams torch_defaults() {
    return {{"lr", 1e-3}, {"momentum", 0.0}, {"dampening", 0.0}, {"weight_decay", 0.0},
            {"nesterov", 0.0}, {"maximize", 0.0}};
  }

 protected:
  void validate(const Hyperparams& h) const override {
    check_nonneg(h, "lr", "learning rate");
    check_nonneg(h, "momentum", "momentum value");
    check_nonneg(h, "weight_decay", "weight_decay value");
    if (flag(h, "nesterov") && (h.at("momentum") <= 0.0 || h.at("dampening") != 0.0))
      invalid(str_cat("nesterov=true requires momentum > 0 and dampening = 0 (got momentum=", h.at("momentum"),
                      ", dampening=", h.at("dampening"), ")"));
  }

 private:
  static Hyperparams resolve(Hyperparams h, const SGDOptions& o) {
    put(h, "lr", o.lr);
    put(h, "momentum", o.momentum);
    put(h, "dampening", o.dampening);
    put(h, "weight_decay", o.weight_decay);
    put(h, "nesterov", o.nesterov);
    put(h, "maximize", o.maximize);
    return h;
  }

  bool fused_ = true;
};

}  // namespace ember::optim
