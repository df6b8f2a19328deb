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
// session records, one Listener (detail::Recorder, a process-lifetime object) is installed;
// otherwise every hook costs one load and one predictable branch (benchmarks/bench_profiler.cpp
// measures both).
//
// Threads: every thread records into its own buffer (a mutex that only stop() and reports
// contend for); the step breakdown is kept for the thread that called start() (the training
// thread). Scopes that straddle start() or stop() are dropped, not mismatched. At most one session
// records at a time (start() while another records is an error).
//
// The results (events, key averages, step records) are the types of profile/report.hpp; the
// recording machinery is in profile/detail/.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ember/core/backend_registry.hpp"
#include "ember/core/error.hpp"
#include "ember/core/trace.hpp"
#include "ember/io/atomic_file.hpp"
#include "ember/logging/json_text.hpp"
#include "ember/profile/detail/recorder.hpp"
#include "ember/profile/detail/session.hpp"
#include "ember/profile/report.hpp"
#include "ember/profile/verdict.hpp"

namespace ember::profile {

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
      if (b->step_thread && s->steps.empty())  // no step() at all: the whole session is one step
        s->steps.push_back(detail::Recorder::finish_step(*s, now, 0));
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

  // The average over the last `window` steps; the session's first step (a warm-up) is left out
  // when it is among them and not the only one.
  StepFigures average_figures() const {
    StepFigures avg;
    if (steps_.empty()) return avg;
    const size_t first = first_averaged_step();
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
    std::string out = step_breakdown();
    if (steps_.empty()) return out;
    out += "Verdict:\n";
    for (const Verdict& v : verdict(average_figures())) out += "  - " + v.message + "\n";
    return out;
  }

  // step_report() without its closing verdict, for a caller that prints the verdict its own way
  // (the Trainer, which also logs it).
  std::string step_breakdown() const {
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
    const size_t first = first_shown_step();
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
    // A metadata event: the name (`what`: process_name or thread_name) of a process or a track.
    auto meta = [&](int pid, size_t tid, const char* what, const std::string& name) {
      sep();
      out += "{\"ph\":\"M\",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid) + ",\"name\":\"" +
             what + "\",\"args\":{\"name\":";
      logging::append_json_string(out, name);
      out += "}}";
    };
    meta(0, 0, "process_name", "ember host");
    for (size_t t = 0; t < thread_names_.size(); ++t) meta(0, t, "thread_name", thread_names_[t]);
    constexpr int kCommTrack = 1000;
    meta(0, kCommTrack, "thread_name", "collectives (launch to completion)");
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
      if (gpu_tracks.insert(e.device.index()).second)
        meta(1, static_cast<size_t>(e.device.index()), "thread_name", e.device.str() + " compute stream");
      sep();
      out += "{\"ph\":\"X\",\"pid\":1,\"tid\":" + std::to_string(e.device.index()) + ",\"ts\":" + us(e.device_begin_ns) +
             ",\"dur\":" + us(e.device_ns) + ",\"cat\":\"device\",\"name\":";
      logging::append_json_string(out, e.name);
      out += "}";
    }
    if (!gpu_tracks.empty()) meta(1, 0, "process_name", "ember devices");
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
  // The span of the steps average_figures() is over, on trace::now_ns()'s clock (the device
  // monitor averages its GPU utilisation over it); the origin when no step was recorded.
  int64_t average_begin_ns() const { return origin_ns_ + (steps_.empty() ? 0 : steps_[first_averaged_step()].begin_ns); }
  int64_t average_end_ns() const { return origin_ns_ + (steps_.empty() ? 0 : steps_.back().end_ns); }

 private:
  // The steps step_report() shows: the last `window`.
  size_t first_shown_step() const {
    const size_t window = static_cast<size_t>(options_.window);
    return steps_.size() > window ? steps_.size() - window : 0;
  }
  // The steps average_figures() is over: those shown, less the session's first step when it is
  // among them, not the only one, and counted as warm-up.
  size_t first_averaged_step() const {
    const size_t first = first_shown_step();
    return first == 0 && steps_.size() > 1 && options_.first_step_is_warmup ? 1 : first;
  }

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
class Range : trace::ListenerScope {
 public:
  explicit Range(const std::string& name) {
    if (listener_) [[unlikely]] listener_->range_begin(name.c_str());
  }
  explicit Range(const char* name) {
    if (listener_) [[unlikely]] listener_->range_begin(name);
  }
  ~Range() {
    if (listener_) [[unlikely]] listener_->range_end(nullptr);
  }
};

}  // namespace ember::profile
