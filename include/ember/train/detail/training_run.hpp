#pragma once
// The loop of one train::Trainer::fit (the Trainer's API and its documentation:
// ember/train/trainer.hpp, docs/training.md): TrainingRun holds where the run is, and has one
// method per phase of it, which run() calls in order.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ember/amp/autocast.hpp"
#include "ember/data/dataloader_json.hpp"
#include "ember/dist/data_parallel.hpp"
#include "ember/dist/fsdp.hpp"
#include "ember/dist/sharded_checkpoint.hpp"
#include "ember/optim/clip.hpp"
#include "ember/train/accumulate.hpp"
#include "ember/train/checkpoint_manager.hpp"
#include "ember/train/detail/profile_window.hpp"
#include "ember/train/metric_tracker.hpp"
#include "ember/train/trainer.hpp"

namespace ember::train::trainer_detail {

inline DType compute_dtype(Precision p) {
  switch (p) {
    case Precision::Fp16: return DType::Float16;
    case Precision::Bf16: return DType::BFloat16;
    case Precision::Fp32: break;
  }
  return DType::Float32;
}

// Whether the device computes in dtype: a 2x2 matmul and a cast back, the kernels a forward and a
// backward need first. A backend without them throws; that becomes a DeviceError naming both.
inline void check_precision_on(Precision p, Device d) {
  if (p == Precision::Fp32) return;
  const DType dt = compute_dtype(p);
  try {
    NoGradGuard no_grad;
    AnyTensor a = AnyTensor::full(Shape{2, 2}, 1.0, dt, d);
    AnyTensor c = op::matmul(a, a).to(DType::Float32);
    (void)c;
  } catch (const std::exception& e) {
    throw DeviceError(::ember::detail::str_cat("Trainer: precision ", precision_name(p), " (", dtype_name(dt),
                                               ") is not supported on ", d.str(), ": ", e.what()));
  }
}

inline double scalar_value(const AnyTensor& loss, const char* who) {
  EMBER_CHECK(loss.defined(), ValueError, "Trainer: the ", who, " returned an undefined tensor");
  EMBER_CHECK(loss.numel() == 1, ShapeError, "Trainer: the ", who, " must return a scalar loss, got ", loss.desc());
  EMBER_CHECK(is_floating(loss.dtype()), DTypeError, "Trainer: the ", who, " must return a floating-point loss, got ",
              loss.desc());
  return loss.item_double();
}

// "val/loss 0.1234  val/accuracy 0.9500": metrics as the progress output shows them.
inline std::string metrics_text(const Metrics& m) {
  std::string s;
  char buf[96];
  for (const auto& [k, v] : m) {
    std::snprintf(buf, sizeof buf, "%s%s %.4f", s.empty() ? "" : "  ", k.c_str(), v);
    s += buf;
  }
  return s;
}

class TrainingRun {
 public:
  // The checks that need the model and the data (ValueError / DTypeError / DeviceError).
  TrainingRun(Trainer& trainer, nn::Module& model, dist::DataParallel* dp, dist::FullyShardedDataParallel* fsdp,
              data::DataLoader& train, optim::Optimizer& opt, const LossFn* loss, const StepFn* step_fn);
  TrainingRun(const TrainingRun&) = delete;
  TrainingRun& operator=(const TrainingRun&) = delete;

  FitResult run();

 private:
  using Clock = std::chrono::steady_clock;
  struct StepTotals {
    double loss_sum = 0;  // over the micro-batches
    int64_t samples = 0;
  };

  // ---- the phases, in the order run() calls them ----
  void resume();
  void resume_sharded();
  void apply_resumed_checkpoint(const nlohmann::json& user, const nlohmann::json& data,
                                const std::filesystem::path& path, const std::string& hint);
  void open_logger();
  void log_checkpoint_artifacts();
  void report_already_complete();
  void run_epochs();
  bool budget_left() const;
  void start_epoch();
  void run_epoch_steps();
  StepTotals step();  // forward and backward of the step's micro-batches
  void optimizer_step();
  void end_step(const StepTotals& totals);
  void step_interval_work();  // validation and checkpoints due at this step
  bool cancel_requested();
  void save_after_cancel();
  void end_epoch();
  void finish();
  void fail(std::exception_ptr e) noexcept;
  FitResult result();

  // ---- the pieces ----
  AnyTensor micro_batch_loss(const data::Batch& batch, StepContext& ctx);
  void validate();
  void save_checkpoint();
  bool checkpoints_on() const { return checkpoints_ || sharded_checkpoints_; }
  void save_best_checkpoint_if_due();
  void save_to(CheckpointManager& manager, bool is_best);
  void save_sharded_to(dist::ShardedCheckpointManager& manager, bool is_best);  // every rank
  void checkpoint_written(const std::filesystem::path& p, bool is_best);
  bool epoch_ends_with_validation() const;
  bool epoch_ends_with_checkpoint() const;
  bool early_stopping_patience_spent() const;
  nlohmann::json trainer_state_json() const;
  void restore_trainer_state(const nlohmann::json& j, const std::string& who);
  ProgressInfo progress_info() const;
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - started_).count(); }
  template <class F>
  void fire(F&& f) {
    for (auto& cb : trainer_.callbacks_) f(*cb);
  }

  // ---- what this fit was given ----
  Trainer& trainer_;
  const TrainerOptions& options_;
  nn::Module& model_;
  dist::DataParallel* data_parallel_;  // null: one process, or fully sharded
  dist::FullyShardedDataParallel* sharded_;  // null: not fully sharded
  dist::ProcessGroup* group_;          // data_parallel_'s or sharded_'s group, or null
  data::DataLoader& train_loader_;
  optim::Optimizer& optimizer_;
  const LossFn* loss_fn_;  // one of loss_fn_ and step_fn_ is set
  const StepFn* step_fn_;
  const int rank_, world_size_;
  const bool is_writer_;  // rank 0: logs, prints, writes checkpoints
  const DType compute_dtype_;
  const int64_t accumulation_;     // micro-batches per optimizer step
  const int64_t steps_per_epoch_;  // optimizer steps
  int64_t total_steps_ = 0;        // the budget in optimizer steps
  std::vector<AnyTensor> params_;  // the optimizer's, for clipping

  // ---- the step's machinery ----
  const bool scaler_on_;
  amp::GradScaler scaler_;
  GradientAccumulator accumulator_;

  // ---- where the run is (saved in checkpoints, with the model and the optimizer) ----
  TrainerState state_;             // step, loss, metrics, ...: what callbacks see
  int64_t epoch_ = 0;              // the epoch the train loader is in (0-based)
  int64_t step_in_epoch_ = 0;      // its optimizer steps done
  bool loss_known_ = false;        // state_.loss is a step's (run here or read from the checkpoint)
  MetricTracker best_tracker_;     // CheckpointPolicy::best_metric
  MetricTracker early_stop_tracker_;
  std::string best_checkpoint_path_;  // the newest best checkpoint's folder (also after a resume)

  // ---- what is due ----
  bool best_checkpoint_due_ = false;  // a validation improved best_metric; saved after that step's work
  bool stop_early_ = false;

  // ---- checkpoints ----
  std::unique_ptr<CheckpointManager> checkpoints_, best_checkpoints_;
  CheckpointTargets targets_;
  // Fully sharded runs: every rank writes its shard of each checkpoint (dist/sharded_checkpoint.hpp).
  std::unique_ptr<dist::ShardedCheckpointManager> sharded_checkpoints_, sharded_best_;
  dist::ShardedCheckpointTargets sharded_targets_;
  int64_t last_saved_step_ = -1;

  // ---- observers (rank 0) ----
  std::unique_ptr<logging::MetricsLogger> own_logger_;
  logging::MetricsLogger* logger_ = nullptr;
  ProgressBar progress_;
  ProfileWindowRecorder profile_;
  Clock::time_point started_ = Clock::now();

  FitResult result_;
};

inline ProgressOptions progress_for_rank(ProgressOptions p, bool is_writer) {
  p.enabled = p.enabled && is_writer;
  return p;
}

inline amp::GradScalerOptions scaler_options(amp::GradScalerOptions o, bool on) {
  o.enabled = on;
  return o;
}

inline TrainingRun::TrainingRun(Trainer& trainer, nn::Module& model, dist::DataParallel* dp,
                                dist::FullyShardedDataParallel* fsdp, data::DataLoader& train, optim::Optimizer& opt,
                                const LossFn* loss, const StepFn* step_fn)
    : trainer_(trainer),
      options_(trainer.opt_),
      model_(model),
      data_parallel_(dp),
      sharded_(fsdp),
      group_(dp ? &dp->group() : fsdp ? &fsdp->group() : nullptr),
      train_loader_(train),
      optimizer_(opt),
      loss_fn_(loss),
      step_fn_(step_fn),
      rank_(group_ ? group_->rank() : 0),
      world_size_(group_ ? group_->size() : 1),
      is_writer_(rank_ == 0),
      compute_dtype_(compute_dtype(options_.precision)),
      accumulation_(options_.accumulation),
      steps_per_epoch_(train.num_batches() / options_.accumulation),
      scaler_on_(options_.precision == Precision::Fp16 && options_.grad_scaler.enabled),
      scaler_(scaler_options(options_.grad_scaler, scaler_on_)),
      accumulator_(options_.accumulation),
      best_tracker_(options_.checkpoint.best_metric, options_.checkpoint.best_mode),
      // (min_delta is checked by the Trainer when early stopping is on; unused when it is off)
      early_stop_tracker_(options_.early_stopping.metric, options_.early_stopping.mode,
                          std::max(0.0, options_.early_stopping.min_delta)),
      progress_(progress_for_rank(options_.progress, is_writer_)),
      profile_(options_.profile, is_writer_) {
  const TrainerOptions& o = options_;
  EMBER_CHECK(steps_per_epoch_ >= 1, ValueError, "Trainer.fit: the train loader has ", train.num_batches(),
              " batch(es) per epoch, fewer than accumulation = ", accumulation_,
              " (an epoch would have no optimizer step)");
  for (const auto& g : opt.param_groups())
    for (const auto& p : g.params) params_.push_back(p);
  EMBER_CHECK(!params_.empty(), ValueError, "Trainer.fit: the optimizer has no parameters");
  if (sharded_) {
    // The optimizer must step the shards (the module's parameters are views of gathered copies).
    const std::vector<AnyTensor> shards = sharded_->parameters();
    for (const AnyTensor& p : params_)
      EMBER_CHECK(std::any_of(shards.begin(), shards.end(), [&](const AnyTensor& s) { return s.same(p); }), ValueError,
                  "Trainer.fit: under FullyShardedDataParallel the optimizer must be built over its parameters() "
                  "(this rank's shards), but it holds ", p.desc(), ", which is not one of them");
  }
  if (o.precision != Precision::Fp32) {
    // Fully sharded: the masters are the shards (the module's parameters may be bf16/fp16 copies).
    std::vector<std::pair<std::string, AnyTensor>> masters;
    if (sharded_) {
      for (size_t i = 0; i < sharded_->unit_count(); ++i)
        masters.emplace_back("shard of unit '" + sharded_->unit_info(i).name + "'", sharded_->shard(i));
    } else {
      masters = model.named_parameters();
    }
    for (const auto& [name, p] : masters)
      EMBER_CHECK(p.dtype() == DType::Float32, DTypeError, "Trainer.fit: precision ", precision_name(o.precision),
                  " keeps fp32 master weights, but parameter '", name, "' is ", dtype_name(p.dtype()),
                  " (keep the parameters float32; the activations are cast)");
    check_precision_on(o.precision, params_.front().device());
  }
  if (o.scheduler)
    EMBER_CHECK(&o.scheduler->optimizer() == &opt, ValueError,
                "Trainer.fit: the scheduler (", o.scheduler->name(), ") belongs to another optimizer");
  total_steps_ = o.epochs > 0 ? o.epochs * steps_per_epoch_ : o.max_steps;
  if (o.max_steps > 0) total_steps_ = std::min(total_steps_, o.max_steps);
  state_.steps_per_epoch = steps_per_epoch_;
  state_.total_steps = total_steps_;
  state_.rank = rank_;
  state_.world_size = world_size_;
}

inline FitResult TrainingRun::run() {
  resume();
  open_logger();
  model_.train();
  started_ = Clock::now();
  fire([&](Callback& c) { c.on_fit_start(state_); });
  try {
    if (result_.already_complete)
      report_already_complete();
    else
      run_epochs();
    finish();
  } catch (...) {
    const std::exception_ptr e = std::current_exception();
    fail(e);
    std::rethrow_exception(e);
  }
  return result();
}

inline void TrainingRun::run_epochs() {
  while (budget_left()) {
    start_epoch();
    run_epoch_steps();
    if (result_.cancelled) {
      save_after_cancel();
      return;
    }
    if (step_in_epoch_ < steps_per_epoch_) return;  // the step budget or early stopping ended the run inside the epoch
    end_epoch();
    if (stop_early_) return;
  }
}

inline void TrainingRun::run_epoch_steps() {
  while (step_in_epoch_ < steps_per_epoch_ && state_.step < total_steps_) {
    profile_.start_if_due(state_.step - state_.start_step);
    const StepTotals totals = step();
    optimizer_step();
    end_step(totals);
    step_interval_work();
    if (cancel_requested()) {
      result_.cancelled = true;
      return;
    }
    if (stop_early_) return;
  }
}

inline void TrainingRun::open_logger() {
  if (!is_writer_) return;
  if (options_.logger) {
    logger_ = options_.logger;
  } else if (!options_.log_dir.empty()) {
    logging::MetricsLoggerOptions lo;
    lo.mlflow = options_.mlflow;
    lo.mlflow.resume = lo.mlflow.resume || state_.start_step > 0;  // a fresh fit is a new run
    own_logger_ = std::make_unique<logging::MetricsLogger>(options_.log_dir, lo);
    logger_ = own_logger_.get();
  }
  if (logger_ && state_.start_step > 0) logger_->resume_at(state_.start_step);
  if (logger_ && !options_.hparams.empty()) logger_->log_hparams(options_.hparams);
}

inline void TrainingRun::report_already_complete() {
  std::string text = "already complete: checkpoint '" + result_.resumed_from.string() + "' is at step " +
                     std::to_string(state_.step);
  if (stop_early_)
    text += ", where early stopping ended the run (" + early_stop_tracker_.metric() + " did not improve for " +
            std::to_string(early_stop_tracker_.validations_without_improvement()) + " validations)";
  else
    text += " of " + std::to_string(total_steps_);
  text += "; nothing left to train";
  char loss[64];
  std::snprintf(loss, sizeof loss, ". last loss %.4f", state_.loss);
  if (loss_known_) text += loss;
  if (!state_.metrics.empty()) text += "  " + metrics_text(state_.metrics);
  progress_.message(text);
}

inline bool TrainingRun::budget_left() const {
  return !(options_.epochs > 0 && epoch_ >= options_.epochs) && state_.step < total_steps_;
}

inline void TrainingRun::start_epoch() {
  state_.epoch = epoch_;
  state_.step_in_epoch = step_in_epoch_;
  const data::DataLoaderState ls = train_loader_.state();
  if (ls.epoch != static_cast<uint64_t>(epoch_) || ls.batches_consumed != step_in_epoch_ * accumulation_)
    train_loader_.load_state({static_cast<uint64_t>(epoch_), step_in_epoch_ * accumulation_, ls.seed});
  fire([&](Callback& c) { c.on_epoch_start(state_); });
}

inline TrainingRun::StepTotals TrainingRun::step() {
  StepTotals totals;
  std::optional<amp::CastCacheGuard> cast_cache;  // each weight cast once per optimizer step
  if (options_.precision != Precision::Fp32) cast_cache.emplace();
  for (int64_t m = 0; m < accumulation_; ++m) {
    std::optional<data::Batch> b = train_loader_.next();
    EMBER_CHECK(b.has_value(), Error, "Trainer: the train loader ended its epoch after ",
                step_in_epoch_ * accumulation_ + m, " batches, but it reports ", train_loader_.num_batches());
    totals.samples += static_cast<int64_t>(b->indices.size());
    StepContext ctx{.step = state_.step, .epoch = epoch_, .micro_batch = m, .compute_dtype = compute_dtype_};
    const AnyTensor loss = micro_batch_loss(*b, ctx);
    totals.loss_sum += scalar_value(loss, step_fn_ ? "step function" : "loss function");
    AnyTensor scaled = accumulator_.scale_loss(loss);
    {
      // Under DataParallel the gradients are all-reduced once, in the step's last backward.
      std::optional<dist::DataParallel::NoSyncGuard> no_sync;
      std::optional<dist::FullyShardedDataParallel::NoSyncGuard> no_sync_sharded;
      if (data_parallel_ && !accumulator_.should_sync()) no_sync.emplace(*data_parallel_);
      if (sharded_ && !accumulator_.should_sync()) no_sync_sharded.emplace(*sharded_);
      if (scaler_on_)
        scaler_.scale(scaled).backward();
      else
        scaled.backward();
    }
    accumulator_.sync_step();
  }
  return totals;
}

inline AnyTensor TrainingRun::micro_batch_loss(const data::Batch& batch, StepContext& ctx) {
  trace::PhaseScope phase(trace::Phase::Forward);
  if (step_fn_) return (*step_fn_)(batch, ctx);
  const std::string& in = options_.input_key;
  const std::string& target = options_.target_key;
  EMBER_CHECK(batch.data.has(in) && batch.data.has(target), ValueError, "Trainer: a batch lacks the field '",
              batch.data.has(in) ? target : in, "' (TrainerOptions::input_key / target_key)");
  AnyTensor x = ctx.cast(batch[in]);
  AnyTensor out = data_parallel_ ? data_parallel_->forward_any(x) : model_.forward_any(x);  // (FSDP: its hooks)
  return (*loss_fn_)(out, batch[target]);
}

inline void TrainingRun::optimizer_step() {
  const TrainerOptions& o = options_;
  bool unscaled = false;
  if (scaler_on_ && (data_parallel_ || sharded_) && world_size_ > 1) {
    dist::sync_found_inf(scaler_, optimizer_, *group_);  // unscales; every rank skips or steps alike
    unscaled = true;
  }
  if (o.clip_grad_norm > 0 || o.clip_grad_value > 0) {
    if (scaler_on_ && !unscaled) scaler_.unscale_(optimizer_);
    if (o.clip_grad_norm > 0) {
      if (sharded_)
        sharded_->clip_grad_norm_(o.clip_grad_norm);  // the norm over every rank's shards
      else
        optim::clip_grad_norm_(params_, o.clip_grad_norm);
    }
    if (o.clip_grad_value > 0) optim::clip_grad_value_(params_, o.clip_grad_value);
  }
  if (scaler_on_) {
    scaler_.step(optimizer_);
    scaler_.update();
  } else {
    optimizer_.step();
  }
  optimizer_.zero_grad();
  if (o.scheduler && o.scheduler_interval == SchedulerInterval::Step) o.scheduler->step();
}

inline void TrainingRun::end_step(const StepTotals& totals) {
  ++state_.step;
  ++step_in_epoch_;
  state_.step_in_epoch = step_in_epoch_;
  state_.loss = totals.loss_sum / static_cast<double>(accumulation_);
  loss_known_ = true;
  state_.samples += totals.samples;
  state_.lr = optimizer_.param_groups()[0].lr();
  state_.seconds = elapsed();
  result_.train_losses.push_back(state_.loss);
  profile_.step_done(totals.samples, state_.step, progress_, logger_);
  if (logger_ && state_.step % options_.log_every_steps == 0)
    logger_->log_scalars(state_.step,
                         {{"train/loss", state_.loss},
                          {"train/lr", state_.lr},
                          {"train/samples_per_second",
                           state_.seconds > 0 ? static_cast<double>(state_.samples) / state_.seconds : 0.0}});
  progress_.update(progress_info());
  fire([&](Callback& c) { c.on_step_end(state_); });
}

// What falls due every N steps; left to the epoch's end when that does it anyway.
inline void TrainingRun::step_interval_work() {
  const ValidationOptions& v = options_.validation;
  const CheckpointPolicy& c = options_.checkpoint;
  const bool epoch_end = step_in_epoch_ == steps_per_epoch_;
  const bool epoch_end_validates = epoch_end && epoch_ends_with_validation();
  if (v.loader && v.every_steps > 0 && state_.step % v.every_steps == 0 && !epoch_end_validates) {
    validate();
    progress_.message("step " + std::to_string(state_.step) + "  " + metrics_text(state_.metrics));
  }
  if (checkpoints_on() && c.every_steps > 0 && state_.step % c.every_steps == 0 && !(epoch_end && epoch_ends_with_checkpoint()))
    save_checkpoint();
  if (!epoch_end_validates) save_best_checkpoint_if_due();
}

// Every rank stops after the same step: the flag is all-reduced.
inline bool TrainingRun::cancel_requested() {
  if (!options_.cancel) return false;
  bool c = options_.cancel->cancelled();
  if (group_ && world_size_ > 1) {
    AnyTensor t = Tensor<int32_t>::from_vector({c ? 1 : 0}, {1}).to(group_->device());
    group_->all_reduce(t, dist::ReduceOp::Max);
    c = Tensor<int32_t>(t.to(Device::cpu())).to_vector()[0] != 0;
  }
  return c;
}

inline void TrainingRun::end_epoch() {
  const bool validates = epoch_ends_with_validation();
  const bool checkpoint_due = epoch_ends_with_checkpoint();
  if (validates) validate();
  if (options_.scheduler && options_.scheduler_interval == SchedulerInterval::Epoch) {
    options_.scheduler->step();
    state_.lr = optimizer_.param_groups()[0].lr();
  }
  ++epoch_;
  step_in_epoch_ = 0;
  ++result_.epochs_completed;
  if (checkpoint_due) save_checkpoint();  // it resumes at the next epoch's first batch
  save_best_checkpoint_if_due();
  state_.seconds = elapsed();
  ProgressInfo finished = progress_info();
  finished.epoch = epoch_ - 1;
  progress_.epoch_end(finished, validates ? metrics_text(state_.metrics) : "");
  fire([&](Callback& c) { c.on_epoch_end(state_); });
}

inline void TrainingRun::finish() {
  result_.early_stopped = stop_early_ && !result_.cancelled;
  if (checkpoints_on() && options_.checkpoint.save_at_end && last_saved_step_ != state_.step) save_checkpoint();
  if (checkpoints_) checkpoints_->wait();  // the last save_async commits (and its error is thrown) before fit returns
  profile_.report(state_.step, progress_, logger_);  // a window the run ended inside of
  progress_.finish();
  if (logger_) {
    log_checkpoint_artifacts();
    if (result_.cancelled) logger_->set_outcome(logging::RunOutcome::Killed);
  }
  if (own_logger_) own_logger_->close();
}

// The run's last and best checkpoints, copied into the MLflow run's artifacts/checkpoints/.
inline void TrainingRun::log_checkpoint_artifacts() {
  logging::MlflowRun* run = logger_->mlflow();
  if (!run || !run->options().log_checkpoints) return;
  const std::filesystem::path last = result_.last_checkpoint.empty() ? result_.resumed_from : result_.last_checkpoint;
  if (!last.empty() && std::filesystem::exists(last)) run->log_artifact(last, "checkpoints");
  if (!best_checkpoint_path_.empty() && std::filesystem::exists(best_checkpoint_path_))
    run->log_artifact(best_checkpoint_path_, "checkpoints/best");
}

// The exception about to leave fit: the bar closed, the profiler stopped, every callback told.
inline void TrainingRun::fail(std::exception_ptr e) noexcept {
  try {
    progress_.finish();
  } catch (...) {
  }
  profile_.abandon();
  try {
    if (logger_) logger_->set_outcome(logging::RunOutcome::Failed);
    if (own_logger_) own_logger_->close();
  } catch (...) {  // the training error is the one to report
  }
  for (auto& cb : trainer_.callbacks_) {
    try {
      cb->on_exception(state_, e);
    } catch (...) {  // the training error is the one to report
    }
  }
}

inline FitResult TrainingRun::result() {
  state_.seconds = elapsed();
  FitResult& r = result_;
  r.steps = state_.step;
  r.seconds = state_.seconds;
  r.samples = state_.samples;
  r.samples_per_second = state_.seconds > 0 ? static_cast<double>(state_.samples) / state_.seconds : 0.0;
  r.final_loss = state_.loss;
  r.final_metrics = state_.metrics;
  if (loss_known_) r.final_metrics["train/loss"] = state_.loss;
  r.best_metric_name = options_.checkpoint.best_metric;
  if (best_tracker_.has_best()) {
    r.best_metric = best_tracker_.best();
    r.best_step = best_tracker_.best_step();
    if (r.best_checkpoint.empty() && !best_checkpoint_path_.empty()) r.best_checkpoint = best_checkpoint_path_;
  }
  fire([&](Callback& c) { c.on_fit_end(state_, r); });
  return r;
}

inline void TrainingRun::validate() {
  Metrics m = trainer_.evaluate_impl(model_, *options_.validation.loader, loss_fn_, step_fn_, group_, state_.step, epoch_);
  state_.metrics = m;
  result_.history.push_back({state_.step, epoch_, m});
  if (logger_) logger_->log_scalars(state_.step, logging::Scalars(m.begin(), m.end()));
  if (best_tracker_.observe(m, state_.step)) best_checkpoint_due_ = true;
  early_stop_tracker_.observe(m, state_.step);
  if (early_stopping_patience_spent()) stop_early_ = true;
  fire([&](Callback& c) { c.on_validation_end(state_, m); });
}

inline bool TrainingRun::epoch_ends_with_validation() const {
  const ValidationOptions& v = options_.validation;
  return v.loader && v.every_epochs > 0 && (epoch_ + 1) % v.every_epochs == 0;
}

inline bool TrainingRun::epoch_ends_with_checkpoint() const {
  const CheckpointPolicy& c = options_.checkpoint;
  return checkpoints_on() && c.every_epochs > 0 && (epoch_ + 1) % c.every_epochs == 0;
}

inline bool TrainingRun::early_stopping_patience_spent() const {
  return early_stop_tracker_.enabled() &&
         early_stop_tracker_.validations_without_improvement() >= options_.early_stopping.patience;
}

inline ProgressInfo TrainingRun::progress_info() const {
  return ProgressInfo{.epoch = epoch_,
                      .epochs = (total_steps_ + steps_per_epoch_ - 1) / steps_per_epoch_,
                      .step = state_.step,
                      .total_steps = total_steps_,
                      .loss = state_.loss,
                      .samples = state_.samples,
                      .seconds = state_.seconds,
                      .start_step = state_.start_step};
}

}  // namespace ember::train::trainer_detail

#include "ember/train/detail/training_run_checkpoints.hpp"
