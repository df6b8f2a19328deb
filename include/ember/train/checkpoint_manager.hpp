#pragma once
// train::CheckpointManager: training checkpoints that survive a kill at any moment, and resume
// exactly (docs/checkpoints.md).
//
//   train::CheckpointManager ckpt("runs/a", {.keep_last = 3, .keep_every = 1000});
//   train::CheckpointTargets t{.model = &model, .optimizer = &opt, .scheduler = &sched, .scaler = &scaler};
//   if (auto r = ckpt.load_latest(t)) start = r->step;            // restores everything in t
//   ...
//   ckpt.save_async(step, t, {.epoch = e, .data = train::sampler_position(sampler, i)});
//
// One checkpoint is a folder `step-<n>/` holding model.safetensors (the model's state dict),
// optimizer.safetensors (optim/state_io.hpp) and state.json: step, epoch, the scheduler's and the
// GradScaler's state, every registered generator's (seed, offset) (the default generator always;
// Philox streams are the same on every device, so one pair covers them all), the position in the
// data (a caller-supplied JSON object), a user object, the ember version, and the size and zlib
// CRC32 of each .safetensors file.
//
// Commit: everything is written into a temporary folder `.tmp-step-<n>-<pid>-<k>/` (each file
// fsynced), state.json last; the folder is renamed to step-<n> and the parent folder fsynced. The
// newest complete checkpoint is found by scanning for step-<n> folders (no pointer file to
// corrupt) and verified (state.json parses, each file has its recorded size and CRC32, each
// safetensors header validates); one that fails is skipped with a warning naming the folder and
// the reason, and the next older one is used. Temporary folders are never taken for checkpoints;
// those left by dead processes are removed when a manager is made. (The folder layout, its scan
// the verification, the commit and the retention: io/detail/checkpoint_folder.hpp; the scheduler,
// scaler and generator state: amp/detail/run_state_json.hpp.)
//
// save_async copies the state to host memory on the calling thread, then writes on a background
// thread while training goes on; a second save waits for the first; a writer's error is thrown by
// the next save, save_async, wait() or load; the destructor waits (and reports an error it cannot
// throw on stderr). (The staging buffers: detail/checkpoint_staging.hpp.)
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ember/amp/detail/run_state_json.hpp"
#include "ember/amp/grad_scaler.hpp"
#include "ember/core/random.hpp"
#include "ember/core/trace.hpp"
#include "ember/data/distributed_sampler.hpp"
#include "ember/io/atomic_file.hpp"
#include "ember/io/detail/checkpoint_folder.hpp"
#include "ember/io/safetensors.hpp"
#include "ember/nn/module.hpp"
#include "ember/optim/scheduler.hpp"
#include "ember/optim/state_io.hpp"
#include "ember/train/detail/checkpoint_staging.hpp"

namespace ember::train {

struct CheckpointOptions {
  int keep_last = 3;       // the newest this many checkpoints are kept (0: keep all)
  int64_t keep_every = 0;  // and, forever, those whose step is a multiple of this (0: none)
  // Where warnings (a skipped corrupt checkpoint, a failed clean-up) go; default: std::cerr. Called
  // from the writer thread during a save_async: it must be thread-safe.
  std::function<void(const std::string&)> warn;
  // Remove, when the manager is made, the temporary folders of writers that are no longer running
  // (pid check on this machine). Set false on every process but the writer when several processes
  // on several machines share the folder (data parallel: rank 0 writes, all ranks load).
  bool clean_stale = true;
  // Threads that copy host tensors into save_async's staging buffers (the caller's thread and
  // copy_threads - 1 helpers, joined before save_async returns); 0: min(4, hardware threads).
  int copy_threads = 0;
};

// What a checkpoint saves and a load restores; a null pointer is left out.
struct CheckpointTargets {
  nn::Module* model = nullptr;
  optim::Optimizer* optimizer = nullptr;
  optim::LRScheduler* scheduler = nullptr;
  amp::GradScaler* scaler = nullptr;
  // Generators by name; the default generator is always saved as "default".
  std::vector<std::pair<std::string, Generator*>> generators;
};

// The rest of state.json, supplied by the caller.
struct CheckpointExtras {
  int64_t epoch = 0;
  nlohmann::json data = nlohmann::json::object();  // the position in the data (sampler_position, a loader's state())
  nlohmann::json user = nlohmann::json::object();  // anything else
};

struct LoadedCheckpoint {
  int64_t step = 0;
  int64_t epoch = 0;
  nlohmann::json data, user;
  std::filesystem::path path;
  nlohmann::json state;  // the whole state.json
};

// The typed convenience for data::DistributedSampler: {"sampler": {"epoch": e, "index": i}}, where
// i is the number of this rank's samples of epoch e already consumed.
inline nlohmann::json sampler_position(const data::DistributedSampler& s, int64_t index) {
  return {{"sampler", {{"epoch", s.epoch()}, {"index", index}}}};
}
struct SamplerPosition {
  uint64_t epoch = 0;
  int64_t index = 0;
};
// Reads it back (and sets the sampler's epoch when one is given).
inline SamplerPosition sampler_position_from(const nlohmann::json& data, data::DistributedSampler* s = nullptr) {
  EMBER_CHECK(data.is_object() && data.contains("sampler") && data["sampler"].is_object() &&
                  data["sampler"].contains("epoch") && data["sampler"]["epoch"].is_number_integer() &&
                  data["sampler"].contains("index") && data["sampler"]["index"].is_number_integer(),
              FormatError, "checkpoint data has no sampler position {\"sampler\": {\"epoch\", \"index\"}}: ", data.dump());
  SamplerPosition p{data["sampler"]["epoch"].get<uint64_t>(), data["sampler"]["index"].get<int64_t>()};
  if (s) s->set_epoch(p.epoch);
  return p;
}

namespace detail {
// Everything one checkpoint writes, detached from the live objects (for save_async) or
// referring to them (for save).
struct Snapshot {
  int64_t step = 0;
  bool has_model = false, has_optimizer = false;
  io::TensorList model;
  optim::OptimizerStateDict optimizer;
  std::string optimizer_name;
  nlohmann::json state;  // state.json without "files"
};
}  // namespace detail

class CheckpointManager {
 public:
  explicit CheckpointManager(std::filesystem::path dir, CheckpointOptions options = {})
      : dir_(std::move(dir)), options_(std::move(options)) {
    EMBER_CHECK(options_.copy_threads >= 0, ValueError, "CheckpointManager: copy_threads must be >= 0, got ",
                options_.copy_threads);
    EMBER_CHECK(options_.keep_last >= 0 && options_.keep_every >= 0, ValueError,
                "CheckpointManager: keep_last and keep_every must be >= 0, got ", options_.keep_last, " and ",
                options_.keep_every);
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) throw IOError("CheckpointManager: cannot create the folder '" + dir_.string() + "': " + ec.message());
    if (options_.clean_stale) io::detail::remove_stale_checkpoint_temporaries(dir_);
  }
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;
  ~CheckpointManager() {
    join();
    if (error_) {
      try {
        std::rethrow_exception(error_);
      } catch (const std::exception& e) {
        warn(std::string("an asynchronous checkpoint save failed and was never reported: ") + e.what());
      }
    }
  }

  const std::filesystem::path& directory() const { return dir_; }
  std::filesystem::path path_of(int64_t step) const { return dir_ / ("step-" + std::to_string(step)); }

  // Writes a checkpoint and returns when it is committed.
  void save(int64_t step, const CheckpointTargets& t, const CheckpointExtras& extras = {}) {
    trace::PhaseScope phase(trace::Phase::CheckpointSave);
    wait();
    detail::Snapshot s = snapshot(step, t, extras, /*copy=*/false);
    write(s);
  }

  // Copies the state to host memory here, then writes and commits on a background thread.
  void save_async(int64_t step, const CheckpointTargets& t, const CheckpointExtras& extras = {}) {
    trace::PhaseScope phase(trace::Phase::CheckpointSave);
    wait();
    staging_.begin();
    auto s = std::make_shared<detail::Snapshot>(snapshot(step, t, extras, /*copy=*/true));
    staging_.complete(options_.copy_threads);  // before the writer reads the buffers
    writer_ = std::thread([this, s] {
      try {
        write(*s);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        error_ = std::current_exception();
      }
    });
  }

  // Waits for a save_async in flight; throws its error, if it failed.
  void wait() {
    join();
    std::exception_ptr e;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::swap(e, error_);
    }
    if (e) std::rethrow_exception(e);
  }

  // Steps of the folders named step-<n>, newest first (not verified).
  std::vector<int64_t> steps() const { return io::detail::checkpoint_steps(dir_); }

  // Why the checkpoint of this step is not usable, or "" when it verifies.
  std::string verify(int64_t step) const {
    try {
      io::detail::verify_checkpoint_folder(path_of(step));
      return "";
    } catch (const std::exception& e) {
      return e.what();
    }
  }

  // The newest checkpoint that verifies (older ones after a warning for each newer one that does not).
  std::optional<int64_t> latest() {
    wait();
    for (int64_t s : steps()) {
      std::string why = verify(s);
      if (why.empty()) return s;
      warn("skipping checkpoint '" + path_of(s).string() + "': " + why);
    }
    return std::nullopt;
  }

  // Restores the checkpoint of `step` into the targets (and the generators); verifies it first.
  LoadedCheckpoint load(int64_t step, const CheckpointTargets& t) {
    wait();
    const std::filesystem::path p = path_of(step);
    nlohmann::json st = io::detail::verify_checkpoint_folder(p);
    const std::string who = "checkpoint '" + p.string() + "'";
    // Check that what the targets need is there before changing anything.
    EMBER_CHECK(!t.model || st["files"].contains("model.safetensors"), FormatError, who, " has no model");
    EMBER_CHECK(!t.optimizer || st["files"].contains("optimizer.safetensors"), FormatError, who, " has no optimizer state");
    EMBER_CHECK(!t.scheduler || (st.contains("scheduler") && !st["scheduler"].is_null()), FormatError, who,
                " has no scheduler state");
    if (t.model) t.model->load((p / "model.safetensors").string(), /*strict=*/true);
    if (t.optimizer) optim::load_state(*t.optimizer, (p / "optimizer.safetensors").string());
    amp::detail::restore_run_state(st, t.scheduler, t.scaler, t.generators, who);
    LoadedCheckpoint r;
    r.step = st["step"].get<int64_t>();
    r.epoch = st["epoch"].get<int64_t>();
    r.data = st["data"];
    r.user = st["user"];
    r.path = p;
    r.state = std::move(st);
    return r;
  }

  // load(latest()), or nullopt when there is no usable checkpoint.
  std::optional<LoadedCheckpoint> load_latest(const CheckpointTargets& t) {
    std::optional<int64_t> s = latest();
    if (!s) return std::nullopt;
    return load(*s, t);
  }

 private:
  // The state to write. copy: into host buffers of this manager's own (reused from one save to the
  // next, so a save_async after the first costs one memcpy per tensor and no page faults), for a
  // writer thread that runs while training changes the live tensors; else the live tensors.
  detail::Snapshot snapshot(int64_t step, const CheckpointTargets& t, const CheckpointExtras& extras, bool copy) {
    EMBER_CHECK(step >= 0, ValueError, "CheckpointManager.save: step must be >= 0, got ", step);
    EMBER_CHECK(extras.data.is_object() && extras.user.is_object(), ValueError,
                "CheckpointManager.save: data and user must be JSON objects");
    detail::Snapshot s;
    s.step = step;
    size_t slot = 0;
    auto take = [&](const AnyTensor& v) { return copy ? staging_.stage(v, slot++) : v.detach(); };
    if (t.model) {
      s.has_model = true;
      // Tied parameters (one storage, two names) are saved once each: safetensors refuses shared
      // storage, and loading copies into both anyway.
      std::unordered_set<const Storage*> seen;
      for (auto& [name, v] : t.model->state_dict()) {
        const bool shared = v.nbytes() > 0 && v.impl()->storage && !seen.insert(v.impl()->storage.get()).second;
        s.model.emplace_back(name, shared && !copy ? detail::host_snapshot(v) : take(v));
      }
    }
    if (t.optimizer) {
      // Optimizer::state_dict()'s layout (state by parameter index across the groups), without its
      // copies: the state tensors themselves, or their staged copies.
      s.has_optimizer = true;
      s.optimizer_name = t.optimizer->name();
      int64_t index = 0;
      for (const auto& g : t.optimizer->param_groups()) {
        optim::OptimizerStateDict::Group sg;
        sg.options = g.options;
        for (const auto& p : g.params) {
          if (const optim::ParamState* st = t.optimizer->state(p)) {
            optim::ParamState c;
            for (const auto& [k, v] : *st) c.emplace_back(k, take(v));
            s.optimizer.state.emplace(index, std::move(c));
          }
          sg.params.push_back(index++);
        }
        s.optimizer.param_groups.push_back(std::move(sg));
      }
    }
    nlohmann::json& j = s.state;
    j["format"] = "ember.checkpoint";
    j["format_version"] = 1;
    j["ember_version"] = io::detail::version_string();
    j["step"] = step;
    j["epoch"] = extras.epoch;
    amp::detail::write_run_state(j, t.scheduler, t.scaler, t.generators, "CheckpointManager.save");
    j["data"] = extras.data;
    j["user"] = extras.user;
    return s;
  }

  void write(const detail::Snapshot& s) {
    const std::string final_name = "step-" + std::to_string(s.step);
    const std::filesystem::path tmp = dir_ / ::ember::detail::str_cat(".tmp-", final_name, "-", ::getpid(), "-", counter_++);
    std::error_code ec;
    std::filesystem::remove_all(tmp, ec);
    if (!std::filesystem::create_directory(tmp, ec))
      throw IOError("CheckpointManager: cannot create '" + tmp.string() + "': " + ec.message());
    try {
      nlohmann::json state = s.state;
      nlohmann::json files = nlohmann::json::object();
      auto record = [&](const std::string& name, auto&& write_fn) {
        uint32_t crc = 0;
        uint64_t bytes = 0;
        write_fn((tmp / name).string(), [&](const void* p, size_t n) {
          crc = io::detail::crc32_update(crc, p, n);
          bytes += n;
        });
        files[name] = {{"bytes", bytes}, {"crc32", crc}};
      };
      if (s.has_model)
        record("model.safetensors", [&](const std::string& path, const io::ByteObserver& obs) {
          io::save_file(path, s.model, {{"format", "pt"}}, obs);
        });
      if (s.has_optimizer)
        record("optimizer.safetensors", [&](const std::string& path, const io::ByteObserver& obs) {
          optim::save_state_dict(s.optimizer, s.optimizer_name, path, {}, obs);
        });
      state["files"] = std::move(files);
      io::write_file_atomic(tmp / "state.json", state.dump(2) + "\n");
      io::detail::commit_checkpoint_folder(tmp, dir_, final_name, "CheckpointManager", counter_);
    } catch (...) {
      std::filesystem::remove_all(tmp, ec);
      throw;
    }
    apply_retention(s.step);
  }


  void apply_retention(int64_t just_written) {
    io::detail::apply_checkpoint_retention(dir_, options_.keep_last, options_.keep_every, just_written,
                                           [this](const std::string& m) { warn(m); }, counter_);
  }

  void join() {
    if (writer_.joinable()) writer_.join();
  }
  void warn(const std::string& msg) const {
    if (options_.warn) {
      options_.warn("ember CheckpointManager: " + msg);
    } else {
      std::cerr << "ember CheckpointManager: warning: " << msg << "\n";
    }
  }

  std::filesystem::path dir_;
  CheckpointOptions options_;
  std::thread writer_;
  std::mutex mu_;
  std::exception_ptr error_;
  detail::StagingBuffers staging_;  // save_async's host copies (touched only between saves)
  uint64_t counter_ = 0;  // only the thread that writes (one at a time) touches it
};

}  // namespace ember::train
