#pragma once
// dist::ShardedCheckpointManager: checkpoints of a FullyShardedDataParallel run, written by every
// rank at once (each its own shards), committed as one folder, loadable by any number of ranks
// (docs/checkpoints.md, docs/distributed.md).
//
//   dist::ShardedCheckpointManager ckpt("runs/a", group, {.keep_last = 3});
//   dist::ShardedCheckpointTargets t{.fsdp = &fsdp, .optimizer = &opt, .scheduler = &sched};
//   if (auto r = ckpt.load_latest(t)) start = r->step;      // a collective; any saved world size
//   ...
//   ckpt.save(step, t, {.epoch = e, .data = position});     // a collective
//   dist::consolidate_sharded_checkpoint("runs/a/step-1000", "model.safetensors");  // one process
//
// One checkpoint is a folder step-<n>/ (the folder layout, its scan, verification, commit and
// retention are train::CheckpointManager's: io/detail/checkpoint_folder.hpp) holding
// - params.rank<r>.safetensors for every rank r of the saving world: "unit.<i>", unit i's master
//   shard (S_i elements of the master dtype; the last rank's ends in zeros past N_i);
// - optimizer.rank<r>.safetensors: rank r's optimizer state in optim/state_io.hpp's format (its
//   parameter i is its shard of unit optimizer.units[i]; elementwise state has S_i elements);
// - buffers.safetensors (rank 0; the buffers are replicated), when the model has buffers;
// - state.json (rank 0, written last): CheckpointManager's fields (step, epoch, scheduler, GradScaler
//   and generator state, data, user, ember version, each file's bytes and CRC32) and "fsdp": the
//   manifest: world, stage, master and parameter dtypes, every unit (name, N "numel", S
//   "shard_numel", its parameters' names, shapes and offsets), the state_dict's names in order (each
//   a parameter, a buffer, or a tied alias of a parameter), the optimizer's name and the unit of each
//   of its parameters.
//
// Save: every rank writes its files into one temporary folder .tmp-step-<n>-<pid>-<k> (rank 0's
// pid), each fsynced; an all_gather collects each rank's sizes and CRC32s (and whether it
// succeeded); rank 0 writes the buffers and state.json, renames the folder to step-<n>, fsyncs the
// parent and applies keep_last; a broadcast of rank 0's outcome ends the save on every rank. A rank
// that dies while writing leaves the previous checkpoints as they were: the others wait for it in
// the all_gather and raise DistributedError after the group's timeout. Temporary folders of dead
// writers are removed by rank 0 when a manager is made.
//
// Load: rank 0 finds the newest checkpoint that verifies (a damaged one is skipped with a warning
// naming it and why) and tells the others. Each rank checks the manifest against its model (another
// model is an error naming the first differing unit or parameter; the world size may differ), then
// cuts its shard of each unit out of the saved shards: the saving ranks' shards in rank order, the
// first N elements, padded for the new world, elements [r*S, (r+1)*S). Optimizer state tensors with
// the unit's saved S elements (Adam's moments, SGD's momentum) are resharded alike; other state
// (step counts, equal on every rank) is taken from one saving rank. Buffers, scheduler, GradScaler
// and generators are restored; fsdp.shards_changed() is called.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ember/amp/detail/run_state_json.hpp"
#include "ember/dist/detail/sharded_checkpoint_layout.hpp"
#include "ember/dist/fsdp.hpp"
#include "ember/io/atomic_file.hpp"
#include "ember/io/detail/checkpoint_folder.hpp"
#include "ember/optim/state_io.hpp"

namespace ember::dist {

struct ShardedCheckpointOptions {
  int keep_last = 3;  // the newest this many checkpoints are kept (0: keep all)
  // Where rank 0's warnings go (a skipped damaged checkpoint, a failed clean-up); default std::cerr.
  std::function<void(const std::string&)> warn;
  // Rank 0 removes, when the manager is made, temporary folders whose writer (rank 0 of the job that
  // saved) is no longer running on this machine.
  bool clean_stale = true;
  // Called on each rank as its files are written: (file name, bytes of it written so far). For
  // progress reports; it runs inside save, between writes.
  std::function<void(const std::string& file, uint64_t bytes)> on_write;
};

// What a checkpoint saves and a load restores; fsdp is required, a null pointer elsewhere is left
// out. The optimizer must be over fsdp.parameters() (any groups).
struct ShardedCheckpointTargets {
  FullyShardedDataParallel* fsdp = nullptr;
  optim::Optimizer* optimizer = nullptr;
  optim::LRScheduler* scheduler = nullptr;
  amp::GradScaler* scaler = nullptr;
  // Generators by name; the default generator is always saved as "default".
  std::vector<std::pair<std::string, Generator*>> generators;
};

// The rest of state.json, supplied by the caller (rank 0's is written).
struct ShardedCheckpointInfo {
  int64_t epoch = 0;
  nlohmann::json data = nlohmann::json::object();  // the position in the data
  nlohmann::json user = nlohmann::json::object();  // anything else
};

struct LoadedShardedCheckpoint {
  int64_t step = 0;
  int64_t epoch = 0;
  nlohmann::json data, user;
  std::filesystem::path path;
  int64_t saved_world = 0;  // the number of ranks that wrote it
  nlohmann::json state;     // the whole state.json
};

namespace detail {
inline const nlohmann::json& sharded_manifest(const nlohmann::json& st, const std::string& who) {
  EMBER_CHECK(st.contains("fsdp") && st["fsdp"].is_object() && st["fsdp"].contains("units") &&
                  st["fsdp"].contains("world") && st["fsdp"].contains("state_dict"),
              FormatError, who, " is not a sharded checkpoint (state.json has no \"fsdp\" manifest; ",
              "train::CheckpointManager loads unsharded ones)");
  return st["fsdp"];
}
}  // namespace detail

class ShardedCheckpointManager {
 public:
  ShardedCheckpointManager(std::filesystem::path dir, ProcessGroup& group, ShardedCheckpointOptions options = {})
      : dir_(std::move(dir)), group_(group), options_(std::move(options)) {
    EMBER_CHECK(options_.keep_last >= 0, ValueError, "ShardedCheckpointManager: keep_last must be >= 0, got ",
                options_.keep_last);
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) throw IOError("ShardedCheckpointManager: cannot create the folder '" + dir_.string() + "': " + ec.message());
    if (options_.clean_stale && group_.rank() == 0) io::detail::remove_stale_checkpoint_temporaries(dir_);
  }
  ShardedCheckpointManager(const ShardedCheckpointManager&) = delete;
  ShardedCheckpointManager& operator=(const ShardedCheckpointManager&) = delete;

  const std::filesystem::path& directory() const { return dir_; }
  std::filesystem::path path_of(int64_t step) const { return dir_ / ("step-" + std::to_string(step)); }
  // Steps of the folders named step-<n>, newest first (not verified).
  std::vector<int64_t> steps() const { return io::detail::checkpoint_steps(dir_); }

  // Writes a checkpoint of `step`; returns on every rank when it is committed. A collective.
  void save(int64_t step, const ShardedCheckpointTargets& t, const ShardedCheckpointInfo& info = {}) {
    EMBER_CHECK(step >= 0, ValueError, "ShardedCheckpointManager.save: step must be >= 0, got ", step);
    EMBER_CHECK(t.fsdp != nullptr, ValueError, "ShardedCheckpointManager.save: targets.fsdp is null");
    EMBER_CHECK(info.data.is_object() && info.user.is_object(), ValueError,
                "ShardedCheckpointManager.save: data and user must be JSON objects");
    FullyShardedDataParallel& f = *t.fsdp;
    const int64_t world = group_.size(), rank = group_.rank();
    const std::vector<int64_t> opt_units = t.optimizer ? optimizer_units(f, *t.optimizer) : std::vector<int64_t>{};
    // One temporary folder for all ranks, named after rank 0's process.
    const std::vector<int64_t> id = broadcast_ints({static_cast<int64_t>(::getpid()), static_cast<int64_t>(counter_++)});
    const std::string final_name = "step-" + std::to_string(step);
    const std::filesystem::path tmp = dir_ / ::ember::detail::str_cat(".tmp-", final_name, "-", id[0], "-", id[1]);

    // This rank's files: {ok, bytes and crc32 of params, of optimizer}.
    std::vector<int64_t> mine(5, 0);
    std::string error;
    try {
      std::error_code ec;
      std::filesystem::create_directories(tmp, ec);
      if (ec) throw IOError("ShardedCheckpointManager.save: cannot create '" + tmp.string() + "': " + ec.message());
      io::TensorList shards;
      for (size_t i = 0; i < f.unit_count(); ++i) shards.emplace_back(detail::unit_key(i), f.shard(i).detach());
      write_recorded(tmp, detail::params_file(rank), &mine[1], [&](const std::string& p, const io::ByteObserver& o) {
        io::save_file(p, shards, {{"format", "ember.fsdp.shard"}}, o);
      });
      if (t.optimizer)
        write_recorded(tmp, detail::optimizer_file(rank), &mine[3], [&](const std::string& p, const io::ByteObserver& o) {
          optim::save_state_dict(t.optimizer->state_dict(), t.optimizer->name(), p, {}, o);
        });
      mine[0] = 1;
    } catch (const std::exception& e) {
      error = e.what();
    }
    std::vector<int64_t> all;
    try {
      all = all_gather_ints(mine);
    } catch (...) {
      if (rank == 0) remove_quietly(tmp);
      throw;
    }
    std::string failed;
    for (int64_t q = 0; q < world; ++q)
      if (all[static_cast<size_t>(q * 5)] == 0) failed += (failed.empty() ? "" : ", ") + std::to_string(q);
    if (!failed.empty()) {
      if (rank == 0) remove_quietly(tmp);
      throw IOError(::ember::detail::str_cat("ShardedCheckpointManager.save(", step, "): rank(s) ", failed,
                                             " could not write their shards", error.empty() ? "" : "; this rank: ",
                                             error));
    }
    if (rank == 0) {
      try {
        commit(step, t, info, tmp, final_name, all, opt_units);
      } catch (const std::exception& e) {
        error = e.what();
        remove_quietly(tmp);
      }
    }
    const std::vector<int64_t> outcome = broadcast_ints({error.empty() ? 1 : 0});
    if (outcome[0] == 0)
      throw IOError(::ember::detail::str_cat("ShardedCheckpointManager.save(", step, "): rank 0 could not commit ",
                                             "the checkpoint", rank == 0 ? ": " + error : std::string()));
  }

  // The newest checkpoint that verifies (checked by rank 0, which warns for each newer one that
  // does not), on every rank. A collective.
  std::optional<int64_t> latest() {
    int64_t found = -1;
    if (group_.rank() == 0)
      for (int64_t s : steps()) {
        const std::string why = verify_folder(path_of(s));
        if (why.empty()) {
          found = s;
          break;
        }
        warn("skipping checkpoint '" + path_of(s).string() + "': " + why);
      }
    found = broadcast_ints({found})[0];
    return found < 0 ? std::nullopt : std::optional<int64_t>(found);
  }

  // Restores the checkpoint in `folder` (written by any number of ranks) into the targets; rank 0
  // verifies it first. A collective.
  LoadedShardedCheckpoint load(const std::filesystem::path& folder, const ShardedCheckpointTargets& t) {
    const std::string why = group_.rank() == 0 ? verify_folder(folder) : std::string();
    EMBER_CHECK(broadcast_ints({why.empty() ? 1 : 0})[0] == 1, FormatError, "ShardedCheckpointManager.load: ",
                "checkpoint '", folder.string(), "' does not verify",
                why.empty() ? std::string(" (rank 0's check)") : ": " + why);
    return load_verified(folder, t);
  }
  LoadedShardedCheckpoint load(int64_t step, const ShardedCheckpointTargets& t) { return load(path_of(step), t); }

  // load(latest()), or nullopt when there is no usable checkpoint. A collective.
  std::optional<LoadedShardedCheckpoint> load_latest(const ShardedCheckpointTargets& t) {
    std::optional<int64_t> s = latest();
    if (!s) return std::nullopt;
    return load_verified(path_of(*s), t);
  }

 private:
  // The unit of each of the optimizer's parameters (numbered across its groups).
  static std::vector<int64_t> optimizer_units(FullyShardedDataParallel& f, const optim::Optimizer& opt) {
    std::unordered_map<const TensorImpl*, int64_t> unit_of;
    for (size_t i = 0; i < f.unit_count(); ++i) unit_of[f.shard(i).impl()] = static_cast<int64_t>(i);
    std::vector<int64_t> out;
    for (const auto& g : opt.param_groups())
      for (const auto& p : g.params) {
        auto it = unit_of.find(p.impl());
        EMBER_CHECK(it != unit_of.end(), ValueError, "ShardedCheckpointManager: parameter ", out.size(), " of the ",
                    opt.name(), " optimizer (", p.desc(), ") is not one of the FSDP shards; build the optimizer ",
                    "over fsdp.parameters()");
        out.push_back(it->second);
      }
    return out;
  }

  // Writes dir/name with write_fn(path, observer), recording {bytes, crc32} into out[0..1].
  template <class WriteFn>
  void write_recorded(const std::filesystem::path& dir, const std::string& name, int64_t* out, WriteFn&& write_fn) {
    uint32_t crc = 0;
    uint64_t bytes = 0;
    write_fn((dir / name).string(), [&](const void* p, size_t n) {
      crc = io::detail::crc32_update(crc, p, n);
      bytes += n;
      if (options_.on_write) options_.on_write(name, bytes);
    });
    out[0] = static_cast<int64_t>(bytes);
    out[1] = static_cast<int64_t>(crc);
  }

  // Rank 0: the buffers, state.json (with every rank's files), the rename, the retention.
  void commit(int64_t step, const ShardedCheckpointTargets& t, const ShardedCheckpointInfo& info,
              const std::filesystem::path& tmp, const std::string& final_name, const std::vector<int64_t>& all,
              const std::vector<int64_t>& opt_units) {
    FullyShardedDataParallel& f = *t.fsdp;
    nn::Module& model = f.module();
    nlohmann::json files = nlohmann::json::object();
    auto record = [&](const std::string& name, int64_t bytes, int64_t crc) {
      files[name] = {{"bytes", static_cast<uint64_t>(bytes)}, {"crc32", static_cast<uint32_t>(crc)}};
    };
    for (int64_t q = 0; q < group_.size(); ++q) {
      const int64_t* v = &all[static_cast<size_t>(q * 5)];
      record(detail::params_file(q), v[1], v[2]);
      if (t.optimizer) record(detail::optimizer_file(q), v[3], v[4]);
    }
    io::TensorList buffers;
    std::unordered_set<std::string> buffer_names;
    for (auto& [n, b] : model.named_buffers())
      if (buffer_names.insert(n).second) buffers.emplace_back(n, b.detach());
    if (!buffers.empty()) {
      int64_t rec[2];
      write_recorded(tmp, detail::buffers_file(), rec, [&](const std::string& p, const io::ByteObserver& o) {
        io::save_file(p, buffers, {{"format", "ember.fsdp.buffers"}}, o);
      });
      record(detail::buffers_file(), rec[0], rec[1]);
    }
    nlohmann::json j;
    j["format"] = "ember.checkpoint";
    j["format_version"] = 1;
    j["ember_version"] = io::detail::version_string();
    j["step"] = step;
    j["epoch"] = info.epoch;
    amp::detail::write_run_state(j, t.scheduler, t.scaler, t.generators, "ShardedCheckpointManager.save");
    j["data"] = info.data;
    j["user"] = info.user;
    j["fsdp"] = manifest(f, buffer_names, t.optimizer, opt_units);
    j["files"] = std::move(files);
    io::write_file_atomic(tmp / "state.json", j.dump(2) + "\n");
    io::detail::commit_checkpoint_folder(tmp, dir_, final_name, "ShardedCheckpointManager", counter_);
    io::detail::apply_checkpoint_retention(dir_, options_.keep_last, 0, step,
                                           [this](const std::string& m) { warn(m); }, counter_);
  }

  nlohmann::json manifest(FullyShardedDataParallel& f, const std::unordered_set<std::string>& buffer_names,
                          const optim::Optimizer* opt, const std::vector<int64_t>& opt_units) const {
    const std::vector<ShardedUnitInfo> units = f.unit_infos();
    // The state_dict's names in order, each with where its values live: a parameter of a unit, a
    // buffer, or (tied parameters) the unit parameter whose tensor it is.
    std::unordered_map<const TensorImpl*, std::string> param_of;
    std::unordered_set<std::string> in_units;
    for (const auto& u : units)
      for (const auto& p : u.params) in_units.insert(p.name);
    for (auto& [n, p] : f.module().named_parameters())
      if (in_units.count(n)) param_of.emplace(p.impl(), n);
    nlohmann::json sd = nlohmann::json::array();
    for (auto& [n, v] : f.module().state_dict()) {
      if (in_units.count(n)) {
        sd.push_back({{"name", n}, {"param", n}});
      } else if (buffer_names.count(n)) {
        sd.push_back({{"name", n}, {"buffer", n}});
      } else {
        auto it = param_of.find(v.impl());
        EMBER_CHECK(it != param_of.end(), ValueError, "ShardedCheckpointManager.save: state_dict entry ", n,
                    " is neither a sharded parameter nor a buffer");
        sd.push_back({{"name", n}, {"param", it->second}});
      }
    }
    nlohmann::json m;
    m["world"] = group_.size();
    m["stage"] = f.stage();
    m["master_dtype"] = dtype_name(f.shard(0).dtype());
    m["param_dtype"] = dtype_name(f.param_dtype());
    m["units"] = detail::units_to_json(units);
    m["state_dict"] = std::move(sd);
    m["buffers"] = !buffer_names.empty();
    m["optimizer"] = opt ? nlohmann::json{{"name", opt->name()}, {"units", opt_units}} : nlohmann::json();
    return m;
  }

  // A manifest whose fields have other JSON types than written (a hand-edited state.json) is a
  // FormatError naming the checkpoint, not a JSON library exception.
  LoadedShardedCheckpoint load_verified(const std::filesystem::path& folder, const ShardedCheckpointTargets& t) {
    try {
      return load_verified_unchecked(folder, t);
    } catch (const nlohmann::json::exception& e) {
      throw FormatError("checkpoint '" + folder.string() + "': its state.json does not hold a sharded checkpoint's " +
                        "manifest: " + e.what());
    }
  }
  LoadedShardedCheckpoint load_verified_unchecked(const std::filesystem::path& folder, const ShardedCheckpointTargets& t) {
    EMBER_CHECK(t.fsdp != nullptr, ValueError, "ShardedCheckpointManager.load: targets.fsdp is null");
    NoGradGuard no_grad;
    FullyShardedDataParallel& f = *t.fsdp;
    const std::string who = "checkpoint '" + folder.string() + "'";
    nlohmann::json st = read_state_json(folder, who);
    const nlohmann::json& m = detail::sharded_manifest(st, who);
    const int64_t old_world = m.at("world").get<int64_t>(), rank = group_.rank();
    const std::vector<ShardedUnitInfo> units = f.unit_infos();
    // Everything checked before anything changes.
    detail::check_same_layout(m.at("units"), units, who);
    std::vector<int64_t> opt_units;
    if (t.optimizer) {
      EMBER_CHECK(!m.at("optimizer").is_null(), FormatError, who, " has no optimizer state");
      opt_units = optimizer_units(f, *t.optimizer);
      EMBER_CHECK(m.at("optimizer").at("name") == t.optimizer->name() && m.at("optimizer").at("units") == opt_units, ValueError,
                  who, " holds the state of a ", m.at("optimizer").at("name").dump(), " optimizer over units ",
                  m.at("optimizer").at("units").dump(), ", not of a ", t.optimizer->name(), " over units ",
                  nlohmann::json(opt_units).dump());
    }
    EMBER_CHECK(!t.scheduler || (st.contains("scheduler") && !st["scheduler"].is_null()), FormatError, who,
                " has no scheduler state");

    detail::ShardReader params([&](int64_t q) { return folder / detail::params_file(q); }, old_world);
    for (size_t i = 0; i < units.size(); ++i) {
      const int64_t n = units[i].numel, S = units[i].shard_numel;
      const int64_t old_S = m.at("units").at(i).at("shard_numel").get<int64_t>();
      AnyTensor v = params.range(detail::unit_key(i), n, old_S, rank * S, (rank + 1) * S);
      AnyTensor dst = f.shard(i).detach();
      dst.copy_(v.dtype() == dst.dtype() ? v.to(dst.device()) : v.to(dst.dtype()).to(dst.device()));
    }
    if (t.optimizer) {
      // One saving rank's state (its step counts); its elementwise tensors resharded when the
      // world changed.
      std::string name;
      const std::filesystem::path base = folder / detail::optimizer_file(std::min(rank, old_world - 1));
      optim::OptimizerStateDict sd = optim::read_state(base.string(), &name);
      if (old_world != group_.size()) {
        detail::ShardReader state([&](int64_t q) { return folder / detail::optimizer_file(q); }, old_world);
        for (auto& [index, ps] : sd.state) {
          const size_t u = static_cast<size_t>(opt_units.at(static_cast<size_t>(index)));
          const int64_t n = units[u].numel, S = units[u].shard_numel;
          const int64_t old_S = m.at("units").at(u).at("shard_numel").get<int64_t>();
          for (auto& [k, v] : ps)
            if (v.shape() == Shape{old_S})
              v = state.range(::ember::detail::str_cat("state.", index, ".", k), n, old_S, rank * S, (rank + 1) * S);
        }
      }
      t.optimizer->load_state_dict(sd);
    }
    if (m.at("buffers").get<bool>()) {
      io::TensorList saved = io::load_file((folder / detail::buffers_file()).string());
      std::unordered_map<std::string, const AnyTensor*> by_name;
      for (auto& [n, v] : saved) by_name[n] = &v;
      for (auto& [n, b] : f.module().named_buffers()) {
        auto it = by_name.find(n);
        EMBER_CHECK(it != by_name.end(), ValueError, who, " has no buffer ", n);
        AnyTensor dst = b.detach();
        dst.copy_(it->second->to(dst.dtype()).to(dst.device()));
      }
    }
    amp::detail::restore_run_state(st, t.scheduler, t.scaler, t.generators, who);
    f.shards_changed();
    LoadedShardedCheckpoint r;
    r.step = st["step"].get<int64_t>();
    r.epoch = st["epoch"].get<int64_t>();
    r.data = st["data"];
    r.user = st["user"];
    r.path = folder;
    r.saved_world = old_world;
    r.state = std::move(st);
    return r;
  }

  static nlohmann::json read_state_json(const std::filesystem::path& folder, const std::string& who) {
    std::ifstream in(folder / "state.json");
    EMBER_CHECK(in.good(), IOError, who, ": no readable state.json");
    try {
      return nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw FormatError(who + ": state.json is not JSON: " + e.what());
    }
  }

  // Why the folder is not a usable sharded checkpoint, or "" when it verifies.
  static std::string verify_folder(const std::filesystem::path& folder) {
    try {
      detail::sharded_manifest(io::detail::verify_checkpoint_folder(folder), "it");
      return "";
    } catch (const std::exception& e) {
      return e.what();
    }
  }

  std::vector<int64_t> broadcast_ints(const std::vector<int64_t>& v) {
    AnyTensor t = AnyTensor(Tensor<int64_t>::from_vector(v)).to(group_.device());
    group_.broadcast(t, 0);
    return Tensor<int64_t>(t.to(Device::cpu())).to_vector();
  }
  std::vector<int64_t> all_gather_ints(const std::vector<int64_t>& v) {
    AnyTensor in = AnyTensor(Tensor<int64_t>::from_vector(v)).to(group_.device());
    AnyTensor out = AnyTensor::zeros(Shape{static_cast<int64_t>(v.size()) * group_.size()}, DType::Int64, group_.device());
    group_.all_gather(out, in);
    return Tensor<int64_t>(out.to(Device::cpu())).to_vector();
  }

  static void remove_quietly(const std::filesystem::path& p) {
    std::error_code ec;
    std::filesystem::remove_all(p, ec);
  }
  void warn(const std::string& msg) const {
    if (options_.warn) {
      options_.warn("ember ShardedCheckpointManager: " + msg);
    } else {
      std::cerr << "ember ShardedCheckpointManager: warning: " << msg << "\n";
    }
  }

  std::filesystem::path dir_;
  ProcessGroup& group_;
  ShardedCheckpointOptions options_;
  uint64_t counter_ = 0;
};

// Writes the checkpoint in `folder` as one unsharded safetensors file `out` (atomically): exactly
// the names, in the order, and the values that Module::save of the unwrapped model writes (the
// parameters in their master dtype, fp32, and the buffers); a tied parameter's second name gets
// a copy. Verifies the folder first. Not a collective: any one process, any time.
inline void consolidate_sharded_checkpoint(const std::filesystem::path& folder, const std::filesystem::path& out) {
  const std::string who = "checkpoint '" + folder.string() + "'";
  try {
    const nlohmann::json st = io::detail::verify_checkpoint_folder(folder);
    const nlohmann::json& m = detail::sharded_manifest(st, who);
    detail::ShardReader params([&](int64_t q) { return folder / detail::params_file(q); }, m.at("world").get<int64_t>());
    std::unordered_map<std::string, AnyTensor> values;
    for (size_t i = 0; i < m.at("units").size(); ++i) {
      const nlohmann::json& u = m.at("units")[i];
      const int64_t n = u.at("numel").get<int64_t>();
      AnyTensor flat = params.range(detail::unit_key(i), n, u.at("shard_numel").get<int64_t>(), 0, n);
      for (const auto& p : u.at("params")) {
        const int64_t off = p.at("offset").get<int64_t>(), numel = p.at("numel").get<int64_t>();
        values[p.at("name").get<std::string>()] = flat.slice(off, off + numel).reshape(Shape(p.at("shape").get<std::vector<int64_t>>()));
      }
    }
    if (m.at("buffers").get<bool>())
      for (auto& [n, v] : io::load_file((folder / detail::buffers_file()).string())) values["buffer:" + n] = v;
    io::TensorList list;
    for (const auto& e : m.at("state_dict")) {
      const std::string key = e.contains("param") ? e.at("param").get<std::string>() : "buffer:" + e.at("buffer").get<std::string>();
      auto it = values.find(key);
      EMBER_CHECK(it != values.end(), FormatError, who, ": the manifest lists ", e.dump(), " but the files lack it");
      list.emplace_back(e.at("name").get<std::string>(), it->second.clone());
    }
    io::save_file(out.string(), list);
  } catch (const nlohmann::json::exception& e) {  // a hand-edited manifest
    throw FormatError(who + ": its state.json does not hold a sharded checkpoint's manifest: " + e.what());
  }
}

}  // namespace ember::dist
