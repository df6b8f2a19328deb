#pragma once
// The bottleneck verdict: rules over a step's figures (profile::StepFigures, what step_report()
// averages over its window, with the device monitor's utilisation where there is one), each rule
// naming the ember feature that removes the bottleneck it finds. A pure function, so that the
// rules are tested on synthetic figures (tests/test_profiler.cpp) as well as shown on real runs.
//
// The rules (thresholds in VerdictThresholds):
//   data-bound            waiting for data > 10% of the step
//   host/launch-bound     device busy < 50% of the step while the data wait is <= 10%
//   memory headroom       peak memory < 50% of the device's capacity
//   at the memory limit   peak memory >= 90% of the device's capacity
//   communication-bound   exposed (not hidden behind backward) all-reduce > 10% of the step
// A figure that is unknown (negative) fires no rule: no device utilisation on a CPU run without a
// monitor, no capacity where neither a memory limit nor the device's size is known.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace ember::profile {

// One step's breakdown (or the average of a window of steps). Times in milliseconds; the phases
// are exclusive (time in a phase nested in another counts for the inner one only), so they and
// rest_ms add up to step_ms.
struct StepFigures {
  double step_ms = 0;
  double data_wait_ms = 0;
  double host_to_device_ms = 0;
  double forward_ms = 0;
  double backward_ms = 0;
  double optimizer_ms = 0;
  double communication_exposed_ms = 0;  // the training thread waiting for collectives
  double checkpoint_save_ms = 0;
  double rest_ms = 0;                   // in no phase (the loop's own code, logging, ...)
  double communication_total_ms = 0;    // collectives from launch to completion, hidden or not
  double samples_per_second = -1;       // -1: no sample counts were given to step()
  double device_busy = -1;              // fraction of the step the device computed; -1: unknown
  int64_t peak_bytes = -1;              // peak memory on the step's device; -1: unknown
  int64_t capacity_bytes = -1;          // that device's capacity (memory limit or size); -1: unknown
  std::string device = "cpu";
};

enum class VerdictKind { DataBound, HostBound, MemoryHeadroom, MemoryLimit, CommunicationBound, NoBottleneck };

inline const char* verdict_kind_name(VerdictKind k) {
  switch (k) {
    case VerdictKind::DataBound: return "data-bound";
    case VerdictKind::HostBound: return "host/launch-bound";
    case VerdictKind::MemoryHeadroom: return "memory headroom";
    case VerdictKind::MemoryLimit: return "at the memory limit";
    case VerdictKind::CommunicationBound: return "communication-bound";
    case VerdictKind::NoBottleneck: return "no bottleneck found";
  }
  return "unknown";
}

struct Verdict {
  VerdictKind kind;
  std::string message;  // the figures that fired the rule and the feature to use
};

struct VerdictThresholds {
  double data_wait_fraction = 0.10;
  double device_busy_fraction = 0.50;
  double headroom_fraction = 0.50;
  double limit_fraction = 0.90;
  double communication_fraction = 0.10;
};

namespace detail {
inline std::string percent(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * f);
  return buf;
}
inline std::string mib(int64_t bytes) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}
}  // namespace detail

// The rules that fire, in the order above; one NoBottleneck line when none does (or the step
// took no time).
inline std::vector<Verdict> verdict(const StepFigures& f, const VerdictThresholds& t = {}) {
  std::vector<Verdict> out;
  if (f.step_ms > 0) {
    const double data = f.data_wait_ms / f.step_ms;
    const double comm = f.communication_exposed_ms / f.step_ms;
    if (data > t.data_wait_fraction)
      out.push_back({VerdictKind::DataBound,
                     "data-bound: waiting for data " + detail::percent(data) + " of the step (over " +
                         detail::percent(t.data_wait_fraction) +
                         "): use more DataLoader workers, a packed dataset (no per-sample decoding), or "
                         "preprocess on the GPU"});
    if (f.device_busy >= 0 && f.device_busy < t.device_busy_fraction && data <= t.data_wait_fraction)
      out.push_back({VerdictKind::HostBound,
                     "host/launch-bound: " + f.device + " busy " + detail::percent(f.device_busy) +
                         " of the step (under " + detail::percent(t.device_busy_fraction) +
                         ") with little data wait: use a larger batch (train::find_max_batch_size) or fused ops "
                         "(fewer, larger kernels per step)"});
    if (comm > t.communication_fraction)
      out.push_back({VerdictKind::CommunicationBound,
                     "communication-bound: exposed all-reduce " + detail::percent(comm) + " of the step (over " +
                         detail::percent(t.communication_fraction) +
                         "): use DataParallelOptions::gradient_as_bucket_view, larger buckets "
                         "(bucket_cap_bytes), or accumulate over several batches with no_sync()"});
  }
  if (f.peak_bytes >= 0 && f.capacity_bytes > 0) {
    const double used = static_cast<double>(f.peak_bytes) / static_cast<double>(f.capacity_bytes);
    if (used < t.headroom_fraction)
      out.push_back({VerdictKind::MemoryHeadroom,
                     "memory headroom: peak " + detail::mib(f.peak_bytes) + " is " + detail::percent(used) + " of " +
                         f.device + "'s " + detail::mib(f.capacity_bytes) +
                         ": a larger batch fits (train::find_max_batch_size finds the largest)"});
    else if (used >= t.limit_fraction)
      out.push_back({VerdictKind::MemoryLimit,
                     "at the memory limit: peak " + detail::mib(f.peak_bytes) + " is " + detail::percent(used) + " of " +
                         f.device + "'s " + detail::mib(f.capacity_bytes) +
                         ": use mixed precision (amp, model(x.to<half>())) or recompute activations "
                         "(nn::recompute)"});
  }
  if (out.empty()) out.push_back({VerdictKind::NoBottleneck, "no bottleneck rule fired"});
  return out;
}

}  // namespace ember::profile
