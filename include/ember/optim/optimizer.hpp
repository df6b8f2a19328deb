#pragma once
// optim::Optimizer: the base of every optimizer, modelled on torch.optim.Optimizer.
//
// - Parameters are AnyTensor leaves (any floating dtype, any device), held in parameter groups.
//   Each group carries its own hyperparameters by torch's names ("lr", "momentum", "weight_decay",
//   ...; torch's `betas` tuple is stored as "beta1" and "beta2", booleans as 0 or 1), so a
//   scheduler or the user sets `opt.param_groups()[i]["lr"] = 0.01` as in Python.
// - The constructor's options are the optimizer's defaults; add_param_group(params, options)
//   overrides only the fields that are set (the options structs hold std::optional fields), as a
//   torch param_group dict overrides only the keys it names (OptimizerBase, optim/optimizer_base.hpp,
//   does this for SGD, Adam, AdamW and RMSprop).
// - step() updates parameters in place (p.copy_, so every handle sees it) under NoGradGuard and
//   skips parameters whose gradient is undefined (no state is created for them).
// - State per parameter is a list of named tensors ("step", "exp_avg", "momentum_buffer", ...), in
//   torch's order. State tensors are fp32 on the parameter's device (float64 for a float64
//   parameter; torch keeps them in the parameter's own dtype, which only differs for fp16/bf16
//   parameters). "step" is a float32 scalar on the CPU, as torch keeps it.
// - state_dict() follows torch's layout: state keyed by parameter index (numbered across the
//   groups in order), and param_groups holding each group's hyperparameters and parameter indices.
//   Unlike torch, whose state_dict() returns references to the live state tensors, it returns a
//   snapshot (copies): a checkpoint is what a state dict is for, and later steps must not change it.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ember/core/named_list.hpp"
#include "ember/core/trace.hpp"
#include "ember/ops/ops.hpp"

namespace ember::optim {

// Hyperparameters of one parameter group, by name, in insertion order (torch's dict order).
class Hyperparams : public NamedList<double> {
 public:
  using NamedList::NamedList;
  bool contains(const std::string& name) const { return find(name) != nullptr; }
  double at(const std::string& name) const {
    const double* v = find(name);
    EMBER_CHECK(v != nullptr, ValueError, "param group has no hyperparameter '", name, "' (it has ", names(), ")");
    return *v;
  }
  // An existing hyperparameter, for assignment: group["lr"] = 0.01. Unknown names are an error (a
  // typo must not silently add a key the optimizer never reads).
  double& operator[](const std::string& name) {
    double* v = find(name);
    EMBER_CHECK(v != nullptr, ValueError, "param group has no hyperparameter '", name, "' (it has ", names(), ")");
    return *v;
  }
  const std::vector<std::pair<std::string, double>>& items() const { return entries(); }
  auto begin() const { return items().begin(); }
  auto end() const { return items().end(); }
};

struct ParamGroup {
  std::vector<AnyTensor> params;
  Hyperparams options;

  double& operator[](const std::string& name) { return options[name]; }
  double at(const std::string& name) const { return options.at(name); }
  double lr() const { return options.at("lr"); }
  void set_lr(double lr) { options["lr"] = lr; }
};

// The named state tensors of one parameter, in torch's order.
using ParamState = std::vector<std::pair<std::string, AnyTensor>>;

inline const AnyTensor* find_state(const ParamState& st, const std::string& name) {
  for (const auto& [k, v] : st)
    if (k == name) return &v;
  return nullptr;
}
inline AnyTensor* find_state(ParamState& st, const std::string& name) {
  for (auto& [k, v] : st)
    if (k == name) return &v;
  return nullptr;
}

// torch.optim.Optimizer.state_dict()'s layout: {"state": {index: {name: tensor}},
// "param_groups": [{hyperparameters..., "params": [indices]}]}.
struct OptimizerStateDict {
  struct Group {
    Hyperparams options;
    std::vector<int64_t> params;  // parameter indices, numbered across all groups in order
  };
  std::map<int64_t, ParamState> state;  // only parameters that have state
  std::vector<Group> param_groups;
};

namespace detail {
// State tensors are fp32, or float64 for a float64 parameter.
inline DType state_dtype(DType param) { return param == DType::Float64 ? DType::Float64 : DType::Float32; }

// The values of t as dtype dt, detached (shares storage when t already has that dtype: read only).
inline AnyTensor value_as(const AnyTensor& t, DType dt) { return t.detach().to(dt); }

// torch.lerp(self, end, w): self + w * (end - self) for |w| < 0.5, else end - (end - self) * (1 - w)
// (the two-branch form torch uses for accuracy; its vectorised CPU kernel fuses the multiply-add,
// so float32 results can differ from torch's in the last bit).
inline AnyTensor lerp(const AnyTensor& self, const AnyTensor& end, double w) {
  AnyTensor d = op::sub(end, self);
  if (std::abs(w) < 0.5) return op::add(self, op::mul(d, w));
  return op::sub(end, op::mul(d, 1.0 - w));
}

// x * a, skipping the multiplication when a == 1 (torch's add(x, alpha=1) is exact).
inline AnyTensor scaled(const AnyTensor& x, double a) { return a == 1.0 ? x : op::mul(x, a); }

// A fresh copy that shares nothing with t.
inline AnyTensor copy_of(const AnyTensor& t) {
  AnyTensor out = AnyTensor::empty(t.shape(), t.dtype(), t.device());
  out.copy_(t);
  return out;
}

// Whether a fused step kernel (Backend::adam_step, sgd_step, rmsprop_step) takes a parameter: a
// floating parameter with its gradient and its state tensors (null ones skipped) on its device, all
// of its size, the state of state_dtype(p). Anything else (a gradient on another device, say) keeps
// the optimizer's composite and its errors.
inline bool fused_step_applies(const AnyTensor& p, const AnyTensor& grad,
                               std::initializer_list<const AnyTensor*> state) {
  if (!is_floating(p.dtype()) || !is_floating(grad.dtype())) return false;
  if (grad.device() != p.device() || grad.numel() != p.numel()) return false;
  for (const AnyTensor* t : state) {
    if (t == nullptr) continue;
    if (t->device() != p.device() || t->numel() != p.numel() || t->dtype() != state_dtype(p.dtype())) return false;
  }
  return true;
}

// The "step" counter: a float32 scalar on the CPU, as torch keeps it.
inline AnyTensor new_step_tensor() { return AnyTensor::zeros(Shape{}, DType::Float32, Device::cpu()); }
inline double increment_step(AnyTensor& step) {
  float* v = static_cast<float*>(step.data_ptr());
  *v += 1.0f;
  return static_cast<double>(*v);
}
}  // namespace detail

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;  // schedulers hold a reference to their optimizer
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient.
  virtual void step() = 0;

  // The GradScaler's unscale fused into the step (amp::GradScaler::step). step_unscaling(inv)
  // is step() with every gradient first multiplied in place by inv, exactly as
  // GradScaler::unscale_ multiplies it (UnaryOp::MulScalar in the gradient's type), and left so; an
  // optimizer whose fuses_grad_unscale() does that inside its fused kernels (one read and one
  // write of each gradient fewer than unscale_ then step()). SGD, Adam, AdamW and RMSprop do, with
  // their fused steps on. Each gradient must be its own tensor (not shared by two parameters): the
  // caller checks that, as GradScaler does.
  virtual bool fuses_grad_unscale() const { return false; }
  void step_unscaling(double inv_scale) {
    EMBER_CHECK(fuses_grad_unscale(), Error, name_,
                ".step_unscaling: this optimizer does not fuse the gradient unscale into its step (fuses_grad_unscale() "
                "is false; unscale the gradients, then call step())");
    struct Reset {
      double& v;
      ~Reset() { v = 1.0; }
    } reset{grad_unscale_};
    grad_unscale_ = inv_scale;
    step();
  }

  // Drops every gradient (torch's zero_grad(set_to_none=True), the default), or with
  // set_to_none=false writes zeros into the existing gradient tensors.
  void zero_grad(bool set_to_none = true) {
    for (auto& g : groups_)
      for (auto& p : g.params) {
        if (set_to_none) {
          p.zero_grad();
        } else if (AnyTensor gr = p.grad(); gr.defined() && gr.numel() > 0) {
          gr.backend().fill(gr.dtype(), gr.data_ptr(), gr.numel(), 0.0);
        }
      }
  }

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // The constructor's options with torch's defaults filled in.
  const Hyperparams& defaults() const { return defaults_; }
  const std::string& name() const { return name_; }

  // The state of parameter p, or nullptr when the optimizer holds none for it.
  const ParamState* state(const AnyTensor& p) const {
    auto it = state_.find(p.impl());
    return it == state_.end() ? nullptr : &it->second;
  }

  // A snapshot of the optimizer state in torch's layout (see the header comment).
  OptimizerStateDict state_dict() const {
    NoGradGuard no_grad;
    OptimizerStateDict sd;
    int64_t index = 0;
    for (const auto& g : groups_) {
      OptimizerStateDict::Group sg;
      sg.options = g.options;
      for (const auto& p : g.params) {
        if (const ParamState* st = state(p)) {
          ParamState copy;
          for (const auto& [k, v] : *st) copy.emplace_back(k, detail::copy_of(v));
          sd.state.emplace(index, std::move(copy));
        }
        sg.params.push_back(index++);
      }
      sd.param_groups.push_back(std::move(sg));
    }
    return sd;
  }

  // Restores hyperparameters and state saved by state_dict() (of this kind of optimizer, over
  // parameters of the same shapes, in the same groups). State tensors are copied to each
  // parameter's device and state dtype. Checks everything before changing anything.
  void load_state_dict(const OptimizerStateDict& sd) {
    const std::string who = name_ + ".load_state_dict: ";
    EMBER_CHECK(sd.param_groups.size() == groups_.size(), ValueError, who, "the state dict has ",
                sd.param_groups.size(), " parameter group(s), the optimizer has ", groups_.size());
    std::map<int64_t, const AnyTensor*> param_of;  // saved index -> current parameter
    for (size_t g = 0; g < groups_.size(); ++g) {
      const auto& sg = sd.param_groups[g];
      EMBER_CHECK(sg.params.size() == groups_[g].params.size(), ValueError, who, "parameter group ", g,
                  " of the state dict has ", sg.params.size(), " parameter(s), the optimizer's has ",
                  groups_[g].params.size());
      for (size_t i = 0; i < sg.params.size(); ++i) {
        EMBER_CHECK(param_of.emplace(sg.params[i], &groups_[g].params[i]).second, ValueError, who,
                    "parameter index ", sg.params[i], " appears more than once in the param_groups");
      }
      // The saved group must hold exactly this optimizer's hyperparameters.
      for (const auto& [k, v] : defaults_)
        EMBER_CHECK(sg.options.contains(k), ValueError, who, "parameter group ", g, " lacks hyperparameter '", k,
                    "' (a state dict of another optimizer? it has ", sg.options.names(), ")");
      for (const auto& [k, v] : sg.options)
        EMBER_CHECK(defaults_.contains(k), ValueError, who, "parameter group ", g, " has hyperparameter '", k,
                    "', which ", name_, " does not know (a state dict of another optimizer?)");
      validate(sg.options);
    }
    NoGradGuard no_grad;
    std::unordered_map<const TensorImpl*, ParamState> new_state;
    for (const auto& [index, st] : sd.state) {
      auto it = param_of.find(index);
      EMBER_CHECK(it != param_of.end(), ValueError, who, "state for parameter index ", index,
                  " which no parameter group lists");
      const AnyTensor& p = *it->second;
      ParamState loaded;
      for (const auto& [k, v] : st) {
        EMBER_CHECK(v.defined(), ValueError, who, "state '", k, "' of parameter ", index, " is undefined");
        if (k == "step") {
          EMBER_CHECK(v.numel() == 1, ShapeError, who, "state 'step' of parameter ", index,
                      " must have one element, got ", v.desc());
          AnyTensor s = detail::new_step_tensor();
          s.copy_(v.detach().to(Device::cpu()).to(DType::Float32).reshape(Shape{}));
          loaded.emplace_back(k, s);
        } else {
          EMBER_CHECK(v.shape() == p.shape(), ShapeError, who, "state '", k, "' of parameter ", index, " is ",
                      v.desc(), " but the parameter is ", p.desc());
          AnyTensor s = AnyTensor::empty(p.shape(), detail::state_dtype(p.dtype()), p.device());
          s.copy_(v.detach().to(p.device()));
          loaded.emplace_back(k, s);
        }
      }
      new_state.emplace(p.impl(), std::move(loaded));
    }
    for (size_t g = 0; g < groups_.size(); ++g) groups_[g].options = sd.param_groups[g].options;
    state_ = std::move(new_state);
  }

 protected:
  // The multiplier step_unscaling passes to step(): 1 in a plain step().
  double grad_unscale_ = 1.0;
  // A composite step's unscale (the fused kernels do their own): grad *= grad_unscale_ in place.
  void unscale_for_composite(const AnyTensor& grad) const {
    if (grad_unscale_ != 1.0 && grad.numel() > 0)
      grad.backend().unary(UnaryOp::MulScalar, grad.dtype(), grad.data_ptr(), grad.data_ptr(), grad.numel(),
                           grad_unscale_, 0.0);
  }

  Optimizer(std::string name, Hyperparams defaults) : name_(std::move(name)), defaults_(std::move(defaults)) {}

  // Checks one group's hyperparameters; throws ValueError naming the optimizer and the option.
  virtual void validate(const Hyperparams& h) const = 0;

  // Adds a group with complete hyperparameters (validated here).
  void add_group(std::vector<AnyTensor> params, Hyperparams options) {
    validate(options);
    std::unordered_set<const TensorImpl*> seen;
    for (const auto& g : groups_)
      for (const auto& p : g.params) seen.insert(p.impl());
    for (size_t i = 0; i < params.size(); ++i) {
      const AnyTensor& p = params[i];
      EMBER_CHECK(p.defined(), ValueError, name_, ": parameter ", i, " of the new group is an undefined tensor");
      EMBER_CHECK(is_floating(p.dtype()), DTypeError, name_, ": parameter ", i,
                  " must be floating point, got ", p.desc());
      EMBER_CHECK(p.is_leaf(), ValueError, name_, ": can't optimize a non-leaf tensor (parameter ", i, ", ",
                  p.desc(), ", output of ", p.grad_fn_name(), ")");
      EMBER_CHECK(seen.insert(p.impl()).second, ValueError, name_, ": parameter ", i, " (", p.desc(),
                  ") appears more than once in the parameter groups");
    }
    groups_.push_back(ParamGroup{std::move(params), std::move(options)});
  }

  // p's gradient (undefined when it has none), checked against p: a gradient set by hand with
  // another shape would broadcast into the update ([1] into [2, 3]) or fail inside an op that names
  // no optimizer, and an integer one would be cast silently (PyTorch refuses all three when .grad
  // is set, as it does a gradient on another device).
  AnyTensor grad_of(const AnyTensor& p) const {
    AnyTensor g = p.grad();
    if (!g.defined()) return g;
    EMBER_CHECK(g.shape() == p.shape(), ShapeError, name_, ".step: the gradient ", g.desc(), " of parameter ",
                p.desc(), " has another shape");
    EMBER_CHECK(is_floating(g.dtype()), DTypeError, name_, ".step: the gradient ", g.desc(), " of parameter ",
                p.desc(), " must be floating point");
    EMBER_CHECK(g.device() == p.device(), DeviceError, name_, ".step: the gradient ", g.desc(), " of parameter ",
                p.desc(), " is on another device");
    return g;
  }

  // The state of p, created empty on first use.
  ParamState& state_for(const AnyTensor& p) {
    ParamState& st = state_[p.impl()];
    // A parameter moved to another device (Module::to) takes its state along.
    for (auto& [k, v] : st)
      if (k != "step" && v.device() != p.device()) v = v.to(p.device());
    return st;
  }

  std::string name_;
  Hyperparams defaults_;
  std::vector<ParamGroup> groups_;
  std::unordered_map<const TensorImpl*, ParamState> state_;  // keyed by parameter, as torch keys by tensor
};

}  // namespace ember::optim
