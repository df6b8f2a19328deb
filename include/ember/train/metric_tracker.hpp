#pragma once
// train::MetricTracker: the best value of one validation metric so far, where it was reached, and
// how many validations in a row have not beaten it. The Trainer keeps one for the best-by-metric
// checkpoint (CheckpointPolicy::best_metric) and one for early stopping (EarlyStopping), and
// stores both in its checkpoints (to_json / load_json), so a resumed run goes on comparing
// against the same best.
//
//   train::MetricTracker t("val/loss", train::MetricMode::Min, /*min_delta=*/1e-3);
//   if (t.observe(metrics, step)) save_best(step);
//   if (t.validations_without_improvement() >= patience) stop();
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "ember/core/error.hpp"

namespace ember::train {

// Metric values by name ("val/loss", "val/accuracy", "train/loss", ...).
using Metrics = std::map<std::string, double>;

// Whether a larger or a smaller metric value is better.
enum class MetricMode { Max, Min };

class MetricTracker {
 public:
  MetricTracker() = default;
  // metric: the key of Metrics to follow (empty: follows nothing). A value improves on the best
  // when it beats it by more than min_delta (>= 0) in the mode's direction.
  MetricTracker(std::string metric, MetricMode mode, double min_delta = 0)
      : metric_(std::move(metric)), mode_(mode), min_delta_(min_delta) {
    EMBER_CHECK(min_delta_ >= 0, ValueError, "MetricTracker: min_delta must be >= 0, got ", min_delta_);
  }

  const std::string& metric() const { return metric_; }
  MetricMode mode() const { return mode_; }
  bool enabled() const { return !metric_.empty(); }

  // Takes one validation's metrics, reached at `step`. Returns whether the metric improved on the
  // best (its first value always does); otherwise one more validation without improvement.
  // Metrics without the followed key (or a tracker that follows none) change nothing.
  bool observe(const Metrics& metrics, int64_t step) {
    if (!enabled()) return false;
    const auto it = metrics.find(metric_);
    if (it == metrics.end()) return false;
    if (has_best_ && !improves(it->second)) {
      ++without_improvement_;
      return false;
    }
    has_best_ = true;
    best_ = it->second;
    best_step_ = step;
    without_improvement_ = 0;
    return true;
  }

  // Whether v would improve on the best (any value does before the first).
  bool improves(double v) const {
    if (!has_best_) return true;
    return mode_ == MetricMode::Max ? v > best_ + min_delta_ : v < best_ - min_delta_;
  }

  bool has_best() const { return has_best_; }
  double best() const { return best_; }
  int64_t best_step() const { return best_step_; }  // -1 before the first value
  int64_t validations_without_improvement() const { return without_improvement_; }

  // Sets the whole state (what load_json reads; also for state kept in another layout).
  void restore(bool has_best, double best, int64_t best_step, int64_t validations_without_improvement) {
    has_best_ = has_best;
    best_ = best;
    best_step_ = best_step;
    without_improvement_ = validations_without_improvement;
  }

  // {"metric", "has_best", "best", "best_step", "without_improvement"}. A best that is not finite
  // is written as null (JSON has no NaN or infinity) and read back as NaN.
  nlohmann::json to_json() const {
    return {{"metric", metric_},
            {"has_best", has_best_},
            {"best", std::isfinite(best_) ? nlohmann::json(best_) : nlohmann::json(nullptr)},
            {"best_step", best_step_},
            {"without_improvement", without_improvement_}};
  }

  // Reads what to_json wrote; the metric, mode and min_delta stay this tracker's own (options of
  // the run that resumes). FormatError naming `who` when a field is missing or of another type.
  void load_json(const nlohmann::json& j, const std::string& who) {
    try {
      const nlohmann::json& b = j.at("best");
      restore(j.at("has_best").get<bool>(), b.is_null() ? std::numeric_limits<double>::quiet_NaN() : b.get<double>(),
              j.at("best_step").get<int64_t>(), j.at("without_improvement").get<int64_t>());
    } catch (const nlohmann::json::exception& e) {
      throw FormatError(who + ": bad metric tracker state: " + e.what());
    }
  }

 private:
  std::string metric_;
  MetricMode mode_ = MetricMode::Max;
  double min_delta_ = 0;
  bool has_best_ = false;
  double best_ = 0;
  int64_t best_step_ = -1;
  int64_t without_improvement_ = 0;
};

}  // namespace ember::train
