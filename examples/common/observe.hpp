#pragma once
// What the examples' --profile and --log-dir flags do (docs/profiling.md):
//   --profile trace.json   profiles the run: writes the Chrome trace there, prints the op table,
//                          the step report and the bottleneck verdict (device monitor included)
//   --log-dir runs/x       logs loss, learning rate, the step report's figures and the monitor's
//                          samples: TensorBoard event file, metrics.jsonl, metrics.csv, hparams.json
//
//   examples::Observe obs(args, {{"lr", lr}, ...});
//   for (...) { ...; obs.step(step, loss, batch, lr); }
//   obs.finish();
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include <ember/ember.hpp>
#include <ember/logging/metrics_logger.hpp>
#include <ember/profile/device_monitor.hpp>
#include <ember/profile/profiler.hpp>
#include <ember/profile/step_log.hpp>

#include "args.hpp"

namespace examples {

// The two flags, to merge into an example's defaults.
inline std::map<std::string, std::string> with_observe_flags(std::map<std::string, std::string> defaults) {
  defaults.emplace("profile", "");
  defaults.emplace("log-dir", "");
  return defaults;
}

class Observe {
 public:
  Observe(const Args& args, const ember::logging::HParams& hparams)
      : trace_path_(args.str("profile")), log_dir_(args.str("log-dir")) {
    if (!log_dir_.empty()) {
      log_ = std::make_unique<ember::logging::MetricsLogger>(log_dir_);
      log_->log_hparams(hparams);
    }
    if (!trace_path_.empty() || log_) {
      monitor_ = std::make_unique<ember::profile::DeviceMonitor>(
          ember::profile::DeviceMonitorOptions{.interval = std::chrono::milliseconds(200)});
      monitor_->start();
    }
    if (!trace_path_.empty() || log_) {
      // The step report's figures for the log need the profiler too; only --profile writes a trace.
      profiler_ = std::make_unique<ember::profile::Profiler>(
          ember::profile::ProfilerOptions{.trace_path = trace_path_, .window = 20});
      profiler_->start();
    }
  }

  // The end of a training step.
  void step(int64_t step, double loss, int64_t samples, double lr) {
    if (profiler_) profiler_->step(samples);
    if (!log_) return;
    log_->log_scalars(step, {{"train/loss", loss}, {"train/lr", lr}});
    if (step % 10 == 0) monitor_->log_to(*log_, step);
  }

  // Stops recording; prints the table, step report and verdict (--profile); logs the averaged
  // figures (--log-dir).
  void finish(int64_t last_step) {
    if (!profiler_) return;
    profiler_->stop();
    monitor_->stop();
    monitor_->feed(*profiler_);
    if (!trace_path_.empty()) {
      profiler_->write_chrome_trace(trace_path_);  // again, now with the monitor's counters
      std::printf("%s\n%s", profiler_->key_averages().table(ember::profile::SortBy::SelfHost, 20).c_str(),
                  profiler_->step_report().c_str());
      std::printf("Device monitor: %s\nTrace: %s (chrome://tracing or https://ui.perfetto.dev)\n",
                  monitor_->status().c_str(), trace_path_.c_str());
    }
    if (log_) {
      ember::profile::log_step_figures(*log_, last_step, profiler_->average_figures());
      std::string verdict;
      for (const auto& v : ember::profile::verdict(profiler_->average_figures())) verdict += "- " + v.message + "\n";
      log_->log_text(last_step, "profile/verdict", verdict);
      log_->close();
      std::printf("Logs: %s (tensorboard --logdir %s)\n", log_dir_.c_str(), log_dir_.c_str());
    }
  }

 private:
  std::string trace_path_, log_dir_;
  std::unique_ptr<ember::logging::MetricsLogger> log_;
  std::unique_ptr<ember::profile::DeviceMonitor> monitor_;
  std::unique_ptr<ember::profile::Profiler> profiler_;
};

}  // namespace examples
