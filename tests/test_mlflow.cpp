// logging::MlflowRun / MlflowSink: the mlruns/ folder ember writes, read back by MLflow's own
// client (MlflowClient over the file store; SKIPPED when mlflow is not importable): params,
// metric histories (values, steps, timestamps), tags, artifacts, the experiment by name, the
// run's status. A Trainer stopped by an error and resumed from its checkpoint continues the same
// run with the history of an uninterrupted run. Bad keys, changed params, unwritable folders and
// missing runs are clear errors; a half-written metric line never reaches a reader.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <sstream>
#include <string>
#include <vector>

#include "ember/ember.hpp"
#include "ember/logging/metrics_logger.hpp"
#include "ember/logging/mlflow.hpp"
#include "ember/train/trainer.hpp"
#include "python_check.hpp"
#include "temp_dir.hpp"
#include "test_util.hpp"

using namespace ember;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

// The whole file (IOError when it cannot be read).
std::string slurp(const fs::path& p) { return logging::mlflow_files::read_text(p); }

std::map<std::string, std::string> run_meta(const logging::MlflowRun& run) {
  return logging::mlflow_files::parse_meta_yaml(slurp(run.run_dir() / "meta.yaml"));
}

// MLflow's client over the store: the run's info, params, tags, every metric's history and the
// artifact tree, as JSON (values as Python's repr, so that nan and inf survive); null when
// mlflow is not importable (the test then says SKIPPED).
std::optional<nlohmann::json> read_with_mlflow(const fs::path& root, const std::string& run_id,
                                               const std::string& experiment) {
  const auto run = testing::run_python_check("read_mlflow_run.py", {root.string(), run_id, experiment});
  if (!run) return std::nullopt;
  const auto& [out, rc] = *run;
  INFO(out);
  REQUIRE(rc == 0);
  const size_t at = out.find("RESULT ");
  REQUIRE(at != std::string::npos);
  return nlohmann::json::parse(out.substr(at + 7, out.find('\n', at) - at - 7));
}

double value_of(const nlohmann::json& repr) { return std::strtod(repr.get<std::string>().c_str(), nullptr); }

bool same_double(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// A small model and data the Trainer resumes bitwise (test_trainer.cpp checks that in depth).
struct Mlp : nn::ModuleBase<Mlp> {
  std::shared_ptr<nn::Linear> fc1, fc2;
  Mlp() {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(4, 8));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(8, 3));
  }
  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    return (*fc2)(relu((*fc1)(x)));
  }
};

std::shared_ptr<data::TensorDataset> make_data(int64_t n, double phase) {
  std::vector<float> x(static_cast<size_t>(n * 4));
  std::vector<int64_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < 4; ++j) x[static_cast<size_t>(i * 4 + j)] = static_cast<float>(std::sin(0.37 * (i * 4 + j) + phase));
    y[static_cast<size_t>(i)] = (i * 7) % 3;
  }
  return std::make_shared<data::TensorDataset>(std::vector<std::pair<std::string, AnyTensor>>{
      {"image", Tensor<float>::from_vector(x, {n, 4})}, {"label", Tensor<int64_t>::from_vector(y, {n})}});
}

// Two epochs of 12 steps, validated at each epoch's end, every step logged, a checkpoint every
// 5 steps; `cb` may stop it.
train::FitResult train_once(const fs::path& dir, const fs::path& mlruns, std::shared_ptr<train::Callback> cb = nullptr) {
  manual_seed(99);
  auto model = std::make_shared<Mlp>();
  optim::AdamW opt(model->parameters(), {.lr = 1e-2});
  data::DataLoader loader(make_data(48, 0.0), {.batch_size = 4, .shuffle = true, .seed = 3, .drop_last = true});
  data::DataLoader val(make_data(12, 0.5), {.batch_size = 6});
  train::TrainerOptions o{.epochs = 2,
                          .validation = {.loader = &val},
                          .checkpoint = {.dir = dir / "ckpt", .every_steps = 5},
                          .log_dir = dir / "logs",
                          .log_every_steps = 1,
                          .hparams = {{"lr", 1e-2}, {"batch_size", 4.0}},
                          .mlflow = {.tracking_dir = mlruns, .experiment = "resume"}};
  o.progress.mode = train::ProgressMode::Off;
  train::Trainer t(o);
  if (cb) t.add_callback(cb);
  return t.fit(*model, loader, opt, train::cross_entropy_loss());
}

std::string run_id_in(const fs::path& log_dir) {
  std::string id = slurp(log_dir / "mlflow_run_id");
  while (!id.empty() && id.back() == '\n') id.pop_back();
  return id;
}

fs::path find_run_dir(const fs::path& root, const std::string& id) {
  for (const auto& e : fs::directory_iterator(root))
    if (fs::exists(e.path() / id / "meta.yaml")) return e.path() / id;
  FAIL("run " << id << " is not in " << root);
  return {};
}

}  // namespace

TEST_CASE("mlflow: the client reads params, metrics, tags, artifacts and the experiment by name", "[mlflow]") {
  const testing::TempDir tmp("ember_test_mlflow");
  const fs::path root = tmp.path / "ml runs";  // a space: the artifact URI is percent-encoded
  // (No single quote: MlflowClient.get_experiment_by_name builds a filter string that cannot hold one.)
  const std::string experiment = "ember: \"quoted\" \xc3\xa4\xc3\xb6\xc3\xbc";
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<int64_t, double>> loss = {{1, 2.5}, {2, 0.1}, {3, 1e-300}, {5, -3.25}, {8, nan}, {9, inf}};
  fs::create_directories(tmp.path / "model" / "sub");
  std::ofstream(tmp.path / "model" / "weights.bin") << "w";
  std::ofstream(tmp.path / "model" / "sub" / "config.json") << "{}";
  std::ofstream(tmp.path / "notes.txt") << "hello";
  std::string run_id, exp_id;
  {
    logging::MetricsLogger log(tmp.path / "logs", {.mlflow = {.tracking_dir = root, .experiment = experiment,
                                                              .run_name = "first: 'run'"}});
    logging::MlflowRun* run = log.mlflow();
    REQUIRE(run != nullptr);
    run_id = run->run_id();
    exp_id = run->experiment_id();
    CHECK(run_id.size() == 32);
    CHECK(run_id_in(tmp.path / "logs") == run_id);
    CHECK(run_meta(*run)["status"] == "1");  // RUNNING while open
    CHECK(run_meta(*run)["end_time"].empty());
    log.log_hparams({{"lr", 0.1}, {"optimizer", std::string("sgd")}, {"batch_size", 64.0}});
    for (const auto& [step, v] : loss) log.log_scalars(step, {{"train/loss", v}, {"lr", 0.01 * static_cast<double>(step)}});
    log.log_text(3, "notes", "text stays with the other sinks");
    run->set_tag("dataset", "mnist \"v2\"\nsecond line");
    CHECK(run->log_artifact(tmp.path / "notes.txt") == run->artifact_dir() / "notes.txt");
    run->log_artifact(tmp.path / "model", "exported");
    run->log_artifact(tmp.path / "notes.txt");  // again: replaced, not duplicated
    // The file format, as MLflow's FileStore writes it: "<timestamp_ms> <value> <step>".
    log.flush();
    const std::string lines = slurp(run->run_dir() / "metrics" / "train" / "loss");
    std::istringstream in(lines);
    std::string line;
    size_t n = 0;
    while (std::getline(in, line)) {
      long long ts = 0, step = 0;
      char value[64];
      REQUIRE(std::sscanf(line.c_str(), "%lld %63s %lld", &ts, value, &step) == 3);
      CHECK(step == loss[n].first);
      CHECK(ts > 1'600'000'000'000LL);
      ++n;
    }
    CHECK(n == loss.size());
    CHECK(slurp(run->run_dir() / "params" / "optimizer") == "sgd");
    CHECK(slurp(run->run_dir() / "params" / "batch_size") == "64");
  }
  // Closed: FINISHED (3) with an end time; a folder of only files MLflow reads.
  {
    const auto meta = logging::mlflow_files::parse_meta_yaml(slurp(root / exp_id / run_id / "meta.yaml"));
    CHECK(meta.at("status") == "3");
    CHECK(meta.at("run_name") == "first: 'run'");
    CHECK(std::stoll(meta.at("end_time")) >= std::stoll(meta.at("start_time")));
    const auto exp_meta = logging::mlflow_files::parse_meta_yaml(slurp(root / exp_id / "meta.yaml"));
    CHECK(exp_meta.at("name") == experiment);
    CHECK(fs::exists(root / "0" / "meta.yaml"));  // MLflow's Default experiment, as its store makes a root
  }
  // A second logger with the same experiment name finds it instead of making another.
  {
    logging::MlflowRun again({.tracking_dir = root, .experiment = experiment});
    CHECK(again.experiment_id() == exp_id);
    CHECK(again.run_id() != run_id);
    CHECK(again.run_name() == "ember-" + again.run_id().substr(0, 8));
  }

  const auto j = read_with_mlflow(root, run_id, experiment);
  if (!j) return;
  const nlohmann::json& r = *j;
  INFO(r.dump());
  CHECK(r["experiment_id"] == exp_id);
  CHECK(r["experiments"] == nlohmann::json::array({"Default", experiment}));
  CHECK(r["status"] == "FINISHED");
  CHECK(r["run_name"] == "first: 'run'");
  CHECK(r["run_experiment"] == exp_id);
  CHECK(r["runs"].size() == 2);
  CHECK(r["params"] == nlohmann::json({{"lr", "0.1"}, {"optimizer", "sgd"}, {"batch_size", "64"}}));
  CHECK(r["tags"]["dataset"] == "mnist \"v2\"\nsecond line");
  CHECK(r["tags"]["mlflow.runName"] == "first: 'run'");
  CHECK(r["tags"]["mlflow.source.type"] == "LOCAL");
  const auto& h = r["metrics"]["train/loss"];
  REQUIRE(h.size() == loss.size());
  for (size_t i = 0; i < loss.size(); ++i) {
    CHECK(h[i][0] == loss[i].first);
    CHECK(same_double(value_of(h[i][1]), loss[i].second));  // bit for bit, nan and inf included
  }
  REQUIRE(r["metrics"]["lr"].size() == loss.size());
  CHECK(value_of(r["metrics"]["lr"][2][1]) == 0.01 * 3.0);
  CHECK(r["metrics"].size() == 2);  // text records are not metrics
  CHECK(r["artifacts"] == nlohmann::json::array({"exported/", "exported/model/", "exported/model/sub/",
                                                 "exported/model/sub/config.json", "exported/model/weights.bin",
                                                 "notes.txt"}));
}

TEST_CASE("mlflow: a Trainer stopped by an error and resumed continues the run with one uninterrupted history",
          "[mlflow][trainer]") {
  const testing::TempDir tmp("ember_test_mlflow_resume");
  const fs::path mlruns = tmp.path / "mlruns";
  const train::FitResult full = train_once(tmp.path / "full", mlruns);
  REQUIRE(full.steps == 24);
  const std::string full_id = run_id_in(tmp.path / "full" / "logs");

  // Dies after step 7 (its metrics logged, the checkpoint of step 5 the newest).
  struct Crash : train::Callback {
    void on_step_end(const train::TrainerState& s) override {
      if (s.step == 7) throw std::runtime_error("simulated crash at step 7");
    }
  };
  const fs::path dir = tmp.path / "a";
  REQUIRE_THROWS_WITH(train_once(dir, mlruns, std::make_shared<Crash>()), Contains("simulated crash"));
  const std::string id = run_id_in(dir / "logs");
  const fs::path run_dir = find_run_dir(mlruns, id);
  CHECK(logging::mlflow_files::parse_meta_yaml(slurp(run_dir / "meta.yaml")).at("status") == "4");  // FAILED
  CHECK(fs::exists(run_dir / "metrics" / "train" / "loss"));
  const train::FitResult resumed = train_once(dir, mlruns);
  REQUIRE(resumed.start_step == 5);
  REQUIRE(resumed.steps == 24);
  CHECK(run_id_in(dir / "logs") == id);  // the same run
  CHECK(logging::mlflow_files::parse_meta_yaml(slurp(run_dir / "meta.yaml")).at("status") == "3");  // FINISHED
  // The last checkpoint went to the artifacts.
  CHECK(fs::exists(run_dir / "artifacts" / "checkpoints" / resumed.last_checkpoint.filename()));

  const auto a = read_with_mlflow(mlruns, id, "resume");
  if (!a) return;
  const auto b = read_with_mlflow(mlruns, full_id, "resume");
  REQUIRE(b);
  INFO((*a).dump());
  CHECK((*a)["runs"].size() == 2);  // the uninterrupted run and the resumed one, no third
  CHECK((*b)["status"] == "FINISHED");
  CHECK((*a)["params"] == (*b)["params"]);
  for (const char* key : {"train/loss", "train/lr", "val/loss", "val/accuracy"}) {
    INFO(key);
    const auto& ha = (*a)["metrics"][key];
    const auto& hb = (*b)["metrics"][key];
    REQUIRE(ha.size() == hb.size());
    for (size_t i = 0; i < ha.size(); ++i) {
      CHECK(ha[i][0] == hb[i][0]);                        // steps 1..24 once each (val: 12, 24)
      CHECK(value_of(ha[i][1]) == value_of(hb[i][1]));    // the resumed training is bitwise the same
    }
  }
  CHECK((*a)["metrics"]["train/loss"].size() == 24);
  CHECK((*a)["artifacts"].size() >= 2);
  CHECK((*a)["artifacts"][0] == "checkpoints/");
}

TEST_CASE("mlflow: run status FAILED when the logger dies with an exception, KILLED when told", "[mlflow]") {
  const testing::TempDir tmp("ember_test_mlflow_status");
  std::string exp_id, failed_id, killed_id;
  try {
    logging::MetricsLogger log(tmp.path / "f", {.mlflow = {.tracking_dir = tmp.path / "mlruns"}});
    failed_id = log.mlflow()->run_id();
    exp_id = log.mlflow()->experiment_id();
    CHECK(exp_id == "0");  // "Default"
    log.log_scalar(1, "loss", 1.0);
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  {
    logging::MetricsLogger log(tmp.path / "k", {.mlflow = {.tracking_dir = tmp.path / "mlruns"}});
    killed_id = log.mlflow()->run_id();
    log.set_outcome(logging::RunOutcome::Killed);
  }
  auto status = [&](const std::string& id) {
    return logging::mlflow_files::parse_meta_yaml(slurp(tmp.path / "mlruns" / exp_id / id / "meta.yaml")).at("status");
  };
  CHECK(status(failed_id) == "4");
  CHECK(status(killed_id) == "5");
  const auto j = read_with_mlflow(tmp.path / "mlruns", failed_id, "Default");
  if (!j) return;
  CHECK((*j)["status"] == "FAILED");
  CHECK((*j)["metrics"]["loss"].size() == 1);
}

TEST_CASE("mlflow: resume drops the steps after the checkpoint and any half-written line", "[mlflow]") {
  const testing::TempDir tmp("ember_test_mlflow_crash");
  const fs::path root = tmp.path / "mlruns";
  std::string id;
  fs::path file;
  {
    logging::MetricsLogger log(tmp.path / "logs", {.mlflow = {.tracking_dir = root}});
    id = log.mlflow()->run_id();
    for (int s = 1; s <= 6; ++s) log.log_scalar(s, "val/loss", 1.0 / s);
    file = log.mlflow()->run_dir() / "metrics" / "val" / "loss";
  }
  std::ofstream(file, std::ios::app) << "1700000000000 0.5";  // a line a full disk cut short
  {
    logging::MetricsLogger log(tmp.path / "logs", {.mlflow = {.tracking_dir = root, .resume = true}});
    REQUIRE(log.mlflow()->run_id() == id);
    CHECK(log.mlflow()->continued());
    CHECK(run_meta(*log.mlflow())["status"] == "1");
    log.resume_at(4);
    log.log_scalar(5, "val/loss", 0.125);
  }
  std::istringstream in(slurp(file));
  std::vector<long long> steps;
  std::string line;
  while (std::getline(in, line)) {
    long long ts = 0, step = 0;
    char value[64];
    REQUIRE(std::sscanf(line.c_str(), "%lld %63s %lld", &ts, value, &step) == 3);
    steps.push_back(step);
  }
  CHECK(steps == std::vector<long long>{1, 2, 3, 4, 5});
  CHECK(slurp(file).back() == '\n');
  // No staging file left where MLflow lists files.
  for (const auto& e : fs::recursive_directory_iterator(file.parent_path().parent_path()))
    CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
}

TEST_CASE("mlflow: bad keys, changed params, unwritable folders and missing runs are clear errors", "[mlflow]") {
  const testing::TempDir tmp("ember_test_mlflow_errors");
  const fs::path root = tmp.path / "mlruns";
  {
    logging::MetricsLogger log(tmp.path / "logs", {.csv = false, .tensorboard = false,
                                                   .mlflow = {.tracking_dir = root}});
    // A key MLflow refuses is refused before any sink writes it.
    REQUIRE_THROWS_AS(log.log_scalars(1, {{"ok", 1.0}, {"train//loss", 2.0}}), ValueError);
    REQUIRE_THROWS_WITH(log.log_scalar(1, "train//loss", 2.0),
                        Contains("'train//loss'") && Contains("is not a plain path"));
    REQUIRE_THROWS_WITH(log.log_scalar(1, "../up", 2.0), Contains("is not a plain path"));
    REQUIRE_THROWS_WITH(log.log_scalar(1, "/abs", 2.0), Contains("is not a plain path"));
    REQUIRE_THROWS_WITH(log.log_scalar(1, "loss!", 2.0),
                        Contains("the metric key 'loss!' has a character MLflow refuses"));
    REQUIRE_THROWS_WITH(log.log_scalar(1, std::string(251, 'a'), 2.0), Contains("MLflow allows at most 250"));
    CHECK(slurp(tmp.path / "logs" / "metrics.jsonl").empty());
    CHECK_FALSE(fs::exists(log.mlflow()->run_dir() / "metrics" / "ok"));
    REQUIRE_THROWS_WITH(log.mlflow()->set_tag("a tag?", "v"), Contains("tag key 'a tag?'"));
    REQUIRE_THROWS_WITH(log.mlflow()->set_tag("t", std::string(8001, 'v')), Contains("at most 8000"));
    REQUIRE_THROWS_WITH(log.mlflow()->log_artifact(tmp.path / "missing.bin"),
                        Contains("log_artifact: '") && Contains("missing.bin' does not exist"));
    log.log_hparams({{"lr", 0.1}});
    REQUIRE_THROWS_WITH(log.log_hparams({{"lr", 0.2}}),
                        Contains("param 'lr'") && Contains("was logged as '0.1'") && Contains("to '0.2'"));
    log.log_hparams({{"lr", 0.1}});  // the same value again is fine (a resumed run logs it again)
  }
  // An unwritable tracking folder (below a regular file: refused even to root).
  std::ofstream(tmp.path / "file") << "x";
  REQUIRE_THROWS_AS(logging::MlflowRun({.tracking_dir = tmp.path / "file" / "mlruns"}), IOError);
  REQUIRE_THROWS_WITH(logging::MlflowRun({.tracking_dir = tmp.path / "file" / "mlruns"}),
                      Contains("cannot create the tracking folder") && Contains("file/mlruns"));
  REQUIRE_THROWS_WITH(logging::MlflowRun({.tracking_dir = root, .experiment = "  "}),
                      Contains("experiment name must not be empty"));
  REQUIRE_THROWS_WITH(logging::MlflowRun({.tracking_dir = root, .run_id = "0123456789abcdef"}),
                      Contains("run 0123456789abcdef is not in"));
  REQUIRE_THROWS_WITH(logging::MlflowRun({.tracking_dir = root, .run_id = "../x"}), Contains("is not a run id"));
  {
    logging::MlflowRun ended({.tracking_dir = root});
    ended.end();
    REQUIRE_THROWS_WITH(ended.log_metric("x", 1.0, 1), Contains("has ended"));
  }
  // The Trainer's option needs a log folder of its own making.
  train::TrainerOptions o;
  o.mlflow.tracking_dir = root;
  REQUIRE_THROWS_WITH(train::Trainer(o), Contains("mlflow.tracking_dir") && Contains("log_dir is empty"));
}

TEST_CASE("mlflow: meta.yaml escapes decode, and a bad one is a FormatError that names it", "[mlflow]") {
  namespace mf = logging::mlflow_files;
  const auto ok = mf::parse_meta_yaml("name: \"caf\\xE9 \\u00e9\\U0001F600\"\nid: '7'\n");
  REQUIRE(ok.at("name") == "caf\xC3\xA9 \xC3\xA9\xF0\x9F\x98\x80");
  REQUIRE(ok.at("id") == "7");
  // Too few or non-hex digits (the fuzzer's find: std::stoul threw std::invalid_argument), and
  // a code point past 10FFFF.
  REQUIRE_THROWS_AS(mf::parse_meta_yaml("name: \"a\\u12G4\"\n"), FormatError);
  REQUIRE_THROWS_WITH(mf::parse_meta_yaml("name: \"a\\u12G4\"\n"), Contains("\\u") && Contains("4 hex digits"));
  REQUIRE_THROWS_WITH(mf::parse_meta_yaml("name: \"\\x"), Contains("2 hex digits"));
  REQUIRE_THROWS_WITH(mf::parse_meta_yaml("name: \"\\UFFFFFFFF\"\n"), Contains("10FFFF"));
}
