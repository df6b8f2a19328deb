#pragma once
// Optimizer and scheduler state files and JSON (optim/state_io.hpp declares them), compiled once
// into the library under EMBER_COMPILED_LIB, included by the header otherwise.
#include <cmath>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "ember/optim/state_io.hpp"

namespace ember::optim {

namespace detail {
inline nlohmann::ordered_json number_to_json(double v) {
  if (std::isfinite(v)) return v;
  return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
}
inline double number_from_json(const nlohmann::ordered_json& j, const std::string& what) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    if (s == "inf") return INFINITY;
    if (s == "-inf") return -INFINITY;
    if (s == "nan") return NAN;
  }
  throw FormatError(::ember::detail::str_cat(what, ": expected a number, got ", j.dump()));
}
}  // namespace detail

EMBER_LIB_INLINE nlohmann::ordered_json hyperparams_to_json(const Hyperparams& h) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [k, v] : h) j[k] = detail::number_to_json(v);
  return j;
}
EMBER_LIB_INLINE Hyperparams hyperparams_from_json(const nlohmann::ordered_json& j, const std::string& what) {
  EMBER_CHECK(j.is_object(), FormatError, what, ": expected a JSON object, got ", j.dump());
  Hyperparams h;
  for (auto it = j.begin(); it != j.end(); ++it) h.set(it.key(), detail::number_from_json(*it, what + "." + it.key()));
  return h;
}

EMBER_LIB_INLINE nlohmann::ordered_json param_groups_to_json(const OptimizerStateDict& sd) {
  nlohmann::ordered_json groups = nlohmann::ordered_json::array();
  for (const auto& g : sd.param_groups) {
    nlohmann::ordered_json j = hyperparams_to_json(g.options);
    j["params"] = g.params;
    groups.push_back(std::move(j));
  }
  return groups;
}

EMBER_LIB_INLINE void save_state_dict(const OptimizerStateDict& sd, const std::string& optimizer_name,
                                      const std::string& path, io::Metadata metadata, const io::ByteObserver& on_bytes) {
  io::TensorList tensors;
  for (const auto& [index, st] : sd.state)
    for (const auto& [name, t] : st) tensors.emplace_back(::ember::detail::str_cat("state.", index, ".", name), t);
  metadata["format"] = "ember.optimizer";
  metadata["optimizer"] = optimizer_name;
  metadata["param_groups"] = param_groups_to_json(sd).dump();
  io::save_file(path, tensors, metadata, on_bytes);
}

EMBER_LIB_INLINE void save_state(const Optimizer& opt, const std::string& path, io::Metadata metadata) {
  save_state_dict(opt.state_dict(), opt.name(), path, std::move(metadata));
}

EMBER_LIB_INLINE OptimizerStateDict read_state(const std::string& path, std::string* optimizer_name) {
  io::SafetensorsFile f(path);
  const io::Metadata& m = f.metadata();
  const std::string who = "optimizer state file '" + path + "'";
  auto field = [&](const char* k) -> const std::string& {
    auto it = m.find(k);
    EMBER_CHECK(it != m.end(), FormatError, who, ": metadata has no '", k, "' (not written by optim::save_state?)");
    return it->second;
  };
  EMBER_CHECK(field("format") == "ember.optimizer", FormatError, who, ": metadata format is '", field("format"),
              "', expected 'ember.optimizer'");
  if (optimizer_name) *optimizer_name = field("optimizer");
  OptimizerStateDict sd;
  nlohmann::ordered_json groups;
  try {
    groups = nlohmann::ordered_json::parse(field("param_groups"));
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(who + ": param_groups is not JSON: " + e.what());
  }
  EMBER_CHECK(groups.is_array(), FormatError, who, ": param_groups must be a JSON array");
  for (size_t g = 0; g < groups.size(); ++g) {
    nlohmann::ordered_json j = groups[g];
    const std::string gw = ::ember::detail::str_cat(who, ": param_groups[", g, "]");
    EMBER_CHECK(j.is_object() && j.contains("params") && j["params"].is_array(), FormatError, gw,
                " must be an object with a 'params' array");
    OptimizerStateDict::Group sg;
    for (const auto& p : j["params"]) {
      EMBER_CHECK(p.is_number_integer(), FormatError, gw, ": params must be integers, got ", p.dump());
      sg.params.push_back(p.get<int64_t>());
    }
    j.erase("params");
    sg.options = hyperparams_from_json(j, gw);
    sd.param_groups.push_back(std::move(sg));
  }
  for (auto& [name, t] : f.load_all()) {
    // "state.<index>.<name>"
    const size_t dot = name.find('.', 6);
    EMBER_CHECK(name.rfind("state.", 0) == 0 && dot != std::string::npos && dot > 6, FormatError, who,
                ": tensor '", name, "' is not named state.<index>.<name>");
    int64_t index = 0;
    try {
      size_t used = 0;
      index = std::stoll(name.substr(6, dot - 6), &used);
      EMBER_CHECK(used == dot - 6, FormatError, who, ": tensor '", name, "': bad parameter index");
    } catch (const std::logic_error&) {
      throw FormatError(who + ": tensor '" + name + "': bad parameter index");
    }
    sd.state[index].emplace_back(name.substr(dot + 1), t);
  }
  return sd;
}

EMBER_LIB_INLINE void load_state(Optimizer& opt, const std::string& path) {
  std::string name;
  OptimizerStateDict sd = read_state(path, &name);
  EMBER_CHECK(name == opt.name(), ValueError, "optim::load_state: '", path, "' holds the state of a ", name,
              " optimizer, not of a ", opt.name());
  opt.load_state_dict(sd);
}

EMBER_LIB_INLINE nlohmann::ordered_json scheduler_to_json(const SchedulerStateDict& sd) {
  nlohmann::ordered_json j;
  j["last_epoch"] = sd.last_epoch;
  j["base_lrs"] = nlohmann::ordered_json::array();
  for (double v : sd.base_lrs) j["base_lrs"].push_back(detail::number_to_json(v));
  j["last_lr"] = nlohmann::ordered_json::array();
  for (double v : sd.last_lr) j["last_lr"].push_back(detail::number_to_json(v));
  return j;
}
EMBER_LIB_INLINE SchedulerStateDict scheduler_from_json(const nlohmann::ordered_json& j) {
  EMBER_CHECK(j.is_object() && j.contains("last_epoch") && j["last_epoch"].is_number_integer() &&
                  j.contains("base_lrs") && j["base_lrs"].is_array() && j.contains("last_lr") && j["last_lr"].is_array(),
              FormatError, "scheduler state must be {\"last_epoch\": int, \"base_lrs\": [...], \"last_lr\": [...]}, got ",
              j.dump());
  SchedulerStateDict sd;
  sd.last_epoch = j["last_epoch"].get<int64_t>();
  for (const auto& v : j["base_lrs"]) sd.base_lrs.push_back(detail::number_from_json(v, "scheduler base_lrs"));
  for (const auto& v : j["last_lr"]) sd.last_lr.push_back(detail::number_from_json(v, "scheduler last_lr"));
  return sd;
}

}  // namespace ember::optim
