#pragma once
// nn::Module: parameters, buffers and submodules with PyTorch-style dotted names, train/eval,
// moving between devices and dtypes, and strict state_dict loading.
//
// A module's forward is a template over the activation type (DESIGN.md decision 5): parameters
// stay in their own dtype (fp32 master weights by default) and a layer casts them to the
// activation type where it uses them. To sit in an nn::Sequential, a module derives from
// nn::ModuleBase<Derived>, which turns its template forward into the untyped `forward_any`.
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "ember/amp/autocast.hpp"
#include "ember/core/trace.hpp"
#include "ember/io/safetensors.hpp"
#include "ember/ops/ops.hpp"

namespace ember::nn {

// Ordered name -> tensor map (the order of registration, as PyTorch's state_dict keeps it).
using StateDict = std::vector<std::pair<std::string, AnyTensor>>;

inline const AnyTensor* find_entry(const StateDict& sd, const std::string& name) {
  for (const auto& [k, v] : sd)
    if (k == name) return &v;
  return nullptr;
}

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;  // modules own parameters; share them with shared_ptr
  Module& operator=(const Module&) = delete;

  // The untyped forward used by containers; ModuleBase implements it from forward<T>.
  virtual AnyTensor forward_any(const AnyTensor& x) {
    throw Error(::ember::detail::str_cat(type_name(), ": this module has no single-input forward"));
  }
  virtual std::string type_name() const { return "Module"; }

  // ---- registration ----
  // A parameter is a floating-point leaf that requires grad.
  AnyTensor register_parameter(const std::string& name, AnyTensor value) {
    check_new_name(name);
    EMBER_CHECK(is_floating(value.dtype()), DTypeError, type_name(), ": parameter '", name,
                "' must be floating point, got ", value.desc());
    value.set_requires_grad(true);
    params_.emplace_back(name, value);
    return value;
  }
  // A buffer is state that is saved and moved with the module but not trained (running means).
  AnyTensor register_buffer(const std::string& name, AnyTensor value) {
    check_new_name(name);
    buffers_.emplace_back(name, value);
    return value;
  }
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    check_new_name(name);
    EMBER_CHECK(module != nullptr, ValueError, type_name(), ": submodule '", name, "' is null");
    module->module_name_ = name;  // what the profiler's dotted module names are made of
    children_.emplace_back(name, module);
    return module;
  }

  // ---- traversal ----
  std::vector<std::pair<std::string, AnyTensor>> named_parameters(bool recurse = true) const {
    std::vector<std::pair<std::string, AnyTensor>> out;
    collect(out, "", recurse, /*buffers=*/false);
    return out;
  }
  std::vector<std::pair<std::string, AnyTensor>> named_buffers(bool recurse = true) const {
    std::vector<std::pair<std::string, AnyTensor>> out;
    collect(out, "", recurse, /*buffers=*/true);
    return out;
  }
  std::vector<AnyTensor> parameters(bool recurse = true) const {
    std::vector<AnyTensor> out;
    for (auto& [n, p] : named_parameters(recurse)) out.push_back(p);
    return out;
  }
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }
  // This module ("") and every module below it, depth first, with dotted names ("encoder.0"), as
  // PyTorch's named_modules(): a module reachable twice (shared) is listed once, first path wins.
  std::vector<std::pair<std::string, Module*>> named_modules() {
    std::vector<std::pair<std::string, Module*>> out;
    collect_modules(out, "");
    return out;
  }
  // The name this module was registered under in its parent ("" for a root).
  const std::string& module_name() const { return module_name_; }
  int64_t parameter_count() const {
    int64_t n = 0;
    for (auto& p : parameters()) n += p.numel();
    return n;
  }

  // ---- printing ----
  // One line of what this module is, without its children: PyTorch's extra_repr. The default
  // lists the module's own parameters and buffers with their shapes ("weight=[10, 64], bias=[10]").
  virtual std::string extra_repr() const {
    std::string s;
    for (const auto& [n, p] : params_) s += (s.empty() ? "" : ", ") + n + "=" + p.shape().str();
    for (const auto& [n, b] : buffers_) s += (s.empty() ? "" : ", ") + n + "=" + b.shape().str() + " (buffer)";
    return s;
  }

  // ---- modes ----
  virtual void train(bool on = true) {
    training_ = on;
    for (auto& [n, c] : children_) c->train(on);
  }
  void eval() { train(false); }
  bool is_training() const { return training_; }

  void zero_grad() {
    for (auto& p : parameters()) p.zero_grad();
  }

  // Moves every parameter and buffer to a device, in place: handles held elsewhere (an
  // optimizer's parameter list) see the move. Gradients are dropped.
  void to(Device d) {
    for_each_tensor([&](AnyTensor& t, bool) { move_in_place(t, t.detach().to(d)); });
  }
  // Casts floating-point parameters and buffers to a dtype, in place (to(DType::Float64) for
  // gradient checks; mixed precision keeps fp32 parameters and casts activations instead).
  void to(DType dt) {
    EMBER_CHECK(is_floating(dt), DTypeError, type_name(), ".to: parameters must be floating point, got ",
                dtype_name(dt));
    for_each_tensor([&](AnyTensor& t, bool) {
      if (is_floating(t.dtype())) move_in_place(t, t.detach().to(dt));
    });
  }

  // ---- state ----
  // Parameters then buffers of each module, depth first, with dotted names (PyTorch's order is
  // per module: own parameters, own buffers, then children, which is what this produces).
  StateDict state_dict() const {
    StateDict out;
    state_into(out, "");
    return out;
  }
  // Copies values into the existing tensors (same shapes; dtype and device are converted).
  // Strict: a missing, unexpected or mis-shaped entry is an error that names it.
  void load_state_dict(const StateDict& sd, bool strict = true) {
    StateDict mine = state_dict();
    std::vector<std::string> missing, unexpected, mismatched;
    for (auto& [name, t] : mine) {
      const AnyTensor* src = find_entry(sd, name);
      if (!src) {
        missing.push_back(name);
        continue;
      }
      if (!(src->shape() == t.shape())) mismatched.push_back(name + " (expected " + t.shape().str() + ", got " +
                                                             src->shape().str() + ")");
    }
    for (auto& [name, t] : sd)
      if (!find_entry(mine, name)) unexpected.push_back(name);
    auto join = [](const std::vector<std::string>& v) {
      std::string s;
      for (auto& x : v) s += (s.empty() ? "" : ", ") + x;
      return s;
    };
    EMBER_CHECK(mismatched.empty(), ShapeError, type_name(), ".load_state_dict: shape mismatch for ", join(mismatched));
    if (strict) {
      EMBER_CHECK(missing.empty() && unexpected.empty(), ValueError, type_name(), ".load_state_dict: ",
                  missing.empty() ? "" : "missing keys: " + join(missing), (!missing.empty() && !unexpected.empty()) ? "; " : "",
                  unexpected.empty() ? "" : "unexpected keys: " + join(unexpected));
    }
    NoGradGuard no_grad;
    for (auto& [name, t] : mine) {
      const AnyTensor* src = find_entry(sd, name);
      if (src) t.copy_(src->detach().to(t.device()));
    }
  }

  // ---- files (io/safetensors.hpp) ----
  // Writes state_dict() to a safetensors file, atomically. PyTorch reads it with
  // model.load_state_dict(safetensors.torch.load_file(path)). Tied parameters (one storage under
  // two names) are refused, as safetensors refuses them.
  void save(const std::string& path, const io::Metadata& metadata = {}) const {
    io::save_file(path, state_dict(), metadata);
  }
  struct LoadResult {
    std::vector<std::string> missing_keys, unexpected_keys;
  };
  // Loads a safetensors file (from ember, or from PyTorch's safetensors.torch.save_file) into the
  // existing tensors as load_state_dict(strict) does; returns the names the file lacked and the
  // names it had in excess (both empty after a strict load).
  LoadResult load(const std::string& path, bool strict = true) {
    io::TensorList sd = io::load_file(path);
    LoadResult r;
    StateDict mine = state_dict();
    for (auto& [name, t] : mine)
      if (!find_entry(sd, name)) r.missing_keys.push_back(name);
    for (auto& [name, t] : sd)
      if (!find_entry(mine, name)) r.unexpected_keys.push_back(name);
    try {
      load_state_dict(sd, strict);
    } catch (const ShapeError& e) {
      throw ShapeError(std::string(e.what()) + " (file '" + path + "')");
    } catch (const ValueError& e) {
      throw ValueError(std::string(e.what()) + " (file '" + path + "')");
    }
    return r;
  }

 protected:
  // Calls f(tensor, is_parameter) on every parameter and buffer slot of this module tree.
  void for_each_tensor(const std::function<void(AnyTensor&, bool)>& f) {
    for (auto& [n, p] : params_) f(p, true);
    for (auto& [n, b] : buffers_) f(b, false);
    for (auto& [n, c] : children_) c->for_each_tensor(f);
  }

 private:
  void check_new_name(const std::string& name) const {
    EMBER_CHECK(!name.empty() && name.find('.') == std::string::npos, ValueError, type_name(),
                ": invalid name '", name, "' (non-empty, no dots)");
    auto taken = [&](const auto& v) {
      for (auto& e : v)
        if (e.first == name) return true;
      return false;
    };
    EMBER_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_), ValueError, type_name(), ": the name '",
                name, "' is already registered");
  }
  void collect(std::vector<std::pair<std::string, AnyTensor>>& out, const std::string& prefix, bool recurse,
               bool buffers) const {
    for (auto& [n, t] : (buffers ? buffers_ : params_)) out.emplace_back(prefix + n, t);
    if (recurse)
      for (auto& [n, c] : children_) c->collect(out, prefix + n + ".", recurse, buffers);
  }
  void state_into(StateDict& out, const std::string& prefix) const {
    for (auto& [n, t] : params_) out.emplace_back(prefix + n, t);
    for (auto& [n, t] : buffers_) out.emplace_back(prefix + n, t);
    for (auto& [n, c] : children_) c->state_into(out, prefix + n + ".");
  }
  // Points the existing TensorImpl at new storage, so every handle to it follows.
  static void move_in_place(AnyTensor& t, const AnyTensor& moved) {
    TensorImpl& dst = *t.impl();
    const TensorImpl& src = *moved.impl();
    dst.storage = src.storage;
    dst.offset = src.offset;
    dst.device = src.device;
    dst.dtype = src.dtype;
    dst.grad.reset();
    dst.grad_accumulator.reset();
  }

  std::vector<std::pair<std::string, AnyTensor>> params_;
  std::vector<std::pair<std::string, AnyTensor>> buffers_;
  void collect_modules(std::vector<std::pair<std::string, Module*>>& out, const std::string& prefix) {
    for (const auto& [n, m] : out)
      if (m == this) return;
    out.emplace_back(prefix, this);
    for (auto& [n, c] : children_) c->collect_modules(out, prefix.empty() ? n : prefix + "." + n);
  }

  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::string module_name_;
  bool training_ = true;
};

namespace detail {
inline void print_module(std::ostream& os, const Module& m, int indent) {
  const int64_t count = m.parameter_count();
  const std::string tail =
      count > 0 ? ::ember::detail::str_cat("  # ", count, count == 1 ? " parameter" : " parameters") : std::string();
  const std::string extra = m.extra_repr();
  if (m.named_children().empty()) {
    os << m.type_name() << "(" << extra << ")" << tail;
    return;
  }
  const std::string pad(static_cast<size_t>(indent + 2), ' ');
  os << m.type_name() << "(" << tail << "\n";
  if (!extra.empty()) os << pad << extra << "\n";
  for (const auto& [n, c] : m.named_children()) {
    os << pad << "(" << n << "): ";
    print_module(os, *c, indent + 2);
    os << "\n";
  }
  os << std::string(static_cast<size_t>(indent), ' ') << ")";
}
}  // namespace detail

// The module tree, as PyTorch prints a module: each child as "(name): Type(extra_repr)", with
// parameter shapes and, per module, its parameter count.
//   Sequential(  # 650 parameters
//     (0): Linear(weight=[10, 64], bias=[10])  # 650 parameters
//     (1): ReLU()
//   )
inline std::ostream& operator<<(std::ostream& os, const Module& m) {
  detail::print_module(os, m, 0);
  return os;
}

namespace detail {
// The profiler's hook into module calls: the profiler builds dotted names ("layers.3.attn") from
// the nesting of these scopes; a scope of the module already innermost is the same call.
class ModuleScope {
 public:
  explicit ModuleScope(const Module& m) : module_(&m), listener_(trace::active_listener()) {
    if (listener_) [[unlikely]] listener_->module_begin(module_, m.module_name(), m.type_name());
  }
  ~ModuleScope() {
    if (listener_) [[unlikely]] listener_->module_end(module_);
  }
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;

 private:
  const Module* module_;
  trace::Listener* listener_;
};
}  // namespace detail

// CRTP base that gives a module with `template <class T> Tensor<T> forward(const Tensor<T>&)`
// an untyped forward (for containers) and operator().
template <class Derived>
class ModuleBase : public Module {
 public:
  AnyTensor forward_any(const AnyTensor& x) override {
    autograd::detail::AnomalyModuleFrame anomaly_frame(*this);  // the module path in anomaly errors
    detail::ModuleScope scope(*this);
    switch (x.dtype()) {
      case DType::Float32: return self().forward(Tensor<float>(x));
      case DType::Float64: return self().forward(Tensor<double>(x));
      case DType::Float16: return self().forward(Tensor<half>(x));
      case DType::BFloat16: return self().forward(Tensor<bfloat16>(x));
      default:
        return forward_other(x);
    }
  }
  template <Element T>
  auto operator()(const Tensor<T>& x) {
    autograd::detail::AnomalyModuleFrame anomaly_frame(*this);
    detail::ModuleScope scope(*this);
    return self().forward(x);
  }

 protected:
  // Integer inputs (token ids for Embedding): a module that takes them overrides this.
  virtual AnyTensor forward_other(const AnyTensor& x) {
    throw DTypeError(::ember::detail::str_cat(type_name(), ": floating-point input expected, got ", x.desc()));
  }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
};

// A parameter as the activation type T: the same tensor when the types agree, else a
// differentiable cast (so gradients reach the fp32 master weight). Inside an amp::CastCacheGuard
// the cast of a parameter is made once and reused (amp/autocast.hpp).
template <Element T>
Tensor<T> param_as(const AnyTensor& p) {
  return Tensor<T>(p.dtype() == dtype_of<T> ? p : amp::cast_parameter(p, dtype_of<T>));
}

}  // namespace ember::nn
