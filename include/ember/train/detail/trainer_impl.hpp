#pragma once
// train::Trainer's implementation (the API and its documentation: ember/train/trainer.hpp): the
// option checks, the losses, evaluate; the loop of a fit is trainer_detail::TrainingRun
// (detail/training_run.hpp).
#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ember/train/detail/training_run.hpp"
#include "ember/train/trainer.hpp"

namespace ember::train {

namespace trainer_detail {

// The metric names a validation with these options reports (for checking best_metric and
// early_stopping.metric up front).
inline std::set<std::string> validation_names(const ValidationOptions& v) {
  std::set<std::string> n = {"val/loss"};
  if (v.accuracy) n.insert("val/accuracy");
  if (v.top_k > 0) n.insert("val/top" + std::to_string(v.top_k) + "_accuracy");
  for (const Metric& m : v.metrics) n.insert("val/" + m.name);
  return n;
}

inline std::string names_list(const std::set<std::string>& n) {
  std::string s;
  for (const auto& x : n) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// Samples whose target class is among the k largest outputs (ties counted against the sample:
// a class scored equal to the target's and listed before it ranks ahead, as a stable sort would).
inline int64_t top_k_correct(const AnyTensor& output, const AnyTensor& target, int k) {
  const std::vector<double> o = output.to_double_vector();
  const std::vector<double> t = target.to_double_vector();
  const int64_t n = output.size(0), c = output.size(1);
  int64_t correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t y = static_cast<int64_t>(t[static_cast<size_t>(i)]);
    if (y < 0 || y >= c) continue;
    const double v = o[static_cast<size_t>(i * c + y)];
    int64_t ahead = 0;
    for (int64_t j = 0; j < c; ++j) {
      const double w = o[static_cast<size_t>(i * c + j)];
      if (w > v || (w == v && j < y)) ++ahead;
    }
    if (ahead < k) ++correct;
  }
  return correct;
}

}  // namespace trainer_detail

namespace trainer_detail {

// loss(Tensor<T>(out), target) for the output's floating dtype T; a DTypeError naming `who` else.
template <class Loss>
AnyTensor on_floating_output(const AnyTensor& out, const AnyTensor& target, const char* who, Loss&& loss) {
  switch (out.dtype()) {
    case DType::Float32: return loss(Tensor<float>(out), target);
    case DType::Float64: return loss(Tensor<double>(out), target);
    case DType::Float16: return loss(Tensor<half>(out), target);
    case DType::BFloat16: return loss(Tensor<bfloat16>(out), target);
    default: break;
  }
  throw DTypeError(std::string(who) + ": the model's output must be floating point, got " + out.desc());
}

}  // namespace trainer_detail

inline LossFn cross_entropy_loss() {
  return [](const AnyTensor& out, const AnyTensor& target) -> AnyTensor {
    return trainer_detail::on_floating_output(out, target, "cross_entropy_loss", [](const auto& o, const AnyTensor& t) {
      return AnyTensor(nn::functional::cross_entropy(o, t));
    });
  };
}

inline LossFn mse_loss() {
  return [](const AnyTensor& out, const AnyTensor& target) -> AnyTensor {
    return trainer_detail::on_floating_output(out, target, "mse_loss", [](const auto& o, const AnyTensor& t) {
      return AnyTensor(nn::functional::mse_loss(o, t));
    });
  };
}

inline Trainer::Trainer(TrainerOptions options) : opt_(std::move(options)) {
  const TrainerOptions& o = opt_;
  EMBER_CHECK(o.epochs >= 0 && o.max_steps >= 0, ValueError, "Trainer: epochs and max_steps must be >= 0, got ",
              o.epochs, " and ", o.max_steps);
  EMBER_CHECK(o.epochs > 0 || o.max_steps > 0, ValueError,
              "Trainer: epochs and max_steps are both 0: nothing bounds the run (set epochs or max_steps)");
  EMBER_CHECK(o.accumulation >= 1, ValueError, "Trainer: accumulation must be >= 1 (micro-batches per optimizer step), got ",
              o.accumulation);
  EMBER_CHECK(o.clip_grad_norm >= 0 && o.clip_grad_value >= 0, ValueError,
              "Trainer: clip_grad_norm and clip_grad_value must be >= 0 (0: off), got ", o.clip_grad_norm, " and ",
              o.clip_grad_value);
  EMBER_CHECK(!o.input_key.empty() && !o.target_key.empty(), ValueError, "Trainer: input_key and target_key must not be empty");
  const ValidationOptions& v = o.validation;
  EMBER_CHECK(v.every_epochs >= 0 && v.every_steps >= 0, ValueError,
              "Trainer: validation.every_epochs and validation.every_steps must be >= 0, got ", v.every_epochs, " and ",
              v.every_steps);
  if (v.loader)
    EMBER_CHECK(v.every_epochs > 0 || v.every_steps > 0, ValueError,
                "Trainer: a validation loader is set but validation.every_epochs and validation.every_steps are both 0 "
                "(a validation interval of 0: it would never run)");
  EMBER_CHECK(v.top_k == 0 || v.top_k >= 2, ValueError,
              "Trainer: validation.top_k must be 0 (off) or >= 2 (top-1 is validation.accuracy), got ", v.top_k);
  for (const Metric& m : v.metrics)
    EMBER_CHECK(!m.name.empty() && m.fn, ValueError, "Trainer: validation metric '", m.name,
                "' needs a name and a function");
  const CheckpointPolicy& c = o.checkpoint;
  EMBER_CHECK(c.every_steps >= 0 && c.every_epochs >= 0 && c.keep_last >= 0, ValueError,
              "Trainer: checkpoint.every_steps, every_epochs and keep_last must be >= 0, got ", c.every_steps, ", ",
              c.every_epochs, " and ", c.keep_last);
  if (c.dir.empty())
    EMBER_CHECK(c.every_steps == 0 && c.every_epochs == 0 && c.best_metric.empty() && !c.save_at_end, ValueError,
                "Trainer: checkpoints are asked for (every_steps ", c.every_steps, ", every_epochs ", c.every_epochs,
                ", best_metric '", c.best_metric, "', save_at_end ", c.save_at_end, ") but checkpoint.dir is empty");
  const std::set<std::string> names = trainer_detail::validation_names(v);
  for (const auto& [what, metric] : {std::pair<const char*, const std::string*>{"checkpoint.best_metric", &c.best_metric},
                                     {"early_stopping.metric", &o.early_stopping.metric}}) {
    if (metric->empty()) continue;
    EMBER_CHECK(v.loader != nullptr, ValueError, "Trainer: ", what, " is '", *metric,
                "' but there is no validation loader (validation.loader)");
    EMBER_CHECK(names.count(*metric) == 1, ValueError, "Trainer: ", what, " '", *metric,
                "' is not a validation metric; these are reported: ", trainer_detail::names_list(names));
  }
  if (!o.early_stopping.metric.empty())
    EMBER_CHECK(o.early_stopping.patience >= 1 && o.early_stopping.min_delta >= 0, ValueError,
                "Trainer: early_stopping.patience must be >= 1 and min_delta >= 0, got ", o.early_stopping.patience,
                " and ", o.early_stopping.min_delta);
  EMBER_CHECK(o.log_every_steps >= 1, ValueError, "Trainer: log_every_steps must be >= 1, got ", o.log_every_steps);
  if (!o.mlflow.tracking_dir.empty())
    EMBER_CHECK(!o.log_dir.empty() && o.logger == nullptr, ValueError, "Trainer: mlflow.tracking_dir is '",
                o.mlflow.tracking_dir.string(), "' but ",
                o.logger ? "a logger is given (give it MetricsLoggerOptions::mlflow instead)"
                         : "log_dir is empty (the run id is kept there)");
  EMBER_CHECK(o.profile.steps >= 0 && o.profile.start_step >= 0, ValueError,
              "Trainer: profile.steps and profile.start_step must be >= 0, got ", o.profile.steps, " and ",
              o.profile.start_step);
  if (o.grad_scaler.enabled && o.precision == Precision::Fp16) amp::GradScaler check(o.grad_scaler);  // its own checks
}

inline FitResult Trainer::fit(nn::Module& model, data::DataLoader& train, optim::Optimizer& opt, LossFn loss) {
  EMBER_CHECK(static_cast<bool>(loss), ValueError, "Trainer.fit: the loss function is empty");
  return run(model, nullptr, nullptr, train, opt, &loss, nullptr);
}
inline FitResult Trainer::fit(nn::Module& model, data::DataLoader& train, optim::Optimizer& opt, StepFn step) {
  EMBER_CHECK(static_cast<bool>(step), ValueError, "Trainer.fit: the step function is empty");
  return run(model, nullptr, nullptr, train, opt, nullptr, &step);
}
inline FitResult Trainer::fit(dist::DataParallel& model, data::DataLoader& train, optim::Optimizer& opt, LossFn loss) {
  EMBER_CHECK(static_cast<bool>(loss), ValueError, "Trainer.fit: the loss function is empty");
  return run(model.module(), &model, nullptr, train, opt, &loss, nullptr);
}
inline FitResult Trainer::fit(dist::DataParallel& model, data::DataLoader& train, optim::Optimizer& opt, StepFn step) {
  EMBER_CHECK(static_cast<bool>(step), ValueError, "Trainer.fit: the step function is empty");
  return run(model.module(), &model, nullptr, train, opt, nullptr, &step);
}
inline FitResult Trainer::fit(dist::FullyShardedDataParallel& model, data::DataLoader& train, optim::Optimizer& opt,
                              LossFn loss) {
  EMBER_CHECK(static_cast<bool>(loss), ValueError, "Trainer.fit: the loss function is empty");
  return run(model.module(), nullptr, &model, train, opt, &loss, nullptr);
}
inline FitResult Trainer::fit(dist::FullyShardedDataParallel& model, data::DataLoader& train, optim::Optimizer& opt,
                              StepFn step) {
  EMBER_CHECK(static_cast<bool>(step), ValueError, "Trainer.fit: the step function is empty");
  return run(model.module(), nullptr, &model, train, opt, nullptr, &step);
}

inline Metrics Trainer::evaluate(nn::Module& model, data::DataLoader& loader, const LossFn& loss,
                                 dist::ProcessGroup* group) {
  return evaluate_impl(model, loader, loss ? &loss : nullptr, nullptr, group, 0, 0);
}

inline Metrics Trainer::evaluate_impl(nn::Module& model, data::DataLoader& loader, const LossFn* loss,
                                      const StepFn* step, dist::ProcessGroup* group, int64_t global_step,
                                      int64_t epoch) {
  const ValidationOptions& v = opt_.validation;
  const DType cdt = trainer_detail::compute_dtype(opt_.precision);
  const bool was_training = model.is_training();
  model.eval();
  struct Restore {
    nn::Module& m;
    bool on;
    ~Restore() { m.train(on); }
  } restore{model, was_training};
  NoGradGuard no_grad;
  // Sums over samples: count, loss, top-1, top-k, then each user metric.
  std::vector<double> sums(4 + v.metrics.size(), 0.0);
  bool has_loss = loss || step, has_acc = false;
  if (loader.state().batches_consumed != 0) loader.set_epoch(loader.epoch());  // a whole pass
  const bool need_output = loss || v.accuracy || v.top_k > 0 || !v.metrics.empty();
  while (std::optional<data::Batch> b = loader.next()) {
    const double n = static_cast<double>(b->indices.size());
    sums[0] += n;
    StepContext ctx{.step = global_step, .epoch = epoch, .micro_batch = 0, .compute_dtype = cdt};
    if (step) sums[1] += trainer_detail::scalar_value((*step)(*b, ctx), "step function") * n;
    if (!need_output || !b->data.has(opt_.input_key)) continue;
    AnyTensor out = model.forward_any(ctx.cast((*b)[opt_.input_key]));
    const bool has_target = b->data.has(opt_.target_key);
    if (loss && has_target) sums[1] += trainer_detail::scalar_value((*loss)(out, (*b)[opt_.target_key]), "loss function") * n;
    if (has_target && out.dim() == 2 && !is_floating((*b)[opt_.target_key].dtype())) {
      const AnyTensor& target = (*b)[opt_.target_key];
      has_acc = true;
      if (v.accuracy) {
        AnyTensor pred = op::argmax(out, {1});
        sums[2] += op::sum(op::eq(pred, target.to(pred.dtype())).to(DType::Int64)).item_double();
      }
      if (v.top_k > 0) sums[3] += static_cast<double>(trainer_detail::top_k_correct(out, target, v.top_k));
    }
    for (size_t i = 0; i < v.metrics.size(); ++i) sums[4 + i] += v.metrics[i].fn(out, *b) * n;
  }
  if (group && group->size() > 1) {
    AnyTensor t = Tensor<double>::from_vector(sums, {static_cast<int64_t>(sums.size())}).to(group->device());
    group->all_reduce(t, dist::ReduceOp::Sum);
    sums = t.to_double_vector();
    // Whether any rank had classification targets.
    AnyTensor f = Tensor<double>::from_vector({has_acc ? 1.0 : 0.0}, {1}).to(group->device());
    group->all_reduce(f, dist::ReduceOp::Max);
    has_acc = f.to_double_vector()[0] > 0;
  }
  Metrics m;
  const double count = std::max(1.0, sums[0]);
  if (has_loss) m["val/loss"] = sums[1] / count;
  if (has_acc && v.accuracy) m["val/accuracy"] = sums[2] / count;
  if (has_acc && v.top_k > 0) m["val/top" + std::to_string(v.top_k) + "_accuracy"] = sums[3] / count;
  for (size_t i = 0; i < v.metrics.size(); ++i) m["val/" + v.metrics[i].name] = sums[4 + i] / count;
  return m;
}

inline FitResult Trainer::run(nn::Module& model, dist::DataParallel* dp, dist::FullyShardedDataParallel* fsdp,
                              data::DataLoader& train, optim::Optimizer& opt, const LossFn* loss,
                              const StepFn* step_fn) {
  return trainer_detail::TrainingRun(*this, model, dp, fsdp, train, opt, loss, step_fn).run();
}

}  // namespace ember::train
