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

// Sets a thread-local flag for a scope and restores its previous value on destruction, also during
// unwinding: what every guard of such a flag does.
class ScopedFlag {
 public:
  ScopedFlag(bool& flag, bool value) : flag_(flag), previous_(flag) { flag = value; }
  ~ScopedFlag() { flag_ = previous_; }
  ScopedFlag(const ScopedFlag&) = delete;
  ScopedFlag& operator=(const ScopedFlag&) = delete;

 private:
  bool& flag_;
  bool previous_;
};
}  // namespace detail

// Inference mode is on for this thread (an InferenceModeGuard(true) is the innermost one alive).
inline bool is_inference_mode_enabled() { return detail::inference_mode_flag(); }

// Whether ops record on the tape now: grad mode on and inference mode off. Every place that
// records or saves for backward asks this (autograd::record, the weight cast cache, nn::recompute).
inline bool is_grad_enabled() { return detail::grad_enabled_flag() && !detail::inference_mode_flag(); }

// While alive, ops record nothing (inference, optimizer updates, backward functions).
class NoGradGuard : detail::ScopedFlag {
 public:
  NoGradGuard() : ScopedFlag(detail::grad_enabled_flag(), false) {}
};

// Sets grad mode to a given value for a scope (EnableGradGuard(true) inside a NoGradGuard).
// Inside an InferenceModeGuard it changes the grad-mode flag but records nothing until the
// inference scope ends.
class GradModeGuard : detail::ScopedFlag {
 public:
  explicit GradModeGuard(bool enabled) : ScopedFlag(detail::grad_enabled_flag(), enabled) {}
};

// torch.inference_mode: while alive, no op records a graph node, so no output has a grad_fn and
// no tensor is kept for a backward pass; the memory of a forward is its outputs alone. Unlike
// NoGradGuard, code inside cannot switch recording back on with a GradModeGuard(true) (a
// library's callback, nn::recompute's recomputation): is_grad_enabled() stays false for the
// whole scope. InferenceModeGuard(false) inside one turns inference mode off for its own scope,
// as torch.inference_mode(False) does. Per thread; nests; restores the previous state on
// destruction, also during unwinding. Tensors made inside are ordinary tensors (ember has no
// separate "inference tensor" kind): they may be used with autograd after the scope, as leaves.
class InferenceModeGuard : detail::ScopedFlag {
 public:
  explicit InferenceModeGuard(bool enabled = true) : ScopedFlag(detail::inference_mode_flag(), enabled) {}
};

}  // namespace ember
