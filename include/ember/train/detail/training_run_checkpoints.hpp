#pragma once
// The checkpoint side of trainer_detail::TrainingRun (detail/training_run.hpp): the resume, the
// saves, and the Trainer's own state in a checkpoint (state.json's user.trainer).
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "ember/data/dataloader_json.hpp"
#include "ember/train/checkpoint_manager.hpp"
#include "ember/train/detail/training_run.hpp"

namespace ember::train::trainer_detail {

// A double for JSON, which has no NaN or infinity: those become null (read back as NaN).
inline nlohmann::json json_number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }
inline double number_from_json(const nlohmann::json& j) {
  return j.is_null() ? std::numeric_limits<double>::quiet_NaN() : j.get<double>();
}

// From the newest checkpoint that verifies (CheckpointPolicy::resume). Rank 0 picks it; every rank
// loads that one (they all see the same folder).
inline void TrainingRun::resume() {
  const CheckpointPolicy& policy = options_.checkpoint;
  if (sharded_) {
    resume_sharded();
    return;
  }
  if (!policy.dir.empty()) {
    CheckpointOptions co;
    co.keep_last = policy.keep_last;
    co.clean_stale = is_writer_;
    checkpoints_ = std::make_unique<CheckpointManager>(policy.dir, co);
  }
  targets_ = {.model = &model_, .optimizer = &optimizer_, .scheduler = options_.scheduler,
              .scaler = scaler_on_ ? &scaler_ : nullptr, .generators = {}};
  if (checkpoints_ && policy.resume) {
    int64_t chosen = -1;
    if (is_writer_) {
      if (auto s = checkpoints_->latest()) chosen = *s;
    }
    if (group_ && world_size_ > 1) {
      AnyTensor t = Tensor<int64_t>::from_vector({chosen}, {1}).to(group_->device());
      group_->broadcast(t, 0);
      chosen = Tensor<int64_t>(t.to(Device::cpu())).to_vector()[0];
    }
    if (chosen >= 0) {
      LoadedCheckpoint r = checkpoints_->load(chosen, targets_);
      apply_resumed_checkpoint(r.user, r.data, r.path, "");
    }
  }
  state_.start_step = state_.step;
  result_.start_step = state_.step;
  state_.lr = optimizer_.param_groups().empty() ? 0.0 : optimizer_.param_groups()[0].lr();
}

inline void TrainingRun::save_after_cancel() {
  if (checkpoints_on() && options_.checkpoint.save_on_cancel && last_saved_step_ != state_.step) save_checkpoint();
}

inline void TrainingRun::save_checkpoint() {
  if (sharded_checkpoints_)
    save_sharded_to(*sharded_checkpoints_, /*is_best=*/false);
  else
    save_to(*checkpoints_, /*is_best=*/false);
}

// dir/best/step-<n>, the only one kept there.
inline void TrainingRun::save_best_checkpoint_if_due() {
  if (!best_checkpoint_due_) return;
  best_checkpoint_due_ = false;
  if (sharded_checkpoints_) {  // every rank writes its shard
    if (!sharded_best_)
      sharded_best_ = std::make_unique<dist::ShardedCheckpointManager>(
          options_.checkpoint.dir / "best", *group_, dist::ShardedCheckpointOptions{.keep_last = 1});
    best_checkpoint_path_ = sharded_best_->path_of(state_.step).string();
    save_sharded_to(*sharded_best_, /*is_best=*/true);
    return;
  }
  if (!is_writer_) return;
  if (!best_checkpoints_) {
    CheckpointOptions bo;
    bo.keep_last = 1;
    best_checkpoints_ = std::make_unique<CheckpointManager>(options_.checkpoint.dir / "best", bo);
  }
  best_checkpoint_path_ = best_checkpoints_->path_of(state_.step).string();
  save_to(*best_checkpoints_, /*is_best=*/true);
}

inline void TrainingRun::save_to(CheckpointManager& manager, bool is_best) {
  if (!is_writer_) return;
  const data::DataLoaderState position{static_cast<uint64_t>(epoch_), step_in_epoch_ * accumulation_,
                                       train_loader_.state().seed};
  const CheckpointExtras extras{.epoch = epoch_, .data = {{"loader", position}}, .user = {{"trainer", trainer_state_json()}}};
  if (options_.checkpoint.save_async && !is_best)
    manager.save_async(state_.step, targets_, extras);
  else
    manager.save(state_.step, targets_, extras);
  checkpoint_written(manager.path_of(state_.step), is_best);
}

// A fully sharded run's checkpoint: a collective (every rank writes its shard; save_async is not
// used: the shards are written synchronously). Rank 0 records it and runs the callbacks.
inline void TrainingRun::save_sharded_to(dist::ShardedCheckpointManager& manager, bool is_best) {
  const data::DataLoaderState position{static_cast<uint64_t>(epoch_), step_in_epoch_ * accumulation_,
                                       train_loader_.state().seed};
  manager.save(state_.step, sharded_targets_,
               {.epoch = epoch_, .data = {{"loader", position}}, .user = {{"trainer", trainer_state_json()}}});
  if (!is_best) last_saved_step_ = state_.step;
  if (is_writer_) checkpoint_written(manager.path_of(state_.step), is_best);
}

// The resume of a fully sharded run: every rank loads its shards of the newest complete
// checkpoint, resharded when it was written by another number of ranks.
inline void TrainingRun::resume_sharded() {
  const CheckpointPolicy& policy = options_.checkpoint;
  if (!policy.dir.empty())
    sharded_checkpoints_ = std::make_unique<dist::ShardedCheckpointManager>(
        policy.dir, *group_, dist::ShardedCheckpointOptions{.keep_last = policy.keep_last});
  sharded_targets_ = {.fsdp = sharded_, .optimizer = &optimizer_, .scheduler = options_.scheduler,
                      .scaler = scaler_on_ ? &scaler_ : nullptr, .generators = {}};
  if (sharded_checkpoints_ && policy.resume) {
    if (auto r = sharded_checkpoints_->load_latest(sharded_targets_)) {
      const std::string world_hint =
          r->saved_world != world_size_ ? "written by " + std::to_string(r->saved_world) + " ranks, resumed on " +
                                              std::to_string(world_size_) + ": keep the global batch, "
                                        : std::string();
      apply_resumed_checkpoint(r->user, r->data, r->path, world_hint);
    }
  }
  state_.start_step = state_.step;
  result_.start_step = state_.step;
  state_.lr = optimizer_.param_groups().empty() ? 0.0 : optimizer_.param_groups()[0].lr();
}

// What both resumes do with a loaded checkpoint: the Trainer's state from its user object, the
// checks that the run fits the loader, and whether the run had already ended. `hint` opens the
// explanation of a step count that does not fit (the sharded resume names the world sizes).
inline void TrainingRun::apply_resumed_checkpoint(const nlohmann::json& user, const nlohmann::json& data,
                                                  const std::filesystem::path& path, const std::string& hint) {
  const std::string who = "Trainer: checkpoint '" + path.string() + "'";
  EMBER_CHECK(user.contains("trainer") && user["trainer"].is_object(), FormatError, who,
              " was not written by a Trainer (no \"trainer\" object in its user state)");
  restore_trainer_state(user["trainer"], who);
  EMBER_CHECK(step_in_epoch_ >= 0 && step_in_epoch_ <= steps_per_epoch_, FormatError, who, ": it stopped after step ",
              step_in_epoch_, " of its epoch, but an epoch now has ", steps_per_epoch_, " steps (", hint,
              "loader, batch size or accumulation changed?)");
  if (data.contains("loader")) {
    const auto ls = data["loader"].get<data::DataLoaderState>();
    EMBER_CHECK(ls.seed == train_loader_.state().seed, ValueError, who, ": saved with loader seed ", ls.seed,
                " but this loader's seed is ", train_loader_.state().seed, " (its batches would differ)");
  }
  result_.resumed_from = path;
  result_.last_checkpoint = path;
  // A run that had ended: nothing to train, and its checkpoint is not written again.
  stop_early_ = early_stopping_patience_spent();
  if (!budget_left() || stop_early_) {
    result_.already_complete = true;
    last_saved_step_ = state_.step;
  }
}

// Rank 0's record of a committed checkpoint, and the callbacks.
inline void TrainingRun::checkpoint_written(const std::filesystem::path& p, bool is_best) {
  if (is_best) {
    result_.best_checkpoint = p;
  } else {
    result_.last_checkpoint = p;
    last_saved_step_ = state_.step;
  }
  fire([&](Callback& c) { c.on_checkpoint(state_, p); });
}

// state.json's user.trainer: where the run is, both metric trackers, the last loss and metrics.
inline nlohmann::json TrainingRun::trainer_state_json() const {
  nlohmann::json metrics = nlohmann::json::object();
  for (const auto& [k, v] : state_.metrics) metrics[k] = json_number(v);
  nlohmann::json j = {{"step", state_.step},
                      {"epoch", epoch_},
                      {"step_in_epoch", step_in_epoch_},
                      {"best_path", best_checkpoint_path_},
                      {"best_metric", best_tracker_.to_json()},
                      {"early_stopping", early_stop_tracker_.to_json()},
                      {"metrics", std::move(metrics)}};
  if (loss_known_) j["loss"] = json_number(state_.loss);
  return j;
}

// Reads trainer_state_json(), or the earlier flat layout: have_best, best, best_step and es_have,
// es_best, es_bad in place of "best_metric" and "early_stopping", and no "loss" or "metrics".
inline void TrainingRun::restore_trainer_state(const nlohmann::json& j, const std::string& who) {
  try {
    state_.step = j.at("step").get<int64_t>();
    epoch_ = j.at("epoch").get<int64_t>();
    step_in_epoch_ = j.at("step_in_epoch").get<int64_t>();
    best_checkpoint_path_ = j.at("best_path").get<std::string>();
    if (j.contains("best_metric"))
      best_tracker_.load_json(j.at("best_metric"), who + " best_metric");
    else
      best_tracker_.restore(j.at("have_best").get<bool>(), number_from_json(j.at("best")),
                            j.at("best_step").get<int64_t>(), 0);
    if (j.contains("early_stopping"))
      early_stop_tracker_.load_json(j.at("early_stopping"), who + " early_stopping");
    else
      early_stop_tracker_.restore(j.at("es_have").get<bool>(), number_from_json(j.at("es_best")), -1,
                                  j.at("es_bad").get<int64_t>());
    if (j.contains("loss")) {
      state_.loss = number_from_json(j.at("loss"));
      loss_known_ = true;
    }
    if (j.contains("metrics"))
      for (const auto& [k, v] : j.at("metrics").items()) state_.metrics[k] = number_from_json(v);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(who + ": bad trainer state: " + e.what());
  }
}

}  // namespace ember::train::trainer_detail
