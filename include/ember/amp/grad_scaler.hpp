#pragma once
// amp::GradScaler: dynamic loss scaling for fp16 training, with torch.amp.GradScaler's semantics.
// bf16 has fp32's exponent range and needs no scaler.
//
//   amp::GradScaler scaler;                   // init_scale 2^16, growth x2, backoff x0.5, interval 2000
//   for (...) {
//     opt.zero_grad();
//     auto loss = nn::functional::mse_loss(model(x.to<half>()), y);   // fp32 loss of an fp16 forward
//     scaler.scale(loss).backward();          // gradients of loss * scale
//     scaler.unscale_(opt);                   // optional: only to look at or clip true gradients
//     optim::clip_grad_norm_(model.parameters(), 1.0);
//     scaler.step(opt);                       // unscales if not yet done; skips opt.step() on inf/NaN
//     scaler.update();                        // backoff on inf/NaN, growth after growth_interval clean steps
//   }
//
// The rules, as torch's (torch/amp/grad_scaler.py and the _amp_foreach_non_finite_check_and_unscale_
// and _amp_update_scale_ kernels):
// - scale(outputs) = outputs * scale, differentiable, with the scale as a float32 tensor on the
//   outputs' device. The scale is created on the first call, on that call's device.
// - unscale_(opt): every gradient of opt's parameters is checked for inf/NaN (before unscaling)
//   and multiplied in place by inv_scale = float32(1 / double(scale)) (skipped when inv_scale is 1),
//   computed in fp32 for fp16/bf16 gradients. At most once per optimizer between update()s.
// - step(opt): unscale_(opt) unless already done; then opt.step() unless an inf/NaN was found.
//   Returns whether it stepped (torch returns the optimizer's step() result, None when skipped).
//   Where unscale_ was not called and the optimizer fuses the unscale (SGD, Adam, AdamW, RMSprop
//   with their fused steps: Optimizer::fuses_grad_unscale), step() runs unscale_'s check alone,
//   then the optimizer's step with the unscale inside its kernel (Optimizer::step_unscaling), as
//   torch's fused optimizers take grad_scale and found_inf: the same values bitwise (parameters,
//   state and the unscaled gradients left behind), each gradient read twice and written once
//   instead of three reads and a write. A skipped step still unscales the gradients.
//   set_fuse_unscale(false) keeps unscale_ then step().
// - update(): found inf/NaN in any optimizer: scale *= backoff_factor, growth tracker = 0; else
//   tracker += 1, and when it reaches growth_interval: scale *= growth_factor (only if that stays
//   finite in float32), tracker = 0. The products are computed in double and rounded to float32.
//   update(new_scale) sets the scale instead (the tracker is left alone). Either way it resets the
//   per-optimizer stages, so the next iteration may unscale_ and step again.
// - enabled = false: scale() returns its input, unscale_() and update() do nothing, step() is
//   opt.step(), get_scale() is 1, state_dict() is empty and load_state_dict() ignores its input.
//
// Where the values live, and host synchronisation. The scale is a float32 tensor on the device
// (scale_tensor()), and each unscale_ records found-inf as a uint8 flag tensor per device, written
// by the backend's nonfinite_check kernel without leaving the device. The scale is mirrored on the
// host as a float32 that always holds the same value: update() computes the new scale on the host
// from the found-inf value that step() has already read, then writes it to the device with a fill
// kernel (no transfer back). So per iteration the only device-to-host read is step()'s read of the
// flag (one byte per device holding gradients): unscale_ multiplies by the host inv_scale (a
// kernel argument), update() reuses the flag step() read, get_scale() and state_dict() read the
// mirror. update() reads a flag itself only for an optimizer that was unscaled but not stepped.
// The growth tracker is an integer kept on the host only (torch keeps it in a device tensor, to
// update it without knowing found-inf on the host; here the host knows it).
//
// Deviations from torch:
// - fp16 gradients are accepted (torch's unscale_ refuses them: "Attempting to unscale FP16
//   gradients."): ember lets parameters be fp16. Unscaled fp16 gradients below 2^-24 flush to 0,
//   which is why master weights should stay fp32.
// - An fp16/bf16 output is multiplied in fp32 and scale() returns fp32 (torch promotes a 0-d fp16
//   loss to fp32 too, but keeps fp16 for a higher-rank fp16 tensor, which overflows at 65504).
//   A float64 output is multiplied by the scale as float64.
// - get_scale() reads the host mirror: no synchronisation (torch calls .item()).
// - update() replaces the device scale tensor by a new one instead of writing into it, so a
//   scaled loss whose backward runs after update() still carries the scale it was made with.
// - Options are checked: growth_factor > 1 and 0 < backoff_factor < 1 (torch asserts the first
//   and backoff < 1), a finite init_scale > 0, growth_interval >= 1; load_state_dict() checks
//   the same, needs all five keys and refuses unknown ones.
// - There is no device argument: the scale lives where the first scaled outputs live, and a
//   scaler is never disabled behind the user's back (torch disables a "cuda" scaler without CUDA).
// - Misuse (unscale_ twice, step twice, a scaler used before scale()) throws ember::Error with
//   torch's RuntimeError messages.
#include <cmath>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ember/optim/optimizer.hpp"

namespace ember::amp {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;
};

// torch's GradScaler.state_dict(), in its key order: "scale", "growth_factor", "backoff_factor",
// "growth_interval", "_growth_tracker" (empty for a disabled scaler).
using GradScalerStateDict = optim::Hyperparams;

class GradScaler {
 public:
  explicit GradScaler(const GradScalerOptions& options = {})
      : enabled_(options.enabled),
        init_scale_(options.init_scale),
        growth_factor_(options.growth_factor),
        backoff_factor_(options.backoff_factor),
        growth_interval_(options.growth_interval) {
    if (enabled_) {
      check_init_scale(init_scale_, "init_scale");
      check_growth_factor(growth_factor_);
      check_backoff_factor(backoff_factor_);
      check_growth_interval(static_cast<double>(growth_interval_));
    }
    scale_host_ = static_cast<float>(init_scale_);
  }
  GradScaler(const GradScaler&) = delete;  // holds per-optimizer state keyed by address
  GradScaler& operator=(const GradScaler&) = delete;

  bool is_enabled() const { return enabled_; }

  // outputs * scale (differentiable). See the header comment for dtypes.
  AnyTensor scale(const AnyTensor& outputs) {
    if (!enabled_) return outputs;
    EMBER_CHECK(outputs.defined(), ValueError, "GradScaler.scale: the outputs are an undefined tensor");
    EMBER_CHECK(is_floating(outputs.dtype()), DTypeError, "GradScaler.scale: outputs must be floating point, got ",
                outputs.desc());
    if (!scale_.defined()) scale_ = make_scale_tensor(outputs.device());
    AnyTensor x = is_low_precision(outputs.dtype()) ? outputs.to(DType::Float32) : outputs;
    AnyTensor s = scale_.device() == x.device() ? scale_ : scale_.to(x.device());
    if (x.dtype() != s.dtype()) s = s.to(x.dtype());
    return op::mul(x, s);
  }
  template <Element T>
  Tensor<compute_t<T>> scale(const Tensor<T>& outputs) {
    return Tensor<compute_t<T>>(enabled_ ? scale(AnyTensor(outputs)) : AnyTensor(outputs).to(dtype_of<compute_t<T>>));
  }
  std::vector<AnyTensor> scale(const std::vector<AnyTensor>& outputs) {
    std::vector<AnyTensor> out;
    out.reserve(outputs.size());
    for (const AnyTensor& o : outputs) out.push_back(scale(o));
    return out;
  }

  // Divides opt's gradients by the scale in place and records whether any was inf/NaN.
  void unscale_(optim::Optimizer& opt) {
    trace::PhaseScope phase(trace::Phase::Optimizer);
    if (!enabled_) return;
    check_initialised("unscale_");
    OptimizerState& st = per_optimizer_[&opt];
    if (st.stage == Stage::Unscaled)
      throw Error("GradScaler: unscale_() has already been called on this optimizer since the last update().");
    if (st.stage == Stage::Stepped) throw Error("GradScaler: unscale_() is being called after step().");
    pass_over_gradients(opt, &st, inverse_scale());
    st.stage = Stage::Unscaled;
  }

  // Unscales (unless unscale_ was called) and runs opt.step() unless a gradient was inf/NaN.
  // Returns true when the optimizer stepped.
  bool step(optim::Optimizer& opt) {
    trace::PhaseScope phase(trace::Phase::Optimizer);
    if (!enabled_) {
      opt.step();
      return true;
    }
    check_initialised("step");
    if (per_optimizer_[&opt].stage == Stage::Stepped)
      throw Error("GradScaler: step() has already been called since the last update().");
    // unscale_ not called: the unscale is fused into the optimizer's step where it can be
    // (Optimizer::step_unscaling), after a check-only pass; otherwise unscale_, then step().
    const bool fuse = per_optimizer_[&opt].stage == Stage::Ready && fuse_unscale_ && opt.fuses_grad_unscale() &&
                      gradients_distinct(opt);
    if (fuse) {
      pass_over_gradients(opt, &per_optimizer_[&opt], 1.0f);  // the check only
      per_optimizer_[&opt].stage = Stage::Unscaled;          // as after unscale_, should the next check throw
    } else if (per_optimizer_[&opt].stage == Stage::Ready)
      unscale_(opt);
    OptimizerState& st = per_optimizer_[&opt];
    EMBER_CHECK(!st.flags.empty(), Error,
                "GradScaler.step: No inf checks were recorded for this optimizer (none of its parameters has a "
                "gradient: was backward() called on the scaled loss?)");
    const bool found_inf = st.read_found_inf();  // the one device-to-host read of the iteration
    const float inv_scale = inverse_scale();
    if (fuse && inv_scale != 1.0f) {
      if (found_inf)
        pass_over_gradients(opt, nullptr, inv_scale);  // skipped: the gradients end unscaled all the same
      else
        opt.step_unscaling(static_cast<double>(inv_scale));
    } else if (!found_inf) {
      opt.step();
    }
    st.stage = Stage::Stepped;
    return !found_inf;
  }

  // Whether step() may fuse the unscale into the optimizer's step (default on): the same values,
  // bitwise, with one pass over the gradients fewer. Off: unscale_ then step(), the reference.
  void set_fuse_unscale(bool on) { fuse_unscale_ = on; }
  bool fuse_unscale() const { return fuse_unscale_; }

  // The found-inf flags unscale_(opt) recorded (uint8 0-d tensors, one per gradient device), as
  // handles: writing into them before step(opt) changes its verdict (dist::sync_found_inf
  // all-reduces them over the ranks). Forgets a verdict already read on the host.
  std::vector<AnyTensor> found_inf_flags(const optim::Optimizer& opt) {
    std::vector<AnyTensor> out;
    auto it = per_optimizer_.find(&opt);
    if (it == per_optimizer_.end()) return out;
    it->second.known = -1;
    for (auto& [dev, f] : it->second.flags) out.push_back(f);
    return out;
  }

  // Updates the scale from the inf/NaN checks of this iteration (see the header comment).
  void update() {
    trace::PhaseScope phase(trace::Phase::Optimizer);
    if (!enabled_) return;
    check_initialised("update");
    bool have_checks = false, found_inf = false;
    for (auto& [opt, st] : per_optimizer_) {
      if (st.flags.empty()) continue;
      have_checks = true;
      found_inf = st.read_found_inf() || found_inf;
    }
    EMBER_CHECK(have_checks, Error, "GradScaler.update: No inf checks were recorded prior to update().");
    float scale = scale_host_;
    if (found_inf) {
      scale = static_cast<float>(static_cast<double>(scale) * backoff_factor_);
      growth_tracker_ = 0;
    } else {
      const int64_t successful = growth_tracker_ + 1;
      if (successful == growth_interval_) {
        const float grown = static_cast<float>(static_cast<double>(scale) * growth_factor_);
        if (std::isfinite(grown)) scale = grown;  // never grow past float32's range to inf
        growth_tracker_ = 0;
      } else {
        growth_tracker_ = successful;
      }
    }
    set_scale(scale);
    per_optimizer_.clear();
  }
  // Sets the scale to a value of the user's (torch's update(new_scale)).
  void update(double new_scale) {
    if (!enabled_) return;
    check_initialised("update");
    set_scale(static_cast<float>(new_scale));
    per_optimizer_.clear();
  }
  void update(const AnyTensor& new_scale) {
    if (!enabled_) return;
    const char* reason = "GradScaler.update: new_scale should be a float or a 1-element floating tensor with "
                         "requires_grad=false";
    EMBER_CHECK(new_scale.defined() && new_scale.numel() == 1 && is_floating(new_scale.dtype()) &&
                    !new_scale.requires_grad(),
                ValueError, reason, ", got ", new_scale.desc());
    update(new_scale.item_double());
  }

  // The current scale: 1 when disabled, init_scale before the first scale() (no synchronisation).
  double get_scale() const {
    if (!enabled_) return 1.0;
    return scale_.defined() ? static_cast<double>(scale_host_) : init_scale_;
  }
  // The device scale (float32, 0-d); undefined before the first scale() or when disabled.
  const AnyTensor& scale_tensor() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }  // torch's _get_growth_tracker()

  double get_growth_factor() const { return growth_factor_; }
  void set_growth_factor(double v) {
    check_growth_factor(v);
    growth_factor_ = v;
  }
  double get_backoff_factor() const { return backoff_factor_; }
  void set_backoff_factor(double v) {
    check_backoff_factor(v);
    backoff_factor_ = v;
  }
  int64_t get_growth_interval() const { return growth_interval_; }
  void set_growth_interval(int64_t v) {
    check_growth_interval(static_cast<double>(v));
    growth_interval_ = v;
  }

  GradScalerStateDict state_dict() const {
    if (!enabled_) return {};
    return {{"scale", get_scale()},
            {"growth_factor", growth_factor_},
            {"backoff_factor", backoff_factor_},
            {"growth_interval", static_cast<double>(growth_interval_)},
            {"_growth_tracker", static_cast<double>(growth_tracker_)}};
  }
  // Checks everything before changing anything.
  void load_state_dict(const GradScalerStateDict& sd) {
    if (!enabled_) return;
    EMBER_CHECK(sd.size() > 0, ValueError,
                "GradScaler.load_state_dict: The source state dict is empty, possibly because it was saved from a "
                "disabled instance of GradScaler.");
    static const char* const kKeys[] = {"scale", "growth_factor", "backoff_factor", "growth_interval",
                                        "_growth_tracker"};
    for (const char* k : kKeys)
      EMBER_CHECK(sd.contains(k), ValueError, "GradScaler.load_state_dict: missing key '", k, "' (the state dict has ",
                  sd.names(), ")");
    for (const auto& [k, v] : sd) {
      bool known = false;
      for (const char* kk : kKeys) known = known || k == kk;
      EMBER_CHECK(known, ValueError, "GradScaler.load_state_dict: unexpected key '", k, "'");
    }
    const double scale = sd.at("scale"), tracker = sd.at("_growth_tracker");
    check_init_scale(scale, "scale");
    check_growth_factor(sd.at("growth_factor"));
    check_backoff_factor(sd.at("backoff_factor"));
    check_growth_interval(sd.at("growth_interval"));
    EMBER_CHECK(tracker >= 0 && tracker == std::floor(tracker), ValueError,
                "GradScaler.load_state_dict: _growth_tracker must be a non-negative integer, got ", tracker);
    init_scale_ = scale;
    growth_factor_ = sd.at("growth_factor");
    backoff_factor_ = sd.at("backoff_factor");
    growth_interval_ = static_cast<int64_t>(sd.at("growth_interval"));
    growth_tracker_ = static_cast<int64_t>(tracker);
    if (scale_.defined()) {
      set_scale(static_cast<float>(scale));
    } else {
      scale_host_ = static_cast<float>(scale);
    }
  }

 private:
  enum class Stage { Ready, Unscaled, Stepped };

  struct OptimizerState {
    Stage stage = Stage::Ready;
    std::vector<std::pair<Device, AnyTensor>> flags;  // found-inf (uint8, 0-d) per gradient device
    int known = -1;                                   // the flags' OR once read on the host, else -1

    AnyTensor& flag_for(Device d) {
      for (auto& [dev, f] : flags)
        if (dev == d) return f;
      flags.emplace_back(d, AnyTensor::zeros(Shape{}, DType::UInt8, d));
      return flags.back().second;
    }
    bool read_found_inf() {
      if (known < 0) {
        bool any = false;
        for (auto& [dev, f] : flags) {
          uint8_t v = 0;
          f.backend().copy_to_host(&v, f.data_ptr(), 1);
          any = any || v != 0;
        }
        known = any ? 1 : 0;
      }
      return known == 1;
    }
  };

  // inv_scale = float32(1 / double(scale)), torch's rounding.
  float inverse_scale() const { return static_cast<float>(1.0 / static_cast<double>(scale_host_)); }

  // One pass of unscale_ over every gradient of opt: the inf/NaN check into st's flags (before
  // any unscaling; none when st is null), then the gradient multiplied in place by inv_scale unless
  // that is 1. unscale_: both; the fused step's check-only pass: inv_scale 1; the unscale of a
  // step skipped after that check: no st. A gradient shared by two parameters is handled once.
  static void pass_over_gradients(optim::Optimizer& opt, OptimizerState* st, float inv_scale) {
    NoGradGuard no_grad;
    std::unordered_set<const TensorImpl*> seen;
    for (const optim::ParamGroup& group : opt.param_groups()) {
      for (const AnyTensor& p : group.params) {
        AnyTensor g = p.grad();
        if (!g.defined() || !seen.insert(g.impl()).second) continue;
        AnyTensor* flag = st ? &st->flag_for(g.device()) : nullptr;
        if (g.numel() == 0) continue;
        Backend& b = g.backend();
        if (flag) b.nonfinite_check(g.dtype(), g.data_ptr(), g.numel(), static_cast<uint8_t*>(flag->data_ptr()));
        if (inv_scale != 1.0f)
          b.unary(UnaryOp::MulScalar, g.dtype(), g.data_ptr(), g.data_ptr(), g.numel(), static_cast<double>(inv_scale),
                  0.0);
      }
    }
  }
  // No two parameters of opt share a gradient tensor (a fused unscale would unscale it twice).
  static bool gradients_distinct(const optim::Optimizer& opt) {
    std::unordered_set<const TensorImpl*> seen;
    for (const optim::ParamGroup& group : opt.param_groups())
      for (const AnyTensor& p : group.params)
        if (AnyTensor g = p.grad(); g.defined() && !seen.insert(g.impl()).second) return false;
    return true;
  }

  void check_initialised(const char* fn) const {
    EMBER_CHECK(scale_.defined(), Error, "GradScaler: Attempted ", fn,
                " but _scale is None.  This may indicate your script did not use scaler.scale(loss or outputs) "
                "earlier in the iteration.");
  }
  AnyTensor make_scale_tensor(Device d) const {
    return AnyTensor::full(Shape{}, static_cast<double>(scale_host_), DType::Float32, d);
  }
  // A fresh device tensor (graphs holding the old one keep their value), and the host mirror.
  void set_scale(float s) {
    const bool changed = !(s == scale_host_) || std::signbit(s) != std::signbit(scale_host_);
    scale_host_ = s;
    if (changed || !scale_.defined()) scale_ = make_scale_tensor(scale_.defined() ? scale_.device() : Device::cpu());
  }

  static void check_init_scale(double v, const char* what) {
    EMBER_CHECK(std::isfinite(v) && v > 0.0 && std::isfinite(static_cast<float>(v)), ValueError, "GradScaler: ",
                what, " must be a positive finite float32 value, got ", v);
  }
  static void check_growth_factor(double v) {
    EMBER_CHECK(v > 1.0 && std::isfinite(v), ValueError, "GradScaler: The growth factor must be > 1.0, got ", v);
  }
  static void check_backoff_factor(double v) {
    EMBER_CHECK(v > 0.0 && v < 1.0, ValueError, "GradScaler: The backoff factor must be in (0, 1), got ", v);
  }
  static void check_growth_interval(double v) {
    EMBER_CHECK(v >= 1.0 && v == std::floor(v) && v <= 2147483647.0, ValueError,
                "GradScaler: growth_interval must be a positive integer, got ", v);
  }

  bool enabled_;
  double init_scale_;
  double growth_factor_, backoff_factor_;
  int64_t growth_interval_;
  int64_t growth_tracker_ = 0;
  bool fuse_unscale_ = true;
  float scale_host_;   // the value of scale_ (always equal; see the header comment)
  AnyTensor scale_;    // float32 0-d on the device of the first scaled outputs
  std::unordered_map<const optim::Optimizer*, OptimizerState> per_optimizer_;
};

}  // namespace ember::amp
