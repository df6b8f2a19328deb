#pragma once
// logging::MlflowRun: one MLflow run in MLflow's file store (an mlruns/ folder), written by ember
// itself (no Python, no server): `mlflow ui --backend-store-uri <dir>` and
// MlflowClient(tracking_uri="file://<dir>") read it. logging::MlflowSink puts a MetricsLogger's
// scalars and hyperparameters into one (MetricsLoggerOptions::mlflow).
//
//   logging::MetricsLogger log("runs/a", {.mlflow = {.tracking_dir = "mlruns", .experiment = "mnist"}});
//   log.log_hparams({{"lr", 0.1}});                    // params/lr
//   log.log_scalars(10, {{"train/loss", 0.42}});       // metrics/train/loss: "<ms> 0.42 10"
//   log.mlflow()->set_tag("dataset", "mnist-v2");
//   log.mlflow()->log_artifact("runs/a/model.onnx");   // artifacts/model.onnx
//
// The run's status (meta.yaml) is RUNNING while it is open, then FINISHED, FAILED or KILLED
// (RunOutcome). The run id is kept in <log_dir>/mlflow_run_id; with `resume`, a later process
// continues that run, and resume_at(step) drops the metric values an interrupted process logged
// after the checkpoint it resumes from, so that the history reads as one uninterrupted run.
//
// Crash safety: a metric value is one line handed to the kernel in one append; meta.yaml,
// params, tags, rewritten metric files and artifacts are staged in <run>/.ember-staging and
// renamed into place, so a reader sees the old content or the new, never a part.
// Names: keys as MLflow accepts them (mlflow_files::check_key, ValueError otherwise); params
// cannot change value once logged (MLflow's rule). Thread-safe: one mutex per run.
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/io/atomic_file.hpp"
#include "ember/logging/file_write.hpp"
#include "ember/logging/metrics_sink.hpp"
#include "ember/logging/mlflow_files.hpp"

namespace ember::logging {

struct MlflowOptions {
  std::filesystem::path tracking_dir;  // the mlruns folder (created when missing); empty: no MLflow run
  std::string experiment = "Default";  // found by name; created when missing
  std::string run_name;                // empty: the log folder's name
  std::string run_id;                  // continue this run (it must exist); empty: see `resume`
  bool resume = false;                 // continue the run <log_dir>/mlflow_run_id names (a new one when none)
  bool log_checkpoints = true;         // Trainer: the last and the best checkpoint go into artifacts/checkpoints/
};

class MlflowRun {
 public:
  // Opens the run: options.run_id's, else (with options.resume) the one id_file names, else a new
  // one in options.experiment. The id is written to id_file (when not empty).
  MlflowRun(const MlflowOptions& options, const std::filesystem::path& id_file = {},
            const std::string& default_run_name = "")
      : options_(options), root_(options.tracking_dir) {
    EMBER_CHECK(!root_.empty(), ValueError, "MlflowRun: tracking_dir is empty");
    std::string id = options.run_id;
    if (id.empty() && options.resume && !id_file.empty() && std::filesystem::exists(id_file)) {
      id = mlflow_files::read_text(id_file);
      while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
    }
    ensure_root();
    if (id.empty()) {
      create(options.run_name.empty() ? default_run_name : options.run_name);
    } else {
      reopen(id, id_file);
    }
    if (!id_file.empty()) io::write_file_atomic(id_file, run_id_ + "\n");
  }
  // A run destroyed by an exception unwinding the stack ends FAILED.
  ~MlflowRun() {
    try {
      end(std::uncaught_exceptions() > uncaught_at_start_ ? RunOutcome::Failed : RunOutcome::Finished);
    } catch (...) {  // a destructor must not throw; the metrics are on disk already
    }
  }
  MlflowRun(const MlflowRun&) = delete;
  MlflowRun& operator=(const MlflowRun&) = delete;

  const std::string& run_id() const { return run_id_; }
  const std::string& experiment_id() const { return experiment_id_; }
  const std::string& run_name() const { return run_name_; }
  const std::filesystem::path& run_dir() const { return run_dir_; }
  std::filesystem::path artifact_dir() const { return run_dir_ / "artifacts"; }
  bool continued() const { return continued_; }  // an existing run was reopened
  const MlflowOptions& options() const { return options_; }

  void log_metric(const std::string& key, double value, int64_t step, int64_t timestamp_ms = mlflow_files::now_ms()) {
    log_metrics(step, {{key, value}}, timestamp_ms);
  }
  // Every key is checked before any value is written.
  void log_metrics(int64_t step, const Scalars& values, int64_t timestamp_ms = mlflow_files::now_ms()) {
    for (const auto& [key, v] : values) mlflow_files::check_key("metric", key);
    std::lock_guard<std::mutex> lock(mutex_);
    check_open("log_metrics");
    for (const auto& [key, v] : values) {
      std::string line = std::to_string(timestamp_ms) + " ";
      mlflow_files::append_metric_value(line, v);
      line += " " + std::to_string(step) + "\n";
      metric_file(key).append(line);
    }
  }
  void log_param(const std::string& key, const std::string& value) { log_params({{key, value}}); }
  // A number is written as its shortest round-trip text ("0.1", "64").
  void log_params(const HParams& params) {
    std::vector<std::pair<std::string, std::string>> texts;
    for (const auto& [key, v] : params) {
      mlflow_files::check_key("param", key);
      std::string text;
      if (const double* d = std::get_if<double>(&v)) mlflow_files::append_metric_value(text, *d);
      else text = std::get<std::string>(v);
      EMBER_CHECK(text.size() <= mlflow_files::kMaxParamValueLength, ValueError, "MLflow: param '", key,
                  "' has a value of ", text.size(), " characters; MLflow allows at most ",
                  mlflow_files::kMaxParamValueLength);
      texts.emplace_back(key, std::move(text));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    check_open("log_params");
    for (const auto& [key, text] : texts) {
      const std::filesystem::path p = run_dir_ / "params" / key;
      if (std::filesystem::exists(p)) {
        const std::string old = mlflow_files::read_text(p);
        EMBER_CHECK(old == text, ValueError, "MLflow: param '", key, "' of run ", run_id_, " was logged as '", old,
                    "'; MLflow does not let a param change (to '", text,
                    "'): start a new run (another log folder, or resume = false)");
      }
    }
    for (const auto& [key, text] : texts) write_staged(run_dir_ / "params" / key, text);
  }
  void set_tag(const std::string& key, const std::string& value) {
    mlflow_files::check_key("tag", key);
    EMBER_CHECK(value.size() <= mlflow_files::kMaxTagValueLength, ValueError, "MLflow: tag '", key, "' has a value of ",
                value.size(), " characters; MLflow allows at most ", mlflow_files::kMaxTagValueLength);
    std::lock_guard<std::mutex> lock(mutex_);
    check_open("set_tag");
    write_staged(run_dir_ / "tags" / key, value);
  }

  // Copies a file or a folder (with its contents) to artifacts/<artifact_path>/<its name>,
  // replacing an earlier artifact of that name; returns where it went.
  std::filesystem::path log_artifact(const std::filesystem::path& local, const std::string& artifact_path = "") {
    namespace fs = std::filesystem;
    EMBER_CHECK(fs::exists(local), IOError, "MLflow: log_artifact: '", local.string(), "' does not exist");
    if (!artifact_path.empty()) mlflow_files::check_key("artifact path", artifact_path);
    std::lock_guard<std::mutex> lock(mutex_);
    check_open("log_artifact");
    const fs::path name = fs::absolute(local).lexically_normal().filename().empty()
                              ? fs::absolute(local).lexically_normal().parent_path().filename()
                              : fs::absolute(local).lexically_normal().filename();
    const fs::path dest_dir = artifact_dir() / artifact_path, dest = dest_dir / name;
    const fs::path staged = staging_dir() / io::detail::temp_name_for(dest);
    std::error_code ec;
    fs::copy(local, staged, fs::copy_options::recursive | fs::copy_options::copy_symlinks, ec);
    if (!ec) fs::create_directories(dest_dir, ec);
    if (!ec && fs::exists(dest)) fs::remove_all(dest, ec);
    if (!ec) fs::rename(staged, dest, ec);
    if (ec) {
      std::error_code ignored;
      fs::remove_all(staged, ignored);
      throw IOError(::ember::detail::str_cat("MLflow: log_artifact: cannot copy '", local.string(), "' to '",
                                             dest.string(), "': ", ec.message()));
    }
    io::fsync_directory(dest_dir);
    return dest;
  }

  // Drops the metric values of steps after `step` (what an interrupted process logged after the
  // checkpoint a resumed run starts from), rewriting each metric file atomically.
  void discard_after(int64_t step) {
    namespace fs = std::filesystem;
    std::lock_guard<std::mutex> lock(mutex_);
    check_open("discard_after");
    metrics_.clear();  // the appenders would keep writing to the replaced files
    const fs::path dir = run_dir_ / "metrics";
    if (!fs::exists(dir)) return;
    std::vector<fs::path> files;
    for (const auto& e : fs::recursive_directory_iterator(dir))
      if (e.is_regular_file()) files.push_back(e.path());
    for (const fs::path& f : files) {
      const std::string text = mlflow_files::read_text(f);
      std::string kept;
      size_t i = 0;
      while (i < text.size()) {
        const size_t eol = text.find('\n', i);
        if (eol == std::string::npos) break;  // a line without its end: never complete
        const std::string line = text.substr(i, eol - i + 1);
        i = eol + 1;
        long long ts = 0, s = 0;
        char value[64];
        if (std::sscanf(line.c_str(), "%lld %63s %lld", &ts, value, &s) == 3 && s <= step) kept += line;
      }
      if (kept != text) write_staged(f, kept);
    }
  }

  void flush() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [key, f] : metrics_) f.sync();
  }
  // Closes the run with its status and end time (a second call does nothing).
  void end(RunOutcome how = RunOutcome::Finished) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ended_) return;
    ended_ = true;
    for (auto& [key, f] : metrics_) f.close();
    metrics_.clear();
    write_run_meta(how == RunOutcome::Finished ? 3 : how == RunOutcome::Failed ? 4 : 5, mlflow_files::now_ms());
  }
  bool ended() const { return ended_; }

 private:
  void check_open(const char* op) const {
    EMBER_CHECK(!ended_, ValueError, "MlflowRun.", op, ": run ", run_id_, " has ended");
  }

  // The root folder, with MLflow's "Default" experiment (id 0, unless deleted) and .trash, as
  // MLflow's own store makes them.
  void ensure_root() {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::create_directories(root_, ec);
    EMBER_CHECK(!ec && fs::is_directory(root_), IOError, "MLflow: cannot create the tracking folder '",
                root_.string(), "': ", ec ? ec.message() : std::string("not a folder"));
    if (!fs::exists(root_ / "0") && !fs::exists(root_ / ".trash" / "0")) write_experiment_meta("0", "Default");
    fs::create_directories(root_ / ".trash", ec);
    EMBER_CHECK(!ec, IOError, "MLflow: cannot create '", (root_ / ".trash").string(), "': ", ec.message());
  }

  void write_experiment_meta(const std::string& id, const std::string& name) {
    const int64_t now = mlflow_files::now_ms();
    std::filesystem::create_directories(root_ / id);
    io::write_file_atomic(root_ / id / "meta.yaml",
                          "artifact_location: " + mlflow_files::yaml_string(mlflow_files::file_uri(root_ / id)) +
                              "\ncreation_time: " + std::to_string(now) + "\nexperiment_id: '" + id +
                              "'\nlast_update_time: " + std::to_string(now) + "\nlifecycle_stage: active\nname: " +
                              mlflow_files::yaml_string(name) + "\n");
  }

  // The experiment's id: the active one of that name, or a new one.
  std::string find_or_create_experiment(const std::string& name) {
    namespace fs = std::filesystem;
    const size_t first = name.find_first_not_of(" \t\n");
    EMBER_CHECK(first != std::string::npos, ValueError, "MLflow: the experiment name must not be empty or blank");
    EMBER_CHECK(name.size() <= mlflow_files::kMaxExperimentNameLength, ValueError, "MLflow: the experiment name has ",
                name.size(), " characters; MLflow allows at most ", mlflow_files::kMaxExperimentNameLength);
    for (const fs::path& parent : {root_, root_ / ".trash"}) {
      for (const auto& e : fs::directory_iterator(parent)) {
        if (!e.is_directory() || !fs::exists(e.path() / "meta.yaml")) continue;
        const auto meta = mlflow_files::parse_meta_yaml(mlflow_files::read_text(e.path() / "meta.yaml"));
        const auto n = meta.find("name");
        if (n == meta.end() || n->second != name) continue;
        const auto stage = meta.find("lifecycle_stage");
        const bool deleted = parent != root_ || (stage != meta.end() && stage->second == "deleted");
        EMBER_CHECK(!deleted, ValueError, "MLflow: experiment '", name, "' exists in the deleted state (",
                    e.path().string(), "): restore it or pick another name");
        return e.path().filename().string();
      }
    }
    // A new id, as MLflow makes them: a random positive integer; create_directory claims it.
    std::random_device rd;
    std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd());
    for (int attempt = 0;; ++attempt) {
      const std::string id = name == "Default" && attempt == 0 ? "0" : std::to_string(gen() % 900000000000000000ull + 100000000000000000ull);
      std::error_code ec;
      if (fs::create_directory(root_ / id, ec)) {
        write_experiment_meta(id, name);
        return id;
      }
      EMBER_CHECK(!ec && attempt < 100, IOError, "MLflow: cannot create an experiment folder in '", root_.string(),
                  "': ", ec ? ec.message() : std::string("every id tried is taken"));
    }
  }

  void create(const std::string& name) {
    namespace fs = std::filesystem;
    experiment_id_ = find_or_create_experiment(options_.experiment);
    std::random_device rd;
    std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd());
    char hex[33];
    std::snprintf(hex, sizeof hex, "%016llx%016llx", static_cast<unsigned long long>(gen()),
                  static_cast<unsigned long long>(gen()));
    run_id_ = hex;
    run_name_ = name.empty() ? "ember-" + run_id_.substr(0, 8) : name;
    run_dir_ = root_ / experiment_id_ / run_id_;
    start_time_ = mlflow_files::now_ms();
    artifact_uri_ = mlflow_files::file_uri(artifact_dir());
    user_ = mlflow_files::user_name();
    std::error_code ec;
    for (const char* sub : {"metrics", "params", "artifacts", "tags"}) fs::create_directories(run_dir_ / sub, ec);
    EMBER_CHECK(!ec, IOError, "MLflow: cannot create the run folder '", run_dir_.string(), "': ", ec.message());
    write_staged(run_dir_ / "tags" / "mlflow.runName", run_name_);
    write_staged(run_dir_ / "tags" / "mlflow.user", user_);
    write_staged(run_dir_ / "tags" / "mlflow.source.type", "LOCAL");
    std::error_code exe_ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", exe_ec);
    if (!exe_ec) write_staged(run_dir_ / "tags" / "mlflow.source.name", exe.string());
    write_run_meta(1, -1);
  }

  void reopen(const std::string& id, const std::filesystem::path& id_file) {
    namespace fs = std::filesystem;
    const std::string from = options_.run_id.empty() ? " (named in '" + id_file.string() + "')" : "";
    bool ok = !id.empty() && id.size() <= 256;
    for (char c : id) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-');
    EMBER_CHECK(ok, ValueError, "MLflow: '", id, "'", from, " is not a run id");
    for (const auto& e : fs::directory_iterator(root_)) {
      if (e.is_directory() && e.path().filename() != ".trash" && fs::exists(e.path() / id / "meta.yaml")) {
        run_dir_ = e.path() / id;
        break;
      }
    }
    EMBER_CHECK(!run_dir_.empty(), ValueError, "MLflow: run ", id, from, " is not in '", root_.string(),
                "' (an active run of an active experiment)");
    const auto meta = mlflow_files::parse_meta_yaml(mlflow_files::read_text(run_dir_ / "meta.yaml"));
    auto get = [&](const char* k) {
      const auto it = meta.find(k);
      return it == meta.end() ? std::string() : it->second;
    };
    EMBER_CHECK(get("lifecycle_stage") != "deleted", ValueError, "MLflow: run ", id, from, " is deleted");
    run_id_ = id;
    experiment_id_ = run_dir_.parent_path().filename().string();
    run_name_ = get("run_name");
    artifact_uri_ = get("artifact_uri");
    user_ = get("user_id");
    const std::string start = get("start_time");
    start_time_ = start.empty() ? mlflow_files::now_ms() : std::stoll(start);
    continued_ = true;
    for (const char* sub : {"metrics", "params", "artifacts", "tags"}) fs::create_directories(run_dir_ / sub);
    write_run_meta(1, -1);
  }

  // status: RUNNING 1, FINISHED 3, FAILED 4, KILLED 5 (mlflow.entities.RunStatus); end -1: none.
  void write_run_meta(int status, int64_t end_time) {
    using mlflow_files::yaml_string;
    std::string m = "artifact_uri: " + yaml_string(artifact_uri_) + "\n";
    m += "deleted_time: null\n";
    m += "end_time: " + (end_time < 0 ? std::string("null") : std::to_string(end_time)) + "\n";
    m += "entry_point_name: ''\nexperiment_id: '" + experiment_id_ + "'\nlifecycle_stage: active\n";
    m += "run_id: " + run_id_ + "\nrun_name: " + yaml_string(run_name_) + "\nrun_uuid: " + run_id_ + "\n";
    m += "source_name: ''\nsource_type: 4\nsource_version: ''\n";
    m += "start_time: " + std::to_string(start_time_) + "\nstatus: " + std::to_string(status) + "\n";
    m += "tags: []\nuser_id: " + yaml_string(user_) + "\n";
    write_staged(run_dir_ / "meta.yaml", m);
  }

  std::filesystem::path staging_dir() {
    const std::filesystem::path d = run_dir_ / ".ember-staging";
    std::error_code ec;
    std::filesystem::create_directories(d, ec);
    EMBER_CHECK(!ec, IOError, "MLflow: cannot create '", d.string(), "': ", ec.message());
    return d;
  }
  // Written whole in the staging folder, then renamed into place (MLflow lists every file under
  // params/, tags/ and metrics/, so no temporary file may appear there).
  void write_staged(const std::filesystem::path& target, const std::string& text) {
    const std::filesystem::path staged = staging_dir() / io::detail::temp_name_for(target);
    io::write_file_atomic(staged, text);
    std::error_code ec;
    std::filesystem::create_directories(target.parent_path(), ec);
    if (ec || ::rename(staged.c_str(), target.c_str()) != 0) {
      const int err = ec ? ec.value() : errno;
      ::unlink(staged.c_str());
      io::detail::throw_io("MLflow: cannot write", target.string(), err);
    }
    io::fsync_directory(target.parent_path());
  }

  AppendFile& metric_file(const std::string& key) {
    auto it = metrics_.find(key);
    if (it != metrics_.end()) return it->second;
    const std::filesystem::path p = run_dir_ / "metrics" / key;
    std::error_code ec;
    std::filesystem::create_directories(p.parent_path(), ec);
    EMBER_CHECK(!ec, IOError, "MLflow: cannot create '", p.parent_path().string(), "': ", ec.message());
    return metrics_.emplace(key, AppendFile(p)).first->second;
  }

  MlflowOptions options_;
  std::filesystem::path root_, run_dir_;
  std::string run_id_, experiment_id_, run_name_, artifact_uri_, user_;
  int64_t start_time_ = 0;
  bool continued_ = false, ended_ = false;
  int uncaught_at_start_ = std::uncaught_exceptions();
  std::map<std::string, AppendFile> metrics_;
  std::mutex mutex_;
};

// A MetricsLogger's sink into an MlflowRun: scalars become metrics (timestamp = the record's wall
// time), hyperparameters params; text records are not MLflow's and are left to the other sinks.
class MlflowSink : public MetricsSink {
 public:
  MlflowSink(const MlflowOptions& options, const std::filesystem::path& log_dir)
      : run_(options, log_dir / "mlflow_run_id", log_dir.filename().string()) {}
  void scalars(int64_t step, double wall_time, const Scalars& values) override {
    run_.log_metrics(step, values, static_cast<int64_t>(std::llround(wall_time * 1000.0)));
  }
  void text(int64_t, double, const std::string&, const std::string&) override {}
  void flush() override { run_.flush(); }
  void close() override { run_.end(outcome_); }
  void check_tag(const std::string& tag) const override { mlflow_files::check_key("metric", tag); }
  void hparams(const HParams& hp) override { run_.log_params(hp); }
  void resume_at(int64_t step) override { run_.discard_after(step); }
  void outcome(RunOutcome how) override { outcome_ = how; }
  MlflowRun& run() { return run_; }

 private:
  MlflowRun run_;
  RunOutcome outcome_ = RunOutcome::Finished;
};

}  // namespace ember::logging
