#pragma once
// The profiler of a train::Trainer fit (TrainerOptions::profile, rank 0): it records
// ProfileWindow::steps optimizer steps after ProfileWindow::start_step steps of the fit, then
// reports once, through the progress output and the logger.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "ember/logging/metrics_logger.hpp"
#include "ember/profile/profiler.hpp"
#include "ember/profile/step_log.hpp"
#include "ember/profile/verdict.hpp"
#include "ember/train/progress.hpp"
#include "ember/train/trainer.hpp"

namespace ember::train::trainer_detail {

class ProfileWindowRecorder {
 public:
  // enabled: this rank profiles (rank 0, and window.steps > 0).
  ProfileWindowRecorder(const ProfileWindow& window, bool enabled) : window_(window), enabled_(enabled && window.steps > 0) {}

  // Before an optimizer step; steps_done: the optimizer steps of this fit so far.
  void start_if_due(int64_t steps_done) {
    if (!enabled_ || done_ || profiler_ || steps_done < window_.start_step) return;
    profiler_ = std::make_unique<profile::Profiler>(profile::ProfilerOptions{
        .trace_path = window_.trace_path,
        .window = static_cast<int>(std::min<int64_t>(window_.steps, 1 << 20)),
        .first_step_is_warmup = false});  // the window starts after the fit's warm-up steps
    profiler_->start();
  }

  // After an optimizer step of `samples` samples that brought the run to `step`: the report when
  // the window is full.
  void step_done(int64_t samples, int64_t step, ProgressBar& progress, logging::MetricsLogger* logger) {
    if (!recording()) return;
    profiler_->step(samples);
    if (++steps_ >= window_.steps) report(step, progress, logger);
  }

  // Stops the profiler and reports what it recorded: the op table (ProfileWindow::table_rows),
  // the step report, the verdict, the trace's path. Nothing when it is not recording.
  void report(int64_t step, ProgressBar& progress, logging::MetricsLogger* logger) {
    if (!recording()) return;
    profiler_->stop();
    done_ = true;
    const profile::StepFigures f = profiler_->average_figures();
    std::string text = "profile (" + std::to_string(steps_) + " steps):\n";
    if (window_.table_rows > 0) text += profiler_->key_averages().table(profile::SortBy::SelfHost, window_.table_rows);
    text += profiler_->step_breakdown();  // the verdict once, below, as it is also logged
    std::string verdict;
    for (const auto& v : profile::verdict(f)) verdict += "- " + v.message + "\n";
    text += "verdict:\n" + verdict;
    if (!window_.trace_path.empty()) text += "trace: " + window_.trace_path + "\n";
    if (!text.empty() && text.back() == '\n') text.pop_back();
    progress.message(text);
    if (logger) {
      profile::log_step_figures(*logger, step, f);
      logger->log_text(step, "profile/verdict", verdict);
    }
  }

  // Stops a recording profiler without a report (fit is leaving with an exception).
  void abandon() noexcept {
    if (!recording()) return;
    try {
      profiler_->stop();
    } catch (...) {
    }
  }

 private:
  bool recording() const { return profiler_ && profiler_->is_recording(); }

  const ProfileWindow& window_;
  const bool enabled_;
  std::unique_ptr<profile::Profiler> profiler_;
  bool done_ = false;   // reported: one window per fit
  int64_t steps_ = 0;   // steps recorded
};

}  // namespace ember::train::trainer_detail
