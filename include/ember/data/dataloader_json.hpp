#pragma once
// DataLoaderState <-> JSON (nlohmann-json), for checkpoints:
//   {"epoch": 3, "batches_consumed": 120, "seed": 42}
// nlohmann::json j = loader.state();  loader.load_state(j.get<data::DataLoaderState>());
// A missing or mistyped key is a FormatError naming it.
#include <nlohmann/json.hpp>

#include "ember/core/error.hpp"
#include "ember/data/dataloader.hpp"

namespace ember::data {

inline void to_json(nlohmann::json& j, const DataLoaderState& s) {
  j = nlohmann::json{{"epoch", s.epoch}, {"batches_consumed", s.batches_consumed}, {"seed", s.seed}};
}

inline void from_json(const nlohmann::json& j, DataLoaderState& s) {
  EMBER_CHECK(j.is_object(), FormatError, "DataLoaderState: JSON is not an object: ", j.dump());
  auto get_u = [&](const char* key) -> uint64_t {
    EMBER_CHECK(j.contains(key) && j[key].is_number_integer() && j[key].get<int64_t>() >= 0, FormatError,
                "DataLoaderState: key '", key, "' is missing or not a non-negative integer in ", j.dump());
    return j[key].get<uint64_t>();
  };
  s.epoch = get_u("epoch");
  s.batches_consumed = static_cast<int64_t>(get_u("batches_consumed"));
  s.seed = get_u("seed");
}

}  // namespace ember::data
