// profile::DeviceMonitor: host samples from /proc at the interval, NVML through a fake
// libnvidia-ml (tests/fake_nvml.cpp: two GPUs, fixed readings) loaded with dlopen, "unavailable"
// without it, prompt stop whatever the interval, feeding the profiler and the metrics log, and
// misuse errors. Also built with -fsanitize=thread (docs/profiling.md).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <ember/ember.hpp>
#include <ember/profile/device_monitor.hpp>

using namespace ember;
using Catch::Contains;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {
template <class F>
bool wait_until(F f, std::chrono::milliseconds limit = 5000ms) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!f()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}
}  // namespace

TEST_CASE("device monitor: without NVML it says unavailable and samples the host", "[monitor]") {
  profile::DeviceMonitor mon({.interval = 10ms, .nvml_library = "/nonexistent/libnvidia-ml.so.1", .quiet = true});
  CHECK(mon.status().empty());
  mon.start();
  CHECK_FALSE(mon.nvml_available());
  CHECK_THAT(mon.status(), Contains("NVML unavailable") && Contains("/nonexistent/libnvidia-ml.so.1") &&
                               Contains("sampling the host only"));
  REQUIRE(wait_until([&] { return mon.sample_count() >= 4; }));
  mon.stop();
  CHECK_FALSE(mon.is_running());
  auto s = mon.samples();
  REQUIRE(s.size() >= 4);
  for (size_t i = 0; i < s.size(); ++i) {
    CHECK(s[i].gpus.empty());
    CHECK(s[i].host.rss_bytes > 1 << 20);  // at least a MiB resident: this test program
    if (i > 0) {
      CHECK(s[i].ts_ns > s[i - 1].ts_ns);
      CHECK(s[i].host.cpu_utilization >= 0.0);
      CHECK(s[i].host.cpu_utilization <= 1.0);
    }
  }
  // Samples are about an interval apart (never faster).
  CHECK(s[2].ts_ns - s[1].ts_ns >= 9'000'000);
  // No GPU figures: the verdict gets unknowns.
  auto u = mon.utilisation();
  CHECK(u.busy_fraction < 0);
  CHECK(u.total_bytes < 0);
}

TEST_CASE("device monitor: NVML through dlopen (a fake library with two GPUs)", "[monitor][nvml]") {
  std::atomic<int> callbacks{0};
  profile::DeviceMonitor mon({.interval = 5ms,
                              .nvml_library = EMBER_FAKE_NVML,
                              .on_sample = [&](const profile::MonitorSample&) { callbacks.fetch_add(1); }});
  mon.start();
  REQUIRE(mon.nvml_available());
  CHECK(mon.status() == "NVML: 2 GPU(s)");
  REQUIRE(wait_until([&] { return mon.sample_count() >= 3; }));
  mon.stop();
  CHECK(callbacks.load() == static_cast<int>(mon.sample_count()));
  auto s = mon.samples().back();
  REQUIRE(s.gpus.size() == 2);
  const auto& g0 = s.gpus[0];
  CHECK(g0.index == 0);
  CHECK(g0.gpu_utilization == Approx(0.37));
  CHECK(g0.memory_utilization == Approx(0.12));
  CHECK(g0.memory_total_bytes == int64_t{80} << 30);
  CHECK(g0.memory_used_bytes == int64_t{20} << 30);
  CHECK(g0.temperature_c == 61);
  CHECK(g0.power_w == Approx(215.5));
  CHECK(g0.sm_clock_mhz == 1755);
  CHECK(g0.throttle_reasons == -1);  // the library lacks the optional function: unknown
  CHECK(s.gpus[1].gpu_utilization == Approx(0.90));
  auto u = mon.utilisation();
  CHECK(u.busy_fraction == Approx(0.37));
  CHECK(u.total_bytes == int64_t{80} << 30);
  CHECK(mon.utilisation(0, 1).busy_fraction == Approx(0.90));
  // Scalars for the metrics log.
  auto scalars = profile::DeviceMonitor::sample_scalars(s);
  auto find = [&](const std::string& k) {
    for (auto& [n, v] : scalars)
      if (n == k) return v;
    return -100.0;
  };
  CHECK(find("monitor/gpu0_utilization") == Approx(0.37));
  CHECK(find("monitor/gpu1_memory_used_mib") == Approx(1024.0));
  CHECK(find("monitor/gpu0_power_w") == Approx(215.5));
  CHECK(find("monitor/gpu0_throttle_reasons") == -100.0);  // unknown: not logged
  // A restart reuses the loaded library.
  mon.start();
  REQUIRE(wait_until([&] { return mon.sample_count() >= 5; }));
  mon.stop();
}

TEST_CASE("device monitor: stop and destruction are prompt whatever the interval", "[monitor]") {
  const auto t0 = std::chrono::steady_clock::now();
  {
    profile::DeviceMonitor mon({.interval = 60s, .nvml_library = "", .quiet = true});
    mon.start();
    REQUIRE(wait_until([&] { return mon.sample_count() >= 1; }));  // the first sample is immediate
    mon.stop();
    mon.stop();  // twice is fine
    mon.start();
  }  // the destructor stops the second run
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
}

TEST_CASE("device monitor: feeds the profiler's trace counters and the metrics log", "[monitor][profile]") {
  profile::DeviceMonitor mon({.interval = 5ms, .nvml_library = EMBER_FAKE_NVML});
  profile::Profiler prof;
  mon.start();
  prof.start();
  // Samples taken after the profiler's start: on the H200 machine prof.start() took longer than
  // three 5 ms intervals, so counting from the monitor's start found none inside the session.
  const size_t before = mon.sample_count();
  REQUIRE(wait_until([&] { return mon.sample_count() >= before + 3; }));
  (void)relu(Tensor<float>::ones({4}));
  prof.step();
  prof.stop();
  mon.stop();
  mon.feed(prof);
  nlohmann::json j = nlohmann::json::parse(prof.chrome_trace_json());
  int gpu_counters = 0, host_counters = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "C") continue;
    if (e["name"] == "gpu0 utilization") {
      ++gpu_counters;
      CHECK(e["args"]["value"].get<double>() == Approx(0.37));
    }
    if (e["name"] == "host cpu utilization") ++host_counters;
  }
  CHECK(gpu_counters >= 1);
  CHECK(host_counters >= 1);

  fs::path dir = fs::temp_directory_path() / ("ember_test_monitor_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    logging::MetricsLogger log(dir, {.csv = false, .tensorboard = false});
    REQUIRE(mon.log_to(log, 3));
  }
  std::ifstream f(dir / "metrics.jsonl");
  std::string line;
  REQUIRE(std::getline(f, line));
  auto row = nlohmann::json::parse(line);
  CHECK(row["step"] == 3);
  CHECK(row["monitor/gpu0_utilization"].get<double>() == Approx(0.37));
  CHECK(row.contains("monitor/host_rss_mib"));
  fs::remove_all(dir);
}

TEST_CASE("device monitor: misuse errors", "[monitor][errors]") {
  REQUIRE_THROWS_WITH(profile::DeviceMonitor({.interval = 0ms}), Contains("interval must be positive"));
  REQUIRE_THROWS_WITH(profile::DeviceMonitor({.max_samples = 0}), Contains("max_samples must be positive"));
  profile::DeviceMonitor mon({.interval = 1s, .nvml_library = "", .quiet = true});
  mon.start();
  REQUIRE_THROWS_WITH(mon.start(), Contains("already running"));
  mon.stop();
  // Past max_samples the oldest are dropped.
  profile::DeviceMonitor small({.interval = 1ms, .max_samples = 3, .nvml_library = "", .quiet = true});
  small.start();
  std::this_thread::sleep_for(30ms);
  small.stop();
  CHECK(small.sample_count() == 3);
}
