#pragma once
// Thread-local switch for recording the autograd tape, and the RAII guard that turns it off.

namespace ember {

namespace detail {
inline bool& grad_enabled_flag() {
  thread_local bool enabled = true;
  return enabled;
}
}  // namespace detail

inline bool is_grad_enabled() { return detail::grad_enabled_flag(); }

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

}  // namespace ember
