#pragma once
// profile::DeviceMonitor: nvidia-smi inside the program. A background thread samples, at a set
// interval, every GPU through NVML (utilisation of the GPU and of its memory, memory used and
// total, temperature, power, SM clock, throttle reasons) and the host from /proc (CPU utilisation
// over all cores, the process's resident memory). The samples feed the profiler's trace counters
// and verdict (feed()) and the metrics log (log_to()).
//
//   profile::DeviceMonitor mon({.interval = std::chrono::milliseconds(200)});
//   mon.start();
//   ... train ...
//   mon.stop();
//   mon.feed(profiler);           // counters into the trace, GPU busy fraction into the verdict
//
// NVML is loaded at run time (dlopen of libnvidia-ml.so.1, which the driver installs); nothing
// links against it, and the few functions and structs used are declared here from NVML's
// documented interface (the toolkit has no nvml.h). Without NVML or without a GPU the monitor
// says "unavailable" once (status(), and one line on stderr per process) and samples the host.
//
// Threads: samples are taken on the monitor's thread and read under a mutex; stop() (and the
// destructor) wakes the thread at once and joins it, whatever the interval.
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <fstream>
#include <functional>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/core/trace.hpp"
#include "ember/logging/metrics_logger.hpp"
#include "ember/profile/profiler.hpp"

namespace ember::profile {

// One GPU's reading. Unknown figures are negative (a GPU that does not report power, ...).
struct GpuSample {
  int index = 0;
  double gpu_utilization = -1;     // 0..1: a kernel ran during the driver's sample period
  double memory_utilization = -1;  // 0..1: device memory was read or written
  int64_t memory_used_bytes = -1;
  int64_t memory_total_bytes = -1;
  double temperature_c = -1;
  double power_w = -1;
  int64_t sm_clock_mhz = -1;
  int64_t throttle_reasons = -1;   // NVML's clocks throttle (event) reason bits; 0: none
};

struct HostSample {
  double cpu_utilization = -1;  // 0..1 over all cores, since the previous sample
  int64_t rss_bytes = -1;       // this process's resident memory
};

struct MonitorSample {
  int64_t ts_ns = 0;  // trace::now_ns()
  HostSample host;
  std::vector<GpuSample> gpus;
};

struct DeviceMonitorOptions {
  std::chrono::milliseconds interval{500};
  size_t max_samples = 100000;                        // the oldest are dropped past this
  std::string nvml_library = "libnvidia-ml.so.1";     // "" skips NVML (host only)
  std::function<void(const MonitorSample&)> on_sample;  // called on the monitor's thread
  bool quiet = false;                                 // no "unavailable" line on stderr
};

namespace detail {

// The part of NVML's interface the monitor uses (NVML API reference: nvmlInit_v2,
// nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetUtilizationRates,
// nvmlDeviceGetMemoryInfo, nvmlDeviceGetTemperature, nvmlDeviceGetPowerUsage,
// nvmlDeviceGetClockInfo, nvmlDeviceGetCurrentClocksThrottleReasons, nvmlShutdown).
struct NvmlDeviceOpaque;
using NvmlDevice = NvmlDeviceOpaque*;  // nvmlDevice_t
using NvmlReturn = int;                 // nvmlReturn_t; NVML_SUCCESS = 0
struct NvmlUtilization {                // nvmlUtilization_t
  unsigned int gpu;
  unsigned int memory;
};
struct NvmlMemory {  // nvmlMemory_t (v1)
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
inline constexpr int kNvmlTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU
inline constexpr int kNvmlClockSm = 1;         // NVML_CLOCK_SM

class Nvml {
 public:
  // Loads the library and initialises NVML; on failure `error()` says why.
  explicit Nvml(const std::string& library) {
    if (library.empty()) {
      error_ = "NVML not requested";
      return;
    }
    handle_ = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) {
      const char* e = ::dlerror();
      error_ = "cannot load " + library + (e ? std::string(": ") + e : std::string());
      return;
    }
    bool ok = sym(init_, "nvmlInit_v2") && sym(shutdown_, "nvmlShutdown") && sym(count_, "nvmlDeviceGetCount_v2") &&
              sym(handle_by_index_, "nvmlDeviceGetHandleByIndex_v2") &&
              sym(utilization_, "nvmlDeviceGetUtilizationRates") && sym(memory_, "nvmlDeviceGetMemoryInfo");
    if (!ok) {
      close();
      return;
    }
    // Optional: older or restricted devices may lack these; the figure is then unknown.
    sym(temperature_, "nvmlDeviceGetTemperature", false);
    sym(power_, "nvmlDeviceGetPowerUsage", false);
    sym(clock_, "nvmlDeviceGetClockInfo", false);
    sym(throttle_, "nvmlDeviceGetCurrentClocksThrottleReasons", false);
    if (const NvmlReturn r = init_(); r != 0) {
      error_ = "nvmlInit_v2 failed (NVML error " + std::to_string(r) + ")";
      close();
      return;
    }
    initialised_ = true;
    unsigned int n = 0;
    if (const NvmlReturn r = count_(&n); r != 0) {
      error_ = "nvmlDeviceGetCount_v2 failed (NVML error " + std::to_string(r) + ")";
      close();
      return;
    }
    for (unsigned int i = 0; i < n; ++i) {
      NvmlDevice d = nullptr;
      if (handle_by_index_(i, &d) == 0) devices_.push_back(d);
    }
    if (devices_.empty()) {
      error_ = "NVML found no GPU";
      close();
    }
  }
  ~Nvml() { close(); }
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool available() const { return !devices_.empty(); }
  const std::string& error() const { return error_; }
  size_t device_count() const { return devices_.size(); }

  GpuSample sample(size_t i) const {
    GpuSample g;
    g.index = static_cast<int>(i);
    NvmlDevice d = devices_[i];
    NvmlUtilization u{};
    if (utilization_(d, &u) == 0) {
      g.gpu_utilization = u.gpu / 100.0;
      g.memory_utilization = u.memory / 100.0;
    }
    NvmlMemory m{};
    if (memory_(d, &m) == 0) {
      g.memory_used_bytes = static_cast<int64_t>(m.used);
      g.memory_total_bytes = static_cast<int64_t>(m.total);
    }
    unsigned int v = 0;
    if (temperature_ && temperature_(d, kNvmlTemperatureGpu, &v) == 0) g.temperature_c = v;
    if (power_ && power_(d, &v) == 0) g.power_w = v / 1000.0;  // milliwatts
    if (clock_ && clock_(d, kNvmlClockSm, &v) == 0) g.sm_clock_mhz = v;
    unsigned long long reasons = 0;
    if (throttle_ && throttle_(d, &reasons) == 0) g.throttle_reasons = static_cast<int64_t>(reasons);
    return g;
  }

 private:
  template <class F>
  bool sym(F& f, const char* name, bool required = true) {
    f = reinterpret_cast<F>(::dlsym(handle_, name));
    if (!f && required) error_ = std::string("NVML library lacks ") + name;
    return f != nullptr;
  }
  void close() {
    devices_.clear();
    if (initialised_ && shutdown_) shutdown_();
    initialised_ = false;
    if (handle_) ::dlclose(handle_);
    handle_ = nullptr;
  }

  void* handle_ = nullptr;
  bool initialised_ = false;
  std::string error_;
  std::vector<NvmlDevice> devices_;
  NvmlReturn (*init_)() = nullptr;
  NvmlReturn (*shutdown_)() = nullptr;
  NvmlReturn (*count_)(unsigned int*) = nullptr;
  NvmlReturn (*handle_by_index_)(unsigned int, NvmlDevice*) = nullptr;
  NvmlReturn (*utilization_)(NvmlDevice, NvmlUtilization*) = nullptr;
  NvmlReturn (*memory_)(NvmlDevice, NvmlMemory*) = nullptr;
  NvmlReturn (*temperature_)(NvmlDevice, int, unsigned int*) = nullptr;
  NvmlReturn (*power_)(NvmlDevice, unsigned int*) = nullptr;
  NvmlReturn (*clock_)(NvmlDevice, int, unsigned int*) = nullptr;
  NvmlReturn (*throttle_)(NvmlDevice, unsigned long long*) = nullptr;
};

// Host CPU time counters from /proc/stat's first line: (busy, total) jiffies; {-1, -1} unreadable.
inline std::pair<int64_t, int64_t> host_cpu_times() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  if (!(f >> cpu) || cpu != "cpu") return {-1, -1};
  int64_t v[8] = {};
  for (int i = 0; i < 8; ++i)
    if (!(f >> v[i])) return {-1, -1};
  const int64_t idle = v[3] + v[4];  // idle + iowait
  int64_t total = 0;
  for (int64_t x : v) total += x;
  return {total - idle, total};
}

inline int64_t process_rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(f >> size >> resident)) return -1;
  return resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

inline std::atomic<bool>& unavailable_said() {
  static std::atomic<bool> said{false};
  return said;
}

}  // namespace detail

class DeviceMonitor {
 public:
  explicit DeviceMonitor(DeviceMonitorOptions options = {}) : options_(std::move(options)) {
    EMBER_CHECK(options_.interval.count() > 0, ValueError, "DeviceMonitor: interval must be positive, got ",
                options_.interval.count(), " ms");
    EMBER_CHECK(options_.max_samples > 0, ValueError, "DeviceMonitor: max_samples must be positive");
  }
  ~DeviceMonitor() { stop(); }
  DeviceMonitor(const DeviceMonitor&) = delete;
  DeviceMonitor& operator=(const DeviceMonitor&) = delete;

  // Loads NVML (once per monitor) and starts the sampling thread; the first sample is taken at once.
  void start() {
    std::lock_guard<std::mutex> lock(control_);
    EMBER_CHECK(!thread_.joinable(), ValueError, "DeviceMonitor::start: already running");
    if (!nvml_) {
      nvml_ = std::make_unique<detail::Nvml>(options_.nvml_library);
      if (!nvml_->available()) {
        status_ = "NVML unavailable (" + nvml_->error() + "): sampling the host only";
        if (!options_.quiet && !detail::unavailable_said().exchange(true))
          std::fprintf(stderr, "ember DeviceMonitor: %s\n", status_.c_str());
      } else {
        status_ = "NVML: " + std::to_string(nvml_->device_count()) + " GPU(s)";
      }
    }
    {
      std::lock_guard<std::mutex> l(mutex_);
      stopping_ = false;
    }
    last_cpu_ = detail::host_cpu_times();
    thread_ = std::thread([this] { run(); });
  }

  // Stops and joins the thread (at once: it waits on a condition variable, not a sleep).
  void stop() {
    std::lock_guard<std::mutex> lock(control_);
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> l(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  bool is_running() const {
    std::lock_guard<std::mutex> l(mutex_);
    return running_;
  }
  bool nvml_available() const {
    std::lock_guard<std::mutex> lock(control_);
    return nvml_ && nvml_->available();
  }
  // "NVML: 2 GPU(s)" or "NVML unavailable (...): sampling the host only"; empty before start().
  std::string status() const {
    std::lock_guard<std::mutex> lock(control_);
    return status_;
  }

  std::vector<MonitorSample> samples() const {
    std::lock_guard<std::mutex> l(mutex_);
    return {samples_.begin(), samples_.end()};
  }
  size_t sample_count() const {
    std::lock_guard<std::mutex> l(mutex_);
    return samples_.size();
  }

  // GPU `gpu`'s average utilisation over the samples taken from `since_ns` to `until_ns`
  // (trace::now_ns()'s clock), and its memory size (from any sample: it does not change): what
  // the verdict needs. Unknown (-1) without NVML; the utilisation also without a sample in the span.
  DeviceUtilisation utilisation(int64_t since_ns = 0, int gpu = 0,
                                int64_t until_ns = std::numeric_limits<int64_t>::max()) const {
    DeviceUtilisation u;
    std::lock_guard<std::mutex> l(mutex_);
    double sum = 0;
    int n = 0;
    for (const MonitorSample& s : samples_) {
      if (gpu >= static_cast<int>(s.gpus.size())) continue;
      const GpuSample& g = s.gpus[static_cast<size_t>(gpu)];
      if (g.memory_total_bytes > 0) u.total_bytes = g.memory_total_bytes;
      if (s.ts_ns < since_ns || s.ts_ns > until_ns || g.gpu_utilization < 0) continue;
      sum += g.gpu_utilization;
      ++n;
    }
    if (n > 0) u.busy_fraction = sum / n;
    return u;
  }

  // Puts the samples taken during the profiler's session into its trace as counters, and the
  // GPU's utilisation over the steps the step report averages (Profiler::average_begin_ns() to
  // average_end_ns()) and its memory size into the report and verdict. Call after
  // Profiler::stop().
  void feed(Profiler& p) const {
    const int64_t since = p.origin_ns();
    for (const MonitorSample& s : samples()) {
      if (s.ts_ns < since) continue;
      if (s.host.cpu_utilization >= 0) p.add_counter("host cpu utilization", s.ts_ns, s.host.cpu_utilization);
      if (s.host.rss_bytes >= 0) p.add_counter("host rss bytes", s.ts_ns, static_cast<double>(s.host.rss_bytes));
      for (const GpuSample& g : s.gpus) {
        const std::string gpu = "gpu" + std::to_string(g.index);
        if (g.gpu_utilization >= 0) p.add_counter(gpu + " utilization", s.ts_ns, g.gpu_utilization);
        if (g.memory_used_bytes >= 0)
          p.add_counter(gpu + " memory used bytes", s.ts_ns, static_cast<double>(g.memory_used_bytes));
      }
    }
    p.set_device_utilisation(utilisation(p.average_begin_ns(), 0, p.average_end_ns()));
  }

  // The latest sample as scalars ("monitor/host_cpu_utilization", "monitor/gpu0_utilization", ...).
  static logging::Scalars sample_scalars(const MonitorSample& s) {
    logging::Scalars out;
    auto put = [&](const std::string& k, double v) {
      if (v >= 0) out.emplace_back("monitor/" + k, v);
    };
    put("host_cpu_utilization", s.host.cpu_utilization);
    put("host_rss_mib", s.host.rss_bytes >= 0 ? static_cast<double>(s.host.rss_bytes) / (1024.0 * 1024.0) : -1);
    for (const GpuSample& g : s.gpus) {
      const std::string p = "gpu" + std::to_string(g.index) + "_";
      put(p + "utilization", g.gpu_utilization);
      put(p + "memory_utilization", g.memory_utilization);
      put(p + "memory_used_mib", g.memory_used_bytes >= 0 ? static_cast<double>(g.memory_used_bytes) / (1024.0 * 1024.0) : -1);
      put(p + "temperature_c", g.temperature_c);
      put(p + "power_w", g.power_w);
      put(p + "sm_clock_mhz", static_cast<double>(g.sm_clock_mhz));
      put(p + "throttle_reasons", static_cast<double>(g.throttle_reasons));
    }
    return out;
  }
  // Logs the latest sample; false when there is none yet.
  bool log_to(logging::MetricsLogger& log, int64_t step) const {
    MonitorSample last;
    {
      std::lock_guard<std::mutex> l(mutex_);
      if (samples_.empty()) return false;
      last = samples_.back();
    }
    log.log_scalars(step, sample_scalars(last));
    return true;
  }

 private:
  void run() {
    {
      std::lock_guard<std::mutex> l(mutex_);
      running_ = true;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      lock.unlock();
      MonitorSample s = take();
      if (options_.on_sample) options_.on_sample(s);
      lock.lock();
      samples_.push_back(std::move(s));
      while (samples_.size() > options_.max_samples) samples_.pop_front();
      wake_.wait_for(lock, options_.interval, [this] { return stopping_; });
    }
    running_ = false;
  }

  // Runs on the monitor's thread only (nvml_ and last_cpu_ are not touched elsewhere while it runs).
  MonitorSample take() {
    MonitorSample s;
    s.ts_ns = trace::now_ns();
    const auto cpu = detail::host_cpu_times();
    if (cpu.first >= 0 && last_cpu_.first >= 0 && cpu.second > last_cpu_.second)
      s.host.cpu_utilization = static_cast<double>(cpu.first - last_cpu_.first) /
                               static_cast<double>(cpu.second - last_cpu_.second);
    else if (cpu.first >= 0 && last_cpu_.first >= 0)
      s.host.cpu_utilization = 0.0;  // no jiffy passed since the previous sample
    last_cpu_ = cpu;
    s.host.rss_bytes = detail::process_rss_bytes();
    if (nvml_ && nvml_->available())
      for (size_t i = 0; i < nvml_->device_count(); ++i) s.gpus.push_back(nvml_->sample(i));
    return s;
  }

  DeviceMonitorOptions options_;
  mutable std::mutex control_;  // start/stop, nvml_, status_
  mutable std::mutex mutex_;    // samples_, stopping_, running_
  std::condition_variable wake_;
  std::thread thread_;
  std::unique_ptr<detail::Nvml> nvml_;
  std::string status_;
  std::deque<MonitorSample> samples_;
  bool stopping_ = false;
  bool running_ = false;
  std::pair<int64_t, int64_t> last_cpu_{-1, -1};
};

}  // namespace ember::profile
