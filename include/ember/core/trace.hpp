#pragma once
// Trace hooks: how every layer (data loading, ops, modules, optimizers, data parallel,
// checkpoints) reports to the profiler without including it (a lower layer never
// includes a higher one; where it must report up, it calls a hook that the lower layer owns).
//
// profile::Profiler installs a Listener while it records; with none installed each scope costs
// one relaxed atomic load and one predictable branch.
//
//   { trace::PhaseScope phase(trace::Phase::DataWait); batch = queue.pop(); }
//   { trace::RangeScope range("my_block"); ... }
//
// Ops report through op::detail::OpScope (ops/detail/common.hpp), modules through
// nn::detail::ModuleScope (nn/module.hpp), asynchronous work measured elsewhere (a collective
// from launch to completion) through trace::interval(). All of them end in this Listener.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "ember/core/device.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/shape.hpp"

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

// One input of an op, as the profiler records it.
struct OpInput {
  DType dtype = DType::Float32;
  Device device;
  Shape shape;
};
inline constexpr int kMaxOpInputs = 4;  // inputs past the fourth are not recorded

// Monotonic nanoseconds (steady clock), the time base of every trace event.
inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// What a profiler implements. Called on the thread that runs the scope; implementations must be
// thread-safe. Names are string literals or strings that outlive the call only: copy them
// (op names passed to op_begin are string literals and may be kept by pointer).
// A Listener must outlive every scope that saw it installed (a scope keeps the pointer it found
// at construction): profile::Profiler installs one object that lives until the program exits.
class Listener {
 public:
  virtual ~Listener() = default;
  virtual void phase_begin(Phase phase) = 0;
  virtual void phase_end(Phase phase) = 0;
  virtual void range_begin(const char* name) = 0;
  virtual void range_end(const char* name) = 0;
  // An op: name (a string literal), its first inputs (n <= kMaxOpInputs).
  virtual void op_begin(const char* /*name*/, const OpInput* /*inputs*/, int /*n*/) {}
  virtual void op_end(const char* /*name*/) {}
  // A node of the autograd graph running its backward (the engine's loop), named by the node;
  // it ends with op_end(nullptr).
  virtual void backward_op_begin(const std::string& /*node_name*/, const OpInput* /*inputs*/, int /*n*/) {}
  // A module's forward. `module` identifies it (a nested scope of the same module is the same
  // call); local_name is its name in its parent ("" for a root), type_name its class.
  virtual void module_begin(const void* /*module*/, const std::string& /*local_name*/,
                            const std::string& /*type_name*/) {}
  virtual void module_end(const void* /*module*/) {}
  // Work that ran outside this thread's scopes, measured by its owner (times from now_ns()).
  virtual void interval(Phase /*phase*/, const char* /*name*/, int64_t /*begin_ns*/, int64_t /*end_ns*/) {}
};

inline std::atomic<Listener*>& listener_slot() {
  static std::atomic<Listener*> slot{nullptr};
  return slot;
}
inline Listener* active_listener() { return listener_slot().load(std::memory_order_acquire); }

inline void interval(Phase phase, const char* name, int64_t begin_ns, int64_t end_ns) {
  if (Listener* l = active_listener()) [[unlikely]] l->interval(phase, name, begin_ns, end_ns);
}

// Annotation ranges for an external tool (NVTX for Nsight Systems): the CUDA unit fills these in
// at start-up when it is linked; the profiler calls them around ops, modules and phases.
struct ExternalRanges {
  void (*push)(const char* name) = nullptr;
  void (*pop)() = nullptr;
};
inline ExternalRanges& external_ranges() {
  static ExternalRanges r;
  return r;
}

// The base of the scopes below (and of the op, module and range scopes above core): the listener
// installed when the scope began, null when none, so that the scope's end goes to the same
// listener as its beginning. Not copyable.
class ListenerScope {
 public:
  ListenerScope(const ListenerScope&) = delete;
  ListenerScope& operator=(const ListenerScope&) = delete;

 protected:
  ListenerScope() : listener_(active_listener()) {}
  ~ListenerScope() = default;
  Listener* const listener_;
};

// The op hook for the core's own tensor methods (clone, to, copy_; core cannot include ops/'
// op::detail::OpScope): one input, any handle with dtype(), device() and shape(). Off, it costs
// the same one load and one predictable branch as OpScope.
class OpCall : ListenerScope {
 public:
  template <class TensorLike>
  OpCall(const char* name, const TensorLike& input) {
    if (listener_) [[unlikely]] {
      OpInput in{input.dtype(), input.device(), input.shape()};
      begin(name, in);
    }
  }
  ~OpCall() {
    if (listener_) [[unlikely]] listener_->op_end(name_);
  }

 private:
  [[gnu::noinline]] void begin(const char* name, const OpInput& in) {
    name_ = name;
    listener_->op_begin(name, &in, 1);
  }
  const char* name_ = nullptr;
};

class PhaseScope : ListenerScope {
 public:
  explicit PhaseScope(Phase phase) : phase_(phase) {
    if (listener_) [[unlikely]] listener_->phase_begin(phase_);
  }
  ~PhaseScope() {
    if (listener_) [[unlikely]] listener_->phase_end(phase_);
  }

 private:
  Phase phase_;
};

class RangeScope : ListenerScope {
 public:
  explicit RangeScope(const char* name) : name_(name) {
    if (listener_) [[unlikely]] listener_->range_begin(name_);
  }
  ~RangeScope() {
    if (listener_) [[unlikely]] listener_->range_end(name_);
  }

 private:
  const char* name_;
};

}  // namespace ember::trace
