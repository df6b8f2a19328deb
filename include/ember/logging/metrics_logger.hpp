#pragma once
// logging::MetricsLogger: experiment tracking into a folder, through sinks:
//   metrics.jsonl   one JSON object per log call: {"step":..,"wall_time":..,"<tag>":value,...}
//                   (text: {"step":..,"wall_time":..,"tag":..,"text":..})
//   metrics.csv     long format, one row per value: step,wall_time,tag,value (RFC 4180 quoting)
//   events.out.tfevents.*  TensorBoard scalars and text (logging/event_file.hpp)
//   hparams.json    the hyperparameters, written atomically (also logged as a text summary)
//   mlflow_run_id   with MetricsLoggerOptions::mlflow: the MLflow run the scalars and
//                   hyperparameters also go to (logging/mlflow.hpp: an mlruns/ folder)
//
//   logging::MetricsLogger log("runs/exp1");
//   log.log_hparams({{"lr", 0.1}, {"optimizer", "sgd"}});
//   log.log_scalars(step, {{"train/loss", loss}, {"train/accuracy", acc}});
//
// Files are append-only and every record is handed to the kernel as it is logged (a killed run
// keeps what it logged; flush() also fsyncs). The namespace is ember::logging because ember::log
// is the logarithm. Thread-safe: one mutex per logger.
#include <cmath>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/io/atomic_file.hpp"
#include "ember/logging/event_file.hpp"
#include "ember/logging/file_write.hpp"
#include "ember/logging/json_text.hpp"
#include "ember/logging/metrics_sink.hpp"
#include "ember/logging/mlflow.hpp"

namespace ember::logging {

class JsonlSink : public MetricsSink {
 public:
  explicit JsonlSink(const std::filesystem::path& path) : file_(path) {}
  void scalars(int64_t step, double wall_time, const Scalars& values) override {
    std::string line = record_start(step, wall_time);
    for (const auto& [tag, v] : values) {
      line += ',';
      append_json_string(line, tag);
      line += ':';
      append_json_number(line, v);
    }
    end_record(line);
  }
  void text(int64_t step, double wall_time, const std::string& tag, const std::string& text) override {
    std::string line = record_start(step, wall_time);
    line += ",\"tag\":";
    append_json_string(line, tag);
    line += ",\"text\":";
    append_json_string(line, text);
    end_record(line);
  }
  void flush() override { file_.sync(); }
  void close() override { file_.close(); }

 private:
  // The start of every record: {"step":..,"wall_time":..
  static std::string record_start(int64_t step, double wall_time) {
    std::string line = "{\"step\":" + std::to_string(step) + ",\"wall_time\":";
    append_json_number(line, wall_time);
    return line;
  }
  void end_record(std::string& line) {
    line += "}\n";
    file_.append(line);
  }

  AppendFile file_;
};

class CsvSink : public MetricsSink {
 public:
  explicit CsvSink(const std::filesystem::path& path) {
    const bool fresh = !std::filesystem::exists(path) || std::filesystem::file_size(path) == 0;
    file_ = AppendFile(path);
    if (fresh) file_.append("step,wall_time,tag,value\n");
  }
  void scalars(int64_t step, double wall_time, const Scalars& values) override {
    std::string rows;
    for (const auto& [tag, v] : values) {
      rows += std::to_string(step) + ",";
      append_json_number(rows, wall_time);
      rows += "," + quote(tag) + ",";
      if (std::isfinite(v)) append_json_number(rows, v);
      else rows += std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
      rows += "\n";
    }
    file_.append(rows);
  }
  void text(int64_t, double, const std::string&, const std::string&) override {}  // scalars only
  void flush() override { file_.sync(); }
  void close() override { file_.close(); }

  // RFC 4180: a field with a comma, quote or line break is quoted, quotes doubled.
  static std::string quote(const std::string& s) {
    if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  }

 private:
  AppendFile file_;
};

class TensorBoardSink : public MetricsSink {
 public:
  explicit TensorBoardSink(const std::filesystem::path& dir) : writer_(dir) {}
  void scalars(int64_t step, double wall_time, const Scalars& values) override {
    std::vector<std::string> vs;
    for (const auto& [tag, v] : values) vs.push_back(scalar_value(tag, static_cast<float>(v)));
    writer_.write(summary_event(wall_time, step, vs));
  }
  void text(int64_t step, double wall_time, const std::string& tag, const std::string& text) override {
    writer_.write(summary_event(wall_time, step, {text_value(tag, text)}));
  }
  void flush() override { writer_.flush(); }
  void close() override { writer_.close(); }
  const std::filesystem::path& path() const { return writer_.path(); }

 private:
  EventFileWriter writer_;
};

struct MetricsLoggerOptions {
  bool jsonl = true;
  bool csv = true;
  bool tensorboard = true;
  MlflowOptions mlflow = {};  // an MLflow run too, when mlflow.tracking_dir is set
};

class MetricsLogger {
 public:
  explicit MetricsLogger(const std::filesystem::path& dir, MetricsLoggerOptions options = {}) : dir_(dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    EMBER_CHECK(!ec && std::filesystem::is_directory(dir_), IOError, "MetricsLogger: cannot create the log folder '",
                dir_.string(), "': ", ec ? ec.message() : std::string("not a folder"));
    if (options.jsonl) sinks_.push_back(std::make_unique<JsonlSink>(dir_ / "metrics.jsonl"));
    if (options.csv) sinks_.push_back(std::make_unique<CsvSink>(dir_ / "metrics.csv"));
    if (options.tensorboard) {
      auto tb = std::make_unique<TensorBoardSink>(dir_);
      event_file_ = tb->path();
      sinks_.push_back(std::move(tb));
    }
    if (!options.mlflow.tracking_dir.empty()) {
      auto ml = std::make_unique<MlflowSink>(options.mlflow, dir_);
      mlflow_ = &ml->run();
      sinks_.push_back(std::move(ml));
    }
  }
  // A logger destroyed by an exception unwinding the stack records a failed run.
  ~MetricsLogger() {
    try {
      if (std::uncaught_exceptions() > uncaught_at_start_) set_outcome(RunOutcome::Failed);
      close();
    } catch (...) {  // a destructor must not throw: the data was handed to the kernel already
    }
  }
  MetricsLogger(const MetricsLogger&) = delete;
  MetricsLogger& operator=(const MetricsLogger&) = delete;

  // Adds a sink of the caller's (a network client, a test probe).
  void add_sink(std::unique_ptr<MetricsSink> sink) {
    std::lock_guard<std::mutex> lock(mutex_);
    sinks_.push_back(std::move(sink));
  }

  void log_scalar(int64_t step, const std::string& tag, double value) { log_scalars(step, {{tag, value}}); }
  void log_scalars(int64_t step, const Scalars& values) {
    for (const auto& [tag, v] : values) check_tag(tag);
    std::lock_guard<std::mutex> lock(mutex_);
    check_open();
    for (const auto& [tag, v] : values)
      for (const auto& s : sinks_) s->check_tag(tag);
    const double wall = EventFileWriter::wall_time_now();
    for (auto& s : sinks_) s->scalars(step, wall, values);
  }
  void log_text(int64_t step, const std::string& tag, const std::string& text) {
    check_tag(tag);
    std::lock_guard<std::mutex> lock(mutex_);
    check_open();
    const double wall = EventFileWriter::wall_time_now();
    for (auto& s : sinks_) s->text(step, wall, tag, text);
  }

  // hparams.json (atomically, replacing an earlier one), a "hparams" text summary (a markdown
  // table that TensorBoard's text tab shows), and the MLflow run's params.
  void log_hparams(const HParams& hp) {
    std::string json = "{\n", table = "| hyperparameter | value |\n|---|---|\n";
    for (size_t i = 0; i < hp.size(); ++i) {
      const auto& [name, v] = hp[i];
      check_tag(name);
      json += "  ";
      append_json_string(json, name);
      json += ": ";
      std::string shown;
      if (const double* d = std::get_if<double>(&v)) {
        append_json_number(json, *d);
        append_json_number(shown, *d);
      } else {
        append_json_string(json, std::get<std::string>(v));
        shown = std::get<std::string>(v);
      }
      json += i + 1 < hp.size() ? ",\n" : "\n";
      table += "| " + name + " | " + shown + " |\n";
    }
    json += "}\n";
    {
      std::lock_guard<std::mutex> lock(mutex_);
      check_open();
      for (auto& s : sinks_) s->hparams(hp);
      io::write_file_atomic(dir_ / "hparams.json", json);
    }
    log_text(0, "hparams", table);
  }

  void flush() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& s : sinks_) s->flush();
  }
  // A resumed run continues after `step`: sinks that can rewrite their history (MLflow) drop
  // what an interrupted process logged after it; the files here are append-only and keep it.
  void resume_at(int64_t step) {
    std::lock_guard<std::mutex> lock(mutex_);
    check_open();
    for (auto& s : sinks_) s->resume_at(step);
  }
  // How the run ended (the MLflow run's status at close; Finished unless told otherwise).
  void set_outcome(RunOutcome how) {
    std::lock_guard<std::mutex> lock(mutex_);
    outcome_ = how;
  }
  void close() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    closed_ = true;
    for (auto& s : sinks_) {
      s->outcome(outcome_);
      s->close();
    }
  }

  const std::filesystem::path& dir() const { return dir_; }
  const std::filesystem::path& event_file() const { return event_file_; }  // empty without TensorBoard
  // The MLflow run (set_tag, log_artifact, run_id); null without MetricsLoggerOptions::mlflow.
  MlflowRun* mlflow() const { return mlflow_; }

 private:
  void check_open() const { EMBER_CHECK(!closed_, ValueError, "MetricsLogger: '", dir_.string(), "' is closed"); }
  static void check_tag(const std::string& tag) {
    EMBER_CHECK(!tag.empty(), ValueError, "MetricsLogger: a tag must not be empty");
  }

  std::filesystem::path dir_, event_file_;
  std::vector<std::unique_ptr<MetricsSink>> sinks_;
  MlflowRun* mlflow_ = nullptr;  // owned by its sink in sinks_
  std::mutex mutex_;
  bool closed_ = false;
  RunOutcome outcome_ = RunOutcome::Finished;
  int uncaught_at_start_ = std::uncaught_exceptions();
};

}  // namespace ember::logging
