#pragma once
// train::Trainer: the training loop, done right by default (docs/training.md). Optional: every
// piece it uses (DataLoader, GradScaler, GradientAccumulator, CheckpointManager, MetricsLogger,
// Profiler, DataParallel) stays usable by hand.
//
//   #include <ember/ember.hpp>
//   #include <ember/train/trainer.hpp>
//   using namespace ember;
//
//   data::DataLoader train_loader(train_set, {.batch_size = 64, .shuffle = true, .seed = 1, .drop_last = true});
//   data::DataLoader val_loader(val_set, {.batch_size = 500});
//   auto model = make_model();                                   // any nn::Module (shared_ptr)
//   optim::AdamW opt(model->parameters(), {.lr = 3e-3});
//   optim::OneCycleLR sched(opt, {.max_lr = 3e-3, .total_steps = 5 * train_loader.num_batches()});
//
//   train::Trainer trainer({
//       .epochs = 5,
//       .precision = train::Precision::Bf16,                     // fp32 master weights
//       .scheduler = &sched,                                     // stepped every optimizer step
//       .validation = {.loader = &val_loader, .top_k = 5},       // val/loss, val/accuracy, val/top5 each epoch
//       .checkpoint = {.dir = "runs/a/ckpt", .every_epochs = 1, .best_metric = "val/accuracy"},
//       .log_dir = "runs/a",                                     // TensorBoard, metrics.jsonl/.csv
//   });
//   train::FitResult r = trainer.fit(*model, train_loader, opt, train::cross_entropy_loss());
//   std::printf("best %s at %s, %.0f samples/s\n", r.best_metric_name.c_str(),
//               r.best_checkpoint.c_str(), r.samples_per_second);
//
// Batches: the model gets batch[input_key] ("image"), cast to the precision's dtype when it is
// floating point; the loss gets the model's output and batch[target_key] ("label"). A StepFn
// replaces both: it gets the batch and returns the loss (the freedom of a hand-written forward);
// the Trainer still does scaling, accumulation, backward, clipping and the optimizer step.
//
// One optimizer step = `accumulation` loader batches (micro-batches). An epoch has
// floor(num_batches / accumulation) steps; the batches left over at an epoch's end are not
// loaded. `epochs` and `max_steps` bound the run (either or both; the first reached ends it).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ember/amp/grad_scaler.hpp"
#include "ember/data/dataloader.hpp"
#include "ember/dist/data_parallel.hpp"
#include "ember/logging/metrics_logger.hpp"
#include "ember/nn/loss.hpp"
#include "ember/nn/module.hpp"
#include "ember/optim/optimizer.hpp"
#include "ember/optim/scheduler.hpp"
#include "ember/train/metric_tracker.hpp"
#include "ember/train/progress.hpp"

namespace ember::train {

// ---------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------

// The activation dtype of forward and backward. Parameters stay fp32 (master weights) in every
// mode; Fp16 adds a GradScaler (TrainerOptions::grad_scaler), Bf16 needs none.
enum class Precision { Fp32, Fp16, Bf16 };
inline const char* precision_name(Precision p) {
  switch (p) {
    case Precision::Fp32: return "fp32";
    case Precision::Fp16: return "fp16";
    case Precision::Bf16: return "bf16";
  }
  return "?";
}

// When the LR scheduler is stepped: after every optimizer step, or after every epoch.
enum class SchedulerInterval { Step, Epoch };

// A validation metric computed by the caller: the mean of something over one batch (the Trainer
// averages batches weighted by their sample count, over every rank).
struct Metric {
  std::string name;  // logged as "val/<name>"
  std::function<double(const AnyTensor& output, const data::Batch& batch)> fn;
};

struct ValidationOptions {
  data::DataLoader* loader = nullptr;  // null: no validation
  int64_t every_epochs = 1;            // validate at the end of every this many epochs (0: not by epochs)
  int64_t every_steps = 0;             // and/or every this many optimizer steps (0: not by steps)
  bool accuracy = true;                // val/accuracy: argmax of the output over dim 1 == the target
  int top_k = 0;                       // also val/top<k>_accuracy (k >= 2; 0: none)
  std::vector<Metric> metrics;         // user metrics
};

struct CheckpointPolicy {
  std::filesystem::path dir;   // empty: no checkpoints (and no resume)
  int64_t every_steps = 0;     // a checkpoint every this many optimizer steps (0: not by steps)
  int64_t every_epochs = 0;    // and/or at the end of every this many epochs (0: not by epochs)
  int keep_last = 3;           // the newest this many are kept (0: all)
  bool resume = true;          // resume = auto: start from the newest complete checkpoint in dir
  bool save_async = false;     // write on a background thread (CheckpointManager::save_async)
  bool save_on_cancel = true;  // a cancelled run writes a checkpoint of the step it stopped after
  bool save_at_end = false;    // a checkpoint of the last step when the run ends
  // Best by metric: after each validation that improves on `best_metric` ("val/accuracy",
  // "val/loss", ...), a checkpoint is written to dir/best/step-<n> (only the best one is kept).
  std::string best_metric;
  MetricMode best_mode = MetricMode::Max;  // Max for accuracies; use Min for losses
};

struct EarlyStopping {
  std::string metric;            // empty: off; else a validation metric ("val/loss")
  MetricMode mode = MetricMode::Min;
  int patience = 3;              // stop after this many validations without an improvement
  double min_delta = 0;          // an improvement must beat the best by more than this
};

struct ProfileWindow {
  int64_t steps = 0;             // profile this many optimizer steps (0: off)
  int64_t start_step = 5;        // starting after this many steps of the run (warm-up)
  std::string trace_path;        // also write a Chrome trace there (rank 0)
  int table_rows = 15;           // the op table's rows printed before the step report (0: none)
};

}  // namespace ember::train
namespace ember::dist {
class FullyShardedDataParallel;
}
namespace ember::train {

class CancelToken;
class Callback;
namespace trainer_detail {
class TrainingRun;
}

struct TrainerOptions {
  // The budget (at least one of them > 0; the first reached ends the run).
  int64_t epochs = 1;
  int64_t max_steps = 0;  // optimizer steps in the whole run, counting those before a resume (0: no limit)

  // Batches.
  std::string input_key = "image";
  std::string target_key = "label";

  // The step.
  Precision precision = Precision::Fp32;
  amp::GradScalerOptions grad_scaler = {};  // Fp16 only
  int64_t accumulation = 1;                 // micro-batches per optimizer step
  double clip_grad_norm = 0;                // > 0: clip_grad_norm_ to this (after unscaling)
  double clip_grad_value = 0;               // > 0: clip_grad_value_ to this
  optim::LRScheduler* scheduler = nullptr;
  SchedulerInterval scheduler_interval = SchedulerInterval::Step;

  ValidationOptions validation = {};
  CheckpointPolicy checkpoint = {};
  EarlyStopping early_stopping = {};

  // Logging (rank 0): scalars every log_every_steps steps ("train/loss", "train/lr",
  // "train/samples_per_second") and every validation's metrics, through logging::MetricsLogger:
  // into `logger` when given, else into a logger the Trainer makes in log_dir (when not empty).
  logging::MetricsLogger* logger = nullptr;
  std::filesystem::path log_dir;
  int64_t log_every_steps = 10;
  // Written once at the start of fit through the logger (hparams.json beside the logs, and a
  // "hparams" text summary), when there is a logger and the list is not empty.
  logging::HParams hparams = {};
  // An MLflow run (an mlruns/ folder, logging/mlflow.hpp) beside the logs of the logger the
  // Trainer makes in log_dir, when mlflow.tracking_dir is set: the scalars as metrics, hparams as
  // params. A fit that resumes a checkpoint continues the run <log_dir>/mlflow_run_id names
  // (its metrics after the checkpoint's step dropped: one history, as if never interrupted); a
  // fit from step 0 starts a new run. Status FINISHED, KILLED (cancelled) or FAILED (fit threw).
  // With mlflow.log_checkpoints, the last and the best checkpoint are copied into the run's
  // artifacts/checkpoints/ at the end. (A logger of the caller's gets its MLflow run through its
  // own MetricsLoggerOptions; the Trainer still tells it resume_at and the outcome.)
  logging::MlflowOptions mlflow = {};

  ProfileWindow profile = {};
  ProgressOptions progress = {};  // the bar (rank 0 only)

  CancelToken* cancel = nullptr;  // another thread may cancel the run through it
};

// ---------------------------------------------------------------------------------------------
// State, results, callbacks
// ---------------------------------------------------------------------------------------------

// Where the run is; what callbacks see.
struct TrainerState {
  int64_t epoch = 0;            // the current epoch (0-based)
  int64_t step = 0;             // optimizer steps done in the whole run
  int64_t step_in_epoch = 0;    // optimizer steps done in this epoch
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;      // the budget in optimizer steps
  int64_t start_step = 0;       // where this fit started (> 0 after a resume)
  double loss = 0;              // the last step's training loss (mean over its micro-batches, this rank;
                                // after a resume, the checkpoint's until a step runs)
  double lr = 0;                // group 0's learning rate
  int64_t samples = 0;          // samples this rank trained on in this fit
  double seconds = 0;           // wall time of this fit so far
  Metrics metrics;              // the latest validation's metrics (after a resume, the checkpoint's)
  int rank = 0, world_size = 1;
};

struct EvalRecord {
  int64_t step = 0, epoch = 0;
  Metrics metrics;
};

// What fit returns. A fit that resumes a checkpoint of a run that had already ended (its budget
// spent, or stopped early) trains nothing: already_complete is true, and final_loss and
// final_metrics are the run's, read from that checkpoint.
struct FitResult {
  bool cancelled = false;       // stopped through the CancelToken
  bool early_stopped = false;   // stopped by EarlyStopping (in this fit, or in the run it resumed)
  bool already_complete = false;  // resumed a finished run: nothing left to train, no step ran
  int64_t steps = 0;            // optimizer steps done in the whole run (resumed ones included)
  int64_t start_step = 0;       // the step this fit started from (0, or the resumed checkpoint's)
  int64_t epochs_completed = 0;
  std::filesystem::path resumed_from;     // the checkpoint resumed from; empty when none
  std::filesystem::path last_checkpoint;  // the newest checkpoint written; empty when none
  std::filesystem::path best_checkpoint;  // dir/best/step-<n>; empty when none
  std::string best_metric_name;
  double best_metric = 0;
  int64_t best_step = -1;
  std::vector<EvalRecord> history;          // every validation of this fit, in order (not those before a resume)
  std::vector<double> train_losses;         // every step's loss in this fit (this rank)
  // The latest validation's metrics in the run (those of the resumed checkpoint when this fit has
  // not validated yet), and "train/loss": final_loss. Without validation, "train/loss" alone.
  Metrics final_metrics;
  double final_loss = 0;                    // the run's last step's loss (this rank; 0 when unknown)
  double seconds = 0;                       // wall time of fit
  int64_t samples = 0;                      // samples this rank trained on
  double samples_per_second = 0;            // this rank's
};

// Callbacks run on every rank, on the training thread, in this order:
//   fit_start, { epoch_start, { step_end, [validation_end], [checkpoint] }*, [validation_end],
//   [checkpoint], epoch_end }*, fit_end        -- or exception (then fit rethrows)
// on_checkpoint gets the committed folder (with save_async: once it is queued; it commits in the
// background). Rank 0 alone writes checkpoints, so on_checkpoint runs on rank 0 only.
class Callback {
 public:
  virtual ~Callback() = default;
  virtual void on_fit_start(const TrainerState&) {}
  virtual void on_epoch_start(const TrainerState&) {}
  virtual void on_step_end(const TrainerState&) {}
  virtual void on_validation_end(const TrainerState&, const Metrics&) {}
  virtual void on_checkpoint(const TrainerState&, const std::filesystem::path&) {}
  virtual void on_epoch_end(const TrainerState&) {}
  virtual void on_fit_end(const TrainerState&, const FitResult&) {}
  // The exception about to leave fit (rethrown after every callback's on_exception).
  virtual void on_exception(const TrainerState&, std::exception_ptr) {}
};

// A Callback from lambdas (unset ones do nothing).
struct LambdaCallback : Callback {
  std::function<void(const TrainerState&)> fit_start, epoch_start, step_end, epoch_end;
  std::function<void(const TrainerState&, const Metrics&)> validation_end;
  std::function<void(const TrainerState&, const std::filesystem::path&)> checkpoint;
  std::function<void(const TrainerState&, const FitResult&)> fit_end;
  std::function<void(const TrainerState&, std::exception_ptr)> exception;
  void on_fit_start(const TrainerState& s) override { if (fit_start) fit_start(s); }
  void on_epoch_start(const TrainerState& s) override { if (epoch_start) epoch_start(s); }
  void on_step_end(const TrainerState& s) override { if (step_end) step_end(s); }
  void on_validation_end(const TrainerState& s, const Metrics& m) override { if (validation_end) validation_end(s, m); }
  void on_checkpoint(const TrainerState& s, const std::filesystem::path& p) override { if (checkpoint) checkpoint(s, p); }
  void on_epoch_end(const TrainerState& s) override { if (epoch_end) epoch_end(s); }
  void on_fit_end(const TrainerState& s, const FitResult& r) override { if (fit_end) fit_end(s, r); }
  void on_exception(const TrainerState& s, std::exception_ptr e) override { if (exception) exception(s, e); }
};

// Set from any thread; the Trainer checks it after every optimizer step: the step finishes, a
// checkpoint is written (CheckpointPolicy::save_on_cancel), and fit returns with cancelled = true.
class CancelToken {
 public:
  void cancel() { flag_.store(true, std::memory_order_release); }
  bool cancelled() const { return flag_.load(std::memory_order_acquire); }
  void reset() { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

// ---------------------------------------------------------------------------------------------
// Losses and steps
// ---------------------------------------------------------------------------------------------

// loss(output, target): a scalar, differentiable in output.
using LossFn = std::function<AnyTensor(const AnyTensor& output, const AnyTensor& target)>;

// What a StepFn sees besides the batch.
struct StepContext {
  int64_t step = 0;         // the optimizer step being computed (0-based, whole run)
  int64_t epoch = 0;
  int64_t micro_batch = 0;  // in [0, accumulation)
  DType compute_dtype = DType::Float32;  // the precision's activation dtype
  // x cast to compute_dtype when it is floating point, else x itself (token ids, labels).
  AnyTensor cast(const AnyTensor& x) const {
    return is_floating(x.dtype()) && x.dtype() != compute_dtype ? x.to(compute_dtype) : x;
  }
};
// A hand-written forward: returns the micro-batch's loss (a differentiable scalar).
using StepFn = std::function<AnyTensor(const data::Batch& batch, StepContext& ctx)>;

// nn::functional's losses on any floating dtype (computed in fp32 for fp16/bf16 outputs).
inline LossFn cross_entropy_loss();
inline LossFn mse_loss();

// ---------------------------------------------------------------------------------------------
// Trainer
// ---------------------------------------------------------------------------------------------

class Trainer {
 public:
  // Checks the options (ValueError naming the option and its value).
  explicit Trainer(TrainerOptions options = {});

  Trainer& add_callback(std::shared_ptr<Callback> cb) {
    callbacks_.push_back(std::move(cb));
    return *this;
  }
  const TrainerOptions& options() const { return opt_; }

  // Trains `model` (its parameters must be the optimizer's).
  FitResult fit(nn::Module& model, data::DataLoader& train, optim::Optimizer& opt, LossFn loss);
  FitResult fit(nn::Module& model, data::DataLoader& train, optim::Optimizer& opt, StepFn step);
  // Data parallel: every rank calls fit with its DataParallel replica and a loader over its share
  // of the data (data::DistributedSampler). Rank 0 logs, prints and writes checkpoints; every rank
  // resumes from the same checkpoint (checkpoint.dir must be one folder all ranks can read).
  FitResult fit(dist::DataParallel& model, data::DataLoader& train, optim::Optimizer& opt, LossFn loss);
  FitResult fit(dist::DataParallel& model, data::DataLoader& train, optim::Optimizer& opt, StepFn step);
  // Fully sharded (dist/fsdp.hpp, ZeRO-2/3): `opt` is over model.parameters() (the shards).
  // Every rank runs every step's collectives; clipping uses the global norm; checkpoints are
  // sharded (dist/sharded_checkpoint.hpp: every rank writes its shard, one commit) and a resume
  // reshards when the number of ranks changed.
  FitResult fit(dist::FullyShardedDataParallel& model, data::DataLoader& train, optim::Optimizer& opt, LossFn loss);
  FitResult fit(dist::FullyShardedDataParallel& model, data::DataLoader& train, optim::Optimizer& opt, StepFn step);

  // One pass over `loader` without gradients, in eval mode (training mode restored after):
  // val/loss (when loss is set), val/accuracy, val/top<k>_accuracy and the user metrics of
  // options().validation, averaged over the samples of every rank when group is given.
  Metrics evaluate(nn::Module& model, data::DataLoader& loader, const LossFn& loss,
                   dist::ProcessGroup* group = nullptr);

 private:
  friend class trainer_detail::TrainingRun;  // the loop of one fit (detail/training_run.hpp)

  FitResult run(nn::Module& model, dist::DataParallel* dp, dist::FullyShardedDataParallel* fsdp,
                data::DataLoader& train, optim::Optimizer& opt, const LossFn* loss, const StepFn* step);
  Metrics evaluate_impl(nn::Module& model, data::DataLoader& loader, const LossFn* loss, const StepFn* step,
                        dist::ProcessGroup* group, int64_t global_step, int64_t epoch);

  TrainerOptions opt_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
};

}  // namespace ember::train

#include "ember/train/detail/trainer_impl.hpp"
