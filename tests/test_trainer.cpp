// train::Trainer and train::ProgressBar: results bitwise equal to hand-written loops (fp32, fp16
// with the GradScaler, bf16, accumulation), exact resume from step and epoch checkpoints, cancel
// from another thread, early stopping, callback order, best-by-metric and keep-last-N, the
// progress output, data parallel over a 2-rank ThreadProcessGroup, and the errors of bad options.
#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ember/backend/cpu/cpu_backend.hpp"
#include "ember/dist/thread_group.hpp"
#include "ember/ember.hpp"
#include "ember/train/trainer.hpp"
#include "pretend_gpu.hpp"
#include "temp_dir.hpp"

using namespace ember;
namespace fs = std::filesystem;

namespace {

struct Mlp : nn::ModuleBase<Mlp> {
  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<nn::Dropout> drop;
  explicit Mlp(double p = 0.0) {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(4, 8));
    drop = register_module("drop", std::make_shared<nn::Dropout>(p));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(8, 3));
  }
  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    return (*fc2)((*drop)(relu((*fc1)(x))));
  }
};

constexpr int64_t kSamples = 48;

// Synthetic 3-class data: "image" float [n, 4], "label" int64 [n].
std::shared_ptr<data::TensorDataset> make_data(int64_t n = kSamples, double phase = 0.0) {
  std::vector<float> x(static_cast<size_t>(n * 4));
  std::vector<int64_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < 4; ++j) x[static_cast<size_t>(i * 4 + j)] = static_cast<float>(std::sin(0.37 * (i * 4 + j) + phase));
    y[static_cast<size_t>(i)] = (i * 7 + static_cast<int64_t>(phase * 10)) % 3;
  }
  return std::make_shared<data::TensorDataset>(std::vector<std::pair<std::string, AnyTensor>>{
      {"image", Tensor<float>::from_vector(x, {n, 4})}, {"label", Tensor<int64_t>::from_vector(y, {n})}});
}

data::DataLoaderOptions train_opts(int64_t batch = 4) {
  return {.batch_size = batch, .shuffle = true, .seed = 7, .drop_last = true};
}

// Everything a run ends with, to compare bitwise.
struct Outcome {
  std::vector<std::vector<uint8_t>> params;  // raw bytes of each parameter
  std::vector<double> losses;
  double lr = 0;
  double scale = 0;  // the hand loop's GradScaler scale at the end
};

std::vector<std::vector<uint8_t>> param_bytes(nn::Module& m) {
  std::vector<std::vector<uint8_t>> out;
  for (auto& [n, p] : m.named_parameters()) {
    AnyTensor c = p.detach().to(Device::cpu());
    const auto* b = static_cast<const uint8_t*>(c.data_ptr());
    out.emplace_back(b, b + c.nbytes());
  }
  return out;
}

// The same physical objects every run is made of, from the same seed.
struct Setup {
  std::shared_ptr<data::TensorDataset> ds = make_data();
  std::shared_ptr<Mlp> model;
  std::unique_ptr<optim::AdamW> opt;
  std::unique_ptr<optim::WarmupCosineLR> sched;
  std::unique_ptr<data::DataLoader> loader;
  explicit Setup(double dropout = 0.0, int64_t batch = 4, int64_t total_steps = 24) {
    manual_seed(1234);
    model = std::make_shared<Mlp>(dropout);
    opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamOptions{.lr = 3e-2, .weight_decay = 0.1});
    sched = std::make_unique<optim::WarmupCosineLR>(
        *opt, optim::WarmupCosineOptions{.warmup_steps = 3, .total_steps = total_steps, .min_lr = 1e-3});
    loader = std::make_unique<data::DataLoader>(ds, train_opts(batch));
  }
};

DType dtype_of_precision(train::Precision p) {
  return p == train::Precision::Fp16 ? DType::Float16 : p == train::Precision::Bf16 ? DType::BFloat16 : DType::Float32;
}

// The hand-written loop the Trainer must equal: the pieces used one by one.
Outcome hand_loop(train::Precision p, int64_t accum, int64_t epochs, double dropout, const amp::GradScalerOptions& so,
                  double clip = 0) {
  Setup s(dropout);
  const DType cdt = dtype_of_precision(p);
  amp::GradScalerOptions o = so;
  o.enabled = p == train::Precision::Fp16;
  amp::GradScaler scaler(o);
  train::GradientAccumulator acc(accum);
  Outcome out;
  s.model->train();
  const int64_t spe = s.loader->num_batches() / accum;
  for (int64_t e = 0; e < epochs; ++e) {
    s.loader->set_epoch(static_cast<uint64_t>(e));
    for (int64_t st = 0; st < spe; ++st) {
      double loss_sum = 0;
      {
        std::optional<amp::CastCacheGuard> cache;
        if (p != train::Precision::Fp32) cache.emplace();
        for (int64_t m = 0; m < accum; ++m) {
          data::Batch b = *s.loader->next();
          AnyTensor x = b["image"].to(cdt);
          AnyTensor l = train::cross_entropy_loss()(s.model->forward_any(x), b["label"]);
          loss_sum += l.item_double();
          AnyTensor scaled = acc.scale_loss(l);
          if (scaler.is_enabled())
            scaler.scale(scaled).backward();
          else
            scaled.backward();
          acc.sync_step();
        }
      }
      if (clip > 0) {
        if (scaler.is_enabled()) scaler.unscale_(*s.opt);
        optim::clip_grad_norm_(s.model->parameters(), clip);
      }
      if (scaler.is_enabled()) {
        scaler.step(*s.opt);
        scaler.update();
      } else {
        s.opt->step();
      }
      s.opt->zero_grad();
      s.sched->step();
      out.losses.push_back(loss_sum / static_cast<double>(accum));
    }
  }
  out.params = param_bytes(*s.model);
  out.lr = s.opt->param_groups()[0].lr();
  out.scale = scaler.is_enabled() ? scaler.get_scale() : 0.0;
  return out;
}

train::TrainerOptions quiet(train::TrainerOptions o) {
  o.progress.mode = train::ProgressMode::Off;
  return o;
}

Outcome trainer_run(train::Precision p, int64_t accum, int64_t epochs, double dropout, const amp::GradScalerOptions& so,
                    double clip = 0) {
  Setup s(dropout);
  train::Trainer t(quiet({.epochs = epochs, .precision = p, .grad_scaler = so, .accumulation = accum,
                          .clip_grad_norm = clip, .scheduler = s.sched.get()}));
  train::FitResult r = t.fit(*s.model, *s.loader, *s.opt, train::cross_entropy_loss());
  REQUIRE(r.steps == epochs * (s.loader->num_batches() / accum));
  REQUIRE_FALSE(r.cancelled);
  REQUIRE(r.samples == r.steps * accum * 4);
  Outcome out;
  out.params = param_bytes(*s.model);
  out.losses = r.train_losses;
  out.lr = s.opt->param_groups()[0].lr();
  return out;
}

void require_same(const Outcome& a, const Outcome& b) {
  REQUIRE(a.losses.size() == b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) REQUIRE(a.losses[i] == b.losses[i]);
  REQUIRE(a.params == b.params);
  REQUIRE(a.lr == b.lr);
}

template <class E>
void require_throws(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    FAIL("expected an exception containing: " << part);
  } catch (const E& e) {
    INFO(e.what());
    REQUIRE(std::string(e.what()).find(part) != std::string::npos);
  }
}

// A full 2-epoch fp16 run with accumulation and dropout, with a callback that runs `at_step`.
struct ResumeRun {
  Setup s{0.25, 4, 24};
  std::unique_ptr<data::DataLoader> val;
  train::FitResult result;
  ResumeRun(const fs::path& dir, int64_t max_steps, train::CheckpointPolicy policy, train::CancelToken* cancel = nullptr,
            std::shared_ptr<train::Callback> cb = nullptr, int64_t epochs = 3, std::ostream* progress = nullptr) {
    val = std::make_unique<data::DataLoader>(make_data(12, 0.5), data::DataLoaderOptions{.batch_size = 6});
    policy.dir = dir;
    train::TrainerOptions o = quiet({.epochs = epochs, .max_steps = max_steps, .precision = train::Precision::Fp16,
                                     .grad_scaler = {.init_scale = 1024.0, .growth_interval = 3}, .accumulation = 2,
                                     .scheduler = s.sched.get(), .validation = {.loader = val.get()},
                                     .checkpoint = policy, .cancel = cancel});
    if (progress) o.progress = {.mode = train::ProgressMode::Lines, .out = progress, .every_steps = 1000};
    train::Trainer t(o);
    if (cb) t.add_callback(cb);
    result = t.fit(*s.model, *s.loader, *s.opt, train::cross_entropy_loss());
  }
};

}  // namespace

TEST_CASE("Trainer fp32 equals a hand-written loop bitwise", "[trainer]") {
  require_same(trainer_run(train::Precision::Fp32, 1, 2, 0.0, {}), hand_loop(train::Precision::Fp32, 1, 2, 0.0, {}));
}

TEST_CASE("Trainer fp16 with the GradScaler equals a hand-written loop bitwise", "[trainer]") {
  // A large initial scale overflows fp16 at first: the first steps are skipped and the scale backs off.
  const amp::GradScalerOptions so{.init_scale = 16777216.0, .growth_interval = 4};
  const Outcome a = trainer_run(train::Precision::Fp16, 1, 2, 0.0, so);
  const Outcome h = hand_loop(train::Precision::Fp16, 1, 2, 0.0, so);
  require_same(a, h);
  REQUIRE(h.scale < 16777216.0);  // steps were skipped on overflow
  Setup fresh;
  REQUIRE(a.params != param_bytes(*fresh.model));  // it trained
}

TEST_CASE("Trainer bf16 equals a hand-written loop bitwise", "[trainer]") {
  require_same(trainer_run(train::Precision::Bf16, 1, 2, 0.0, {}), hand_loop(train::Precision::Bf16, 1, 2, 0.0, {}));
}

TEST_CASE("Trainer with gradient accumulation equals a hand-written loop bitwise", "[trainer]") {
  require_same(trainer_run(train::Precision::Fp32, 3, 2, 0.25, {}), hand_loop(train::Precision::Fp32, 3, 2, 0.25, {}));
  const amp::GradScalerOptions so{.init_scale = 256.0, .growth_interval = 2};
  require_same(trainer_run(train::Precision::Fp16, 2, 1, 0.25, so), hand_loop(train::Precision::Fp16, 2, 1, 0.25, so));
}

TEST_CASE("Trainer with gradient clipping equals a hand-written loop bitwise", "[trainer]") {
  const Outcome clipped = trainer_run(train::Precision::Fp32, 1, 1, 0.0, {}, 0.05);
  require_same(clipped, hand_loop(train::Precision::Fp32, 1, 1, 0.0, {}, 0.05));
  REQUIRE(clipped.params != trainer_run(train::Precision::Fp32, 1, 1, 0.0, {}).params);  // the clip mattered
  const amp::GradScalerOptions so{.init_scale = 1024.0, .growth_interval = 2};
  require_same(trainer_run(train::Precision::Fp16, 2, 1, 0.0, so, 0.05), hand_loop(train::Precision::Fp16, 2, 1, 0.0, so, 0.05));
}

TEST_CASE("Trainer steps the scheduler per epoch", "[trainer]") {
  Setup s(0.0, 8);  // 6 steps per epoch
  optim::SGD sgd(s.model->parameters(), {.lr = 0.1});
  optim::StepLR step_lr(sgd, 1, 0.5);
  std::vector<double> lrs;
  auto cb = std::make_shared<train::LambdaCallback>();
  cb->step_end = [&](const train::TrainerState& st) { lrs.push_back(st.lr); };
  train::Trainer t(quiet({.epochs = 3, .scheduler = &step_lr, .scheduler_interval = train::SchedulerInterval::Epoch}));
  t.add_callback(cb);
  t.fit(*s.model, *s.loader, sgd, train::cross_entropy_loss());
  REQUIRE(lrs.size() == 18);
  REQUIRE(lrs[0] == 0.1);
  REQUIRE(lrs[5] == 0.1);
  REQUIRE(lrs[6] == 0.05);
  REQUIRE(lrs[17] == 0.025);
  REQUIRE(step_lr.last_epoch() == 3);
}

TEST_CASE("Trainer resumes bitwise from a step checkpoint", "[trainer]") {
  testing::TempDir tmp("ember-trainer-");
  ResumeRun full(tmp.path / "full", 0, {});
  REQUIRE(full.result.steps == 18);
  // Stops after step 5 (mid-epoch 0: an epoch has 12 / 2 = 6 steps), with a checkpoint every 5 steps.
  ResumeRun first(tmp.path / "a", 5, {.every_steps = 5});
  REQUIRE(first.result.steps == 5);
  REQUIRE(first.result.last_checkpoint == tmp.path / "a" / "step-5");
  ResumeRun second(tmp.path / "a", 0, {.every_steps = 5});
  REQUIRE(second.result.resumed_from == tmp.path / "a" / "step-5");
  REQUIRE(second.result.start_step == 5);
  REQUIRE(second.result.steps == 18);
  REQUIRE(second.result.train_losses.size() == 13);
  for (size_t i = 0; i < 13; ++i) REQUIRE(second.result.train_losses[i] == full.result.train_losses[5 + i]);
  REQUIRE(param_bytes(*second.s.model) == param_bytes(*full.s.model));
  REQUIRE(second.result.final_metrics == full.result.final_metrics);
  REQUIRE(default_generator().offset() > 0);
  // The same with save_async: fit waits for the background write before it returns.
  ResumeRun first_async(tmp.path / "b", 5, {.every_steps = 5, .save_async = true});
  REQUIRE(train::CheckpointManager(tmp.path / "b").verify(5).empty());
  ResumeRun second_async(tmp.path / "b", 0, {.every_steps = 5, .save_async = true});
  REQUIRE(second_async.result.start_step == 5);
  REQUIRE(param_bytes(*second_async.s.model) == param_bytes(*full.s.model));
}

TEST_CASE("Trainer resumes bitwise from an epoch checkpoint", "[trainer]") {
  testing::TempDir tmp("ember-trainer-");
  ResumeRun full(tmp.path / "full", 0, {});
  const uint64_t full_offset = default_generator().offset();
  ResumeRun first(tmp.path / "a", 0, {.every_epochs = 1}, nullptr, nullptr, /*epochs=*/1);
  REQUIRE(first.result.steps == 6);
  REQUIRE(first.result.epochs_completed == 1);
  REQUIRE(first.result.last_checkpoint == tmp.path / "a" / "step-6");
  ResumeRun second(tmp.path / "a", 0, {.every_epochs = 1});
  REQUIRE(second.result.resumed_from == tmp.path / "a" / "step-6");
  REQUIRE(second.result.steps == 18);
  REQUIRE(second.result.epochs_completed == 2);
  for (size_t i = 0; i < 12; ++i) REQUIRE(second.result.train_losses[i] == full.result.train_losses[6 + i]);
  REQUIRE(param_bytes(*second.s.model) == param_bytes(*full.s.model));
  REQUIRE(default_generator().offset() == full_offset);
  // The history of the resumed part: the validations of epochs 2 and 3, equal to the full run's.
  REQUIRE(second.result.history.size() == 2);
  REQUIRE(second.result.history[1].metrics == full.result.history[2].metrics);
}

TEST_CASE("Trainer is cancelled from another thread: the step finishes, a checkpoint is written", "[trainer]") {
  testing::TempDir tmp("ember-trainer-");
  ResumeRun full(tmp.path / "full", 0, {});
  train::CancelToken token;
  std::mutex mu;
  std::condition_variable cv;
  bool reached = false, cancelled = false;
  std::thread host([&] {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return reached; });
    token.cancel();
    cancelled = true;
    cv.notify_all();
  });
  auto cb = std::make_shared<train::LambdaCallback>();
  cb->step_end = [&](const train::TrainerState& s) {
    if (s.step != 8) return;
    std::unique_lock<std::mutex> lock(mu);
    reached = true;
    cv.notify_all();
    cv.wait(lock, [&] { return cancelled; });  // the host thread has cancelled before step 9 could start
  };
  ResumeRun first(tmp.path / "a", 0, {}, &token, cb);
  host.join();
  REQUIRE(first.result.cancelled);
  REQUIRE_FALSE(first.result.early_stopped);
  REQUIRE(first.result.steps == 8);
  REQUIRE(first.result.last_checkpoint == tmp.path / "a" / "step-8");
  REQUIRE(fs::exists(tmp.path / "a" / "step-8" / "state.json"));
  // The checkpoint continues the run exactly.
  token.reset();
  ResumeRun second(tmp.path / "a", 0, {}, &token);
  REQUIRE_FALSE(second.result.cancelled);
  REQUIRE(second.result.start_step == 8);
  REQUIRE(param_bytes(*second.s.model) == param_bytes(*full.s.model));
}

TEST_CASE("Trainer early stopping stops after `patience` validations without improvement", "[trainer]") {
  Setup s;
  optim::SGD sgd(s.model->parameters(), {.lr = 0.0});  // nothing changes: val/loss never improves
  data::DataLoader val(make_data(12, 0.5), {.batch_size = 6});
  train::Trainer t(quiet({.epochs = 10, .validation = {.loader = &val}, .early_stopping = {.metric = "val/loss", .patience = 2}}));
  train::FitResult r = t.fit(*s.model, *s.loader, sgd, train::cross_entropy_loss());
  REQUIRE(r.early_stopped);
  REQUIRE_FALSE(r.cancelled);
  REQUIRE(r.epochs_completed == 3);  // best at 1, no better at 2 and 3
  REQUIRE(r.history.size() == 3);
  REQUIRE(r.steps == 3 * 12);
  REQUIRE(r.history[0].metrics.at("val/loss") == r.history[2].metrics.at("val/loss"));
}

TEST_CASE("Trainer callback order, and the exception callback before the error leaves fit", "[trainer]") {
  testing::TempDir tmp("ember-trainer-");
  Setup s(0.0, 12);  // 4 batches per epoch
  data::DataLoader val(make_data(12, 0.5), {.batch_size = 6});
  std::vector<std::string> events;
  auto cb = std::make_shared<train::LambdaCallback>();
  cb->fit_start = [&](const train::TrainerState&) { events.push_back("fit_start"); };
  cb->epoch_start = [&](const train::TrainerState& st) { events.push_back("epoch_start " + std::to_string(st.epoch)); };
  cb->step_end = [&](const train::TrainerState& st) { events.push_back("step_end " + std::to_string(st.step)); };
  cb->validation_end = [&](const train::TrainerState& st, const train::Metrics& m) {
    events.push_back("validation_end " + std::to_string(st.step) + (m.count("val/accuracy") ? " acc" : ""));
  };
  cb->checkpoint = [&](const train::TrainerState&, const fs::path& p) { events.push_back("checkpoint " + p.filename().string()); };
  cb->epoch_end = [&](const train::TrainerState& st) { events.push_back("epoch_end " + std::to_string(st.epoch)); };
  cb->fit_end = [&](const train::TrainerState&, const train::FitResult& r) { events.push_back("fit_end " + std::to_string(r.steps)); };
  cb->exception = [&](const train::TrainerState& st, std::exception_ptr) { events.push_back("exception " + std::to_string(st.step)); };
  train::Trainer t(quiet({.epochs = 2, .accumulation = 2, .validation = {.loader = &val},
                          .checkpoint = {.dir = tmp.path / "c", .every_epochs = 1}}));
  t.add_callback(cb);
  train::FitResult r = t.fit(*s.model, *s.loader, *s.opt, train::cross_entropy_loss());
  REQUIRE(r.steps == 4);
  const std::vector<std::string> want = {
      "fit_start",  "epoch_start 0", "step_end 1", "step_end 2", "validation_end 2 acc", "checkpoint step-2",
      "epoch_end 0", "epoch_start 1", "step_end 3", "step_end 4", "validation_end 4 acc", "checkpoint step-4",
      "epoch_end 1", "fit_end 4"};
  REQUIRE(events == want);

  // A loss that fails at the 3rd micro-batch: on_exception, then the error itself (type and message).
  events.clear();
  int calls = 0;
  train::LossFn bad = [&](const AnyTensor& out, const AnyTensor& target) -> AnyTensor {
    if (++calls == 3) throw ShapeError("my loss: boom");
    return train::cross_entropy_loss()(out, target);
  };
  Setup s2(0.0, 12);
  train::Trainer t2(quiet({.epochs = 2}));
  t2.add_callback(cb);
  require_throws<ShapeError>([&] { t2.fit(*s2.model, *s2.loader, *s2.opt, bad); }, "my loss: boom");
  REQUIRE(events == std::vector<std::string>{"fit_start", "epoch_start 0", "step_end 1", "step_end 2", "exception 2"});
}

TEST_CASE("Trainer best-by-metric checkpoint and keep-last-N", "[trainer]") {
  testing::TempDir tmp("ember-trainer-");
  Setup s(0.0, 8);  // 6 steps per epoch
  data::DataLoader val(make_data(12, 0.5), {.batch_size = 6});
  int64_t step = 0;
  // A scripted metric: 0.5 at step 2, 0.9 at step 4, 0.7 at step 6.
  train::Metric scripted{"score", [&](const AnyTensor&, const data::Batch&) {
                           return step == 2 ? 0.5 : step == 4 ? 0.9 : 0.7;
                         }};
  std::vector<std::vector<uint8_t>> at_best;
  auto cb = std::make_shared<train::LambdaCallback>();
  cb->step_end = [&](const train::TrainerState& st) { step = st.step; };
  cb->validation_end = [&](const train::TrainerState& st, const train::Metrics&) {
    if (st.step == 4) at_best = param_bytes(*s.model);
  };
  const fs::path dir = tmp.path / "c";
  train::Trainer t(quiet({.epochs = 1,
                          .scheduler = s.sched.get(),
                          .validation = {.loader = &val, .every_epochs = 0, .every_steps = 2, .metrics = {scripted}},
                          .checkpoint = {.dir = dir, .every_steps = 1, .keep_last = 2, .best_metric = "val/score"}}));
  t.add_callback(cb);
  train::FitResult r = t.fit(*s.model, *s.loader, *s.opt, train::cross_entropy_loss());
  REQUIRE(r.history.size() == 3);
  REQUIRE(r.history[1].metrics.at("val/score") == 0.9);
  REQUIRE(r.best_metric_name == "val/score");
  REQUIRE(r.best_metric == 0.9);
  REQUIRE(r.best_step == 4);
  REQUIRE(r.best_checkpoint == dir / "best" / "step-4");
  train::CheckpointManager best(dir / "best");
  REQUIRE(best.steps() == std::vector<int64_t>{4});  // only the best is kept there
  train::CheckpointManager last(dir);
  REQUIRE(last.steps() == std::vector<int64_t>{6, 5});  // keep_last = 2
  REQUIRE(r.last_checkpoint == dir / "step-6");
  // The best checkpoint holds the weights of step 4.
  Mlp fresh;
  best.load(4, {.model = &fresh});
  REQUIRE(param_bytes(fresh) == at_best);
  REQUIRE(at_best != param_bytes(*s.model));
}

TEST_CASE("ProgressBar: terminal bar, plain lines, silent when disabled", "[trainer][progress]") {
  REQUIRE(train::format_duration(5) == "0:05");
  REQUIRE(train::format_duration(125.4) == "2:05");
  REQUIRE(train::format_duration(3723) == "1:02:03");
  REQUIRE(train::format_duration(-1) == "?");

  const train::ProgressInfo i1{.epoch = 0, .epochs = 2, .step = 5, .total_steps = 10, .loss = 0.5, .samples = 500, .seconds = 5};
  const train::ProgressInfo i2{.epoch = 1, .epochs = 2, .step = 10, .total_steps = 10, .loss = 0.25, .samples = 1000, .seconds = 8};
  {
    std::ostringstream os;
    train::ProgressBar bar({.mode = train::ProgressMode::Bar, .out = &os, .width = 10});
    REQUIRE(bar.mode() == train::ProgressMode::Bar);
    bar.update(i1);
    bar.epoch_end(i2, "val/accuracy 0.9000");
    bar.update(i1);
    bar.message("hello");
    bar.finish();
    REQUIRE(os.str() ==
            "\repoch 1/2 [#####.....] 5/10  loss 0.5000  100 samples/s  ETA 0:05"
            "\repoch 2/2 [##########] 10/10  loss 0.2500  125 samples/s  ETA 0:00  val/accuracy 0.9000\n"
            "\repoch 1/2 [#####.....] 5/10  loss 0.5000  100 samples/s  ETA 0:05\n"
            "hello\n");
  }
  {
    std::ostringstream os;
    train::ProgressBar bar({.mode = train::ProgressMode::Auto, .out = &os, .every_steps = 5});
    REQUIRE(bar.mode() == train::ProgressMode::Lines);  // not a terminal
    train::ProgressInfo i = i1;
    i.step = 4;
    bar.update(i);  // not a multiple of 5: nothing
    bar.update(i1);
    bar.epoch_end(i2, "val/loss 0.3000");
    bar.finish();
    REQUIRE(os.str() ==
            "epoch 1/2  step 5/10  loss 0.5000  100 samples/s  ETA 0:05\n"
            "epoch 2/2  step 10/10  loss 0.2500  125 samples/s  ETA 0:00  val/loss 0.3000\n");
  }
  {
    std::ostringstream os;
    train::ProgressBar bar({.mode = train::ProgressMode::Bar, .out = &os, .enabled = false});
    bar.update(i1);
    bar.epoch_end(i2);
    bar.message("x");
    bar.finish();
    REQUIRE(bar.mode() == train::ProgressMode::Off);
    REQUIRE(os.str().empty());
  }
  require_throws<ValueError>([] { train::ProgressBar({.every_steps = -1}); }, "every_steps must be >= 0");
}

TEST_CASE("Trainer prints plain progress lines and the profiler's verdict once", "[trainer][progress]") {
  Setup s(0.0, 8);  // 6 steps per epoch
  std::ostringstream os;
  train::Trainer t({.epochs = 2, .profile = {.steps = 3, .start_step = 1},
                    .progress = {.mode = train::ProgressMode::Lines, .out = &os, .every_steps = 4}});
  train::FitResult r = t.fit(*s.model, *s.loader, *s.opt, train::cross_entropy_loss());
  REQUIRE(r.steps == 12);
  const std::string out = os.str();
  INFO(out);
  REQUIRE(out.find("epoch 1/2  step 4/12  loss ") != std::string::npos);
  REQUIRE(out.find("epoch 2/2  step 8/12  loss ") != std::string::npos);
  REQUIRE(out.find("epoch 2/2  step 12/12  loss ") != std::string::npos);
  REQUIRE(out.find("step 5/12") == std::string::npos);
  const size_t v = out.find("verdict:");
  REQUIRE(v != std::string::npos);
  REQUIRE(out.find("verdict:", v + 1) == std::string::npos);  // once
  REQUIRE(out.find("profile (3 steps)") != std::string::npos);
  REQUIRE(out.find("Self host") != std::string::npos);  // the op table's header
  REQUIRE(out.find("linear") != std::string::npos);     // and the model's ops in it
}

TEST_CASE("Trainer logs through MetricsLogger every N steps", "[trainer]") {
  testing::TempDir tmp("ember-trainer-");
  Setup s(0.0, 8);
  data::DataLoader val(make_data(12, 0.5), {.batch_size = 6});
  train::Trainer t(quiet({.epochs = 1,
                          .validation = {.loader = &val},
                          .log_dir = tmp.path / "logs",
                          .log_every_steps = 2,
                          .hparams = {{"lr", 0.25}, {"optimizer", std::string("sgd")}}}));
  train::FitResult r = t.fit(*s.model, *s.loader, *s.opt, train::cross_entropy_loss());
  // The hyperparameters, once, beside the logs.
  std::ifstream h(tmp.path / "logs" / "hparams.json");
  REQUIRE(h.good());
  const std::string hp((std::istreambuf_iterator<char>(h)), std::istreambuf_iterator<char>());
  CHECK(hp.find("\"lr\": 0.25") != std::string::npos);
  CHECK(hp.find("\"optimizer\": \"sgd\"") != std::string::npos);
  std::ifstream f(tmp.path / "logs" / "metrics.jsonl");
  REQUIRE(f.good());
  std::string line;
  int train_lines = 0, val_lines = 0;
  while (std::getline(f, line)) {
    if (line.find("\"train/loss\"") != std::string::npos) ++train_lines;
    if (line.find("\"val/accuracy\"") != std::string::npos) ++val_lines;
  }
  REQUIRE(train_lines == 3);  // steps 2, 4, 6
  REQUIRE(val_lines == 1);
  REQUIRE(r.final_metrics.count("val/loss") == 1);
}

TEST_CASE("Trainer with a step function, top-k and user metrics", "[trainer]") {
  Setup a(0.0, 8), b(0.0, 8);
  // The StepFn doing what the loss path does gives the same result.
  train::Trainer t1(quiet({.epochs = 1}));
  train::FitResult r1 = t1.fit(*a.model, *a.loader, *a.opt, train::cross_entropy_loss());
  train::Trainer t2(quiet({.epochs = 1}));
  auto model = b.model;
  train::FitResult r2 = t2.fit(*b.model, *b.loader, *b.opt, [model](const data::Batch& batch, train::StepContext& ctx) {
    return train::cross_entropy_loss()(model->forward_any(ctx.cast(batch["image"])), batch["label"]);
  });
  REQUIRE(r1.train_losses == r2.train_losses);
  REQUIRE(param_bytes(*a.model) == param_bytes(*b.model));

  // evaluate: top-3 of 3 classes is always right; a user metric is averaged by samples.
  data::DataLoader val(make_data(12, 0.5), {.batch_size = 5});  // batches of 5, 5, 2
  train::Trainer t3(quiet({.epochs = 1,
                           .validation = {.loader = &val,
                                          .top_k = 3,
                                          .metrics = {{"rows", [](const AnyTensor& out, const data::Batch&) {
                                                         return static_cast<double>(out.size(0));
                                                       }}}}}));
  train::Metrics m = t3.evaluate(*a.model, val, train::cross_entropy_loss());
  REQUIRE(m.at("val/top3_accuracy") == 1.0);
  REQUIRE(m.at("val/rows") == Approx((5.0 * 5 + 5.0 * 5 + 2.0 * 2) / 12));
  REQUIRE(m.at("val/accuracy") >= 0.0);
  REQUIRE(m.at("val/accuracy") <= 1.0);
  // val/accuracy by hand.
  NoGradGuard ng;
  int64_t correct = 0;
  for (int64_t i = 0; i < 12; ++i) {
    auto ds = make_data(12, 0.5);
    data::Example e = ds->get(i);
    auto out = Tensor<float>(a.model->forward_any(e["image"].reshape({1, 4}))).to_vector();
    const int64_t pred = std::max_element(out.begin(), out.end()) - out.begin();
    correct += pred == e["label"].item_double() ? 1 : 0;
  }
  REQUIRE(m.at("val/accuracy") == Approx(static_cast<double>(correct) / 12));
}

namespace {

// One rank of a data-parallel run (or the single process): returns the final parameters.
struct DpRank {
  std::vector<std::vector<uint8_t>> params;
  std::vector<double> losses;
  std::string progress;
  int checkpoints = 0;
  std::string error;
};

// Made on the main thread before the rank threads start: the default generator is shared by
// the threads, and concurrent initialisations would interleave their draws.
std::shared_ptr<Mlp> dp_model(uint64_t seed = 99) {
  manual_seed(seed);
  return std::make_shared<Mlp>(0.0);
}

DpRank dp_rank(dist::ProcessGroup* group, int64_t batch, int64_t accum, const fs::path& dir,
               train::Precision precision = train::Precision::Fp32,
               std::shared_ptr<Mlp> model = nullptr) {
  DpRank out;
  try {
    const int world = group ? group->size() : 1, rank = group ? group->rank() : 0;
    auto ds = make_data(kSamples);
    if (!model) model = dp_model();
    optim::SGD sgd(model->parameters(), {.lr = 0.1, .momentum = 0.9});
    data::DataLoader loader(ds, {.batch_size = batch, .drop_last = true,
                                 .sampler = data::DistributedSampler(kSamples, world, rank, {.shuffle = true, .seed = 5})});
    std::ostringstream os;
    train::TrainerOptions o{.epochs = 2, .precision = precision, .grad_scaler = {.init_scale = 1024.0, .growth_interval = 3},
                            .accumulation = accum, .clip_grad_norm = 1.0,
                            .progress = {.mode = train::ProgressMode::Lines, .out = &os, .every_steps = 1}};
    if (!dir.empty()) o.checkpoint = {.dir = dir, .every_epochs = 1};
    train::Trainer t(o);
    auto cb = std::make_shared<train::LambdaCallback>();
    cb->checkpoint = [&](const train::TrainerState&, const fs::path&) { ++out.checkpoints; };
    t.add_callback(cb);
    train::FitResult r;
    if (group) {
      dist::DataParallel dp(model, *group);
      r = t.fit(dp, loader, sgd, train::cross_entropy_loss());
    } else {
      r = t.fit(*model, loader, sgd, train::cross_entropy_loss());
    }
    out.params = param_bytes(*model);
    out.losses = r.train_losses;
    out.progress = os.str();
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

std::vector<float> as_floats(const std::vector<uint8_t>& b) {
  std::vector<float> f(b.size() / sizeof(float));
  std::memcpy(f.data(), b.data(), f.size() * sizeof(float));
  return f;
}

}  // namespace

TEST_CASE("Trainer data parallel over 2 ThreadProcessGroup ranks equals the single process on the whole batch", "[trainer][dist]") {
  testing::TempDir tmp("ember-trainer-");
  for (int64_t accum : {1, 2}) {
    INFO("accumulation " << accum);
    const DpRank single = dp_rank(nullptr, 8, accum, {});
    REQUIRE(single.error.empty());
    auto groups = dist::ThreadProcessGroup::create(2);
    std::vector<DpRank> ranks(2);
    const fs::path dir = tmp.path / ("dp" + std::to_string(accum));
    std::vector<std::thread> ts;
    std::vector<std::shared_ptr<Mlp>> models = {dp_model(), dp_model()};
    for (int r = 0; r < 2; ++r)
      ts.emplace_back([&, r] { ranks[r] = dp_rank(groups[r].get(), 4, accum, dir, train::Precision::Fp32, models[r]); });
    for (auto& t : ts) t.join();
    REQUIRE(ranks[0].error.empty());
    REQUIRE(ranks[1].error.empty());
    REQUIRE(ranks[0].params == ranks[1].params);  // the replicas agree bitwise
    REQUIRE(ranks[0].params.size() == single.params.size());
    for (size_t i = 0; i < single.params.size(); ++i) {
      const auto a = as_floats(ranks[0].params[i]), b = as_floats(single.params[i]);
      for (size_t k = 0; k < a.size(); ++k) REQUIRE(a[k] == Approx(b[k]).epsilon(1e-5).margin(1e-6));
    }
    // The mean of the two ranks' losses is the whole batch's loss.
    REQUIRE(single.losses.size() == ranks[0].losses.size());
    for (size_t i = 0; i < single.losses.size(); ++i)
      REQUIRE((ranks[0].losses[i] + ranks[1].losses[i]) / 2 == Approx(single.losses[i]).epsilon(1e-5));
    // Rank 0 prints and writes; rank 1 is silent.
    REQUIRE(ranks[0].progress.find("step 1/") != std::string::npos);
    REQUIRE(ranks[1].progress.empty());
    REQUIRE(ranks[0].checkpoints == 2);
    REQUIRE(ranks[1].checkpoints == 0);
    REQUIRE(train::CheckpointManager(dir).steps() == std::vector<int64_t>{12 / accum, 6 / accum});
  }
}

TEST_CASE("Trainer data parallel with fp16, the GradScaler and clipping matches the single process", "[trainer][dist]") {
  auto groups = dist::ThreadProcessGroup::create(2);
  std::vector<DpRank> ranks(2);
  std::vector<std::thread> ts;
  std::vector<std::shared_ptr<Mlp>> models = {dp_model(), dp_model()};
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] { ranks[r] = dp_rank(groups[r].get(), 4, 2, {}, train::Precision::Fp16, models[r]); });
  for (auto& t : ts) t.join();
  REQUIRE(ranks[0].error.empty());
  REQUIRE(ranks[1].error.empty());
  REQUIRE(ranks[0].params == ranks[1].params);
  const DpRank single = dp_rank(nullptr, 8, 2, {}, train::Precision::Fp16);
  REQUIRE(single.error.empty());
  for (size_t i = 0; i < single.params.size(); ++i) {
    const auto a = as_floats(ranks[0].params[i]), b = as_floats(single.params[i]);
    for (size_t k = 0; k < a.size(); ++k) REQUIRE(a[k] == Approx(b[k]).epsilon(1e-3).margin(1e-4));  // fp16 rounding
  }
}

TEST_CASE("Trainer data parallel: every rank resumes from the same checkpoint", "[trainer][dist]") {
  testing::TempDir tmp("ember-trainer-");
  auto run2 = [&](const fs::path& dir, int64_t epochs) {
    auto groups = dist::ThreadProcessGroup::create(2);
    std::vector<DpRank> ranks(2);
    std::vector<std::thread> ts;
    // Other initial weights on rank 1: the broadcast and the checkpoint fix them.
    std::vector<std::shared_ptr<Mlp>> models = {dp_model(99), dp_model(100)};
    for (int r = 0; r < 2; ++r)
      ts.emplace_back([&, r] {
        DpRank& out = ranks[r];
        try {
          auto ds = make_data(kSamples);
          auto model = models[static_cast<size_t>(r)];
          optim::SGD sgd(model->parameters(), {.lr = 0.1, .momentum = 0.9});
          data::DataLoader loader(ds, {.batch_size = 4, .drop_last = true,
                                       .sampler = data::DistributedSampler(kSamples, 2, r, {.shuffle = true, .seed = 5})});
          train::Trainer t(quiet({.epochs = epochs, .checkpoint = {.dir = dir, .every_epochs = 1}}));
          dist::DataParallel dp(model, *groups[static_cast<size_t>(r)]);
          train::FitResult res = t.fit(dp, loader, sgd, train::cross_entropy_loss());
          out.params = param_bytes(*model);
          out.losses = res.train_losses;
          out.checkpoints = static_cast<int>(res.start_step);
        } catch (const std::exception& e) {
          out.error = e.what();
        }
      });
    for (auto& t : ts) t.join();
    return ranks;
  };
  const auto full = run2(tmp.path / "full", 3);
  REQUIRE(full[0].error.empty());
  const auto first = run2(tmp.path / "a", 1);
  REQUIRE(first[0].error.empty());
  REQUIRE(first[1].error.empty());
  const auto second = run2(tmp.path / "a", 3);
  REQUIRE(second[0].error.empty());
  REQUIRE(second[1].error.empty());
  for (int r = 0; r < 2; ++r) {
    REQUIRE(second[static_cast<size_t>(r)].checkpoints == 6);  // both resumed at step 6
    REQUIRE(second[static_cast<size_t>(r)].params == full[0].params);
    REQUIRE(second[static_cast<size_t>(r)].losses.size() == 12);
    for (size_t i = 0; i < 12; ++i)
      REQUIRE(second[static_cast<size_t>(r)].losses[i] == full[static_cast<size_t>(r)].losses[6 + i]);
  }
}

namespace {

// A cuda:0 of CPU kernels whose GEMM has no fp16 (a device without fp16 support), installed for a
// scope when no real GPU is present.
class NoHalfBackend : public cpu::CpuBackend {
 public:
  Device device() const override { return Device::cuda(0); }
  void gemm(const GemmArgs& g) override {
    if (g.dtype == DType::Float16) throw DTypeError("gemm: float16 is not supported by this device");
    cpu::CpuBackend::gemm(g);
  }
};

using NoHalfDevice = testing::StandIn<NoHalfBackend, testing::CudaStandIn::Always>;

}  // namespace

TEST_CASE("Trainer bad options are clear errors", "[trainer]") {
  using train::Trainer;
  require_throws<ValueError>([] { Trainer(quiet({.accumulation = 0})); }, "Trainer: accumulation must be >= 1");
  require_throws<ValueError>([] { Trainer(quiet({.epochs = 0})); }, "epochs and max_steps are both 0");
  require_throws<ValueError>([] { Trainer(quiet({.epochs = -1})); }, "epochs and max_steps must be >= 0, got -1");
  data::DataLoader val(make_data(12), {.batch_size = 6});
  require_throws<ValueError>([&] { Trainer(quiet({.validation = {.loader = &val, .every_epochs = 0}})); },
                             "validation.every_epochs and validation.every_steps are both 0");
  require_throws<ValueError>([&] { Trainer(quiet({.validation = {.loader = &val, .every_steps = -2}})); },
                             "must be >= 0, got 1 and -2");
  require_throws<ValueError>([&] { Trainer(quiet({.validation = {.loader = &val, .top_k = 1}})); },
                             "validation.top_k must be 0 (off) or >= 2");
  require_throws<ValueError>([] { Trainer(quiet({.checkpoint = {.every_steps = 10}})); },
                             "checkpoint.dir is empty");
  require_throws<ValueError>([] { Trainer(quiet({.checkpoint = {.dir = "x", .best_metric = "val/loss"}})); },
                             "checkpoint.best_metric is 'val/loss' but there is no validation loader");
  require_throws<ValueError>(
      [&] { Trainer(quiet({.validation = {.loader = &val}, .checkpoint = {.dir = "x", .best_metric = "val/acc"}})); },
      "checkpoint.best_metric 'val/acc' is not a validation metric; these are reported: val/accuracy, val/loss");
  require_throws<ValueError>(
      [&] { Trainer(quiet({.validation = {.loader = &val}, .early_stopping = {.metric = "val/loss", .patience = 0}})); },
      "early_stopping.patience must be >= 1");
  require_throws<ValueError>([] { Trainer(quiet({.clip_grad_norm = -1})); }, "clip_grad_norm and clip_grad_value must be >= 0");
  require_throws<ValueError>([] { Trainer(quiet({.log_every_steps = 0})); }, "log_every_steps must be >= 1, got 0");
  require_throws<ValueError>([] { Trainer(quiet({.precision = train::Precision::Fp16, .grad_scaler = {.growth_factor = 0.5}})); },
                             "GradScaler");

  Setup s(0.0, 16);  // 3 batches per epoch
  require_throws<ValueError>(
      [&] { Trainer(quiet({.accumulation = 4})).fit(*s.model, *s.loader, *s.opt, train::cross_entropy_loss()); },
      "the train loader has 3 batch(es) per epoch, fewer than accumulation = 4");
  require_throws<ValueError>([&] { Trainer(quiet({})).fit(*s.model, *s.loader, *s.opt, train::LossFn{}); },
                             "the loss function is empty");
  require_throws<ShapeError>(
      [&] {
        Trainer(quiet({})).fit(*s.model, *s.loader, *s.opt, [](const AnyTensor& out, const AnyTensor&) { return out; });
      },
      "must return a scalar loss, got");
  require_throws<ValueError>(
      [&] {
        Trainer(quiet({.input_key = "x"})).fit(*s.model, *s.loader, *s.opt, train::cross_entropy_loss());
      },
      "a batch lacks the field 'x'");
  {
    Setup d(0.0, 16);
    d.model->to(DType::Float64);
    optim::SGD sgd(d.model->parameters(), {.lr = 0.1});
    require_throws<DTypeError>(
        [&] { Trainer(quiet({.precision = train::Precision::Bf16})).fit(*d.model, *d.loader, sgd, train::cross_entropy_loss()); },
        "precision bf16 keeps fp32 master weights, but parameter 'fc1.weight' is float64");
  }
  if (cuda::is_available()) {
    std::printf("SKIPPED: the fp16-less pretend device needs a machine without a GPU\n");
    return;
  }
  NoHalfDevice no_half;
  Setup d(0.0, 16);
  d.model->to(Device::cuda(0));
  require_throws<DeviceError>(
      [&] { Trainer(quiet({.precision = train::Precision::Fp16})).fit(*d.model, *d.loader, *d.opt, train::cross_entropy_loss()); },
      "Trainer: precision fp16 (float16) is not supported on cuda:0: gemm: float16 is not supported by this device");
  // bf16 on that device is fine as far as the check goes (the loader's batches are on the CPU
  // here, so only the check is exercised).
  REQUIRE_NOTHROW(train::trainer_detail::check_precision_on(train::Precision::Bf16, Device::cuda(0)));
}

namespace {

// How often `what` occurs in `text`, ignoring case.
size_t count_ignoring_case(std::string text, std::string what) {
  for (std::string* s : {&text, &what})
    for (char& c : *s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("Trainer prints the bottleneck verdict once, in any case", "[trainer][progress]") {
  Setup s(0.0, 8);  // 6 steps per epoch
  std::ostringstream os;
  train::Trainer t({.epochs = 1, .profile = {.steps = 2, .start_step = 1, .table_rows = 0},
                    .progress = {.mode = train::ProgressMode::Lines, .out = &os, .every_steps = 100}});
  t.fit(*s.model, *s.loader, *s.opt, train::cross_entropy_loss());
  INFO(os.str());
  REQUIRE(count_ignoring_case(os.str(), "verdict:") == 1);
  REQUIRE(os.str().find("Step breakdown") != std::string::npos);  // the profiler's step report is there
}

TEST_CASE("Trainer without validation reports the training loss in final_metrics", "[trainer]") {
  Setup s(0.0, 8);
  train::Trainer t(quiet({.epochs = 1}));
  train::FitResult r = t.fit(*s.model, *s.loader, *s.opt, train::cross_entropy_loss());
  REQUIRE(r.train_losses.size() == 6);
  REQUIRE(r.final_loss == r.train_losses.back());
  REQUIRE(r.final_metrics == train::Metrics{{"train/loss", r.train_losses.back()}});

  // With validation: the last validation's metrics and the training loss.
  Setup v(0.0, 8);
  data::DataLoader val(make_data(12, 0.5), {.batch_size = 6});
  train::Trainer tv(quiet({.epochs = 1, .validation = {.loader = &val}}));
  train::FitResult rv = tv.fit(*v.model, *v.loader, *v.opt, train::cross_entropy_loss());
  REQUIRE(rv.history.size() == 1);
  train::Metrics want = rv.history.back().metrics;
  want["train/loss"] = rv.train_losses.back();
  REQUIRE(rv.final_metrics == want);
}

TEST_CASE("Trainer run again after the run finished reports its figures and that it was complete", "[trainer]") {
  testing::TempDir tmp("ember-trainer-");
  const fs::path dir = tmp.path / "a";
  ResumeRun full(dir, 0, {.every_epochs = 1});
  REQUIRE(full.result.steps == 18);
  REQUIRE_FALSE(full.result.already_complete);
  REQUIRE(full.result.final_loss == full.result.train_losses.back());
  std::ostringstream os;
  ResumeRun again(dir, 0, {.every_epochs = 1}, nullptr, nullptr, 3, &os);
  INFO(os.str());
  REQUIRE(again.result.already_complete);
  REQUIRE(again.result.resumed_from == dir / "step-18");
  REQUIRE(again.result.start_step == 18);
  REQUIRE(again.result.steps == 18);
  REQUIRE(again.result.train_losses.empty());
  REQUIRE(again.result.history.empty());
  REQUIRE(again.result.final_loss == full.result.final_loss);
  REQUIRE(again.result.final_metrics == full.result.final_metrics);
  REQUIRE(again.result.final_metrics.at("val/accuracy") == full.result.history.back().metrics.at("val/accuracy"));
  REQUIRE(os.str().find("already complete") != std::string::npos);
  REQUIRE(train::CheckpointManager(dir).steps() == std::vector<int64_t>{18, 12, 6});  // nothing new written
  REQUIRE(param_bytes(*again.s.model) == param_bytes(*full.s.model));
}

TEST_CASE("Trainer run again after early stopping stays stopped", "[trainer]") {
  testing::TempDir tmp("ember-trainer-");
  data::DataLoader val(make_data(12, 0.5), {.batch_size = 6});
  auto run = [&] {
    Setup s;
    optim::SGD sgd(s.model->parameters(), {.lr = 0.0});  // val/loss never improves
    train::Trainer t(quiet({.epochs = 10,
                            .validation = {.loader = &val},
                            .checkpoint = {.dir = tmp.path / "c", .every_epochs = 1},
                            .early_stopping = {.metric = "val/loss", .patience = 2}}));
    return t.fit(*s.model, *s.loader, sgd, train::cross_entropy_loss());
  };
  const train::FitResult first = run();
  REQUIRE(first.early_stopped);
  REQUIRE(first.steps == 3 * 12);
  const train::FitResult again = run();
  REQUIRE(again.resumed_from == tmp.path / "c" / "step-36");
  REQUIRE(again.already_complete);
  REQUIRE(again.steps == 3 * 12);
  REQUIRE(again.early_stopped);
  REQUIRE(again.train_losses.empty());
  REQUIRE(again.final_loss == first.final_loss);
  REQUIRE(again.final_metrics == first.final_metrics);
}

// The earlier flat layout of the Trainer's checkpoint state (have_best, best, best_step, es_have,
// es_best, es_bad): such a checkpoint resumes best-by-metric and early stopping where they were.
TEST_CASE("Trainer resumes a checkpoint whose trainer state has the flat best/es keys", "[trainer]") {
  testing::TempDir tmp("ember-trainer-");
  data::DataLoader val(make_data(12, 0.5), {.batch_size = 6});
  auto run = [&](const fs::path& dir, int64_t epochs) {
    Setup s;
    optim::SGD sgd(s.model->parameters(), {.lr = 0.0});  // val/loss never improves: best stays at step 12
    train::Trainer t(quiet({.epochs = epochs,
                            .validation = {.loader = &val},
                            .checkpoint = {.dir = dir, .every_epochs = 1, .best_metric = "val/loss",
                                           .best_mode = train::MetricMode::Min},
                            .early_stopping = {.metric = "val/loss", .patience = 3}}));
    return t.fit(*s.model, *s.loader, sgd, train::cross_entropy_loss());
  };
  const train::FitResult full = run(tmp.path / "full", 10);
  REQUIRE(full.early_stopped);
  REQUIRE(full.epochs_completed == 4);  // best at epoch 1, three without improvement
  REQUIRE(full.best_step == 12);
  const double best = full.history.front().metrics.at("val/loss");

  for (const bool flat : {false, true}) {
    INFO((flat ? "flat keys" : "as written"));
    const fs::path dir = tmp.path / (flat ? "flat" : "nested");
    const train::FitResult first = run(dir, 2);
    REQUIRE(first.steps == 24);
    if (flat) {
      const fs::path state = dir / "step-24" / "state.json";
      nlohmann::json j;
      {
        std::ifstream in(state);
        in >> j;
      }
      j["user"]["trainer"] = {{"step", 24},      {"epoch", 2},
                              {"step_in_epoch", 0}, {"have_best", true},
                              {"best", best},    {"best_step", 12},
                              {"best_path", (dir / "best" / "step-12").string()},
                              {"es_have", true}, {"es_best", best},
                              {"es_bad", 1}};
      std::ofstream(state) << j.dump(2) << "\n";
    }
    const train::FitResult second = run(dir, 10);
    REQUIRE(second.resumed_from == dir / "step-24");
    REQUIRE_FALSE(second.already_complete);
    REQUIRE(second.early_stopped);
    REQUIRE(second.steps == full.steps);
    REQUIRE(second.epochs_completed == 2);
    REQUIRE(second.best_step == 12);
    REQUIRE(second.best_metric == best);
    REQUIRE(second.best_checkpoint == dir / "best" / "step-12");
  }
}
