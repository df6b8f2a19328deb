#pragma once
// optim::OptimizerBase<Derived, Options>: what SGD, Adam/AdamW and RMSprop share on top of
// Optimizer, so that each of them holds only its options and its update:
//
//   class SGD : public OptimizerBase<SGD, SGDOptions> {
//     friend OptimizerBase;
//     static constexpr OptionField<SGDOptions> kOptionFields[] = {{"lr", &SGDOptions::lr, 1e-3}, ...};
//     static void check(const HyperparamCheck& c);           // the options' rules
//     void update(const SGDOptions& o, AnyTensor& p, const AnyTensor& grad);  // one parameter
//    public:
//     explicit SGD(std::vector<AnyTensor> params, const SGDOptions& options = {})
//         : OptimizerBase("SGD", std::move(params), options) {}
//   };
//
// The base gives the constructor (torch's defaults from kOptionFields, overridden by the options'
// set fields; an empty parameter list refused), add_param_group, the validation of every group
// (check(), which load_state_dict runs too), step() (the profiler's optimizer phase, NoGradGuard,
// and update() for each parameter that has a gradient, with its group's options all set), and the
// switch between the optimizer's fused kernel and its composite (set_fused; fuses_grad_unscale:
// an update honours grad_unscale_ either way, in the kernel's arguments or by
// unscale_for_composite).
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ember/optim/optimizer.hpp"

namespace ember::optim {

// One field of an optimizer's options struct: its hyperparameter's name (torch's), the field, and
// torch's default. The order of an optimizer's fields is torch's param_group order.
template <class Options>
struct OptionField {
  const char* name;
  std::optional<double> Options::*number = nullptr;
  std::optional<bool> Options::*flag = nullptr;
  double torch_default = 0.0;  // a flag's as 0 or 1, as Hyperparams holds it
  constexpr OptionField(const char* n, std::optional<double> Options::*field, double d)
      : name(n), number(field), torch_default(d) {}
  constexpr OptionField(const char* n, std::optional<bool> Options::*field, bool d)
      : name(n), flag(field), torch_default(d ? 1.0 : 0.0) {}
};

// The checks of one parameter group's hyperparameters: each failure is a ValueError naming the
// optimizer and the option ("SGD: invalid learning rate lr=-0.1 (must be >= 0)").
class HyperparamCheck {
 public:
  HyperparamCheck(const std::string& optimizer, const Hyperparams& h) : name_(optimizer), h_(h) {}
  double at(const char* key) const { return h_.at(key); }
  bool flag(const char* key) const { return h_.at(key) != 0.0; }
  void nonneg(const char* key, const char* label) const {
    const double v = h_.at(key);
    if (!(v >= 0.0)) invalid(::ember::detail::str_cat("invalid ", label, " ", key, "=", v, " (must be >= 0)"));
  }
  void unit(const char* key, const char* label) const {
    const double v = h_.at(key);
    if (!(v >= 0.0 && v < 1.0))
      invalid(::ember::detail::str_cat("invalid ", label, " ", key, "=", v, " (must be in [0, 1))"));
  }
  [[noreturn]] void invalid(const std::string& what) const { throw ValueError(name_ + ": " + what); }

 private:
  const std::string& name_;
  const Hyperparams& h_;
};

template <class Derived, class Options>
class OptimizerBase : public Optimizer {
 public:
  // A new group; options left unset take the constructor's values.
  void add_param_group(std::vector<AnyTensor> params, const Options& options = {}) {
    add_group(std::move(params), resolve(defaults_, options));
  }

  void step() override {
    trace::PhaseScope phase(trace::Phase::Optimizer);  // the profiler's optimizer phase
    NoGradGuard no_grad;
    for (ParamGroup& group : groups_) {
      const Options o = settings(group.options);
      for (AnyTensor& p : group.params) {
        const AnyTensor grad = grad_of(p);
        if (!grad.defined()) continue;
        static_cast<Derived&>(*this).update(o, p, grad);
      }
    }
  }

  // The fused step (default on): one kernel per parameter instead of the composite's elementwise
  // ops. set_fused(false) takes the composite, the reference the kernel is tested against.
  void set_fused(bool on) { fused_ = on; }
  bool fused() const { return fused_; }
  // The GradScaler's unscale runs inside the fused kernel (Optimizer::step_unscaling).
  bool fuses_grad_unscale() const override { return fused_; }

  // torch's defaults, in torch's order.
  static Hyperparams torch_defaults() {
    Hyperparams h;
    for (const auto& f : Derived::kOptionFields) h.set(f.name, f.torch_default);
    return h;
  }

 protected:
  OptimizerBase(const char* name, std::vector<AnyTensor> params, const Options& options,
                Hyperparams defaults = Derived::torch_defaults())
      : Optimizer(name, resolve(std::move(defaults), options)) {
    EMBER_CHECK(!params.empty(), ValueError, name, ": optimizer got an empty parameter list");
    add_group(std::move(params), defaults_);
  }

  // Derived's rules, on every group added or loaded. (A static function: the first group is
  // checked while the base is being constructed, before Derived exists.)
  void validate(const Hyperparams& h) const final { Derived::check(HyperparamCheck(name_, h)); }

  // The start of an update's composite (set_fused(false), or tensors the fused kernel does not
  // take): the gradient unscaled in place (unscale_for_composite), then the parameter and the
  // gradient read as the state type sd, the gradient negated when maximizing.
  std::pair<AnyTensor, AnyTensor> composite_inputs(const AnyTensor& p, const AnyTensor& grad, DType sd,
                                                   bool maximize) const {
    unscale_for_composite(grad);
    AnyTensor param = detail::value_as(p, sd);
    AnyTensor g = detail::value_as(grad, sd);
    if (maximize) g = op::neg(g);
    return {param, g};
  }

  bool fused_ = true;

 private:
  // h with the options' set fields overriding.
  static Hyperparams resolve(Hyperparams h, const Options& o) {
    for (const auto& f : Derived::kOptionFields) {
      if (f.number != nullptr && (o.*f.number).has_value()) h.set(f.name, *(o.*f.number));
      if (f.flag != nullptr && (o.*f.flag).has_value()) h.set(f.name, *(o.*f.flag) ? 1.0 : 0.0);
    }
    return h;
  }
  // A group's hyperparameters as options with every field set (flags: non-zero is true).
  static Options settings(const Hyperparams& h) {
    Options o;
    for (const auto& f : Derived::kOptionFields) {
      if (f.number != nullptr) o.*f.number = h.at(f.name);
      if (f.flag != nullptr) o.*f.flag = h.at(f.name) != 0.0;
    }
    return o;
  }
};

}  // namespace ember::optim
