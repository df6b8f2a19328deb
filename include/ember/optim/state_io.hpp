#pragma once
// Optimizer and scheduler state on disk and in JSON.
//
//   optim::save_state(opt, "optimizer.safetensors");   // state tensors + groups as metadata
//   optim::load_state(opt, "optimizer.safetensors");   // bitwise the state that was saved
//
// The file is a safetensors file: each state tensor is named "state.<parameter index>.<name>"
// (torch's state-dict keys: "state.0.exp_avg", "state.0.step"), in the state dict's order;
// "__metadata__" holds "format" = "ember.optimizer", "optimizer" = the optimizer's name and
// "param_groups" = a JSON array of the groups in torch's layout ({"lr": ..., ..., "params":
// [indices]}), hyperparameters in their order. Doubles are written in the shortest form that reads
// back to the same bits; non-finite values as the strings "inf", "-inf", "nan".
//
// The JSON forms (*_to_json, *_from_json) need <nlohmann/json.hpp> where their results are used;
// this header declares them with <nlohmann/json_fwd.hpp>. The definitions are in
// optim/detail/state_io_impl.hpp, compiled once into the library under EMBER_COMPILED_LIB
// (core/macros.hpp), included here when header-only.
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "ember/core/macros.hpp"
#include "ember/io/safetensors.hpp"
#include "ember/optim/optimizer.hpp"
#include "ember/optim/scheduler.hpp"

namespace ember::optim {

EMBER_LIB_INLINE nlohmann::ordered_json hyperparams_to_json(const Hyperparams& h);
EMBER_LIB_INLINE Hyperparams hyperparams_from_json(const nlohmann::ordered_json& j, const std::string& what);

// The param_groups in torch's layout: [{"lr": 0.001, ..., "params": [0, 1]}].
EMBER_LIB_INLINE nlohmann::ordered_json param_groups_to_json(const OptimizerStateDict& sd);

// Writes a state dict of the optimizer named `optimizer_name` (a snapshot: training may go on).
EMBER_LIB_INLINE void save_state_dict(const OptimizerStateDict& sd, const std::string& optimizer_name,
                                      const std::string& path, io::Metadata metadata = {},
                                      const io::ByteObserver& on_bytes = {});

EMBER_LIB_INLINE void save_state(const Optimizer& opt, const std::string& path, io::Metadata metadata = {});

// The state dict stored in a file written by save_state (FormatError when the file is not one).
EMBER_LIB_INLINE OptimizerStateDict read_state(const std::string& path, std::string* optimizer_name = nullptr);

// Restores what save_state wrote (into an optimizer of the same kind over the same parameters).
EMBER_LIB_INLINE void load_state(Optimizer& opt, const std::string& path);

// A scheduler's state as JSON: {"last_epoch": t, "base_lrs": [...], "last_lr": [...]}.
EMBER_LIB_INLINE nlohmann::ordered_json scheduler_to_json(const SchedulerStateDict& sd);
EMBER_LIB_INLINE SchedulerStateDict scheduler_from_json(const nlohmann::ordered_json& j);

}  // namespace ember::optim

#if !defined(EMBER_COMPILED_LIB)
#include "ember/optim/detail/state_io_impl.hpp"
#endif
