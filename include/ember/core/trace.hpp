#pragma once
// Trace hooks: how every layer (data loading, ops, modules, optimizers, data parallel,
// checkpoints) reports to the profiler without including it (DESIGN.md: a lower layer never
// includes a higher one; where it must report up, it calls a hook that the lower layer owns).
//
// profile::Profiler installs a Listener while it records; with none installed each scope costs
// one relaxed atomic load and one predictable branch.
//
//   { trace::PhaseScope phase(trace::Phase::DataWait); batch = queue.pop(); }
//   { trace::RangeScope range("my_block"); ... }
#include <atomic>
#include <cstdint>

namespace ember::trace {

// The parts of a training step that the step report breaks time into.
enum class Phase : uint8_t {
  DataWait,        // the training thread waits for the next batch
  HostToDevice,    // uploads of batches (and other host-to-device copies the caller marks)
  Forward,
  Backward,
  Optimizer,       // optimizer step (and the GradScaler's unscale/update)
  Communication,   // collectives (data parallel all-reduces), measured where they are waited on
  CheckpointSave,  // the training thread's part of a checkpoint save
};
inline constexpr int kNumPhases = 7;

inline const char* phase_name(Phase p) {
  switch (p) {
    case Phase::DataWait: return "data_wait";
    case Phase::HostToDevice: return "host_to_device";
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::Optimizer: return "optimizer";
    case Phase::Communication: return "communication";
    case Phase::CheckpointSave: return "checkpoint_save";
  }
  return "unknown";
}

// What a profiler implements. Called on the thread that runs the scope; implementations must be
// thread-safe. Names are string literals or strings that outlive the call only: copy them.
class Listener {
 public:
  virtual ~Listener() = default;
  virtual void phase_begin(Phase phase) = 0;
  virtual void phase_end(Phase phase) = 0;
  virtual void range_begin(const char* name) = 0;
  virtual void range_end(const char* name) = 0;
};

inline std::atomic<Listener*>& listener_slot() {
  static std::atomic<Listener*> slot{nullptr};
  return slot;
}
inline Listener* active_listener() { return listener_slot().load(std::memory_order_acquire); }

class PhaseScope {
 public:
  explicit PhaseScope(Phase phase) : phase_(phase), listener_(active_listener()) {
    if (listener_) [[unlikely]] listener_->phase_begin(phase_);
  }
  ~PhaseScope() {
    if (listener_) [[unlikely]] listener_->phase_end(phase_);
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Phase phase_;
  Listener* listener_;
};

class RangeScope {
 public:
  explicit RangeScope(const char* name) : name_(name), listener_(active_listener()) {
    if (listener_) [[unlikely]] listener_->range_begin(name_);
  }
  ~RangeScope() {
    if (listener_) [[unlikely]] listener_->range_end(name_);
  }
  RangeScope(const RangeScope&) = delete;
  RangeScope& operator=(const RangeScope&) = delete;

 private:
  const char* name_;
  Listener* listener_;
};

}  // namespace ember::trace
