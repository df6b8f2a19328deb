#pragma once
// logging::MetricsSink: where a logging::MetricsLogger's records go (metrics_logger.hpp has the
// file sinks, mlflow.hpp the MLflow one), and the value types they share. Its own header so that
// a sink in another header (MlflowSink) and the logger that makes it need not include each other.
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace ember::logging {

using Scalars = std::vector<std::pair<std::string, double>>;

// A hyperparameter value: a number or a string.
using HParam = std::variant<double, std::string>;
using HParams = std::vector<std::pair<std::string, HParam>>;

// How the run a logger records ended (what MLflow shows as the run's status).
enum class RunOutcome { Finished, Failed, Killed };

class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  virtual void scalars(int64_t step, double wall_time, const Scalars& values) = 0;
  virtual void text(int64_t step, double wall_time, const std::string& tag, const std::string& text) = 0;
  virtual void flush() = 0;
  virtual void close() = 0;
  // Refuses (with ValueError) a tag this sink cannot store; called for every tag before any sink
  // writes, so that a refused record is written nowhere.
  virtual void check_tag(const std::string& /*tag*/) const {}
  // The hyperparameters (the file sinks leave them to hparams.json).
  virtual void hparams(const HParams& /*hp*/) {}
  // A resumed run logs again from `step` + 1: a sink that can rewrite its history drops what an
  // interrupted process logged after `step` (the others append).
  virtual void resume_at(int64_t /*step*/) {}
  // How the run ended, told before close().
  virtual void outcome(RunOutcome /*how*/) {}
};

}  // namespace ember::logging
