#pragma once
// nn::Module: parameters, buffers and submodules with PyTorch-style dotted names, train/eval,
// moving between devices and dtypes, and strict state_dict loading.
//
// A module's forward is a template over the activation type: parameters
// stay in their own dtype (fp32 master weights by default) and a layer casts them to the
// activation type where it uses them. To sit in an nn::Sequential, a module derives from
// nn::ModuleBase<Derived>, which turns its template forward into the untyped `forward_any`.
//
// Modules move (a factory may return one by value: the registered parameters, buffers and children
// are handles, shared with the layer's own members, so they travel with it) but do not copy (two
// modules would share parameters unseen; share a module through std::shared_ptr instead).
// The non-template members are defined in nn/detail/module_impl.hpp, compiled once into the
// library under EMBER_COMPILED_LIB (core/macros.hpp), included here when header-only.
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ember/amp/autocast.hpp"
#include "ember/core/macros.hpp"
#include "ember/core/trace.hpp"
#include "ember/io/safetensors.hpp"
#include "ember/ops/ops.hpp"

namespace ember::nn {

// Ordered name -> tensor map (the order of registration, as PyTorch's state_dict keeps it).
using StateDict = std::vector<std::pair<std::string, AnyTensor>>;

// The entry of that name; nullptr when there is none.
EMBER_LIB_INLINE const AnyTensor* find_entry(const StateDict& sd, const std::string& name);

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;  // modules own parameters; share them with shared_ptr
  Module& operator=(const Module&) = delete;
  Module(Module&&) noexcept = default;  // the handles move with it (see the top of this file)
  Module& operator=(Module&&) noexcept = default;

  // The untyped forward used by containers; ModuleBase implements it from forward<T>.
  EMBER_LIB_INLINE virtual AnyTensor forward_any(const AnyTensor& x);
  virtual std::string type_name() const { return "Module"; }

  // ---- registration ----
  // A parameter is a floating-point leaf that requires grad.
  EMBER_LIB_INLINE AnyTensor register_parameter(const std::string& name, AnyTensor value);
  // A buffer is state that is saved and moved with the module but not trained (running means).
  EMBER_LIB_INLINE AnyTensor register_buffer(const std::string& name, AnyTensor value);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    register_child(name, module);
    return module;
  }

  // ---- traversal ----
  EMBER_LIB_INLINE std::vector<std::pair<std::string, AnyTensor>> named_parameters(bool recurse = true) const;
  EMBER_LIB_INLINE std::vector<std::pair<std::string, AnyTensor>> named_buffers(bool recurse = true) const;
  EMBER_LIB_INLINE std::vector<AnyTensor> parameters(bool recurse = true) const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }
  // This module ("") and every module below it, depth first, with dotted names ("encoder.0"), as
  // PyTorch's named_modules(): a module reachable twice (shared) is listed once, first path wins.
  EMBER_LIB_INLINE std::vector<std::pair<std::string, Module*>> named_modules();
  // The name this module was registered under in its parent ("" for a root).
  const std::string& module_name() const { return module_name_; }
  EMBER_LIB_INLINE int64_t parameter_count() const;

  // ---- printing ----
  // One line of what this module is, without its children: PyTorch's extra_repr. The default
  // lists the module's own parameters and buffers with their shapes ("weight=[10, 64], bias=[10]").
  EMBER_LIB_INLINE virtual std::string extra_repr() const;

  // ---- modes ----
  EMBER_LIB_INLINE virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  EMBER_LIB_INLINE void zero_grad();

  // ---- forward hook ----
  // An object told about each call of this module's forward made as (*m)(x) or
  // m->forward_any(x) (a typed m->forward(x) skips it): before() ahead of the forward, after()
  // with its output, whose return value is what the caller gets. Nested calls of the same module
  // (operator() reaching forward_any) notify once. dist::FullyShardedDataParallel gathers a
  // unit's sharded parameters this way. One hook per module; null removes it.
  class ForwardHook {
   public:
    virtual ~ForwardHook() = default;
    virtual void before(Module& m) = 0;
    virtual AnyTensor after(Module& m, const AnyTensor& output) = 0;
  };
  void set_forward_hook(std::shared_ptr<ForwardHook> hook) { forward_hook_ = std::move(hook); }
  const std::shared_ptr<ForwardHook>& forward_hook() const { return forward_hook_; }
  // Runs f() (this module's forward) inside the hook, when one is set and not already running.
  template <class F>
  auto with_forward_hook(F&& f) {
    using R = decltype(f());
    if (!forward_hook_ || in_forward_hook_) [[likely]]
      return f();
    std::shared_ptr<ForwardHook> hook = forward_hook_;
    in_forward_hook_ = true;
    struct Reset {
      bool& flag;
      ~Reset() { flag = false; }
    } reset{in_forward_hook_};
    hook->before(*this);
    R y = f();
    if constexpr (std::is_constructible_v<R, AnyTensor> && std::is_convertible_v<const R&, AnyTensor>) {
      return R(hook->after(*this, y));
    } else {
      hook->after(*this, AnyTensor());
      return y;
    }
  }

  // Moves every parameter and buffer to a device, in place: handles held elsewhere (an
  // optimizer's parameter list) see the move. Gradients are dropped.
  EMBER_LIB_INLINE void to(Device d);
  // Casts floating-point parameters and buffers to a dtype, in place (to(DType::Float64) for
  // gradient checks; mixed precision keeps fp32 parameters and casts activations instead).
  EMBER_LIB_INLINE void to(DType dt);

  // ---- state ----
  // Parameters then buffers of each module, depth first, with dotted names (PyTorch's order is
  // per module: own parameters, own buffers, then children, which is what this produces).
  EMBER_LIB_INLINE StateDict state_dict() const;
  // Copies values into the existing tensors (same shapes; dtype and device are converted).
  // Strict: a missing, unexpected or mis-shaped entry is an error that names it.
  EMBER_LIB_INLINE void load_state_dict(const StateDict& sd, bool strict = true);

  // ---- files (io/safetensors.hpp) ----
  // Writes state_dict() to a safetensors file, atomically. PyTorch reads it with
  // model.load_state_dict(safetensors.torch.load_file(path)). Tied parameters (one storage under
  // two names) are refused, as safetensors refuses them.
  EMBER_LIB_INLINE void save(const std::string& path, const io::Metadata& metadata = {}) const;
  struct LoadResult {
    std::vector<std::string> missing_keys, unexpected_keys;
  };
  // Loads a safetensors file (from ember, or from PyTorch's safetensors.torch.save_file) into the
  // existing tensors as load_state_dict(strict) does; returns the names the file lacked and the
  // names it had in excess (both empty after a strict load).
  EMBER_LIB_INLINE LoadResult load(const std::string& path, bool strict = true);

 protected:
  // Calls f(tensor, is_parameter) on every parameter and buffer slot of this module tree.
  EMBER_LIB_INLINE void for_each_tensor(const std::function<void(AnyTensor&, bool)>& f);

 private:
  EMBER_LIB_INLINE void check_new_name(const std::string& name) const;
  EMBER_LIB_INLINE void register_child(const std::string& name, std::shared_ptr<Module> module);
  EMBER_LIB_INLINE void collect(std::vector<std::pair<std::string, AnyTensor>>& out, const std::string& prefix,
                                bool recurse, bool buffers) const;
  EMBER_LIB_INLINE void state_into(StateDict& out, const std::string& prefix) const;
  // Points the existing TensorImpl at new storage, so every handle to it follows.
  EMBER_LIB_INLINE static void move_in_place(AnyTensor& t, const AnyTensor& moved);
  EMBER_LIB_INLINE void collect_modules(std::vector<std::pair<std::string, Module*>>& out, const std::string& prefix);

  std::vector<std::pair<std::string, AnyTensor>> params_;
  std::vector<std::pair<std::string, AnyTensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::string module_name_;
  bool training_ = true;
  std::shared_ptr<ForwardHook> forward_hook_;
  bool in_forward_hook_ = false;
};

// The module tree, as PyTorch prints a module: each child as "(name): Type(extra_repr)", with
// parameter shapes and, per module, its parameter count.
//   Sequential(  # 650 parameters
//     (0): Linear(weight=[10, 64], bias=[10])  # 650 parameters
//     (1): ReLU()
//   )
EMBER_LIB_INLINE std::ostream& operator<<(std::ostream& os, const Module& m);

namespace detail {
// The profiler's hook into module calls: the profiler builds dotted names ("layers.3.attn") from
// the nesting of these scopes; a scope of the module already innermost is the same call.
class ModuleScope : trace::ListenerScope {
 public:
  explicit ModuleScope(const Module& m) : module_(&m) {
    if (listener_) [[unlikely]] listener_->module_begin(module_, m.module_name(), m.type_name());
  }
  ~ModuleScope() {
    if (listener_) [[unlikely]] listener_->module_end(module_);
  }

 private:
  const Module* module_;
};
}  // namespace detail

// CRTP base that gives a module with `template <class T> Tensor<T> forward(const Tensor<T>&)`
// an untyped forward (for containers) and operator().
template <class Derived>
class ModuleBase : public Module {
 public:
  AnyTensor forward_any(const AnyTensor& x) override;
  template <Element T>
  auto operator()(const Tensor<T>& x) {
    autograd::detail::AnomalyModuleFrame anomaly_frame(*this);
    detail::ModuleScope scope(*this);
    return with_forward_hook([&] { return self().forward(x); });
  }

 protected:
  // Integer inputs (token ids for Embedding): a module that takes them overrides this.
  virtual AnyTensor forward_other(const AnyTensor& x) {
    throw DTypeError(::ember::detail::str_cat(type_name(), ": floating-point input expected, got ", x.desc()));
  }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
};

template <class Derived>
AnyTensor ModuleBase<Derived>::forward_any(const AnyTensor& x) {
  autograd::detail::AnomalyModuleFrame anomaly_frame(*this);  // the module path in anomaly errors
  detail::ModuleScope scope(*this);
  return with_forward_hook([&]() -> AnyTensor {
    switch (x.dtype()) {
      case DType::Float32: return self().forward(Tensor<float>(x));
      case DType::Float64: return self().forward(Tensor<double>(x));
      case DType::Float16: return self().forward(Tensor<half>(x));
      case DType::BFloat16: return self().forward(Tensor<bfloat16>(x));
      default:
        return forward_other(x);
    }
  });
}

// A parameter as the activation type T: the same tensor when the types agree, else a
// differentiable cast (so gradients reach the fp32 master weight). Inside an amp::CastCacheGuard
// the cast of a parameter is made once and reused (amp/autocast.hpp).
template <Element T>
Tensor<T> param_as(const AnyTensor& p) {
  return Tensor<T>(p.dtype() == dtype_of<T> ? p : amp::cast_parameter(p, dtype_of<T>));
}

}  // namespace ember::nn

#if !defined(EMBER_COMPILED_LIB)
#include "ember/nn/detail/module_impl.hpp"
#endif
