#pragma once
// The run state a checkpoint's state.json records besides the tensors, shared by
// train::CheckpointManager and dist::ShardedCheckpointManager: the learning-rate scheduler's
// state ("scheduler", "scheduler_name"), the GradScaler's ("grad_scaler"; null when there is none
// or it is disabled) and every generator's (seed, offset) ("generators": the default generator
// always, as "default"; Philox streams are the same on every device, so one pair covers them all).
// It lives in amp, the lowest layer that sees all three (the GradScaler).
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ember/amp/grad_scaler.hpp"
#include "ember/core/random.hpp"
#include "ember/optim/scheduler.hpp"
#include "ember/optim/state_io.hpp"

namespace ember::amp::detail {

using NamedGenerators = std::vector<std::pair<std::string, Generator*>>;

// Adds "scheduler", "scheduler_name" (with a scheduler), "grad_scaler" and "generators" to j.
// `who` names the caller in errors ("CheckpointManager.save").
inline void write_run_state(nlohmann::json& j, optim::LRScheduler* scheduler, GradScaler* scaler,
                            const NamedGenerators& generators, const std::string& who) {
  j["scheduler"] = scheduler ? nlohmann::json(optim::scheduler_to_json(scheduler->state_dict())) : nlohmann::json();
  if (scheduler) j["scheduler_name"] = scheduler->name();
  j["grad_scaler"] = scaler && scaler->is_enabled() ? nlohmann::json(optim::hyperparams_to_json(scaler->state_dict()))
                                                    : nlohmann::json();
  nlohmann::json gens = nlohmann::json::object();
  gens["default"] = {{"seed", default_generator().seed()}, {"offset", default_generator().offset()}};
  for (const auto& [name, g] : generators) {
    EMBER_CHECK(name != "default" && g != nullptr, ValueError, who, ": generator '", name,
                "' is null or uses the reserved name 'default'");
    gens[name] = {{"seed", g->seed()}, {"offset", g->offset()}};
  }
  j["generators"] = std::move(gens);
}

// Restores what write_run_state recorded into the scheduler (when given), the scaler (when given
// and enabled), the default generator and the named ones. `who` names the checkpoint in errors.
inline void restore_run_state(const nlohmann::json& st, optim::LRScheduler* scheduler, GradScaler* scaler,
                              const NamedGenerators& generators, const std::string& who) {
  if (scheduler) {
    EMBER_CHECK(st.contains("scheduler") && !st["scheduler"].is_null(), FormatError, who, " has no scheduler state");
    scheduler->load_state_dict(optim::scheduler_from_json(st["scheduler"]));
  }
  if (scaler && scaler->is_enabled()) {
    EMBER_CHECK(st.contains("grad_scaler") && st["grad_scaler"].is_object(), FormatError, who,
                " has no GradScaler state");
    scaler->load_state_dict(optim::hyperparams_from_json(st["grad_scaler"], who + " grad_scaler"));
  }
  EMBER_CHECK(st.contains("generators") && st["generators"].is_object(), FormatError, who, " has no generator states");
  const auto& gens = st["generators"];
  auto restore = [&](const std::string& name, Generator& g) {
    EMBER_CHECK(gens.contains(name) && gens[name].contains("seed") && gens[name].contains("offset"), FormatError, who,
                " has no state for generator '", name, "'");
    g.set_state(gens[name]["seed"].get<uint64_t>(), gens[name]["offset"].get<uint64_t>());
  };
  restore("default", default_generator());
  for (const auto& [name, g] : generators) restore(name, *g);
}

}  // namespace ember::amp::detail
