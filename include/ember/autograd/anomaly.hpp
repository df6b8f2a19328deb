#pragma once
// Anomaly detection (as torch.autograd.detect_anomaly): while an `autograd::detect_anomaly`
// guard is alive on a thread, every op recorded on the tape has its outputs checked for NaN in
// forward, and every node's gradients are checked for NaN and infinity in backward. The first
// offender raises an AutogradError that names the op, the module path it ran in (when it ran
// inside a module's forward) and, in backward, the forward op that created the node:
//
//   { autograd::detect_anomaly anomaly;  loss = model(x); loss.backward(); }
//   -> detect_anomaly: the backward of 'log' returned nan values in its 0th output (the gradient
//      of input 0, float32[4] on cpu); the node was created in forward by op 'log' in module
//      'encoder.act' (ReLU)
//
// Off (the default) it costs one thread-local branch per recorded op, node and module call. On,
// each check reads a flag back from the device (a synchronisation per op): a debugging tool.
// Forward outputs are checked for NaN only (an infinity is often intended: an attention mask,
// log(0)); pass `true` to the guard to reject infinities in forward as well. Ops that record
// nothing (no input requires grad, or under NoGradGuard) are not checked.
//
// Like grad mode, the switch is per thread: a guard on one thread does not affect another.
#include <string>
#include <utility>
#include <vector>

namespace ember::autograd {

namespace detail {
struct AnomalyState {
  bool enabled = false;
  bool forward_inf = false;
  // The module calls open on this thread: (module identity, "local name", "type name").
  struct Frame {
    const void* module;
    std::string local_name;
    std::string type_name;
  };
  std::vector<Frame> modules;
};
inline AnomalyState& anomaly_state() {
  thread_local AnomalyState s;
  return s;
}

// " in module 'encoder.layers.0.act' (ReLU)" for the innermost open module call, "" outside
// modules; the root module is '<root>'.
inline std::string current_module_where() {
  const auto& frames = anomaly_state().modules;
  if (frames.empty()) return "";
  std::string path;
  for (const auto& f : frames) {
    if (f.local_name.empty()) continue;  // the root has no name of its own
    if (!path.empty()) path += '.';
    path += f.local_name;
  }
  if (path.empty()) path = "<root>";
  return " in module '" + path + "' (" + frames.back().type_name + ")";
}

// Pushed by every module call (nn::ModuleBase) so that anomaly errors can say where they were;
// does nothing while anomaly detection is off. Duck-typed on module_name() and type_name() so
// that this layer needs nothing from nn/.
class AnomalyModuleFrame {
 public:
  template <class M>
  explicit AnomalyModuleFrame(const M& m) {
    AnomalyState& s = anomaly_state();
    if (!s.enabled) [[likely]] return;
    if (!s.modules.empty() && s.modules.back().module == &m) return;  // the same call, one level in
    s.modules.push_back({&m, m.module_name(), m.type_name()});
    pushed_ = true;
  }
  ~AnomalyModuleFrame() {
    if (pushed_) anomaly_state().modules.pop_back();
  }
  AnomalyModuleFrame(const AnomalyModuleFrame&) = delete;
  AnomalyModuleFrame& operator=(const AnomalyModuleFrame&) = delete;

 private:
  bool pushed_ = false;
};
}  // namespace detail

inline bool is_anomaly_enabled() { return detail::anomaly_state().enabled; }

// The scope guard. Nests; restores the previous setting on destruction.
class detect_anomaly {
 public:
  explicit detect_anomaly(bool check_inf_in_forward = false)
      : previous_(detail::anomaly_state().enabled), previous_inf_(detail::anomaly_state().forward_inf) {
    detail::anomaly_state().enabled = true;
    detail::anomaly_state().forward_inf = check_inf_in_forward;
  }
  ~detect_anomaly() {
    detail::anomaly_state().enabled = previous_;
    detail::anomaly_state().forward_inf = previous_inf_;
  }
  detect_anomaly(const detect_anomaly&) = delete;
  detect_anomaly& operator=(const detect_anomaly&) = delete;

 private:
  bool previous_, previous_inf_;
};

}  // namespace ember::autograd
