#pragma once
// Learning-rate schedulers, as torch.optim.lr_scheduler. A scheduler is built on an optimizer
// (which must outlive it), reads each group's lr at construction as its base lr, and sets the
// lr of epoch 0 right away; each step() advances one epoch (or iteration) and sets every group's
// lr; get_last_lr() returns the lrs it last set. t below is last_epoch(), the number of step()
// calls so far.
//
//   StepLR(opt, step_size, gamma = 0.1)        base * gamma^floor(t / step_size)
//   MultiStepLR(opt, milestones, gamma = 0.1)  base * gamma^(number of milestones <= t)
//   ExponentialLR(opt, gamma)                  base * gamma^t
//   CosineAnnealingLR(opt, T_max, eta_min = 0) eta_min + (base - eta_min) * (1 + cos(pi t / T_max)) / 2
//   WarmupCosineLR(opt, {warmup_steps W, total_steps T, min_lr = 0, start_factor s = 0}):
//       t < W:       base * (s + (1 - s) * t / W)                 (linear warmup from s * base)
//       W <= t < T:  min_lr + (base - min_lr) * (1 + cos(pi (t - W) / (T - W))) / 2
//       t >= T:      min_lr
//     (torch: SequentialLR(LinearLR(start_factor=s, total_iters=W),
//      CosineAnnealingLR(T_max=T-W, eta_min=min_lr), milestones=[W]) up to T; it then holds min_lr
//      where torch's cosine would rise again.)
//   OneCycleLR(opt, {max_lr, total_steps, pct_start = 0.3, anneal_strategy = "cos",
//       cycle_momentum = true, base_momentum = 0.85, max_momentum = 0.95, div_factor = 25,
//       final_div_factor = 1e4, three_phase = false}): torch's formula and phases exactly,
//     including momentum cycling ("beta1" of Adam/AdamW, "momentum" of SGD/RMSprop; with
//     cycle_momentum it sets the momentum at construction, as torch does, so an SGD built without
//     momentum gets momentum). Stepping beyond total_steps is an error, as in torch.
//
// Deviations from torch, on purpose: the lr is computed in closed form from the base lr (torch's
// step() uses the recursive, "chainable" form for StepLR, MultiStepLR, ExponentialLR and
// CosineAnnealingLR; the values agree to rounding, about 1e-16 relative, but an lr changed by hand
// or by a second scheduler is overwritten at the next step rather than scaled). The base lr is the
// group's lr when the scheduler is built (torch keeps a group's first "initial_lr").
// state_dict()/load_state_dict() save and restore last_epoch, the base lrs and the last lrs;
// like torch's, loading does not change the optimizer's lrs (its own state dict holds them).
#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "ember/optim/optimizer.hpp"

namespace ember::optim {

struct SchedulerStateDict {
  int64_t last_epoch = 0;
  std::vector<double> base_lrs;
  std::vector<double> last_lr;
};

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Advances one epoch and sets every group's lr.
  void step() {
    check_groups();
    check_step(last_epoch_ + 1);
    ++last_epoch_;
    apply();
  }
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  int64_t last_epoch() const { return last_epoch_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  Optimizer& optimizer() const { return opt_; }
  const std::string& name() const { return name_; }
  // The lr of group g at epoch t (closed form).
  virtual double lr_at(size_t g, int64_t t) const = 0;

  SchedulerStateDict state_dict() const { return {last_epoch_, base_lrs_, last_lr_}; }
  void load_state_dict(const SchedulerStateDict& sd) {
    EMBER_CHECK(sd.base_lrs.size() == base_lrs_.size() && sd.last_lr.size() == base_lrs_.size(), ValueError, name_,
                ".load_state_dict: the state dict is for ", sd.base_lrs.size(), " parameter group(s) (",
                sd.last_lr.size(), " last lrs), this scheduler has ", base_lrs_.size());
    EMBER_CHECK(sd.last_epoch >= 0, ValueError, name_, ".load_state_dict: last_epoch must be >= 0, got ",
                sd.last_epoch);
    check_step(sd.last_epoch);
    last_epoch_ = sd.last_epoch;
    base_lrs_ = sd.base_lrs;
    last_lr_ = sd.last_lr;
  }

 protected:
  LRScheduler(Optimizer& opt, std::string name) : opt_(opt), name_(std::move(name)) {
    for (const auto& g : opt_.param_groups()) base_lrs_.push_back(g.lr());
  }
  // Called at the end of a derived constructor: epoch 0 (torch's _initial_step).
  void initial_step() {
    last_epoch_ = -1;
    step();
  }
  // Throws when epoch t is out of range (OneCycleLR).
  virtual void check_step(int64_t /*t*/) const {}
  // Sets other hyperparameters for epoch t (OneCycleLR's momentum).
  virtual void apply_extra(size_t /*g*/, int64_t /*t*/) {}

  void check_groups() const {
    EMBER_CHECK(opt_.param_groups().size() == base_lrs_.size(), ValueError, name_, ": built for ", base_lrs_.size(),
                " parameter group(s) but the optimizer now has ", opt_.param_groups().size());
  }
  void apply() {
    last_lr_.clear();
    auto& groups = opt_.param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      groups[g].set_lr(lr_at(g, last_epoch_));
      apply_extra(g, last_epoch_);
      last_lr_.push_back(groups[g].lr());
    }
  }
  [[noreturn]] void invalid(const std::string& what) const { throw ValueError(name_ + ": " + what); }

  Optimizer& opt_;
  std::string name_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
  int64_t last_epoch_ = -1;
};

class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& opt, int64_t step_size, double gamma = 0.1)
      : LRScheduler(opt, "StepLR"), step_size_(step_size), gamma_(gamma) {
    if (step_size < 1) invalid(::ember::detail::str_cat("step_size must be >= 1, got ", step_size));
    initial_step();
  }
  double lr_at(size_t g, int64_t t) const override {
    return base_lrs_[g] * std::pow(gamma_, static_cast<double>(t / step_size_));
  }

 private:
  int64_t step_size_;
  double gamma_;
};

class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& opt, std::vector<int64_t> milestones, double gamma = 0.1)
      : LRScheduler(opt, "MultiStepLR"), milestones_(std::move(milestones)), gamma_(gamma) {
    std::sort(milestones_.begin(), milestones_.end());  // a repeated milestone decays twice, as in torch
    initial_step();
  }
  double lr_at(size_t g, int64_t t) const override {
    auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), t) - milestones_.begin();
    return base_lrs_[g] * std::pow(gamma_, static_cast<double>(passed));
  }

 private:
  std::vector<int64_t> milestones_;
  double gamma_;
};

class ExponentialLR : public LRScheduler {
 public:
  ExponentialLR(Optimizer& opt, double gamma) : LRScheduler(opt, "ExponentialLR"), gamma_(gamma) { initial_step(); }
  double lr_at(size_t g, int64_t t) const override { return base_lrs_[g] * std::pow(gamma_, static_cast<double>(t)); }

 private:
  double gamma_;
};

class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& opt, int64_t T_max, double eta_min = 0.0)
      : LRScheduler(opt, "CosineAnnealingLR"), T_max_(T_max), eta_min_(eta_min) {
    if (T_max < 1) invalid(::ember::detail::str_cat("T_max must be >= 1, got ", T_max));
    initial_step();
  }
  // torch's _get_closed_form_lr.
  double lr_at(size_t g, int64_t t) const override {
    return eta_min_ + (base_lrs_[g] - eta_min_) *
                          (1.0 + std::cos(std::numbers::pi * static_cast<double>(t) / static_cast<double>(T_max_))) /
                          2.0;
  }

 private:
  int64_t T_max_;
  double eta_min_;
};

struct WarmupCosineOptions {
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  double min_lr = 0.0;
  double start_factor = 0.0;  // the warmup starts at start_factor * base lr
};

class WarmupCosineLR : public LRScheduler {
 public:
  WarmupCosineLR(Optimizer& opt, const WarmupCosineOptions& o) : LRScheduler(opt, "WarmupCosineLR"), o_(o) {
    using ::ember::detail::str_cat;
    if (o.warmup_steps < 0) invalid(str_cat("warmup_steps must be >= 0, got ", o.warmup_steps));
    if (o.total_steps < 1 || o.total_steps < o.warmup_steps)
      invalid(str_cat("total_steps must be >= 1 and >= warmup_steps (", o.warmup_steps, "), got ", o.total_steps));
    if (!(o.start_factor >= 0.0 && o.start_factor <= 1.0))
      invalid(str_cat("start_factor must be in [0, 1], got ", o.start_factor));
    if (!(o.min_lr >= 0.0)) invalid(str_cat("min_lr must be >= 0, got ", o.min_lr));
    initial_step();
  }
  double lr_at(size_t g, int64_t t) const override {
    const double base = base_lrs_[g];
    if (t < o_.warmup_steps)
      return base * (o_.start_factor + (1.0 - o_.start_factor) * static_cast<double>(t) /
                                           static_cast<double>(o_.warmup_steps));
    if (t >= o_.total_steps) return o_.min_lr;
    const double progress =
        static_cast<double>(t - o_.warmup_steps) / static_cast<double>(o_.total_steps - o_.warmup_steps);
    return o_.min_lr + (base - o_.min_lr) * (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
  }

 private:
  WarmupCosineOptions o_;
};

// One value for every parameter group, or one per group: `.max_lr = 0.1` or `.max_lr = {0.1, 0.01}`.
struct PerGroup {
  std::vector<double> values;
  PerGroup() = default;
  PerGroup(double v) : values{v} {}  // NOLINT(google-explicit-constructor): a scalar for all groups
  PerGroup(std::initializer_list<double> v) : values(v) {}
  PerGroup(std::vector<double> v) : values(std::move(v)) {}  // NOLINT(google-explicit-constructor)
  double for_group(size_t g) const { return values.size() == 1 ? values[0] : values[g]; }
};

struct OneCycleOptions {
  PerGroup max_lr;  // required
  int64_t total_steps = 0;  // required
  double pct_start = 0.3;
  std::string anneal_strategy = "cos";  // or "linear"
  bool cycle_momentum = true;
  PerGroup base_momentum = 0.85;
  PerGroup max_momentum = 0.95;
  double div_factor = 25.0;
  double final_div_factor = 1e4;
  bool three_phase = false;
};

class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& opt, const OneCycleOptions& o) : LRScheduler(opt, "OneCycleLR"), o_(o) {
    using ::ember::detail::str_cat;
    const size_t n = opt.param_groups().size();
    if (o.total_steps <= 0) invalid(str_cat("expected a positive total_steps, got ", o.total_steps));
    if (!(o.pct_start >= 0.0 && o.pct_start <= 1.0))
      invalid(str_cat("expected pct_start between 0 and 1, got ", o.pct_start));
    if (o.anneal_strategy != "cos" && o.anneal_strategy != "linear")
      invalid("anneal_strategy must be one of 'cos' or 'linear', got '" + o.anneal_strategy + "'");
    auto check_count = [&](const PerGroup& v, const char* what) {
      if (v.values.size() != 1 && v.values.size() != n)
        invalid(str_cat("expected 1 or ", n, " values for ", what, " (one per parameter group), got ",
                        v.values.size()));
    };
    check_count(o.max_lr, "max_lr");
    check_count(o.base_momentum, "base_momentum");
    check_count(o.max_momentum, "max_momentum");
    const double tf = static_cast<double>(o.total_steps);
    if (o.three_phase) {
      phases_ = {{o.pct_start * tf - 1.0, kInitial, kMax, kMaxM, kBaseM},
                 {2.0 * o.pct_start * tf - 2.0, kMax, kInitial, kBaseM, kMaxM},
                 {tf - 1.0, kInitial, kMin, kMaxM, kMaxM}};
    } else {
      phases_ = {{o.pct_start * tf - 1.0, kInitial, kMax, kMaxM, kBaseM}, {tf - 1.0, kMax, kMin, kBaseM, kMaxM}};
    }
    for (size_t g = 0; g < n; ++g) {
      Values v;
      v.lr[kMax] = o.max_lr.for_group(g);
      v.lr[kInitial] = v.lr[kMax] / o.div_factor;
      v.lr[kMin] = v.lr[kInitial] / o.final_div_factor;
      v.m[kMaxM] = o.max_momentum.for_group(g);
      v.m[kBaseM] = o.base_momentum.for_group(g);
      values_.push_back(v);
      base_lrs_[g] = v.lr[kInitial];  // torch's initial_lr
    }
    if (o.cycle_momentum) {
      const Hyperparams& d = opt.defaults();
      if (d.contains("beta1")) {
        momentum_key_ = "beta1";
      } else if (d.contains("momentum")) {
        momentum_key_ = "momentum";
      } else {
        invalid(opt.name() + " has neither momentum nor beta1 to cycle; pass .cycle_momentum = false");
      }
      for (size_t g = 0; g < n; ++g) opt.param_groups()[g][momentum_key_] = values_[g].m[kMaxM];
    }
    initial_step();
  }

  double lr_at(size_t g, int64_t t) const override {
    double pct = 0.0;
    const Phase& ph = phase_of(t, pct);
    return anneal(values_[g].lr[ph.start_lr], values_[g].lr[ph.end_lr], pct);
  }
  // The momentum (or beta1) of group g at epoch t.
  double momentum_at(size_t g, int64_t t) const {
    double pct = 0.0;
    const Phase& ph = phase_of(t, pct);
    return anneal(values_[g].m[ph.start_m], values_[g].m[ph.end_m], pct);
  }

 protected:
  void check_step(int64_t t) const override {
    if (t > o_.total_steps)
      invalid(::ember::detail::str_cat("tried to step ", t, " times; the specified number of total steps is ",
                                       o_.total_steps));
  }
  void apply_extra(size_t g, int64_t t) override {
    if (o_.cycle_momentum) opt_.param_groups()[g][momentum_key_] = momentum_at(g, t);
  }

 private:
  enum LrKey { kInitial = 0, kMax = 1, kMin = 2 };
  enum MomentumKey { kMaxM = 0, kBaseM = 1 };
  struct Phase {
    double end_step;
    int start_lr, end_lr, start_m, end_m;
  };
  struct Values {
    double lr[3] = {};
    double m[2] = {};
  };
  // The phase holding step t, and how far into it t is (torch's get_lr loop).
  const Phase& phase_of(int64_t t, double& pct) const {
    const double step = static_cast<double>(t);
    double start = 0.0;
    for (size_t i = 0; i < phases_.size(); ++i) {
      if (step <= phases_[i].end_step || i + 1 == phases_.size()) {
        if (phases_[i].end_step == start)  // torch: ZeroDivisionError
          invalid(::ember::detail::str_cat("phase ", i + 1, " of the schedule is empty (ends at step ", start,
                                           " where it starts); raise total_steps or change pct_start (",
                                           o_.pct_start, ")"));
        pct = (step - start) / (phases_[i].end_step - start);
        return phases_[i];
      }
      start = phases_[i].end_step;
    }
    return phases_.back();  // not reached
  }
  double anneal(double start, double end, double pct) const {
    if (o_.anneal_strategy == "cos") {
      const double cos_out = std::cos(std::numbers::pi * pct) + 1.0;
      return end + (start - end) / 2.0 * cos_out;
    }
    return (end - start) * pct + start;
  }

  OneCycleOptions o_;
  std::vector<Phase> phases_;
  std::vector<Values> values_;
  std::string momentum_key_;
};

}  // namespace ember::optim
