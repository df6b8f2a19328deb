#pragma once
// The step report's figures as metrics (logging::MetricsLogger scalars under "profile/"), so that
// TensorBoard plots the breakdown beside the loss. Unknown figures (negative) are left out.
#include <cstdint>

#include "ember/logging/metrics_logger.hpp"
#include "ember/profile/verdict.hpp"

namespace ember::profile {

inline logging::Scalars step_figures_scalars(const StepFigures& f) {
  logging::Scalars s = {
      {"profile/step_ms", f.step_ms},
      {"profile/data_wait_ms", f.data_wait_ms},
      {"profile/host_to_device_ms", f.host_to_device_ms},
      {"profile/forward_ms", f.forward_ms},
      {"profile/backward_ms", f.backward_ms},
      {"profile/optimizer_ms", f.optimizer_ms},
      {"profile/communication_exposed_ms", f.communication_exposed_ms},
      {"profile/communication_total_ms", f.communication_total_ms},
      {"profile/checkpoint_save_ms", f.checkpoint_save_ms},
      {"profile/rest_ms", f.rest_ms},
  };
  if (f.samples_per_second >= 0) s.emplace_back("profile/samples_per_second", f.samples_per_second);
  if (f.device_busy >= 0) s.emplace_back("profile/device_busy", f.device_busy);
  if (f.peak_bytes >= 0) s.emplace_back("profile/peak_memory_mib", static_cast<double>(f.peak_bytes) / (1024.0 * 1024.0));
  return s;
}

inline void log_step_figures(logging::MetricsLogger& log, int64_t step, const StepFigures& f) {
  log.log_scalars(step, step_figures_scalars(f));
}

}  // namespace ember::profile
