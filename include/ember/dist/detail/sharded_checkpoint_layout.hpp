#pragma once
// The layout part of a sharded checkpoint (dist/sharded_checkpoint.hpp): the manifest that
// state.json records under "fsdp", the check that a model's layout is the saved one, the file
// names, and the reader that cuts any rank's slice of a unit out of the shards of however many
// ranks wrote them (resharding), which consolidation uses too.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ember/dist/fsdp.hpp"
#include "ember/io/safetensors.hpp"

namespace ember::dist::detail {

// The files of one checkpoint folder: each rank's master shards and optimizer state, rank 0's
// buffers (the buffers are replicated).
inline std::string params_file(int64_t rank) { return ::ember::detail::str_cat("params.rank", rank, ".safetensors"); }
inline std::string optimizer_file(int64_t rank) {
  return ::ember::detail::str_cat("optimizer.rank", rank, ".safetensors");
}
inline const char* buffers_file() { return "buffers.safetensors"; }
// The name of unit i's master shard in a params file.
inline std::string unit_key(size_t i) { return ::ember::detail::str_cat("unit.", i); }

inline nlohmann::json shape_json(const Shape& s) {
  nlohmann::json a = nlohmann::json::array();
  for (int64_t d : s) a.push_back(d);
  return a;
}

// The units as the manifest records them.
inline nlohmann::json units_to_json(const std::vector<ShardedUnitInfo>& units) {
  nlohmann::json out = nlohmann::json::array();
  for (const ShardedUnitInfo& u : units) {
    nlohmann::json params = nlohmann::json::array();
    for (const auto& p : u.params)
      params.push_back({{"name", p.name}, {"shape", shape_json(p.shape)}, {"offset", p.offset}, {"numel", p.numel}});
    out.push_back({{"name", u.name}, {"numel", u.numel}, {"shard_numel", u.shard_numel}, {"params", params}});
  }
  return out;
}

// Checks that the saved units (the manifest's "units") are the model's, but for the shard size
// (the world may differ); the error names the first difference.
inline void check_same_layout(const nlohmann::json& saved, const std::vector<ShardedUnitInfo>& mine,
                              const std::string& who) {
  auto unit_name = [](const std::string& n) { return n.empty() ? std::string("<root>") : n; };
  const size_t n = std::min(saved.size(), mine.size());
  for (size_t i = 0; i < n; ++i) {
    const nlohmann::json& s = saved[i];
    const ShardedUnitInfo& m = mine[i];
    const std::string sname = s.at("name").get<std::string>();
    EMBER_CHECK(sname == m.name, ValueError, who, " was saved from another model: unit ", i, " is '",
                unit_name(sname), "' there, '", unit_name(m.name), "' here");
    const nlohmann::json& sp = s.at("params");
    for (size_t k = 0; k < std::max(sp.size(), m.params.size()); ++k) {
      EMBER_CHECK(k < sp.size() && k < m.params.size(), ValueError, who, " was saved from another model: unit '",
                  unit_name(m.name), "' has ", sp.size(), " parameter(s) there, ", m.params.size(), " here (first ",
                  "unmatched: ", k < sp.size() ? sp[k].at("name").get<std::string>() : m.params[k].name, ")");
      const auto& p = m.params[k];
      const std::string pname = sp[k].at("name").get<std::string>();
      EMBER_CHECK(pname == p.name && sp[k].at("shape") == shape_json(p.shape) &&
                      sp[k].at("offset").get<int64_t>() == p.offset,
                  ValueError, who, " was saved from another model: unit '", unit_name(m.name), "' parameter ", k,
                  " is ", pname, " ", Shape(sp[k].at("shape").get<std::vector<int64_t>>()).str(), " at offset ",
                  sp[k].at("offset").dump(),
                  " there, ", p.name, " ", p.shape.str(), " at offset ", p.offset, " here");
    }
    EMBER_CHECK(s.at("numel").get<int64_t>() == m.numel, ValueError, who, " was saved from another model: unit '",
                unit_name(m.name), "' has ", s.at("numel").dump(), " elements there, ", m.numel, " here");
  }
  EMBER_CHECK(saved.size() == mine.size(), ValueError, who, " was saved from another model: it has ", saved.size(),
              " unit(s), the model has ", mine.size(), " (first unmatched: '",
              unit_name(saved.size() > n ? saved[n].at("name").get<std::string>() : mine[n].name), "')");
}

// Reads ranges of the flat (unpadded) vectors that a checkpoint's ranks wrote in shards: the
// bytes of [begin, end) of a vector whose rank q holds [q*S, (q+1)*S), copied from the shard
// files (memory-mapped; each opened on first use) into a new host tensor. Past the vector's N
// elements the result is zero (the padding of the new world).
class ShardReader {
 public:
  // file_of(q): the path of rank q's file; world: how many ranks wrote.
  ShardReader(std::function<std::filesystem::path(int64_t)> file_of, int64_t world)
      : file_of_(std::move(file_of)), world_(world) {
    EMBER_CHECK(world >= 1 && world <= (int64_t{1} << 24), FormatError,
                "sharded checkpoint: the manifest's world size ", world, " is not a number of ranks");
    files_.resize(static_cast<size_t>(world));
  }

  const io::SafetensorsFile& file(int64_t q) {
    auto& f = files_.at(static_cast<size_t>(q));
    if (!f) f = std::make_unique<io::SafetensorsFile>(file_of_(q).string());
    return *f;
  }

  // Elements [begin, end) of the vector of `n` elements stored as `key` (S elements per rank).
  AnyTensor range(const std::string& key, int64_t n, int64_t S, int64_t begin, int64_t end) {
    EMBER_CHECK(S >= 1 && n >= 0 && S <= (int64_t{1} << 48) && n <= S * world_, FormatError, "sharded checkpoint: '",
                key, "' of ", n, " elements cannot lie in ", world_, " shards of ", S,
                " (the manifest's shard_numel or world is wrong)");
    const io::TensorEntry& first = file(0).entry(key);
    EMBER_CHECK(first.dtype.has_value(), FormatError, "sharded checkpoint: '", key, "' in ", file(0).path(),
                " has the dtype ", first.dtype_name, ", which ember cannot hold");
    const DType dt = *first.dtype;
    AnyTensor out = AnyTensor::zeros(Shape{end - begin}, dt, Device::cpu());
    const size_t es = dtype_size(dt);
    const int64_t stop = std::min(end, n);
    for (int64_t i = begin; i < stop;) {
      const int64_t q = i / S, q_end = std::min(stop, (q + 1) * S);
      const io::SafetensorsFile& f = file(q);
      const io::TensorEntry& e = f.entry(key);
      EMBER_CHECK(e.dtype == first.dtype && e.nbytes() == static_cast<uint64_t>(S) * es, FormatError,
                  "sharded checkpoint: '", key, "' in ", f.path(), " is ", e.dtype_name, " of ", e.nbytes(),
                  " bytes; expected ", first.dtype_name, " of ", S, " elements");
      std::memcpy(static_cast<char*>(out.data_ptr()) + static_cast<size_t>(i - begin) * es,
                  f.data(key) + static_cast<size_t>(i - q * S) * es, static_cast<size_t>(q_end - i) * es);
      i = q_end;
    }
    return out;
  }

 private:
  std::function<std::filesystem::path(int64_t)> file_of_;
  int64_t world_;
  std::vector<std::unique_ptr<io::SafetensorsFile>> files_;
};

}  // namespace ember::dist::detail
