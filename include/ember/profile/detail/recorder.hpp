#pragma once
// The profiler's trace::Listener (users never include this): installed while a session records,
// it turns the hooks that core/trace.hpp owns (ops, module calls, phases, ranges, the autograd
// engine's nodes, DataParallel's all-reduces) into events in the calling thread's buffer, charges
// the step thread's time to its phases, reads memory and times GPU ops.
//
// Memory: at the end of every op, at phase changes and at steps the recorder reads the device's
// MemoryStats. An open module, phase or range gets the largest current bytes seen while it was
// open; when the device's own peak rose since the previous reading the new peak counts instead,
// so a high-water mark reached inside an op is not missed.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ember/core/backend_registry.hpp"
#include "ember/core/trace.hpp"
#include "ember/profile/detail/session.hpp"
#include "ember/profile/report.hpp"

namespace ember::profile::detail {

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
    const StepRecord r = finish_step(s, now, samples);
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
  // The step being recorded, ended at `now`: its communication total and each device's capacity.
  static StepRecord finish_step(Session& s, int64_t now, int64_t samples) {
    StepRecord r = s.current;
    r.end_ns = now - s.origin_ns;
    r.samples = samples;
    r.communication_total_ns = s.pending_comm_ns.exchange(0);
    for (size_t i = 0; i < r.memory.size(); ++i) r.memory[i].capacity_bytes = capacity(s, s.devices[i]);
    return r;
  }
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

}  // namespace ember::profile::detail
