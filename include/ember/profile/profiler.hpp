#pragma once
// profile::Profiler: op, module, range and phase times, memory per phase and per module, a
// Chrome trace, a table of averages and a step report with a bottleneck verdict
// (docs/profiling.md).
//
//   profile::Profiler prof({.trace_path = "trace.json"});
//   prof.start();
//   for (...) {
//     { profile::Range r("load"); ... }
//     auto loss = model(x) ...; loss.backward(); opt.step();
//     prof.step(batch_size);                 // marks the end of a training step
//   }
//   prof.stop();                             // writes the trace when trace_path is set
//   std::cout << prof.key_averages().table() << prof.step_report();
//
// How it hears about the program: the lower layers call hooks that core/trace.hpp owns (ops,
// module calls, phases, ranges, the autograd engine's nodes, DataParallel's all-reduces). While a
// session records, one Listener (a process-lifetime object) is installed; otherwise every hook
// costs one load and one predictable branch (benchmarks/bench_profiler.cpp measures both).
//
// Threads: every thread records into its own buffer (a mutex that only stop() and reports
// contend for); the step breakdown is kept for the thread that called start() (the training
// thread). Scopes that straddle start() or stop() are dropped, not mismatched. At most one session
// records at a time (start() while another records is an error).
//
// Memory: at the end of every op, at phase changes and at steps the profiler reads the device's
// MemoryStats. An open module, phase or range gets the largest current bytes seen while it was
// open; when the device's own peak rose since the previous reading the new peak counts instead,
// so a high-water mark reached inside an op is not missed.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ember/core/backend_registry.hpp"
#include "ember/core/trace.hpp"
#include "ember/io/atomic_file.hpp"
#include "ember/logging/json_text.hpp"
#include "ember/profile/verdict.hpp"

namespace ember::profile {

struct ProfilerOptions {
  bool record_shapes = true;     // input shapes of each op (key_averages(group_by_input_shapes))
  bool profile_memory = true;    // memory readings at op ends, phases and steps
  bool external_ranges = true;   // NVTX ranges for Nsight Systems when the CUDA backend is linked
  std::string trace_path;        // written by stop() (also when a ProfileScope unwinds) when set
  int window = 10;               // steps averaged by step_report() (the first step is left out
                                 // as warm-up when there are more)
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

namespace detail {

inline std::string shapes_text(const trace::OpInput* in, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) {
    if (i) s += ", ";
    s += in[i].shape.str();
  }
  return s + "]";
}

// The host's memory size, from /proc/meminfo (the CPU's capacity); -1 when unreadable.
inline int64_t host_memory_total() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = -1;
  while (f >> key) {
    if (key == "MemTotal:") {
      f >> kb;
      return kb > 0 ? kb * 1024 : -1;
    }
    f.ignore(1 << 10, '\n');
  }
  return -1;
}

// What a thread records: compact, no string is built per op (op names are literals kept by
// pointer, other names and input shapes are interned per thread and turned into text at stop()).
struct RawEvent {
  EventKind kind = EventKind::Op;
  bool unfinished = false;
  int32_t depth = 0;
  const char* literal = nullptr;  // the name, when a string literal (ops, phases)
  uint32_t name = 0;              // else an index into ThreadBuffer::strings
  uint32_t shapes = 0;            // 1 + index into ThreadBuffer::shape_sets; 0: none
  int64_t begin_ns = 0, end_ns = 0, self_ns = 0;
  int64_t peak_bytes = -1;
  int64_t device_ns = -1, device_begin_ns = -1;
  Device device;
};

struct Frame {
  EventKind kind = EventKind::Op;
  const char* literal = nullptr;
  uint32_t name = 0;
  uint32_t path = 0;        // modules: the dotted name, for the children's names
  uint32_t shapes = 0;
  int64_t begin_ns = 0;
  int64_t child_ns = 0;
  int64_t peak_bytes = -1;
  Device device;
  bool device_set = false;
  const void* module = nullptr;
  trace::Phase phase = trace::Phase::DataWait;
  bool auto_forward = false;  // a Forward phase begun by a top-level module call
  bool pushed_external = false;
  bool root = false;          // a root module (called outside every other, with no name of its own)
  bool marker = false;        // a repeated scope of the module already innermost: ends silently
  Backend* timed = nullptr;   // ops on a GPU (step thread): the backend of the timing events
  uint64_t ev_start = 0;
};

// An op's pair of timing events, read back at the end of the step.
struct PendingTiming {
  size_t event = 0;  // index into ThreadBuffer::events
  Backend* backend = nullptr;
  uint64_t start = 0, end = 0;
  bool top_level = true;  // no op around it: counts toward the step's device time
};
struct TimingReference {
  Backend* backend = nullptr;
  uint64_t event = 0;  // recorded at host time host_ns
  int64_t host_ns = 0;
};

struct RawCounter {
  uint32_t slot;  // device slot: "memory <device>"
  int64_t ts_ns;
  int64_t bytes;
};

// An interned set of input shapes and dtypes.
struct ShapeSet {
  int n = 0;
  std::array<Shape, trace::kMaxOpInputs> shapes;
  std::array<DType, trace::kMaxOpInputs> dtypes{};
  bool same(const trace::OpInput* in, int k) const {
    if (k != n) return false;
    for (int i = 0; i < k; ++i)
      if (!(shapes[static_cast<size_t>(i)] == in[i].shape) || dtypes[static_cast<size_t>(i)] != in[i].dtype) return false;
    return true;
  }
};

struct Session;

struct ThreadBuffer {
  std::mutex mutex;
  bool active = true;  // false once the session stopped: late scopes are dropped
  Session* session = nullptr;
  int index = 0;
  bool step_thread = false;
  std::vector<Frame> stack;
  std::deque<RawEvent> events;  // a deque: appending never moves what was recorded
  std::vector<RawCounter> counters;
  // Interned names (modules, ranges, backward nodes) and input shapes.
  std::vector<std::string> strings;
  std::map<std::string, uint32_t, std::less<>> string_ids;
  std::unordered_map<std::string, uint32_t> backward_ids;           // node name -> "<name>_backward"
  std::map<std::pair<const void*, uint32_t>, std::pair<uint32_t, uint32_t>> module_ids;  // (module, parent path) -> (display, path)
  std::vector<ShapeSet> shape_sets;
  std::unordered_map<uint64_t, std::vector<uint32_t>> shape_ids;    // hash -> candidates
  // Step accounting (the step thread only).
  std::vector<trace::Phase> phases;  // open phases, innermost last
  int64_t last_charge_ns = 0;
  std::vector<PendingTiming> timings;
  std::vector<TimingReference> references;  // one per GPU used in the step

  uint32_t intern(std::string_view s) {
    auto it = string_ids.find(s);
    if (it != string_ids.end()) return it->second;
    const auto id = static_cast<uint32_t>(strings.size());
    strings.emplace_back(s);
    string_ids.emplace(std::string(s), id);
    return id;
  }
  uint32_t intern_shapes(const trace::OpInput* in, int n) {
    // The trace hooks pass at most kMaxOpInputs; saying so here also lets GCC see the copies
    // below stay inside ShapeSet's arrays (it warned -Wstringop-overflow at -O3).
    n = std::clamp(n, 0, trace::kMaxOpInputs);
    uint64_t h = 1469598103934665603ULL ^ static_cast<uint64_t>(n);
    for (int i = 0; i < n; ++i) {
      h = (h ^ static_cast<uint64_t>(in[i].dtype)) * 1099511628211ULL;
      h = (h ^ static_cast<uint64_t>(in[i].shape.dim())) * 1099511628211ULL;
      for (int64_t d : in[i].shape) h = (h ^ static_cast<uint64_t>(d)) * 1099511628211ULL;
    }
    auto& ids = shape_ids[h];
    for (uint32_t id : ids)
      if (shape_sets[id].same(in, n)) return id + 1;
    ShapeSet set;
    set.n = n;
    for (int i = 0; i < n; ++i) {
      set.shapes[static_cast<size_t>(i)] = in[i].shape;
      set.dtypes[static_cast<size_t>(i)] = in[i].dtype;
    }
    shape_sets.push_back(set);
    ids.push_back(static_cast<uint32_t>(shape_sets.size() - 1));
    return static_cast<uint32_t>(shape_sets.size());
  }
  std::string shapes_string(uint32_t id) const {
    if (id == 0) return {};
    const ShapeSet& set = shape_sets[id - 1];
    trace::OpInput in[trace::kMaxOpInputs];
    for (int i = 0; i < set.n; ++i) in[i].shape = set.shapes[static_cast<size_t>(i)];
    return shapes_text(in, set.n);
  }
  std::string dtypes_string(uint32_t id) const {
    if (id == 0) return {};
    const ShapeSet& set = shape_sets[id - 1];
    std::string s = "[";
    for (int i = 0; i < set.n; ++i) {
      if (i) s += ", ";
      s += dtype_name(set.dtypes[static_cast<size_t>(i)]);
    }
    return s + "]";
  }
  const char* name_of(const Frame& f) const { return f.literal ? f.literal : strings[f.name].c_str(); }
};

struct Session {
  ProfilerOptions options;
  int64_t origin_ns = 0;
  std::vector<Device> devices;  // read at every memory reading
  int64_t host_total_bytes = -1;
  std::mutex mutex;             // threads, async, steps
  std::vector<std::shared_ptr<ThreadBuffer>> threads;
  std::vector<std::string> thread_names;
  std::vector<Event> async_events;
  std::vector<StepRecord> steps;
  StepRecord current;  // the step being recorded (step thread, under its buffer's mutex)
  std::atomic<int64_t> pending_comm_ns{0};
  std::unique_ptr<std::atomic<int64_t>[]> seen_peak;  // per device: its peak at the last reading
};

inline std::atomic<uint64_t>& session_generation() {
  static std::atomic<uint64_t> g{0};
  return g;
}
inline std::mutex& session_mutex() {
  static std::mutex m;
  return m;
}
inline std::shared_ptr<Session>& current_session() {
  static std::shared_ptr<Session> s;
  return s;
}

struct ThreadSlot {
  uint64_t generation = ~uint64_t{0};
  std::shared_ptr<ThreadBuffer> buffer;
};
inline ThreadSlot& thread_slot() {
  thread_local ThreadSlot slot;
  return slot;
}

// This thread's buffer in the recording session, or null.
inline ThreadBuffer* thread_buffer() {
  ThreadSlot& slot = thread_slot();
  const uint64_t g = session_generation().load(std::memory_order_acquire);
  if (slot.generation == g) [[likely]]
    return slot.buffer.get();
  std::lock_guard<std::mutex> lock(session_mutex());
  slot.generation = session_generation().load(std::memory_order_relaxed);
  slot.buffer.reset();
  std::shared_ptr<Session>& s = current_session();
  if (!s) return nullptr;
  auto buf = std::make_shared<ThreadBuffer>();
  buf->session = s.get();
  buf->stack.reserve(64);
  {
    std::lock_guard<std::mutex> l2(s->mutex);
    buf->index = static_cast<int>(s->threads.size());
    s->threads.push_back(buf);
    std::ostringstream name;
    name << "thread " << buf->index << " (" << std::this_thread::get_id() << ")";
    s->thread_names.push_back(name.str());
  }
  slot.buffer = buf;
  return buf.get();
}

// The Listener installed while a session records. One object for the life of the program, so a
// scope that found it installed may call it after stop().
class Recorder final : public trace::Listener {
 public:
  static Recorder& instance() {
    static Recorder* r = new Recorder();  // never destroyed: scopes may outlive static destruction
    return *r;
  }

  void phase_begin(trace::Phase p) override {
    with_buffer([&](ThreadBuffer& b, Session& s, int64_t now) { begin_phase(b, s, now, p, false); });
  }
  void phase_end(trace::Phase p) override {
    with_buffer([&](ThreadBuffer& b, Session& s, int64_t now) {
      if (b.stack.empty() || b.stack.back().kind != EventKind::Phase || b.stack.back().phase != p) return;
      end_frame(b, s, now);
    });
  }
  void range_begin(const char* name) override {
    with_buffer([&](ThreadBuffer& b, Session& s, int64_t now) {
      Frame& f = push(b, s, now, EventKind::Range);
      f.name = b.intern(name ? name : "(null)");
      external_push(s, f, b);
    });
  }
  void range_end(const char*) override { end_kind(EventKind::Range); }
  void op_begin(const char* name, const trace::OpInput* in, int n) override {
    with_buffer([&](ThreadBuffer& b, Session& s, int64_t now) {
      Frame& f = push(b, s, now, EventKind::Op);
      f.literal = name;
      begin_op(b, s, f, in, n, now);
    });
  }
  void backward_op_begin(const std::string& node_name, const trace::OpInput* in, int n) override {
    with_buffer([&](ThreadBuffer& b, Session& s, int64_t now) {
      auto it = b.backward_ids.find(node_name);
      if (it == b.backward_ids.end()) {
        // "mul" -> "mul_backward"; a node already named for its backward ("ReshapeBackward") stays.
        const bool named = node_name.size() >= 8 && (node_name.compare(node_name.size() - 8, 8, "Backward") == 0 ||
                                                     node_name.compare(node_name.size() - 8, 8, "backward") == 0);
        it = b.backward_ids.emplace(node_name, b.intern(named ? node_name : node_name + "_backward")).first;
      }
      Frame& f = push(b, s, now, EventKind::BackwardOp);
      f.name = it->second;
      begin_op(b, s, f, in, n, now);
    });
  }
  void op_end(const char*) override {
    with_buffer([&](ThreadBuffer& b, Session& s, int64_t now) {
      if (b.stack.empty()) return;
      const EventKind k = b.stack.back().kind;
      if (k != EventKind::Op && k != EventKind::BackwardOp) return;
      if (s.options.profile_memory) read_memory(b, s, b.stack.back().device_set ? b.stack.back().device : Device::cpu(), now);
      end_frame(b, s, now);
    });
  }
  void module_begin(const void* module, const std::string& local_name, const std::string& type_name) override {
    with_buffer([&](ThreadBuffer& b, Session& s, int64_t now) {
      const Frame* parent = nullptr;
      for (auto it = b.stack.rbegin(); it != b.stack.rend(); ++it)
        if (it->kind == EventKind::Module && !it->marker) {
          parent = &*it;
          break;
        }
      if (parent && parent->module == module) {  // the same call seen twice (operator() then forward)
        Frame& m = push(b, s, now, EventKind::Module);
        m.marker = true;
        m.module = module;
        return;
      }
      // A top-level module call outside every phase is the forward phase.
      if (!parent && b.phases.empty() && b.step_thread) begin_phase(b, s, now, trace::Phase::Forward, true);
      // Names, cached per (module, parent): a root is named by its class, its children from the
      // root down ("layers.3.attn", not "Model.layers.3.attn"), as named_parameters() names them.
      const bool root = parent == nullptr && local_name.empty();
      const uint32_t parent_key = parent ? (parent->root ? ~0u - 1 : parent->path) : ~0u;
      auto key = std::make_pair(module, parent_key);
      auto it = b.module_ids.find(key);
      if (it == b.module_ids.end()) {
        const std::string& local = local_name.empty() ? type_name : local_name;
        std::string path = (!parent || parent->root) ? local : b.strings[parent->path] + "." + local;
        const std::string display = path == type_name ? path : path + " (" + type_name + ")";
        const uint32_t path_id = b.intern(path);
        it = b.module_ids.emplace(key, std::make_pair(b.intern(display), path_id)).first;
      }
      Frame& f = push(b, s, now, EventKind::Module);
      f.name = it->second.first;
      f.path = it->second.second;
      f.module = module;
      f.root = root;
      external_push(s, f, b);
    });
  }
  void module_end(const void* module) override {
    with_buffer([&](ThreadBuffer& b, Session& s, int64_t now) {
      if (b.stack.empty() || b.stack.back().kind != EventKind::Module || b.stack.back().module != module) return;
      if (b.stack.back().marker) {
        b.stack.pop_back();
        return;
      }
      end_frame(b, s, now);
      if (!b.stack.empty() && b.stack.back().kind == EventKind::Phase && b.stack.back().auto_forward) end_frame(b, s, now);
    });
  }
  void interval(trace::Phase p, const char* name, int64_t begin_ns, int64_t end_ns) override {
    ThreadBuffer* b = thread_buffer();
    if (!b) return;
    std::lock_guard<std::mutex> lock(b->mutex);
    if (!b->active) return;
    Session& s = *b->session;
    Event e;
    e.kind = EventKind::Async;
    e.name = std::string(name) + " (" + trace::phase_name(p) + ")";
    e.begin_ns = begin_ns - s.origin_ns;
    e.end_ns = end_ns - s.origin_ns;
    e.self_ns = e.duration_ns();
    e.thread = b->index;
    // Only the step thread's collectives count toward the step's total: with thread ranks
    // (ThreadProcessGroup) every rank reports its own all-reduces, and adding the other ranks'
    // would count the same communication once per rank. Theirs stay in the trace.
    if (p == trace::Phase::Communication && b->step_thread) s.pending_comm_ns.fetch_add(end_ns - begin_ns);
    std::lock_guard<std::mutex> l2(s.mutex);
    s.async_events.push_back(std::move(e));
  }

  // Called by Profiler::step() on the step thread.
  void mark_step(int64_t samples) {
    with_buffer([&](ThreadBuffer& b, Session& s, int64_t now) {
      if (!b.step_thread) return;
      charge(b, s, now);
      if (s.options.profile_memory) read_all_memory(b, s, now);
      resolve_timings(b, s);
      close_step(b, s, now, samples);
    });
  }

 private:
  template <class F>
  void with_buffer(F&& f) {
    ThreadBuffer* b = thread_buffer();
    if (!b) return;
    std::lock_guard<std::mutex> lock(b->mutex);
    if (!b->active) return;
    f(*b, *b->session, trace::now_ns());
  }

  static Frame& push(ThreadBuffer& b, Session&, int64_t now, EventKind kind) {
    b.stack.emplace_back();
    Frame& f = b.stack.back();
    f.kind = kind;
    f.begin_ns = now;
    return f;
  }
  static void external_push(Session& s, Frame& f, const ThreadBuffer& b) {
    if (!s.options.external_ranges) return;
    const trace::ExternalRanges& x = trace::external_ranges();
    if (x.push) {
      x.push(b.name_of(f));
      f.pushed_external = true;
    }
  }
  static void begin_op(ThreadBuffer& b, Session& s, Frame& f, const trace::OpInput* in, int n, int64_t now) {
    if (s.options.record_shapes) f.shapes = b.intern_shapes(in, n);
    if (n > 0) {
      f.device = in[0].device;
      f.device_set = true;
      start_timing(b, f, now);
    }
    external_push(s, f, b);
  }

  static void begin_phase(ThreadBuffer& b, Session& s, int64_t now, trace::Phase p, bool auto_forward) {
    if (b.step_thread) {
      charge(b, s, now);
      b.phases.push_back(p);
    }
    Frame& f = push(b, s, now, EventKind::Phase);
    f.literal = trace::phase_name(p);
    f.phase = p;
    f.auto_forward = auto_forward;
    external_push(s, f, b);
    if (s.options.profile_memory && b.step_thread) read_all_memory(b, s, now);
  }

  // Adds the time since the last phase change to the innermost open phase (or to the rest).
  static void charge(ThreadBuffer& b, Session& s, int64_t now) {
    const int64_t dt = now - b.last_charge_ns;
    if (b.phases.empty())
      s.current.rest_ns += dt;
    else
      s.current.phase_ns[static_cast<size_t>(b.phases.back())] += dt;
    b.last_charge_ns = now;
  }

  static void end_frame(ThreadBuffer& b, Session& s, int64_t now, bool unfinished = false) {
    const Frame f = b.stack.back();
    b.stack.pop_back();
    if (f.pushed_external) {
      const trace::ExternalRanges& x = trace::external_ranges();
      if (x.pop) x.pop();
    }
    if (f.kind == EventKind::Phase && b.step_thread) {
      if (s.options.profile_memory && !unfinished) read_all_memory(b, s, now);
      charge(b, s, now);
      if (!b.phases.empty()) b.phases.pop_back();
    }
    if (f.timed) {
      const uint64_t end_ev = f.timed->timing_event_record();
      bool top = true;
      for (const Frame& o : b.stack)
        if (o.kind == EventKind::Op || o.kind == EventKind::BackwardOp) top = false;
      if (end_ev != 0) b.timings.push_back(PendingTiming{b.events.size(), f.timed, f.ev_start, end_ev, top});
    }
    RawEvent& e = b.events.emplace_back();
    e.kind = f.kind;
    e.literal = f.literal;
    e.name = f.name;
    e.shapes = f.shapes;
    e.depth = static_cast<int32_t>(b.stack.size());
    e.begin_ns = f.begin_ns - s.origin_ns;
    e.end_ns = now - s.origin_ns;
    const int64_t dur = now - f.begin_ns;
    e.self_ns = f.kind == EventKind::Phase ? dur : dur - f.child_ns;
    e.peak_bytes = f.peak_bytes;
    e.device = f.device;
    e.unfinished = unfinished;
    if (f.kind != EventKind::Phase) {
      for (auto it = b.stack.rbegin(); it != b.stack.rend(); ++it)
        if (it->kind != EventKind::Phase && !it->marker) {
          it->child_ns += dur;
          break;
        }
    }
  }

  void end_kind(EventKind k) {
    with_buffer([&](ThreadBuffer& b, Session& s, int64_t now) {
      if (b.stack.empty() || b.stack.back().kind != k) return;
      end_frame(b, s, now);
    });
  }

  // GPU ops on the step thread get a pair of timing events (no synchronisation now).
  static void start_timing(ThreadBuffer& b, Frame& f, int64_t now) {
    if (!b.step_thread || f.device.is_cpu()) return;
    Backend& be = backend_for(f.device);
    bool have_ref = false;
    for (const TimingReference& r : b.references) have_ref = have_ref || r.backend == &be;
    if (!have_ref) {
      const uint64_t ref = be.timing_event_record();
      if (ref == 0) return;  // this device keeps no timing events
      b.references.push_back({&be, ref, now});
    }
    f.ev_start = be.timing_event_record();
    if (f.ev_start != 0) f.timed = &be;
  }

 public:
  // Reads back the step's timing events (waiting for the device once, at the last of them), puts
  // device times on the events and the step, and returns the events to their pools.
  static void resolve_timings(ThreadBuffer& b, Session& s) {
    if (b.timings.empty() && b.references.empty()) return;
    int64_t step_device = -1;
    for (const PendingTiming& t : b.timings) {
      const double ms = t.backend->timing_event_elapsed_ms(t.start, t.end);
      if (ms < 0) continue;
      RawEvent& e = b.events[t.event];
      e.device_ns = static_cast<int64_t>(ms * 1e6);
      for (const TimingReference& r : b.references)
        if (r.backend == t.backend) {
          const double at = t.backend->timing_event_elapsed_ms(r.event, t.start);
          if (at >= 0) e.device_begin_ns = r.host_ns - s.origin_ns + static_cast<int64_t>(at * 1e6);
        }
      if (t.top_level) step_device = std::max<int64_t>(step_device, 0) + e.device_ns;
    }
    for (const TimingReference& r : b.references) r.backend->timing_events_release();
    b.timings.clear();
    b.references.clear();
    s.current.device_ns = step_device;
  }

 private:
  static size_t device_slot(Session& s, Device d) {
    for (size_t i = 0; i < s.devices.size(); ++i)
      if (s.devices[i] == d) return i;
    return s.devices.size();
  }

  // One memory reading of device d: updates the open frames, the step's figures and the trace's
  // counter.
  static void read_memory(ThreadBuffer& b, Session& s, Device d, int64_t now) {
    const size_t slot = device_slot(s, d);
    if (slot == s.devices.size()) return;
    const MemoryStats st = backend_for(d).memory_stats();
    int64_t value = st.current_bytes;
    int64_t seen = s.seen_peak[slot].load(std::memory_order_relaxed);
    while (st.peak_bytes > seen && !s.seen_peak[slot].compare_exchange_weak(seen, st.peak_bytes)) {
    }
    if (st.peak_bytes > seen) value = std::max(value, st.peak_bytes);  // the high-water mark rose since the last reading
    for (Frame& f : b.stack) {
      if (f.marker) continue;
      if (f.device_set && !(f.device == d)) continue;
      f.device = d;
      f.device_set = true;
      f.peak_bytes = std::max(f.peak_bytes, value);
    }
    if (b.step_thread) {
      DeviceMemory& m = s.current.memory[slot];
      m.peak_bytes = std::max(m.peak_bytes, value);
      m.end_bytes = st.current_bytes;
      const size_t ph = b.phases.empty() ? trace::kNumPhases : static_cast<size_t>(b.phases.back());
      m.phase_peak[ph] = std::max(m.phase_peak[ph], value);
    }
    // A counter sample when the value changed since this thread's last sample of the device.
    for (auto it = b.counters.rbegin(); it != b.counters.rend(); ++it)
      if (it->slot == slot) {
        if (it->bytes == st.current_bytes) return;
        break;
      }
    b.counters.push_back({static_cast<uint32_t>(slot), now - s.origin_ns, st.current_bytes});
  }
  static void read_all_memory(ThreadBuffer& b, Session& s, int64_t now) {
    for (const Device& d : s.devices) read_memory(b, s, d, now);
  }

  static void close_step(ThreadBuffer& b, Session& s, int64_t now, int64_t samples) {
    StepRecord r = s.current;
    r.end_ns = now - s.origin_ns;
    r.samples = samples;
    r.communication_total_ns = s.pending_comm_ns.exchange(0);
    for (size_t i = 0; i < r.memory.size(); ++i) r.memory[i].capacity_bytes = capacity(s, s.devices[i]);
    RawEvent& e = b.events.emplace_back();
    e.kind = EventKind::Step;
    e.name = b.intern("ProfilerStep#" + std::to_string(r.index));
    e.begin_ns = r.begin_ns;
    e.end_ns = r.end_ns;
    e.self_ns = r.end_ns - r.begin_ns;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      s.steps.push_back(r);
    }
    reset_step(s, r.index + 1, now);
  }

 public:
  static int64_t capacity(const Session& s, Device d) {
    const MemoryStats st = backend_for(d).memory_stats();
    if (st.limit_bytes >= 0) return st.limit_bytes;
    if (d.is_cpu()) return s.host_total_bytes;
    return -1;  // a GPU's size comes from the device monitor (Profiler::set_device_utilisation)
  }
  static void reset_step(Session& s, int64_t index, int64_t now) {
    s.current = StepRecord{};
    s.current.index = index;
    s.current.begin_ns = now - s.origin_ns;
    s.current.memory.resize(s.devices.size());
    for (size_t i = 0; i < s.devices.size(); ++i) s.current.memory[i].device = s.devices[i];
  }
  // Closes the frames still open on a thread (stop() while scopes are open: an exception on its
  // way out, another thread mid-op).
  static void close_open(ThreadBuffer& b, Session& s, int64_t now) {
    while (!b.stack.empty()) {
      if (b.stack.back().marker) {
        b.stack.pop_back();
        continue;
      }
      end_frame(b, s, now, /*unfinished=*/true);
    }
    if (b.step_thread) charge(b, s, now);
  }
  // The thread's events as Events (names and shapes as text).
  static void export_events(const ThreadBuffer& b, std::vector<Event>& out, std::vector<CounterSample>& counters,
                            const Session& s) {
    std::unordered_map<uint32_t, std::pair<std::string, std::string>> shapes;  // id -> (shapes, dtypes)
    for (const RawEvent& r : b.events) {
      Event e;
      e.kind = r.kind;
      e.name = r.literal ? std::string(r.literal) : b.strings[r.name];
      if (r.shapes) {
        auto it = shapes.find(r.shapes);
        if (it == shapes.end())
          it = shapes.emplace(r.shapes, std::make_pair(b.shapes_string(r.shapes), b.dtypes_string(r.shapes))).first;
        e.shapes = it->second.first;
        e.dtypes = it->second.second;
      }
      e.thread = b.index;
      e.depth = r.depth;
      e.begin_ns = r.begin_ns;
      e.end_ns = r.end_ns;
      e.self_ns = r.self_ns;
      e.peak_bytes = r.peak_bytes;
      e.device_ns = r.device_ns;
      e.device_begin_ns = r.device_begin_ns;
      e.device = r.device;
      e.unfinished = r.unfinished;
      out.push_back(std::move(e));
    }
    for (const RawCounter& c : b.counters)
      counters.push_back({"memory " + s.devices[c.slot].str(), c.ts_ns, static_cast<double>(c.bytes)});
  }
};

}  // namespace detail

class Profiler {
 public:
  explicit Profiler(ProfilerOptions options = {}) : options_(std::move(options)) {
    EMBER_CHECK(options_.window >= 1, ValueError, "Profiler: window must be >= 1, got ", options_.window);
  }
  ~Profiler() {
    if (recording_) {
      try {
        stop();
      } catch (...) {  // a destructor must not throw; the trace write failed
      }
    }
  }
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  bool is_recording() const { return recording_; }

  // Starts a session; the calling thread becomes the step thread. Earlier results are dropped.
  void start() {
    EMBER_CHECK(!recording_, ValueError, "Profiler::start: this profiler is already recording");
    auto s = std::make_shared<detail::Session>();
    s->options = options_;
    s->devices.push_back(Device::cpu());
    for (int i = 0; i < cuda::device_count(); ++i) s->devices.push_back(Device::cuda(i));
    s->seen_peak = std::make_unique<std::atomic<int64_t>[]>(s->devices.size());
    for (size_t i = 0; i < s->devices.size(); ++i) s->seen_peak[i].store(backend_for(s->devices[i]).memory_stats().peak_bytes);
    s->host_total_bytes = detail::host_memory_total();
    {
      std::lock_guard<std::mutex> lock(detail::session_mutex());
      EMBER_CHECK(!detail::current_session(), ValueError,
                  "Profiler::start: another profiler is recording (one session at a time)");
      s->origin_ns = trace::now_ns();
      detail::Recorder::reset_step(*s, 0, s->origin_ns);
      detail::current_session() = s;
      detail::session_generation().fetch_add(1, std::memory_order_acq_rel);
    }
    session_ = s;
    detail::ThreadBuffer* b = detail::thread_buffer();
    {
      std::lock_guard<std::mutex> lock(b->mutex);
      b->step_thread = true;
      b->last_charge_ns = s->origin_ns;
    }
    {
      std::lock_guard<std::mutex> lock(s->mutex);
      s->thread_names[static_cast<size_t>(b->index)] = "training thread";
    }
    trace::listener_slot().store(&detail::Recorder::instance(), std::memory_order_release);
    recording_ = true;
  }

  // Marks the end of a training step (of `samples` samples, for samples per second).
  void step(int64_t samples = 0) {
    EMBER_CHECK(recording_, ValueError, "Profiler::step: not recording (call start() first)");
    detail::Recorder::instance().mark_step(samples);
  }

  // Ends the session: open scopes are closed as unfinished, the trace is written when
  // trace_path is set. Results stay readable until the next start().
  void stop() {
    EMBER_CHECK(recording_, ValueError, "Profiler::stop: not recording");
    recording_ = false;
    trace::listener_slot().store(nullptr, std::memory_order_release);
    std::shared_ptr<detail::Session> s = session_;
    {
      std::lock_guard<std::mutex> lock(detail::session_mutex());
      detail::current_session().reset();
      detail::session_generation().fetch_add(1, std::memory_order_acq_rel);
    }
    const int64_t now = trace::now_ns();
    std::vector<std::shared_ptr<detail::ThreadBuffer>> threads;
    {
      std::lock_guard<std::mutex> lock(s->mutex);
      threads = s->threads;
    }
    for (auto& b : threads) {
      std::lock_guard<std::mutex> lock(b->mutex);
      detail::Recorder::close_open(*b, *s, now);
      if (b->step_thread) detail::Recorder::resolve_timings(*b, *s);
      b->active = false;
      if (b->step_thread && s->steps.empty()) {  // no step() at all: the whole session is one step
        StepRecord r = s->current;
        r.end_ns = now - s->origin_ns;
        r.communication_total_ns = s->pending_comm_ns.exchange(0);
        for (size_t i = 0; i < r.memory.size(); ++i) r.memory[i].capacity_bytes = detail::Recorder::capacity(*s, s->devices[i]);
        s->steps.push_back(r);
      }
    }
    collect(*s, threads);
    if (!options_.trace_path.empty()) write_chrome_trace(options_.trace_path);
  }

  // ---- results (after stop) ----
  const std::vector<Event>& events() const { return events_; }
  const std::vector<StepRecord>& steps() const { return steps_; }
  const std::vector<std::string>& thread_names() const { return thread_names_; }
  const std::vector<CounterSample>& counters() const { return counters_; }

  // Averages per name (and per input shapes), over ops, backward nodes, modules and ranges.
  KeyAverages key_averages(bool group_by_input_shapes = false) const {
    std::map<std::pair<std::string, std::string>, KeyAverage> acc;
    std::vector<std::pair<std::string, std::string>> order;
    for (const Event& e : events_) {
      if (e.kind == EventKind::Phase || e.kind == EventKind::Step || e.kind == EventKind::Async) continue;
      auto key = std::make_pair(std::string(event_kind_name(e.kind)) + ":" + e.name,
                                group_by_input_shapes ? e.shapes : std::string());
      auto [it, fresh] = acc.try_emplace(key);
      KeyAverage& r = it->second;
      if (fresh) {
        r.kind = e.kind;
        r.name = e.name;
        r.shapes = key.second;
        order.push_back(key);
      }
      r.calls += 1;
      r.self_ns += e.self_ns;
      r.total_ns += e.duration_ns();
      if (e.device_ns >= 0) r.device_ns = std::max<int64_t>(r.device_ns, 0) + e.device_ns;
      r.peak_bytes = std::max(r.peak_bytes, e.peak_bytes);
    }
    std::vector<KeyAverage> rows;
    for (auto& k : order) rows.push_back(acc[k]);
    return KeyAverages(std::move(rows)).sort(SortBy::SelfHost);
  }

  // The figures of one step record.
  StepFigures figures(const StepRecord& r) const {
    StepFigures f;
    const double ms = 1e-6;
    f.step_ms = static_cast<double>(r.duration_ns()) * ms;
    auto ph = [&](trace::Phase p) { return static_cast<double>(r.phase_ns[static_cast<size_t>(p)]) * ms; };
    f.data_wait_ms = ph(trace::Phase::DataWait);
    f.host_to_device_ms = ph(trace::Phase::HostToDevice);
    f.forward_ms = ph(trace::Phase::Forward);
    f.backward_ms = ph(trace::Phase::Backward);
    f.optimizer_ms = ph(trace::Phase::Optimizer);
    f.communication_exposed_ms = ph(trace::Phase::Communication);
    f.checkpoint_save_ms = ph(trace::Phase::CheckpointSave);
    f.rest_ms = static_cast<double>(r.rest_ns) * ms;
    f.communication_total_ms = static_cast<double>(r.communication_total_ns) * ms;
    if (r.samples > 0 && r.duration_ns() > 0) f.samples_per_second = static_cast<double>(r.samples) / (f.step_ms * 1e-3);
    // The step's device: the first GPU that held memory, else the CPU.
    const DeviceMemory* dm = nullptr;
    for (const DeviceMemory& m : r.memory)
      if (!m.device.is_cpu() && m.peak_bytes > 0) {
        dm = &m;
        break;
      }
    if (!dm && !r.memory.empty()) dm = &r.memory[0];
    if (dm) {
      f.device = dm->device.str();
      f.peak_bytes = dm->peak_bytes;
      f.capacity_bytes = dm->capacity_bytes;
      if (!dm->device.is_cpu() && utilisation_.total_bytes > 0 && f.capacity_bytes < 0)
        f.capacity_bytes = utilisation_.total_bytes;
    }
    if (r.device_ns >= 0 && r.duration_ns() > 0)
      f.device_busy = static_cast<double>(r.device_ns) / static_cast<double>(r.duration_ns());
    else if (dm && !dm->device.is_cpu())
      f.device_busy = utilisation_.busy_fraction;
    return f;
  }

  // The average over the last `window` steps (leaving out the first as warm-up when there are
  // more steps than that).
  StepFigures average_figures() const {
    StepFigures avg;
    if (steps_.empty()) return avg;
    size_t first = steps_.size() > static_cast<size_t>(options_.window) ? steps_.size() - static_cast<size_t>(options_.window)
                                                                      : (steps_.size() > 1 ? 1 : 0);
    const double n = static_cast<double>(steps_.size() - first);
    int64_t samples = 0;
    double ms = 0;
    avg.peak_bytes = -1;
    bool busy_known = true;
    double busy = 0;
    for (size_t i = first; i < steps_.size(); ++i) {
      StepFigures f = figures(steps_[i]);
      avg.step_ms += f.step_ms / n;
      avg.data_wait_ms += f.data_wait_ms / n;
      avg.host_to_device_ms += f.host_to_device_ms / n;
      avg.forward_ms += f.forward_ms / n;
      avg.backward_ms += f.backward_ms / n;
      avg.optimizer_ms += f.optimizer_ms / n;
      avg.communication_exposed_ms += f.communication_exposed_ms / n;
      avg.checkpoint_save_ms += f.checkpoint_save_ms / n;
      avg.rest_ms += f.rest_ms / n;
      avg.communication_total_ms += f.communication_total_ms / n;
      avg.peak_bytes = std::max(avg.peak_bytes, f.peak_bytes);
      avg.capacity_bytes = f.capacity_bytes;
      avg.device = f.device;
      samples += steps_[i].samples;
      ms += f.step_ms;
      if (f.device_busy < 0) busy_known = false;
      busy += f.device_busy / n;
    }
    avg.device_busy = busy_known ? busy : -1;
    if (samples > 0 && ms > 0) avg.samples_per_second = static_cast<double>(samples) / (ms * 1e-3);
    return avg;
  }

  // Per step (the last `window`) and averaged: the phases, samples per second, peak memory
  // against capacity, then the verdict.
  std::string step_report() const {
    std::string out;
    char buf[512];
    out += "Step breakdown (ms; phases exclusive, they add up to the step)\n";
    std::snprintf(buf, sizeof buf, "%-7s %9s %9s %9s %9s %9s %9s %9s %9s %9s %11s %10s\n", "step", "total", "data",
                  "h2d", "forward", "backward", "optim", "comm", "ckpt", "rest", "comm total", "samples/s");
    out += buf;
    auto row = [&](const std::string& label, const StepFigures& f) {
      char sps[32];
      if (f.samples_per_second >= 0) std::snprintf(sps, sizeof sps, "%.0f", f.samples_per_second);
      else std::snprintf(sps, sizeof sps, "-");
      std::snprintf(buf, sizeof buf, "%-7s %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %11.3f %10s\n",
                    label.c_str(), f.step_ms, f.data_wait_ms, f.host_to_device_ms, f.forward_ms, f.backward_ms,
                    f.optimizer_ms, f.communication_exposed_ms, f.checkpoint_save_ms, f.rest_ms,
                    f.communication_total_ms, sps);
      out += buf;
    };
    const size_t first = steps_.size() > static_cast<size_t>(options_.window) ? steps_.size() - static_cast<size_t>(options_.window) : 0;
    for (size_t i = first; i < steps_.size(); ++i) row(std::to_string(steps_[i].index), figures(steps_[i]));
    if (steps_.empty()) {
      out += "(no steps recorded)\n";
      return out;
    }
    StepFigures avg = average_figures();
    row("avg", avg);
    auto share = [&](double v) { return avg.step_ms > 0 ? 100.0 * v / avg.step_ms : 0.0; };
    std::snprintf(buf, sizeof buf,
                  "Shares of the average step: data %.1f%%, h2d %.1f%%, forward %.1f%%, backward %.1f%%, optimizer "
                  "%.1f%%, exposed comm %.1f%%, checkpoint %.1f%%, rest %.1f%%\n",
                  share(avg.data_wait_ms), share(avg.host_to_device_ms), share(avg.forward_ms), share(avg.backward_ms),
                  share(avg.optimizer_ms), share(avg.communication_exposed_ms), share(avg.checkpoint_save_ms),
                  share(avg.rest_ms));
    out += buf;
    if (avg.communication_total_ms > 0) {
      std::snprintf(buf, sizeof buf, "Communication: %.3f ms per step, %.1f%% hidden behind backward\n",
                    avg.communication_total_ms,
                    100.0 * std::max(0.0, 1.0 - avg.communication_exposed_ms / avg.communication_total_ms));
      out += buf;
    }
    // Peak memory per device and phase, over the window.
    for (size_t d = 0; d < steps_.back().memory.size(); ++d) {
      int64_t peak = -1, cap = -1;
      std::array<int64_t, trace::kNumPhases + 1> phase{};
      phase.fill(-1);
      for (size_t i = first; i < steps_.size(); ++i) {
        if (d >= steps_[i].memory.size()) continue;
        const DeviceMemory& m = steps_[i].memory[d];
        peak = std::max(peak, m.peak_bytes);
        cap = m.capacity_bytes;
        for (size_t p = 0; p < phase.size(); ++p) phase[p] = std::max(phase[p], m.phase_peak[p]);
      }
      if (peak < 0) continue;
      const Device dev = steps_.back().memory[d].device;
      if (!dev.is_cpu() && cap < 0) cap = utilisation_.total_bytes;
      out += "Peak memory " + dev.str() + ": " + KeyAverages::bytes_text(peak);
      if (cap > 0) {
        std::snprintf(buf, sizeof buf, " of %s (%.1f%%)", KeyAverages::bytes_text(cap).c_str(),
                      100.0 * static_cast<double>(peak) / static_cast<double>(cap));
        out += buf;
      }
      out += "; by phase:";
      for (size_t p = 0; p < phase.size(); ++p)
        if (phase[p] >= 0)
          out += std::string(" ") + (p < trace::kNumPhases ? trace::phase_name(static_cast<trace::Phase>(p)) : "rest") +
                 " " + KeyAverages::bytes_text(phase[p]);
      out += "\n";
    }
    if (avg.device_busy >= 0) {
      std::snprintf(buf, sizeof buf, "Device busy: %.1f%% of the step (%s)\n", 100.0 * avg.device_busy, avg.device.c_str());
      out += buf;
    }
    out += "Verdict:\n";
    for (const Verdict& v : verdict(avg)) out += "  - " + v.message + "\n";
    return out;
  }

  // The device monitor's figures for the verdict (utilisation over the window, device size).
  void set_device_utilisation(DeviceUtilisation u) { utilisation_ = u; }
  // Counters from elsewhere (the device monitor's samples) for the trace; ts from trace::now_ns().
  void add_counter(const std::string& name, int64_t ts_ns, double value) {
    extra_counters_.push_back({name, ts_ns, value});
  }

  // The Chrome trace JSON (chrome://tracing, https://ui.perfetto.dev): a track per host thread,
  // nested complete events, a track for collectives, counters for memory.
  std::string chrome_trace_json() const {
    std::string out;
    out.reserve(256 + events_.size() * 160);
    out += "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"ember profile::Profiler\"},\"traceEvents\":[\n";
    bool first = true;
    auto sep = [&] {
      if (!first) out += ",\n";
      first = false;
    };
    auto us = [&](int64_t ns) {
      char buf[40];
      std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(ns) / 1e3);
      return std::string(buf);
    };
    sep();
    out += "{\"ph\":\"M\",\"pid\":0,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"ember host\"}}";
    for (size_t t = 0; t < thread_names_.size(); ++t) {
      sep();
      out += "{\"ph\":\"M\",\"pid\":0,\"tid\":" + std::to_string(t) + ",\"name\":\"thread_name\",\"args\":{\"name\":";
      logging::append_json_string(out, thread_names_[t]);
      out += "}}";
    }
    constexpr int kCommTrack = 1000;
    sep();
    out += "{\"ph\":\"M\",\"pid\":0,\"tid\":" + std::to_string(kCommTrack) +
           ",\"name\":\"thread_name\",\"args\":{\"name\":\"collectives (launch to completion)\"}}";
    for (const Event& e : events_) {
      sep();
      out += "{\"ph\":\"X\",\"pid\":0,\"tid\":" + std::to_string(e.kind == EventKind::Async ? kCommTrack : e.thread) +
             ",\"ts\":" + us(e.begin_ns) + ",\"dur\":" + us(e.duration_ns()) + ",\"cat\":\"" + event_kind_name(e.kind) +
             "\",\"name\":";
      logging::append_json_string(out, e.name);
      out += ",\"args\":{";
      out += "\"self_us\":" + us(e.self_ns);
      if (!e.shapes.empty()) {
        out += ",\"input_shapes\":";
        logging::append_json_string(out, e.shapes);
        out += ",\"input_dtypes\":";
        logging::append_json_string(out, e.dtypes);
      }
      if (e.peak_bytes >= 0) out += ",\"peak_bytes\":" + std::to_string(e.peak_bytes) + ",\"device\":\"" + e.device.str() + "\"";
      if (e.device_ns >= 0) out += ",\"device_us\":" + us(e.device_ns);
      if (e.unfinished) out += ",\"unfinished\":true";
      out += "}}";
    }
    // A track per GPU stream: the ops' device times from CUDA events.
    std::set<int> gpu_tracks;
    for (const Event& e : events_) {
      if (e.device_begin_ns < 0 || e.device_ns < 0) continue;
      if (gpu_tracks.insert(e.device.index()).second) {
        sep();
        out += "{\"ph\":\"M\",\"pid\":1,\"tid\":" + std::to_string(e.device.index()) +
               ",\"name\":\"thread_name\",\"args\":{\"name\":\"" + e.device.str() + " compute stream\"}}";
      }
      sep();
      out += "{\"ph\":\"X\",\"pid\":1,\"tid\":" + std::to_string(e.device.index()) + ",\"ts\":" + us(e.device_begin_ns) +
             ",\"dur\":" + us(e.device_ns) + ",\"cat\":\"device\",\"name\":";
      logging::append_json_string(out, e.name);
      out += "}";
    }
    if (!gpu_tracks.empty()) {
      sep();
      out += "{\"ph\":\"M\",\"pid\":1,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"ember devices\"}}";
    }
    auto counter = [&](const CounterSample& c, int64_t ts) {
      sep();
      out += "{\"ph\":\"C\",\"pid\":0,\"ts\":" + us(ts) + ",\"name\":";
      logging::append_json_string(out, c.name);
      out += ",\"args\":{\"value\":";
      logging::append_json_number(out, c.value);
      out += "}}";
    };
    for (const CounterSample& c : counters_) counter(c, c.ts_ns);
    for (const CounterSample& c : extra_counters_) counter(c, c.ts_ns - origin_ns_);
    out += "\n]}\n";
    return out;
  }
  // Written atomically (io::write_file_atomic): a reader never sees half a trace.
  void write_chrome_trace(const std::string& path) const { io::write_file_atomic(path, chrome_trace_json()); }

  // The session's time origin on trace::now_ns()'s clock.
  int64_t origin_ns() const { return origin_ns_; }

 private:
  void collect(detail::Session& s, const std::vector<std::shared_ptr<detail::ThreadBuffer>>& threads) {
    events_.clear();
    counters_.clear();
    for (auto& b : threads) {
      std::lock_guard<std::mutex> lock(b->mutex);
      detail::Recorder::export_events(*b, events_, counters_, s);
      b->events.clear();
    }
    std::lock_guard<std::mutex> lock(s.mutex);
    events_.insert(events_.end(), s.async_events.begin(), s.async_events.end());
    std::stable_sort(events_.begin(), events_.end(), [](const Event& a, const Event& b) {
      if (a.begin_ns != b.begin_ns) return a.begin_ns < b.begin_ns;
      return a.depth < b.depth;
    });
    std::stable_sort(counters_.begin(), counters_.end(),
                     [](const CounterSample& a, const CounterSample& b) { return a.ts_ns < b.ts_ns; });
    steps_ = s.steps;
    thread_names_ = s.thread_names;
    origin_ns_ = s.origin_ns;
  }

  ProfilerOptions options_;
  bool recording_ = false;
  std::shared_ptr<detail::Session> session_;
  std::vector<Event> events_;
  std::vector<StepRecord> steps_;
  std::vector<std::string> thread_names_;
  std::vector<CounterSample> counters_, extra_counters_;
  DeviceUtilisation utilisation_;
  int64_t origin_ns_ = 0;
};

// A session for the life of a scope: start() now, stop() at the end, also when an exception
// leaves the scope (the trace is then still complete, valid JSON, with the scopes the exception
// cut short marked unfinished).
class ProfileScope {
 public:
  explicit ProfileScope(Profiler& p) : p_(p) { p_.start(); }
  ~ProfileScope() {
    if (!p_.is_recording()) return;
    try {
      p_.stop();
    } catch (...) {  // unwinding already, or a destructor: the trace write failed
    }
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  Profiler& p_;
};

// A user range: profile::Range r("load"); nested ranges nest in the trace and the table. The
// name is copied.
class Range {
 public:
  explicit Range(const std::string& name) : listener_(trace::active_listener()) {
    if (listener_) [[unlikely]] listener_->range_begin(name.c_str());
  }
  explicit Range(const char* name) : listener_(trace::active_listener()) {
    if (listener_) [[unlikely]] listener_->range_begin(name);
  }
  ~Range() {
    if (listener_) [[unlikely]] listener_->range_end(nullptr);
  }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  trace::Listener* listener_;
};

}  // namespace ember::profile
