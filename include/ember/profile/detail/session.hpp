#pragma once
// The profiler's recording state (users never include this): what a thread records (its buffer of
// compact events, its stack of open scopes, its interned names and input shapes), the session
// that owns the buffers, and the process-wide slot of the recording session.
//
// Threads: every thread records into its own buffer, under a mutex that only stop() and reports
// contend for. A thread finds its buffer through a thread_local slot that it checks against the
// session generation (one atomic load when nothing changed); a thread that first records
// mid-session gets its buffer then.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ember/core/backend.hpp"
#include "ember/core/device.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/shape.hpp"
#include "ember/core/trace.hpp"
#include "ember/profile/report.hpp"

namespace ember::profile {
namespace detail {

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
  // An interned set's shapes, "[[64, 784], [10, 784]]", and dtypes, "[float32, float32]".
  std::string shapes_string(uint32_t id) const {
    return set_text(id, [](const ShapeSet& set, size_t i) { return set.shapes[i].str(); });
  }
  std::string dtypes_string(uint32_t id) const {
    return set_text(id, [](const ShapeSet& set, size_t i) { return std::string(dtype_name(set.dtypes[i])); });
  }
  template <class ItemText>
  std::string set_text(uint32_t id, ItemText item) const {
    if (id == 0) return {};
    const ShapeSet& set = shape_sets[id - 1];
    std::string s = "[";
    for (size_t i = 0; i < static_cast<size_t>(set.n); ++i) {
      if (i) s += ", ";
      s += item(set, i);
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

}  // namespace detail
}  // namespace ember::profile
