#pragma once
// What a profiling session reports: its options, the finished events, the per-name averages
// (KeyAverages and its table), the step records with their memory per device, the counters for
// the trace. profile::Profiler (ember/profile/profiler.hpp) fills them in; this header holds the
// data and its text, nothing that records.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ember/core/device.hpp"
#include "ember/core/trace.hpp"

namespace ember::profile {

struct ProfilerOptions {
  bool record_shapes = true;     // input shapes of each op (key_averages(group_by_input_shapes))
  bool profile_memory = true;    // memory readings at op ends, phases and steps
  bool external_ranges = true;   // NVTX ranges for Nsight Systems when the CUDA backend is linked
  std::string trace_path;        // written by stop() (also when a ProfileScope unwinds) when set
  int window = 10;               // steps averaged by step_report() (the first step is left out
                                 // as warm-up when there are more, unless first_step_is_warmup
                                 // is false)
  bool first_step_is_warmup = true;  // false: the session starts after the caller's own warm-up
                                     // (the Trainer's profile window), so its first step counts
};

enum class EventKind : uint8_t { Op, BackwardOp, Module, Range, Phase, Step, Async };

inline const char* event_kind_name(EventKind k) {
  switch (k) {
    case EventKind::Op: return "op";
    case EventKind::BackwardOp: return "backward";
    case EventKind::Module: return "module";
    case EventKind::Range: return "range";
    case EventKind::Phase: return "phase";
    case EventKind::Step: return "step";
    case EventKind::Async: return "async";
  }
  return "unknown";
}

// A finished scope. Times in nanoseconds since the session started.
struct Event {
  EventKind kind = EventKind::Op;
  std::string name;
  std::string shapes;       // ops: "[[64, 784], [10, 784]]" when record_shapes
  std::string dtypes;       // ops: "[float32, float32]" when record_shapes (the same inputs)
  int thread = 0;           // index into Profiler::thread_names()
  int depth = 0;            // nesting on its thread (phases included)
  int64_t begin_ns = 0, end_ns = 0;
  int64_t self_ns = 0;      // minus the time in nested ops, modules and ranges
  int64_t peak_bytes = -1;  // largest memory reading while open (on `device`); -1: none
  int64_t device_ns = -1;   // time on the GPU (CUDA events); -1: none
  int64_t device_begin_ns = -1;  // where it ran on the device's timeline (same origin); -1: none
  Device device;
  bool unfinished = false;  // still open when the session stopped (an exception, a thread)
  int64_t duration_ns() const { return end_ns - begin_ns; }
};

// Memory per device over one step.
struct DeviceMemory {
  Device device;
  int64_t peak_bytes = -1;                                // largest reading in the step
  int64_t end_bytes = -1;                                 // current at the end of the step
  int64_t capacity_bytes = -1;                            // memory limit, else device size; -1: unknown
  std::array<int64_t, trace::kNumPhases + 1> phase_peak;  // per phase; last: outside every phase
  DeviceMemory() { phase_peak.fill(-1); }
};

struct StepRecord {
  int64_t index = 0;
  int64_t begin_ns = 0, end_ns = 0;
  std::array<int64_t, trace::kNumPhases> phase_ns{};  // exclusive
  int64_t rest_ns = 0;
  int64_t communication_total_ns = 0;
  int64_t device_ns = -1;  // GPU time of the step's ops (CUDA events); -1: none
  int64_t samples = 0;
  std::vector<DeviceMemory> memory;
  int64_t duration_ns() const { return end_ns - begin_ns; }
};

// One row of key_averages().
struct KeyAverage {
  EventKind kind = EventKind::Op;
  std::string name;
  std::string shapes;  // when grouped by input shapes
  int64_t calls = 0;
  int64_t self_ns = 0, total_ns = 0;
  int64_t device_ns = -1;
  int64_t peak_bytes = -1;
  double avg_ns() const { return calls ? static_cast<double>(total_ns) / static_cast<double>(calls) : 0.0; }
};

enum class SortBy { SelfHost, TotalHost, Calls, Device, PeakMemory, Name };

class KeyAverages {
 public:
  KeyAverages() = default;
  explicit KeyAverages(std::vector<KeyAverage> rows) : rows_(std::move(rows)) {}
  const std::vector<KeyAverage>& rows() const { return rows_; }
  size_t size() const { return rows_.size(); }
  const KeyAverage* find(std::string_view name, std::string_view shapes = {}) const {
    for (const auto& r : rows_)
      if (r.name == name && (shapes.empty() || r.shapes == shapes)) return &r;
    return nullptr;
  }
  KeyAverages& sort(SortBy by) {
    auto key = [by](const KeyAverage& r) -> double {
      switch (by) {
        case SortBy::SelfHost: return static_cast<double>(r.self_ns);
        case SortBy::TotalHost: return static_cast<double>(r.total_ns);
        case SortBy::Calls: return static_cast<double>(r.calls);
        case SortBy::Device: return static_cast<double>(r.device_ns);
        case SortBy::PeakMemory: return static_cast<double>(r.peak_bytes);
        case SortBy::Name: return 0.0;
      }
      return 0.0;
    };
    std::stable_sort(rows_.begin(), rows_.end(), [&](const KeyAverage& a, const KeyAverage& b) {
      if (by == SortBy::Name) return a.name < b.name;
      return key(a) > key(b);
    });
    return *this;
  }
  // A PyTorch-like table: name, kind, calls, self and total host time, self share, average,
  // device time, peak memory. `row_limit` <= 0: every row.
  std::string table(SortBy by = SortBy::SelfHost, int row_limit = 25) const {
    KeyAverages sorted = *this;
    sorted.sort(by);
    int64_t self_sum = 0;
    for (const auto& r : rows_) self_sum += r.self_ns;
    bool shapes = false, device = false;
    for (const auto& r : rows_) {
      shapes = shapes || !r.shapes.empty();
      device = device || r.device_ns >= 0;
    }
    size_t name_w = 4;
    for (const auto& r : sorted.rows_) name_w = std::max(name_w, std::min<size_t>(r.name.size(), 48));
    std::string out;
    char buf[512];
    auto line = [&] { out += std::string(name_w + (shapes ? 30 : 0) + 96, '-') + "\n"; };
    std::snprintf(buf, sizeof buf, "%-*s  %-8s %7s %11s %7s %11s %11s %11s %11s", static_cast<int>(name_w), "Name",
                  "Kind", "Calls", "Self host", "Self %", "Total host", "Avg host", "Device", "Peak mem");
    line();
    out += buf;
    if (shapes) out += "  Input shapes";
    out += "\n";
    line();
    int n = 0;
    for (const auto& r : sorted.rows_) {
      if (row_limit > 0 && n++ >= row_limit) break;
      std::string name = r.name.size() > 48 ? r.name.substr(0, 45) + "..." : r.name;
      std::snprintf(buf, sizeof buf, "%-*s  %-8s %7lld %11s %6.1f%% %11s %11s %11s %11s", static_cast<int>(name_w),
                    name.c_str(), event_kind_name(r.kind), static_cast<long long>(r.calls), time_text(r.self_ns).c_str(),
                    self_sum > 0 ? 100.0 * static_cast<double>(r.self_ns) / static_cast<double>(self_sum) : 0.0,
                    time_text(r.total_ns).c_str(), time_text(static_cast<int64_t>(r.avg_ns())).c_str(),
                    r.device_ns >= 0 ? time_text(r.device_ns).c_str() : "-",
                    r.peak_bytes >= 0 ? bytes_text(r.peak_bytes).c_str() : "-");
      out += buf;
      if (shapes) out += "  " + r.shapes;
      out += "\n";
    }
    line();
    out += "Self host total: " + time_text(self_sum) + (device ? "" : "; no device times (CPU run)") + "\n";
    return out;
  }

  static std::string time_text(int64_t ns) {
    char buf[32];
    const double v = static_cast<double>(ns);
    if (ns < 10'000) std::snprintf(buf, sizeof buf, "%.2fus", v / 1e3);
    else if (ns < 10'000'000) std::snprintf(buf, sizeof buf, "%.3fms", v / 1e6);
    else std::snprintf(buf, sizeof buf, "%.1fms", v / 1e6);
    return buf;
  }
  static std::string bytes_text(int64_t b) {
    char buf[32];
    const double v = static_cast<double>(b);
    if (b < 1024) std::snprintf(buf, sizeof buf, "%lldB", static_cast<long long>(b));
    else if (b < (int64_t{1} << 20)) std::snprintf(buf, sizeof buf, "%.1fKiB", v / 1024.0);
    else if (b < (int64_t{1} << 30)) std::snprintf(buf, sizeof buf, "%.1fMiB", v / (1024.0 * 1024.0));
    else std::snprintf(buf, sizeof buf, "%.2fGiB", v / (1024.0 * 1024.0 * 1024.0));
    return buf;
  }

 private:
  std::vector<KeyAverage> rows_;
};

// A counter sample for the trace (memory per device, utilisation from the device monitor).
struct CounterSample {
  std::string name;  // "memory cpu", "gpu0 utilization"
  int64_t ts_ns = 0;
  double value = 0;
};

// Device figures the step report and verdict use, from profile::DeviceMonitor (or a test).
struct DeviceUtilisation {
  double busy_fraction = -1;    // GPU utilisation over the window, 0..1; -1: unknown
  int64_t total_bytes = -1;     // the device's memory size; -1: unknown
};

}  // namespace ember::profile
