#pragma once
// nn::Module's non-template members (nn/module.hpp declares them), compiled once into the library
// under EMBER_COMPILED_LIB, included by the header otherwise.
#include <ostream>

#include "ember/nn/module.hpp"

namespace ember::nn {

EMBER_LIB_INLINE const AnyTensor* find_entry(const StateDict& sd, const std::string& name) {
  for (const auto& [k, v] : sd)
    if (k == name) return &v;
  return nullptr;
}

EMBER_LIB_INLINE AnyTensor Module::forward_any(const AnyTensor& x) {
  throw Error(::ember::detail::str_cat(type_name(), ": this module has no single-input forward"));
}

EMBER_LIB_INLINE AnyTensor Module::register_parameter(const std::string& name, AnyTensor value) {
  check_new_name(name);
  EMBER_CHECK(is_floating(value.dtype()), DTypeError, type_name(), ": parameter '", name,
              "' must be floating point, got ", value.desc());
  value.set_requires_grad(true);
  params_.emplace_back(name, value);
  return value;
}
EMBER_LIB_INLINE AnyTensor Module::register_buffer(const std::string& name, AnyTensor value) {
  check_new_name(name);
  buffers_.emplace_back(name, value);
  return value;
}

EMBER_LIB_INLINE std::vector<std::pair<std::string, AnyTensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, AnyTensor>> out;
  collect(out, "", recurse, /*buffers=*/false);
  return out;
}
EMBER_LIB_INLINE std::vector<std::pair<std::string, AnyTensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, AnyTensor>> out;
  collect(out, "", recurse, /*buffers=*/true);
  return out;
}
EMBER_LIB_INLINE std::vector<AnyTensor> Module::parameters(bool recurse) const {
  std::vector<AnyTensor> out;
  for (auto& [n, p] : named_parameters(recurse)) out.push_back(p);
  return out;
}

EMBER_LIB_INLINE std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  collect_modules(out, "");
  return out;
}

EMBER_LIB_INLINE int64_t Module::parameter_count() const {
  int64_t n = 0;
  for (auto& p : parameters()) n += p.numel();
  return n;
}

EMBER_LIB_INLINE std::string Module::extra_repr() const {
  std::string s;
  for (const auto& [n, p] : params_) s += (s.empty() ? "" : ", ") + n + "=" + p.shape().str();
  for (const auto& [n, b] : buffers_) s += (s.empty() ? "" : ", ") + n + "=" + b.shape().str() + " (buffer)";
  return s;
}

EMBER_LIB_INLINE void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

EMBER_LIB_INLINE void Module::zero_grad() {
  for (auto& p : parameters()) p.zero_grad();
}

EMBER_LIB_INLINE void Module::to(Device d) {
  for_each_tensor([&](AnyTensor& t, bool) { move_in_place(t, t.detach().to(d)); });
}
EMBER_LIB_INLINE void Module::to(DType dt) {
  EMBER_CHECK(is_floating(dt), DTypeError, type_name(), ".to: parameters must be floating point, got ",
              dtype_name(dt));
  for_each_tensor([&](AnyTensor& t, bool) {
    if (is_floating(t.dtype())) move_in_place(t, t.detach().to(dt));
  });
}

EMBER_LIB_INLINE StateDict Module::state_dict() const {
  StateDict out;
  state_into(out, "");
  return out;
}
EMBER_LIB_INLINE void Module::load_state_dict(const StateDict& sd, bool strict) {
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

EMBER_LIB_INLINE void Module::save(const std::string& path, const io::Metadata& metadata) const {
  io::save_file(path, state_dict(), metadata);
}

EMBER_LIB_INLINE Module::LoadResult Module::load(const std::string& path, bool strict) {
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

EMBER_LIB_INLINE void Module::for_each_tensor(const std::function<void(AnyTensor&, bool)>& f) {
  for (auto& [n, p] : params_) f(p, true);
  for (auto& [n, b] : buffers_) f(b, false);
  for (auto& [n, c] : children_) c->for_each_tensor(f);
}

EMBER_LIB_INLINE void Module::check_new_name(const std::string& name) const {
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
EMBER_LIB_INLINE void Module::register_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name);
  EMBER_CHECK(module != nullptr, ValueError, type_name(), ": submodule '", name, "' is null");
  module->module_name_ = name;  // what the profiler's dotted module names are made of
  children_.emplace_back(name, std::move(module));
}
EMBER_LIB_INLINE void Module::collect(std::vector<std::pair<std::string, AnyTensor>>& out, const std::string& prefix,
                                      bool recurse, bool buffers) const {
  for (auto& [n, t] : (buffers ? buffers_ : params_)) out.emplace_back(prefix + n, t);
  if (recurse)
    for (auto& [n, c] : children_) c->collect(out, prefix + n + ".", recurse, buffers);
}
EMBER_LIB_INLINE void Module::state_into(StateDict& out, const std::string& prefix) const {
  for (auto& [n, t] : params_) out.emplace_back(prefix + n, t);
  for (auto& [n, t] : buffers_) out.emplace_back(prefix + n, t);
  for (auto& [n, c] : children_) c->state_into(out, prefix + n + ".");
}
EMBER_LIB_INLINE void Module::move_in_place(AnyTensor& t, const AnyTensor& moved) {
  TensorImpl& dst = *t.impl();
  const TensorImpl& src = *moved.impl();
  dst.storage = src.storage;
  dst.offset = src.offset;
  dst.device = src.device;
  dst.dtype = src.dtype;
  dst.grad.reset();
  dst.grad_accumulator.reset();
}

EMBER_LIB_INLINE void Module::collect_modules(std::vector<std::pair<std::string, Module*>>& out,
                                              const std::string& prefix) {
  for (const auto& [n, m] : out)
    if (m == this) return;
  out.emplace_back(prefix, this);
  for (auto& [n, c] : children_) c->collect_modules(out, prefix.empty() ? n : prefix + "." + n);
}

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

EMBER_LIB_INLINE std::ostream& operator<<(std::ostream& os, const Module& m) {
  detail::print_module(os, m, 0);
  return os;
}

}  // namespace ember::nn
