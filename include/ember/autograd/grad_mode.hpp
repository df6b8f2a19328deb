#pragma once
// Thread-local switches for recording the autograd tape: grad mode (NoGradGuard, GradModeGuard)
// and inference mode (InferenceModeGuard), which no grad-mode guard inside it can turn back on.

namespace ember {

namespace detail {
inline bool& grad_enabled_flag() {
  thread_local bool enabled = true;
  return enabled;
}
inline bool& inference_mode_flag() {
  thread_local bool enabled = false;
  return enabled;
}
}  // namespace detail

// Inference mode is on for this thread (an InferenceModeGuard(true) is the innermost one alive).
inline bool is_inference_mode_enabled() { return detail::inference_mode_flag(); }

// Whether ops record on the tape now: grad mode on and inference mode off. Every place that
// records or saves for backward asks this (autograd::record, the weight cast cache, nn::recompute).
inline bool is_grad_enabled() { return detail::grad_enabled_flag() && !detail::inference_mode_flag(); }

// While alive, ops record nothing (inference, optimizer updates, backward functions).
class NoGradGuard {
 public:
  NoGradGuard() : previous_(detail::grad_enabled_flag()) { detail::grad_enabled_flag() = false; }
  ~NoGradGuard() { detail::grad_enabled_flag() = previous_; }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Sets grad mode to a given value for a scope (EnableGradGuard(true) inside a NoGradGuard).
// Inside an InferenceModeGuard it changes the grad-mode flag but records nothing until the
// inference scope ends.
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled) : previous_(detail::grad_enabled_flag()) {
    detail::grad_enabled_flag() = enabled;
  }
  ~GradModeGuard() { detail::grad_enabled_flag() = previous_; }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool previous_;
};

// torch.inference_mode: while alive, no op records a graph node, so no output has a grad_fn and
// no tensor is kept for a backward pass; the memory of a forward is its outputs alone. Unlike
// NoGradGuard, code inside cannot switch recording back on with a GradModeGuard(true) (a
// library's callback, nn::recompute's recomputation): is_grad_enabled() stays false for the
// whole scope. InferenceModeGuard(false) inside one turns inference mode off for its own scope,
// as torch.inference_mode(False) does. Per thread; nests; restores the previous state on
// destruction, also during unwinding. Tensors made inside are ordinary tensors (ember has no
// separate "inference tensor" kind): they may be used with autograd after the scope, as leaves.
class InferenceModeGuard {
 public:
  explicit InferenceModeGuard(bool enabled = true) : previous_(detail::inference_mode_flag()) {
    detail::inference_mode_flag() = enabled;
  }
  ~InferenceModeGuard() { detail::inference_mode_flag() = previous_; }
  InferenceModeGuard(const InferenceModeGuard&) = delete;
  InferenceModeGuard& operator=(const InferenceModeGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace ember
