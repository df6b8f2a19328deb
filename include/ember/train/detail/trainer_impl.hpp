#pragma once
// train::Trainer's implementation (the API and its documentation: ember/train/trainer.hpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ember/amp/autocast.hpp"
#include "ember/train/accumulate.hpp"
#include "ember/data/dataloader_json.hpp"
#include "ember/dist/data_parallel.hpp"
#include "ember/optim/clip.hpp"
#include "ember/profile/profiler.hpp"
#include "ember/profile/step_log.hpp"
#include "ember/profile/verdict.hpp"
#include "ember/train/checkpoint_manager.hpp"
#include "ember/train/trainer.hpp"

namespace ember::train {

namespace trainer_detail {

inline DType compute_dtype(Precision p) {
  switch (p) {
    case Precision::Fp16: return DType::Float16;
    case Precision::Bf16: return DType::BFloat16;
    case Precision::Fp32: break;
  }
  return DType::Float32;
}

inline bool better(double v, double best, MetricMode mode, double min_delta) {
  return mode == MetricMode::Max ? v > best + min_delta : v < best - min_delta;
}

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

inline LossFn cross_entropy_loss() {
  return [](const AnyTensor& out, const AnyTensor& target) -> AnyTensor {
    switch (out.dtype()) {
      case DType::Float32: return nn::functional::cross_entropy(Tensor<float>(out), target);
      case DType::Float64: return nn::functional::cross_entropy(Tensor<double>(out), target);
      case DType::Float16: return nn::functional::cross_entropy(Tensor<half>(out), target);
      case DType::BFloat16: return nn::functional::cross_entropy(Tensor<bfloat16>(out), target);
      default: break;
    }
    throw DTypeError("cross_entropy_loss: the model's output must be floating point, got " + out.desc());
  };
}

inline LossFn mse_loss() {
  return [](const AnyTensor& out, const AnyTensor& target) -> AnyTensor {
    switch (out.dtype()) {
      case DType::Float32: return nn::functional::mse_loss(Tensor<float>(out), target);
      case DType::Float64: return nn::functional::mse_loss(Tensor<double>(out), target);
      case DType::Float16: return nn::functional::mse_loss(Tensor<half>(out), target);
      case DType::BFloat16: return nn::functional::mse_loss(Tensor<bfloat16>(out), target);
      default: break;
    }
    throw DTypeError("mse_loss: the model's output must be floating point, got " + out.desc());
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
  EMBER_CHECK(o.profile.steps >= 0 && o.profile.start_step >= 0, ValueError,
              "Trainer: profile.steps and profile.start_step must be >= 0, got ", o.profile.steps, " and ",
              o.profile.start_step);
  if (o.grad_scaler.enabled && o.precision == Precision::Fp16) amp::GradScaler check(o.grad_scaler);  // its own checks
}

inline FitResult Trainer::fit(nn::Module& model, data::DataLoader& train, optim::Optimizer& opt, LossFn loss) {
  EMBER_CHECK(static_cast<bool>(loss), ValueError, "Trainer.fit: the loss function is empty");
  return run(model, nullptr, train, opt, &loss, nullptr);
}
inline FitResult Trainer::fit(nn::Module& model, data::DataLoader& train, optim::Optimizer& opt, StepFn step) {
  EMBER_CHECK(static_cast<bool>(step), ValueError, "Trainer.fit: the step function is empty");
  return run(model, nullptr, train, opt, nullptr, &step);
}
inline FitResult Trainer::fit(dist::DataParallel& model, data::DataLoader& train, optim::Optimizer& opt, LossFn loss) {
  EMBER_CHECK(static_cast<bool>(loss), ValueError, "Trainer.fit: the loss function is empty");
  return run(model.module(), &model, train, opt, &loss, nullptr);
}
inline FitResult Trainer::fit(dist::DataParallel& model, data::DataLoader& train, optim::Optimizer& opt, StepFn step) {
  EMBER_CHECK(static_cast<bool>(step), ValueError, "Trainer.fit: the step function is empty");
  return run(model.module(), &model, train, opt, nullptr, &step);
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

inline FitResult Trainer::run(nn::Module& model, dist::DataParallel* dp, data::DataLoader& train, optim::Optimizer& opt,
                              const LossFn* loss, const StepFn* step_fn) {
  using clock = std::chrono::steady_clock;
  const TrainerOptions& o = opt_;
  dist::ProcessGroup* group = dp ? &dp->group() : nullptr;
  const int rank = group ? group->rank() : 0, world = group ? group->size() : 1;
  const bool writer = rank == 0;
  const DType cdt = trainer_detail::compute_dtype(o.precision);

  // ---- checks that need the model and the data ----
  const int64_t accum = o.accumulation;
  const int64_t spe = train.num_batches() / accum;
  EMBER_CHECK(spe >= 1, ValueError, "Trainer.fit: the train loader has ", train.num_batches(),
              " batch(es) per epoch, fewer than accumulation = ", accum, " (an epoch would have no optimizer step)");
  std::vector<AnyTensor> params;
  for (const auto& g : opt.param_groups())
    for (const auto& p : g.params) params.push_back(p);
  EMBER_CHECK(!params.empty(), ValueError, "Trainer.fit: the optimizer has no parameters");
  const Device device = params.front().device();
  if (o.precision != Precision::Fp32) {
    for (const auto& [name, p] : model.named_parameters())
      EMBER_CHECK(p.dtype() == DType::Float32, DTypeError, "Trainer.fit: precision ", precision_name(o.precision),
                  " keeps fp32 master weights, but parameter '", name, "' is ", dtype_name(p.dtype()),
                  " (keep the parameters float32; the activations are cast)");
    trainer_detail::check_precision_on(o.precision, device);
  }
  if (o.scheduler)
    EMBER_CHECK(&o.scheduler->optimizer() == &opt, ValueError,
                "Trainer.fit: the scheduler (", o.scheduler->name(), ") belongs to another optimizer");
  int64_t total = o.epochs > 0 ? o.epochs * spe : o.max_steps;
  if (o.max_steps > 0) total = std::min(total, o.max_steps);

  const bool scaler_on = o.precision == Precision::Fp16 && o.grad_scaler.enabled;
  amp::GradScalerOptions so = o.grad_scaler;
  so.enabled = scaler_on;
  amp::GradScaler scaler(so);
  GradientAccumulator acc(accum);

  // ---- checkpoints and resume ----
  std::unique_ptr<CheckpointManager> ckpt, best_ckpt;
  if (!o.checkpoint.dir.empty()) {
    CheckpointOptions co;
    co.keep_last = o.checkpoint.keep_last;
    co.clean_stale = writer;
    ckpt = std::make_unique<CheckpointManager>(o.checkpoint.dir, co);
  }
  CheckpointTargets targets{.model = &model, .optimizer = &opt, .scheduler = o.scheduler,
                            .scaler = scaler_on ? &scaler : nullptr};
  FitResult result;
  TrainerState st;
  st.steps_per_epoch = spe;
  st.total_steps = total;
  st.rank = rank;
  st.world_size = world;
  st.metrics = {};
  int64_t epoch = 0, sie = 0;
  bool have_best = false;
  double best = 0;
  int64_t best_step = -1;
  std::string best_path;
  double es_best = 0;
  bool es_have = false;
  int es_bad = 0;
  if (ckpt && o.checkpoint.resume) {
    // Rank 0 picks the checkpoint; every rank loads that one (they all see the same folder).
    int64_t chosen = -1;
    if (writer) {
      if (auto s = ckpt->latest()) chosen = *s;
    }
    if (group && world > 1) {
      AnyTensor t = Tensor<int64_t>::from_vector({chosen}, {1}).to(group->device());
      group->broadcast(t, 0);
      chosen = Tensor<int64_t>(t.to(Device::cpu())).to_vector()[0];
    }
    if (chosen >= 0) {
      LoadedCheckpoint r = ckpt->load(chosen, targets);
      const std::string who = "Trainer: checkpoint '" + r.path.string() + "'";
      EMBER_CHECK(r.user.contains("trainer") && r.user["trainer"].is_object(), FormatError, who,
                  " was not written by a Trainer (no \"trainer\" object in its user state)");
      const nlohmann::json& tj = r.user["trainer"];
      try {
        st.step = tj.at("step").get<int64_t>();
        epoch = tj.at("epoch").get<int64_t>();
        sie = tj.at("step_in_epoch").get<int64_t>();
        have_best = tj.at("have_best").get<bool>();
        best = tj.at("best").get<double>();
        best_step = tj.at("best_step").get<int64_t>();
        best_path = tj.at("best_path").get<std::string>();
        es_have = tj.at("es_have").get<bool>();
        es_best = tj.at("es_best").get<double>();
        es_bad = tj.at("es_bad").get<int>();
      } catch (const nlohmann::json::exception& e) {
        throw FormatError(who + ": bad trainer state: " + e.what());
      }
      EMBER_CHECK(sie >= 0 && sie <= spe, FormatError, who, ": it stopped after step ", sie,
                  " of its epoch, but an epoch now has ", spe, " steps (loader, batch size or accumulation changed?)");
      if (r.data.contains("loader")) {
        const auto ls = r.data["loader"].get<data::DataLoaderState>();
        EMBER_CHECK(ls.seed == train.state().seed, ValueError, who, ": saved with loader seed ", ls.seed,
                    " but this loader's seed is ", train.state().seed, " (its batches would differ)");
      }
      result.resumed_from = r.path;
      result.last_checkpoint = r.path;
    }
  }
  st.start_step = st.step;
  result.start_step = st.step;
  st.lr = opt.param_groups().empty() ? 0.0 : opt.param_groups()[0].lr();

  // ---- observers (rank 0) ----
  std::unique_ptr<logging::MetricsLogger> own_logger;
  logging::MetricsLogger* logger = nullptr;
  if (writer) {
    if (o.logger) {
      logger = o.logger;
    } else if (!o.log_dir.empty()) {
      own_logger = std::make_unique<logging::MetricsLogger>(o.log_dir);
      logger = own_logger.get();
    }
    if (logger && !o.hparams.empty()) logger->log_hparams(o.hparams);
  }
  ProgressOptions po = o.progress;
  po.enabled = po.enabled && writer;
  ProgressBar bar(po);
  std::unique_ptr<profile::Profiler> profiler;
  bool profiled = false;
  int64_t profiled_steps = 0;
  auto finish_profile = [&]() {
    if (!profiler || !profiler->is_recording()) return;
    profiler->stop();
    profiled = true;
    const profile::StepFigures f = profiler->average_figures();
    std::string text = "profile (" + std::to_string(profiled_steps) + " steps):\n";
    if (o.profile.table_rows > 0) text += profiler->key_averages().table(profile::SortBy::SelfHost, o.profile.table_rows);
    text += profiler->step_report();
    std::string verdict;
    for (const auto& v : profile::verdict(f)) verdict += "- " + v.message + "\n";
    text += "verdict:\n" + verdict;
    if (!o.profile.trace_path.empty()) text += "trace: " + o.profile.trace_path + "\n";
    if (!text.empty() && text.back() == '\n') text.pop_back();
    bar.message(text);
    if (logger) {
      profile::log_step_figures(*logger, st.step, f);
      logger->log_text(st.step, "profile/verdict", verdict);
    }
  };

  auto fire = [&](auto&& f) {
    for (auto& cb : callbacks_) f(*cb);
  };
  const auto t0 = clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(clock::now() - t0).count(); };
  auto info = [&]() {
    return ProgressInfo{.epoch = epoch,
                        .epochs = (total + spe - 1) / spe,
                        .step = st.step, .total_steps = total, .loss = st.loss, .samples = st.samples,
                        .seconds = st.seconds, .start_step = st.start_step};
  };
  auto trainer_json = [&]() {
    return nlohmann::json{{"step", st.step},       {"epoch", epoch},       {"step_in_epoch", sie},
                          {"have_best", have_best}, {"best", best},         {"best_step", best_step},
                          {"best_path", best_path}, {"es_have", es_have},   {"es_best", es_best},
                          {"es_bad", es_bad}};
  };
  auto extras = [&]() {
    data::DataLoaderState ls{static_cast<uint64_t>(epoch), sie * accum, train.state().seed};
    return CheckpointExtras{.epoch = epoch, .data = {{"loader", ls}}, .user = {{"trainer", trainer_json()}}};
  };
  int64_t last_saved = -1;
  auto save = [&](CheckpointManager& m, bool is_best) {
    if (!writer) return;
    const CheckpointExtras ex = extras();
    if (o.checkpoint.save_async && !is_best)
      m.save_async(st.step, targets, ex);
    else
      m.save(st.step, targets, ex);
    const std::filesystem::path p = m.path_of(st.step);
    if (is_best) {
      result.best_checkpoint = p;
    } else {
      result.last_checkpoint = p;
      last_saved = st.step;
    }
    fire([&](Callback& c) { c.on_checkpoint(st, p); });
  };
  bool best_pending = false, stop_early = false;
  auto validate = [&]() {
    Metrics m = evaluate_impl(model, *o.validation.loader, loss, step_fn, group, st.step, epoch);
    st.metrics = m;
    result.history.push_back({st.step, epoch, m});
    result.final_metrics = m;
    if (logger) {
      logging::Scalars s(m.begin(), m.end());
      logger->log_scalars(st.step, s);
    }
    const std::string& bm = o.checkpoint.best_metric;
    if (!bm.empty() && m.count(bm)) {
      const double v = m.at(bm);
      if (!have_best || trainer_detail::better(v, best, o.checkpoint.best_mode, 0.0)) {
        have_best = true;
        best = v;
        best_step = st.step;
        best_pending = true;
      }
    }
    const EarlyStopping& es = o.early_stopping;
    if (!es.metric.empty() && m.count(es.metric)) {
      const double v = m.at(es.metric);
      if (!es_have || trainer_detail::better(v, es_best, es.mode, es.min_delta)) {
        es_have = true;
        es_best = v;
        es_bad = 0;
      } else if (++es_bad >= es.patience) {
        stop_early = true;
      }
    }
    fire([&](Callback& c) { c.on_validation_end(st, m); });
  };
  auto save_best_if_pending = [&]() {
    if (!best_pending) return;
    best_pending = false;
    if (writer) {
      if (!best_ckpt) {
        CheckpointOptions bo;
        bo.keep_last = 1;
        best_ckpt = std::make_unique<CheckpointManager>(o.checkpoint.dir / "best", bo);
      }
      best_path = best_ckpt->path_of(st.step).string();
      save(*best_ckpt, true);
    }
  };
  auto metrics_text = [](const Metrics& m) {
    std::string s;
    char buf[96];
    for (const auto& [k, v] : m) {
      std::snprintf(buf, sizeof buf, "%s%s %.4f", s.empty() ? "" : "  ", k.c_str(), v);
      s += buf;
    }
    return s;
  };

  model.train();
  fire([&](Callback& c) { c.on_fit_start(st); });
  try {
    const bool profiling_wanted = writer && o.profile.steps > 0;
    while (!(o.epochs > 0 && epoch >= o.epochs) && st.step < total) {
      // ---- an epoch (or the rest of one, after a resume) ----
      st.epoch = epoch;
      st.step_in_epoch = sie;
      {
        const data::DataLoaderState ls = train.state();
        if (ls.epoch != static_cast<uint64_t>(epoch) || ls.batches_consumed != sie * accum)
          train.load_state({static_cast<uint64_t>(epoch), sie * accum, ls.seed});
      }
      fire([&](Callback& c) { c.on_epoch_start(st); });
      bool cancelled = false;
      while (sie < spe && st.step < total) {
        if (profiling_wanted && !profiled && !profiler && st.step - st.start_step >= o.profile.start_step) {
          profiler = std::make_unique<profile::Profiler>(profile::ProfilerOptions{
              .trace_path = o.profile.trace_path, .window = static_cast<int>(std::min<int64_t>(o.profile.steps, 1 << 20))});
          profiler->start();
        }
        // ---- one optimizer step: `accum` micro-batches ----
        double step_loss = 0;
        int64_t step_samples = 0;
        {
          std::optional<amp::CastCacheGuard> cache;
          if (o.precision != Precision::Fp32) cache.emplace();
          for (int64_t m = 0; m < accum; ++m) {
            std::optional<data::Batch> b = train.next();
            EMBER_CHECK(b.has_value(), Error, "Trainer: the train loader ended its epoch after ", sie * accum + m,
                        " batches, but it reports ", train.num_batches());
            step_samples += static_cast<int64_t>(b->indices.size());
            StepContext ctx{.step = st.step, .epoch = epoch, .micro_batch = m, .compute_dtype = cdt};
            AnyTensor l;
            {
              trace::PhaseScope phase(trace::Phase::Forward);
              if (step_fn) {
                l = (*step_fn)(*b, ctx);
              } else {
                EMBER_CHECK(b->data.has(o.input_key) && b->data.has(o.target_key), ValueError,
                            "Trainer: a batch lacks the field '", b->data.has(o.input_key) ? o.target_key : o.input_key,
                            "' (TrainerOptions::input_key / target_key)");
                AnyTensor x = ctx.cast((*b)[o.input_key]);
                AnyTensor out = dp ? dp->forward_any(x) : model.forward_any(x);
                l = (*loss)(out, (*b)[o.target_key]);
              }
            }
            step_loss += trainer_detail::scalar_value(l, step_fn ? "step function" : "loss function");
            AnyTensor scaled = acc.scale_loss(l);
            {
              std::optional<dist::DataParallel::NoSyncGuard> no_sync;
              if (dp && !acc.should_sync()) no_sync.emplace(*dp);
              if (scaler_on)
                scaler.scale(scaled).backward();
              else
                scaled.backward();
            }
            acc.sync_step();
          }
        }
        {
          bool unscaled = false;
          if (scaler_on && dp && world > 1) {
            dist::sync_found_inf(scaler, opt, *group);  // unscales; every rank skips or steps alike
            unscaled = true;
          }
          if (o.clip_grad_norm > 0 || o.clip_grad_value > 0) {
            if (scaler_on && !unscaled) scaler.unscale_(opt);
            if (o.clip_grad_norm > 0) optim::clip_grad_norm_(params, o.clip_grad_norm);
            if (o.clip_grad_value > 0) optim::clip_grad_value_(params, o.clip_grad_value);
          }
          if (scaler_on) {
            scaler.step(opt);
            scaler.update();
          } else {
            opt.step();
          }
          opt.zero_grad();
        }
        if (o.scheduler && o.scheduler_interval == SchedulerInterval::Step) o.scheduler->step();
        ++st.step;
        ++sie;
        st.step_in_epoch = sie;
        st.loss = step_loss / static_cast<double>(accum);
        st.samples += step_samples;
        st.lr = opt.param_groups()[0].lr();
        st.seconds = elapsed();
        result.train_losses.push_back(st.loss);
        if (profiler && profiler->is_recording()) {
          profiler->step(step_samples);
          if (++profiled_steps >= o.profile.steps) finish_profile();
        }
        if (logger && st.step % o.log_every_steps == 0)
          logger->log_scalars(st.step, {{"train/loss", st.loss},
                                        {"train/lr", st.lr},
                                        {"train/samples_per_second",
                                         st.seconds > 0 ? static_cast<double>(st.samples) / st.seconds : 0.0}});
        bar.update(info());
        fire([&](Callback& c) { c.on_step_end(st); });

        const bool epoch_end = sie == spe;
        const bool val_epoch_due = o.validation.loader && o.validation.every_epochs > 0 &&
                                   (epoch + 1) % o.validation.every_epochs == 0;
        const bool ckpt_epoch_due = ckpt && o.checkpoint.every_epochs > 0 && (epoch + 1) % o.checkpoint.every_epochs == 0;
        // Step-interval work; left to the epoch's end when that does it anyway.
        if (o.validation.loader && o.validation.every_steps > 0 && st.step % o.validation.every_steps == 0 &&
            !(epoch_end && val_epoch_due)) {
          validate();
          bar.message("step " + std::to_string(st.step) + "  " + metrics_text(st.metrics));
        }
        if (ckpt && o.checkpoint.every_steps > 0 && st.step % o.checkpoint.every_steps == 0 &&
            !(epoch_end && ckpt_epoch_due))
          save(*ckpt, false);
        if (!(epoch_end && val_epoch_due)) save_best_if_pending();
        // Cancellation: every rank stops after the same step.
        if (o.cancel) {
          bool c = o.cancel && o.cancel->cancelled();
          if (group && world > 1) {
            AnyTensor t = Tensor<int32_t>::from_vector({c ? 1 : 0}, {1}).to(group->device());
            group->all_reduce(t, dist::ReduceOp::Max);
            c = Tensor<int32_t>(t.to(Device::cpu())).to_vector()[0] != 0;
          }
          if (c) {
            cancelled = true;
            break;
          }
        }
        if (stop_early && !(epoch_end && val_epoch_due)) break;
      }
      if (cancelled) {
        result.cancelled = true;
        if (ckpt && o.checkpoint.save_on_cancel && last_saved != st.step) save(*ckpt, false);
        break;
      }
      if (sie < spe) break;  // the step budget (or early stopping) ended the run inside the epoch
      // ---- the epoch's end ----
      const bool val_due = o.validation.loader && o.validation.every_epochs > 0 && (epoch + 1) % o.validation.every_epochs == 0;
      if (val_due) {
        validate();
      }
      if (o.scheduler && o.scheduler_interval == SchedulerInterval::Epoch) {
        o.scheduler->step();
        st.lr = opt.param_groups()[0].lr();
      }
      ++epoch;
      sie = 0;
      ++result.epochs_completed;
      // The checkpoints of the epoch's end resume at the next epoch's start.
      if (ckpt && o.checkpoint.every_epochs > 0 && epoch % o.checkpoint.every_epochs == 0) save(*ckpt, false);
      save_best_if_pending();
      st.seconds = elapsed();
      {
        ProgressInfo pi = info();
        pi.epoch = epoch - 1;
        bar.epoch_end(pi, val_due ? metrics_text(st.metrics) : "");
      }
      fire([&](Callback& c) { c.on_epoch_end(st); });
      if (stop_early) break;
    }
    result.early_stopped = stop_early && !result.cancelled;
    if (ckpt && o.checkpoint.save_at_end && last_saved != st.step) save(*ckpt, false);
    if (ckpt) ckpt->wait();  // the last save_async commits (and its error is thrown) before fit returns
    finish_profile();
    bar.finish();
    if (own_logger) own_logger->close();
  } catch (...) {
    std::exception_ptr e = std::current_exception();
    bar.finish();
    if (profiler && profiler->is_recording()) {
      try {
        profiler->stop();
      } catch (...) {
      }
    }
    for (auto& cb : callbacks_) {
      try {
        cb->on_exception(st, e);
      } catch (...) {  // the training error is the one to report
      }
    }
    std::rethrow_exception(e);
  }
  st.seconds = elapsed();
  result.steps = st.step;
  result.seconds = st.seconds;
  result.samples = st.samples;
  result.samples_per_second = st.seconds > 0 ? static_cast<double>(st.samples) / st.seconds : 0.0;
  result.final_loss = st.loss;
  result.best_metric_name = o.checkpoint.best_metric;
  if (have_best) {
    result.best_metric = best;
    result.best_step = best_step;
    if (result.best_checkpoint.empty() && !best_path.empty()) result.best_checkpoint = best_path;
  }
  fire([&](Callback& c) { c.on_fit_end(st, result); });
  return result;
}

}  // namespace ember::train
