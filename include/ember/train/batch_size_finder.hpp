#pragma once
// train::find_max_batch_size: the largest batch size whose training step fits in memory, found by
// running the step (as PyTorch Lightning's batch-size finder, mode "binsearch"):
//
//   auto found = train::find_max_batch_size(
//       [&](int64_t b) {                      // one full training step at batch size b
//         auto [x, y] = loader.batch(b);
//         auto loss = nn::functional::cross_entropy(model(x), y);
//         loss.backward();
//         opt.step();
//         opt.zero_grad();
//       },
//       model, opt, {.initial_batch_size = 16, .max_batch_size = 4096, .margin = 0.9,
//                    .device = Device::cuda(0)});
//   int64_t batch = found.batch_size;         // floor(0.9 * found.max_batch_size), at least 1
//
// The search:
// - Doubling from initial_batch_size until a step raises ember::OutOfMemory (or the cap fits),
//   then bisection between the last size that fit and the first that did not. When the initial
//   size already fails, the bisection runs between 0 and it. Memory is assumed to grow with the
//   batch size; each size is tried once (steps_per_trial steps).
// - Only ember::OutOfMemory counts as "does not fit". Any other exception leaves the search at
//   once, after the state is restored, and propagates unchanged. When not even a batch of 1 fits,
//   the search throws OutOfMemory (the figures of the last failure, a message saying so).
// - State: before the first trial the finder copies the module's state_dict (parameters and
//   buffers), the optimizer's state and hyperparameters, and the default generator's
//   (seed, offset) into host memory that ember's allocators do not count (plain std::vector, so
//   the snapshot takes no device memory and does not move the limit the search probes). After
//   every trial, successful or not, it drops all gradients (Module::zero_grad and
//   Optimizer::zero_grad: set to none) and writes the snapshot back: parameters, buffers and
//   optimizer state are bitwise what they were, the generator is where it was, and every trial
//   starts from the same state. Optimizer state is written back in place when the trial left
//   tensors of the same names and shapes (no allocation), else through load_state_dict (an
//   optimizer that had no state before loses what the trial created). Gradients that existed
//   before the search are dropped, not restored.
// - Without a module or optimizer (the overload taking only the step), nothing but the generator
//   is restored: the step is then responsible for its own side effects.
// - device: whose memory the trials are measured on (reset_peak_memory before, peak_bytes after,
//   reported per trial) and which is synchronised after each step, so that an error of
//   asynchronous work surfaces inside its trial. It does not move anything.
// - Other state the step changes (a learning-rate scheduler, a GradScaler's scale, a data loader's
//   position) is not restored.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ember/nn/module.hpp"
#include "ember/optim/optimizer.hpp"

namespace ember::train {

struct BatchSizeFinderOptions {
  int64_t initial_batch_size = 1;
  int64_t max_batch_size = int64_t{1} << 20;  // the cap: never tries more (set it to the dataset size)
  double margin = 0.9;                         // the result is floor(max fit * margin), at least 1; in (0, 1]
  int steps_per_trial = 1;                     // steps run at each size
  Device device = Device::cpu();               // whose memory is probed (see the header comment)
};

struct BatchSizeTrial {
  int64_t batch_size = 0;
  bool fit = false;
  int64_t peak_bytes = 0;  // peak memory of the device during the trial (in use at its start included)
};

struct BatchSizeResult {
  int64_t batch_size = 0;      // max_batch_size * margin, rounded down, at least 1
  int64_t max_batch_size = 0;  // the largest size that fit
  bool reached_cap = false;    // the cap fit: larger sizes might fit too
  std::vector<BatchSizeTrial> trials;  // in the order they ran
};

using TrainStepFn = std::function<void(int64_t batch_size)>;

namespace batch_size_finder_detail {

// A tensor's bytes in plain host memory (outside ember's allocator statistics and limits).
struct HostCopy {
  DType dtype = DType::Float32;
  Shape shape;
  std::vector<unsigned char> bytes;
};

inline HostCopy host_copy(const AnyTensor& t) {
  HostCopy c{t.dtype(), t.shape(), std::vector<unsigned char>(t.nbytes())};
  if (!c.bytes.empty()) t.backend().copy_to_host(c.bytes.data(), t.data_ptr(), c.bytes.size());
  return c;
}

inline bool matches(const AnyTensor& t, const HostCopy& c) {
  return t.defined() && t.dtype() == c.dtype && t.shape() == c.shape;
}

inline void write_back(const AnyTensor& dst, const HostCopy& c) {
  if (!c.bytes.empty()) dst.backend().copy_from_host(dst.data_ptr(), c.bytes.data(), c.bytes.size());
}

// A CPU tensor holding the copy (for Optimizer::load_state_dict, which moves it to the device).
inline AnyTensor to_tensor(const HostCopy& c) {
  AnyTensor t = AnyTensor::empty(c.shape, c.dtype, Device::cpu());
  if (!c.bytes.empty()) std::memcpy(t.data_ptr(), c.bytes.data(), c.bytes.size());
  return t;
}

class Snapshot {
 public:
  Snapshot(nn::Module* model, optim::Optimizer* opt) : model_(model), opt_(opt) {
    seed_ = default_generator().seed();
    offset_ = default_generator().offset();
    if (model_) {
      for (const auto& [name, t] : model_->state_dict()) module_.emplace_back(name, host_copy(t));
    }
    if (opt_) {
      for (const auto& g : opt_->param_groups()) {
        groups_.push_back(g.options);
        group_sizes_.push_back(g.params.size());
        for (const auto& p : g.params) {
          std::optional<std::vector<std::pair<std::string, HostCopy>>> st;
          if (const optim::ParamState* s = opt_->state(p)) {
            st.emplace();
            for (const auto& [k, v] : *s) st->emplace_back(k, host_copy(v));
          }
          state_.push_back(std::move(st));
        }
      }
    }
  }

  // Drops gradients and writes everything back.
  void restore() const {
    NoGradGuard no_grad;
    if (model_) model_->zero_grad();
    if (opt_) opt_->zero_grad(/*set_to_none=*/true);
    if (model_) restore_module();
    if (opt_) restore_optimizer();
    default_generator().set_state(seed_, offset_);
  }

 private:
  void restore_module() const {
    const nn::StateDict now = model_->state_dict();
    EMBER_CHECK(now.size() == module_.size(), ValueError, "find_max_batch_size: the module had ", module_.size(),
                " state_dict entries before the trial and has ", now.size(), " after it");
    for (size_t i = 0; i < now.size(); ++i) {
      const auto& [name, t] = now[i];
      const auto& [saved_name, c] = module_[i];
      EMBER_CHECK(name == saved_name && matches(t, c), ValueError, "find_max_batch_size: module entry '", name,
                  "' (", t.desc(), ") no longer matches '", saved_name, "' ", dtype_name(c.dtype), c.shape.str(),
                  " saved before the trial");
      write_back(t, c);
    }
  }

  void restore_optimizer() const {
    auto& groups = opt_->param_groups();
    EMBER_CHECK(groups.size() == groups_.size(), ValueError, "find_max_batch_size: the optimizer had ",
                groups_.size(), " parameter group(s) before the trial and has ", groups.size(), " after it");
    // In place when every parameter's state has the saved names and shapes.
    bool in_place = true;
    size_t index = 0;
    for (const auto& g : groups) {
      for (const auto& p : g.params) {
        if (index >= state_.size()) return reload();  // parameters added by the step: load_state_dict says so
        const optim::ParamState* now = opt_->state(p);
        const auto& saved = state_[index++];
        if (!saved.has_value() || now == nullptr) {
          in_place = in_place && !saved.has_value() && now == nullptr;
          continue;
        }
        if (now->size() != saved->size()) {
          in_place = false;
          continue;
        }
        for (size_t k = 0; k < now->size(); ++k)
          in_place = in_place && (*now)[k].first == (*saved)[k].first && matches((*now)[k].second, (*saved)[k].second);
      }
    }
    if (!in_place || index != state_.size()) return reload();
    index = 0;
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      groups[gi].options = groups_[gi];
      for (const auto& p : groups[gi].params) {
        const auto& saved = state_[index++];
        if (!saved.has_value()) continue;
        const optim::ParamState& now = *opt_->state(p);
        for (size_t k = 0; k < now.size(); ++k) write_back(now[k].second, (*saved)[k].second);
      }
    }
  }

  // Through Optimizer::load_state_dict: drops state the trial created, recreates what it replaced.
  void reload() const {
    optim::OptimizerStateDict sd;
    int64_t index = 0;  // numbered across the groups in order, as state_dict() numbers them
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      optim::OptimizerStateDict::Group g;
      g.options = groups_[gi];
      for (size_t i = 0; i < group_sizes_[gi]; ++i) {
        const auto& st = state_[static_cast<size_t>(index)];
        if (st.has_value()) {
          optim::ParamState loaded;
          for (const auto& [k, c] : *st) loaded.emplace_back(k, to_tensor(c));
          sd.state.emplace(index, std::move(loaded));
        }
        g.params.push_back(index++);
      }
      sd.param_groups.push_back(std::move(g));
    }
    opt_->load_state_dict(sd);
  }

  nn::Module* model_;
  optim::Optimizer* opt_;
  uint64_t seed_ = 0, offset_ = 0;
  std::vector<std::pair<std::string, HostCopy>> module_;
  std::vector<optim::Hyperparams> groups_;
  std::vector<size_t> group_sizes_;
  std::vector<std::optional<std::vector<std::pair<std::string, HostCopy>>>> state_;  // per parameter, in order
};

inline BatchSizeResult find_max_batch_size(const TrainStepFn& step, nn::Module* model, optim::Optimizer* opt,
                                           const BatchSizeFinderOptions& o) {
  EMBER_CHECK(step != nullptr, ValueError, "find_max_batch_size: the step function is empty");
  EMBER_CHECK(o.initial_batch_size >= 1, ValueError, "find_max_batch_size: initial_batch_size must be >= 1, got ",
              o.initial_batch_size);
  EMBER_CHECK(o.max_batch_size >= o.initial_batch_size, ValueError,
              "find_max_batch_size: max_batch_size (", o.max_batch_size, ") must be >= initial_batch_size (",
              o.initial_batch_size, ")");
  EMBER_CHECK(o.margin > 0.0 && o.margin <= 1.0, ValueError, "find_max_batch_size: margin must be in (0, 1], got ",
              o.margin);
  EMBER_CHECK(o.steps_per_trial >= 1, ValueError, "find_max_batch_size: steps_per_trial must be >= 1, got ",
              o.steps_per_trial);
  Backend& backend = backend_for(o.device);  // a missing device fails here, before anything runs

  const Snapshot snapshot(model, opt);
  BatchSizeResult result;
  std::optional<OutOfMemory> last_oom;

  // Runs one trial; true when it fit. Anything but OutOfMemory propagates (state restored by the
  // caller's handler).
  auto fits = [&](int64_t b) {
    backend.reset_peak_memory();
    bool fit = true;
    try {
      for (int s = 0; s < o.steps_per_trial; ++s) step(b);
      backend.synchronize();
    } catch (const OutOfMemory& e) {
      fit = false;
      last_oom.emplace(e);
    }
    result.trials.push_back({b, fit, backend.memory_stats().peak_bytes});
    snapshot.restore();
    return fit;
  };

  try {
    int64_t lo = 0, hi = 0;  // lo: the largest size known to fit (0: none); hi: the smallest known not to (0: none)
    for (int64_t b = o.initial_batch_size;;) {
      if (!fits(b)) {
        hi = b;
        break;
      }
      lo = b;
      if (b >= o.max_batch_size) {
        result.reached_cap = true;
        break;
      }
      b = b > o.max_batch_size / 2 ? o.max_batch_size : 2 * b;
    }
    while (hi > 0 && hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (fits(mid)) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    if (lo == 0) {
      const OutOfMemory& e = *last_oom;
      throw OutOfMemory(::ember::detail::str_cat("find_max_batch_size: not even a batch of 1 fits on ",
                                                 o.device.str(), " (", e.what(), ")"),
                        e.requested_bytes, e.in_use_bytes, e.limit_bytes);
    }
    result.max_batch_size = lo;
    // floor(lo * margin), with a little slack so that 10 * 0.9 is 9, not 8.
    const int64_t scaled = static_cast<int64_t>(std::floor(static_cast<double>(lo) * o.margin + 1e-9));
    result.batch_size = scaled < 1 ? 1 : scaled;
  } catch (...) {
    try {
      snapshot.restore();
    } catch (...) {
      // The original exception says more than a failed restore would.
    }
    throw;
  }
  return result;
}

}  // namespace batch_size_finder_detail

// Finds the largest batch size whose step fits, restoring `model` and `opt` after every trial
// (see the header comment).
inline BatchSizeResult find_max_batch_size(const TrainStepFn& step, nn::Module& model, optim::Optimizer& opt,
                                           const BatchSizeFinderOptions& options = {}) {
  return batch_size_finder_detail::find_max_batch_size(step, &model, &opt, options);
}

// The same with only a module to restore (a step that updates parameters itself, or none).
inline BatchSizeResult find_max_batch_size(const TrainStepFn& step, nn::Module& model,
                                           const BatchSizeFinderOptions& options = {}) {
  return batch_size_finder_detail::find_max_batch_size(step, &model, nullptr, options);
}

// The same restoring nothing but the default generator: the step owns its side effects.
inline BatchSizeResult find_max_batch_size(const TrainStepFn& step, const BatchSizeFinderOptions& options = {}) {
  return batch_size_finder_detail::find_max_batch_size(step, nullptr, nullptr, options);
}

}  // namespace ember::train
